"""Regions of small ops on one core, every intermediate between them held in LX: a post-solve
step judged on the simulator.

On the timing model a small op on one core is nearly as fast as on 32 (a streaming kernel on
part of the machine keeps most of the bus), and on one core every reader reads the whole
tensor its producer wrote on that core, so a whole chain of small ops (a norm, a softmax,
the bias add and head permutes after a projection, a residual add feeding the next norm)
can keep every intermediate in LX. The CP-SAT model reaches such a region one residency at
a time (`hold_moves`), and never through a restickify: the model prices every restickify
through device memory and keeps the tensor it reads out of LX, while on chip a restickify
between two LX-resident tensors is a relayout (each core walks its own slice). Here the
whole region moves at once, its restickifies included, and the simulator judges it:
1. `small_regions`: the connected components of the program's small ops (pointwise,
   reduce and data-moving copy ops, restickifies) outside every tiled kernel, joined
   through the tensors one of them writes and another reads;
2. `region_decisions`: the plan with every op of a region on one core (untiled, natural
   slices; its restickifies too) and every tensor a region op writes that only region ops
   read held in LX at first-fit addresses (`relayout.placed_in_lx`); residencies of the
   tensors crossing the region's edge are dropped (a producer or reader off the region
   runs on other cores);
3. each region, largest first (at most `MAX_REGION_TRIALS`), is emitted, validated and
   simulated, and kept when the program is valid and faster; the next region starts from
   the plan so far.
Nothing here is keyed on op names or shapes.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Optional

from target.primitives import PrimGraph
from target.superdsc import OpDecl, Program
from simulator.timing import time_program
from solver.oracle import valid_program
from solver.spyre.post_solve import Improved
from solver.plan import OpPlan, PlanDecisions
from solver.spyre.relayout import placed_in_lx

# the kinds of primitive op a region may hold (matmuls stay where the plan put them)
_SMALL_KINDS = ("pointwise", "reduce", "copy")
# regions tried per plan, the largest first: each trial emits the whole program twice (an
# emission of a 1844-op T5 graph takes about 3 s), and a layer's regions that pay are its
# few largest (the tiny layer graphs have 5-6 regions; a layer-sized region never fits one
# core's LX, which `region_decisions` mostly sees before emitting)
MAX_REGION_TRIALS = 8


def _ends(op: OpDecl) -> tuple[list[str], Optional[str]]:
    """(tensors read, tensor written) of a program op."""
    if op.prim is not None:
        return [i["tensor"] for i in op.prim["inputs"]], op.prim["output"]["tensor"]
    return ([op.src] if op.src else []), op.dst


def _is_small(pg: PrimGraph, op: OpDecl, prims: dict) -> bool:
    """A restickify, or a pointwise, reduce or data-moving copy op, outside every tiled
    kernel (a kernel's members are the fusion search's)."""
    if op.temporal_tiles:
        return False
    if op.kind == "restickify":
        return True
    prim = prims.get(op.id)
    return prim is not None and prim.body.kind in _SMALL_KINDS and not op.alias


def small_regions(pg: PrimGraph, program: Program) -> list[set[str]]:
    """The connected components (program op ids) of the program's small ops, joined through
    the tensors one writes and another reads; at least two ops each, largest first (ties in
    program order)."""
    prims = {op.id: op for op in pg.ops}
    small = [o for o in program.ops if _is_small(pg, o, prims)]
    index = {o.id: k for k, o in enumerate(program.ops)}
    parent = {o.id: o.id for o in small}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x
    writer = {}
    for o in small:
        writer[_ends(o)[1]] = o.id
    for o in small:
        for t in _ends(o)[0]:
            w = writer.get(t)
            if w is not None:
                a, b = find(w), find(o.id)
                if a != b:
                    parent[max(a, b, key=index.get)] = min(a, b, key=index.get)
    groups: dict[str, set[str]] = {}
    for o in small:
        groups.setdefault(find(o.id), set()).add(o.id)
    out = [g for g in groups.values() if len(g) >= 2]
    return sorted(out, key=lambda g: (-len(g), min(index[x] for x in g)))


def region_decisions(pg: PrimGraph, hw, d: PlanDecisions, program: Program, region: set[str]
                     ) -> Optional[PlanDecisions]:
    """`d` with `region` (program op ids) on one core and the tensors only its ops read
    held in LX (module docstring); None when it changes nothing, a held tensor cannot fit
    one core's LX, or the plan does not emit."""
    ops = {o.id: o for o in program.ops}
    readers: dict[str, list[str]] = {}
    for o in program.ops:
        for t in _ends(o)[0]:
            readers.setdefault(t, []).append(o.id)
    new_ops, new_resticks = dict(d.ops), dict(d.restick_ops)
    made: list[str] = []
    touched: set[str] = set()
    for oid in sorted(region):
        o = ops[oid]
        ins, out = _ends(o)
        touched |= set(ins) | {out}
        made.append(out)
        if o.kind == "restickify":
            new_resticks[out] = replace(new_resticks.get(out, OpPlan()), core_split={}, core_slices=None)
        else:
            new_ops[oid] = replace(new_ops.get(oid, OpPlan()), core_split={}, core_slices=None, temporal_tiles={})
    outputs = set(pg.outputs)
    produced = {op.output.tensor for op in pg.ops}
    # a restickified copy of a graph input is not held: where this graph is a piece of a
    # larger one (the depth step's repeated block), that input is one tensor every copy of
    # the piece reads, and its one restickified copy is live across all of them
    copied_from = {o.dst: o.src for o in program.ops if o.kind in ("restickify", "relayout")}
    keep = tuple(t for t in made if t not in outputs and readers.get(t)
                 and all(r in region for r in readers[t])
                 and (t not in copied_from or copied_from[t] in produced))
    for t in keep:
        if pg.tensors[copied_from.get(t, t)].nbytes > hw.lx_capacity_bytes:
            return None  # one core's LX cannot hold it whole
    resident = {t: r for t, r in d.resident.items() if t not in touched}
    trial = replace(d, ops=new_ops, restick_ops=new_resticks, resident=resident)
    if all(new_ops.get(o) == d.ops.get(o) for o in region) and \
            all(new_resticks.get(t) == d.restick_ops.get(t) for t in made) and all(t in d.resident for t in keep):
        return None  # already so
    return placed_in_lx(pg, hw, trial, keep) if keep else trial


def regions_on_one_core(pg: PrimGraph, hw, d: PlanDecisions, program: Program,
                        deadline: Optional[float] = None) -> Improved:
    """`d` (emitted as the valid `program`) with each small-op region on one core where that
    validates and simulates faster (`post_solve.Improved`). Stops before a trial it has no
    time left for (`deadline`, perf_counter seconds)."""
    base_us = best_us = time_program(program, hw).total_us
    notes: list[str] = []
    longest = 0.0
    for region in small_regions(pg, program)[:MAX_REGION_TRIALS]:
        if deadline is not None and time.perf_counter() + 2 * longest > deadline:
            notes.append("one-core regions: stopped early (time limit)")
            break
        started = time.perf_counter()
        trial = region_decisions(pg, hw, d, program, region)
        if trial is not None:
            prog = valid_program(pg, hw, trial)
            if prog is not None:
                us = time_program(prog, hw).total_us
                if us < best_us:
                    notes.append(f"one-core region of {len(region)} ops ({min(region)} ...), "
                                 f"simulated {best_us:.2f} -> {us:.2f} us")
                    d, program, best_us = trial, prog, us
        longest = max(longest, time.perf_counter() - started)
    return Improved(d, program, notes, base_us, best_us)
