"""LX relayouts: a restickify whose source and copy both stay in LX runs on chip.

The CP-SAT model prices every restickify through device memory (about 116 GB/s: the copy is
written and read back), and its residency rule keeps a tensor that a restickify reads in
device memory. The emitter already turns a restickify between two LX-resident tensors into
an on-chip relayout (each core walks its own slice at `lx_relayout_gbps_per_core`, about
547 GB/s a core), so after the solve and fusion this step tries that for each restickify of
the plan, as a pipeline of small steps:
1. `relayout_candidates`: restickifies whose source the program produces (not a graph
   input or output), with the copy in device memory;
2. `placed_in_lx`: the plan with the source and the copy in LX, at first-fit addresses around
   every other live LX buffer (`tile_buffers.place_first_fit`; sizes and live ranges as
   the emitter derives them);
3. the validator judges (each core's relayout reads what that core's producer wrote; every
   other reader of the source must read it from LX too) and the simulator times it; a
   candidate is kept when the program is valid and faster.
Nothing here is keyed on op names or shapes.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Optional

from target.primitives import PrimGraph
from target.superdsc import LxMemory, Program, lx_live_spans
from simulator.timing import time_program
from solver.emit import emit_program
from solver.oracle import valid_program
from solver.spyre.post_solve import Improved
from solver.plan import PlanDecisions, Residency
from solver.spyre.tile_buffers import LxRequest, place_first_fit


def relayout_candidates(pg: PrimGraph, program: Program) -> list[tuple[str, str]]:
    """(source, copy) of every restickify through device memory whose source the program
    computes and does not return."""
    produced = {op.output.tensor for op in pg.ops}
    tmap = program.tensor_map()
    out = []
    for op in program.ops:
        if op.kind != "restickify" or op.src is None or op.dst is None:
            continue
        if op.src in produced and op.src not in pg.outputs and not isinstance(tmap[op.dst].memory, LxMemory):
            out.append((op.src, op.dst))
    return out


def placed_in_lx(pg: PrimGraph, hw, d: PlanDecisions, names: tuple[str, ...]) -> Optional[PlanDecisions]:
    """`d` with `names` LX-resident at first-fit addresses (None when they do not fit or the
    plan does not emit). The emitter sizes each buffer and sets its live range; a first
    emission with provisional addresses reads them off."""
    trial = replace(d, resident={**d.resident, **{t: Residency(lx_address=0) for t in names if t not in d.resident}})
    try:
        prog = emit_program(pg, hw, trial)
    except ValueError:
        return None
    spans = lx_live_spans(prog)
    wanted = {t.id: LxRequest(*spans[t.id], t.memory.size_per_core) for t in prog.tensors if t.id in names}
    addresses = place_first_fit(prog, wanted, hw.lx_capacity_bytes, hw.stick_bytes)
    if len(addresses) < len(wanted):
        return None
    return replace(d, resident={**d.resident, **{t: Residency(lx_address=a) for t, a in addresses.items()}})


def add_lx_relayouts(pg: PrimGraph, hw, d: PlanDecisions, program: Program,
                     deadline: Optional[float] = None) -> Improved:
    """`d` (emitted as the valid `program`) with every restickify turned into an LX relayout
    where that validates and simulates faster (`post_solve.Improved`). Stops before a trial
    it has no time left for (`deadline`, perf_counter seconds)."""
    base_us = best_us = time_program(program, hw).total_us
    notes: list[str] = []
    longest = 0.0
    for src, copy in relayout_candidates(pg, program):
        if deadline is not None and time.perf_counter() + 2 * longest > deadline:
            notes.append("lx relayout: stopped early (time limit)")
            break
        started = time.perf_counter()
        trial = placed_in_lx(pg, hw, d, (src, copy))
        if trial is not None:
            prog = valid_program(pg, hw, trial)
            if prog is not None:
                us = time_program(prog, hw).total_us
                if us < best_us:
                    notes.append(f"lx relayout: {src} -> {copy} on chip, simulated {best_us:.1f} -> {us:.1f} us")
                    d, program, best_us = trial, prog, us
        longest = max(longest, time.perf_counter() - started)
    return Improved(d, program, notes, base_us, best_us)
