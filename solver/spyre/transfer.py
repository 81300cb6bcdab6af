"""Plan transfer: the plan of one size of a graph carried to another size of the same graph.

A serving loop compiles the same layer graph at many shapes (prefill lengths, decode batch
sizes, KV lengths). Their structure is identical: the same primitive ops over the same
tensors, only dim sizes differ. Most of a plan is about structure, not size: which dim each
tensor is sticked on, which iteration dims an op is split over, what stays in LX, which ops
fuse into tiled kernels, the op order. `transfer_decisions` keeps all of that and repairs
what a size change breaks: a core split or a tile count that no longer divides a dim in
whole sticks shrinks to the nearest factor that does, an explicit core -> slice map whose
split changed is dropped, and the LX residencies the validator rejects at the new size
(too big, overlapping) are dropped, then all tile buffers and tiles if that is not enough;
what was dropped is placed again at fresh LX addresses where it fits and the program gets
faster (`solver.spyre.tile_buffers`).

The result is a complete plan for the new size (valid, or `None`): the planner can use it as
it is, or as the start (hint) of a shorter search.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Optional

from simulator.timing import time_program
from solver.oracle import checked_program, program_and_issues
from solver.plan import OpPlan, PlanDecisions, Residency, program_dim_orders
from solver.spyre.tile_buffers import LxRequest, add_tile_buffers, add_whole_residencies, place_first_fit
from target.op_rules import check_split, matching_choice, split_granules, split_units
from target.primitives import PrimGraph, PrimOp
from target.superdsc import LxMemory, Program, lx_live_spans

# rounds of dropping the residencies the validator names before all tile buffers go
REPAIR_ROUNDS = 4


class NotTransferable(ValueError):
    """The two graphs differ in structure, not only in sizes."""


def structure_key(pg: PrimGraph) -> str:
    """A digest of everything about `pg` except its dim sizes: two graphs with the same key
    are sizes of one graph, and a plan of one transfers to the other."""
    ops = []
    for op in pg.ops:
        ops.append([op.id, op.body.kind, [(d.name, d.kind) for d in op.iter_dims],
                    [(a.tensor, list(a.dims)) for a in op.inputs], [op.output.tensor, list(op.output.dims)]])
    tensors = sorted((t.id, len(t.shape), t.dtype, t.role) for t in pg.tensors.values())
    doc = {"ops": ops, "tensors": tensors, "inputs": list(pg.inputs), "outputs": list(pg.outputs)}
    return hashlib.sha256(json.dumps(doc, default=str).encode()).hexdigest()


def program_decisions(pg: PrimGraph, program: Program) -> PlanDecisions:
    """Everything `program` decided, as plan decisions of `pg`: stick choices, device dim
    orders, core splits and slices, temporal tiles, aliases, LX residencies (tile buffers
    included), restickify splits, the op order and the bundle starts."""
    tmap = program.tensor_map()
    d = PlanDecisions(planner=program.stats.planner, dim_orders=program_dim_orders(program))
    produced = {op.output.tensor for op in pg.ops}
    for t in pg.tensors:
        if t not in produced and t in tmap:
            d.input_sticks[t] = tmap[t].layout.stick_dim
    pg_ops = {op.id: op for op in pg.ops}
    bundle_of_previous = None
    for o in program.ops:
        if bundle_of_previous is not None and o.bundle != bundle_of_previous:
            d.bundle_starts.append(o.id)
        bundle_of_previous = o.bundle
        split = {k: v for k, v in o.core_split.items() if v > 1}
        slices = [(c.core, dict(c.slice)) for c in o.core_slices] if o.core_slices else None
        tiles = {k: v for k, v in o.temporal_tiles.items() if v > 1}
        if o.kind == "compute" and o.id in pg_ops:
            op = pg_ops[o.id]
            in_sticks = [tmap[src["tensor"]].layout.stick_dim if src["tensor"] in tmap else None
                         for src in (o.prim["inputs"] if o.prim else [])]
            choice = matching_choice(op, in_sticks, tmap[op.output.tensor].layout.stick_dim)
            d.ops[o.id] = OpPlan(stick=choice, core_split=split, temporal_tiles=tiles,
                                 core_slices=slices, alias=o.alias)
            d.op_order.append(o.id)
        elif o.kind == "restickify" and o.dst is not None:
            d.restick_ops[o.dst] = OpPlan(core_split=split, temporal_tiles=tiles, core_slices=slices)
    for t in tmap.values():
        if isinstance(t.memory, LxMemory):
            d.resident[t.id] = Residency(t.memory.lx_address, None, per_tile=t.memory.per_tile)
    return d


@dataclass(frozen=True)
class SizedPlan:
    """A program and the graph it was planned for: a hint for another size of that graph
    (the CP-SAT planner transfers it instead of solving; `plan_cpsat`)."""
    pg: PrimGraph
    program: Program


@dataclass
class Transferred:
    decisions: PlanDecisions
    program: Program
    repairs: list[str] = field(default_factory=list)   # what the size change broke, and how it was mended


def _largest_factor_at_most(units: int, f: int) -> int:
    for g in range(min(f, units), 0, -1):
        if units % g == 0:
            return g
    return 1


def _granules(op: PrimOp, plan: OpPlan, pg: PrimGraph, stick_bytes: int) -> dict[int, int]:
    if plan.stick is None:
        return {}
    dtypes = [pg.tensors[a.tensor].dtype for a in op.inputs] + [pg.tensors[op.output.tensor].dtype]
    return split_granules(op, list(plan.stick.inputs), plan.stick.output, dtypes, stick_bytes)


def _repair_op(src_op: PrimOp, op: PrimOp, plan: OpPlan, pg: PrimGraph, hw, repairs: list[str],
               grow: bool) -> OpPlan:
    """`plan` (made for `src_op`) with every split factor and tile count brought to what
    `op`'s sizes allow. Splits either keep their factor (`grow=False`: the nearest factor at
    most the old one that divides the new size) or follow their dim (`grow=True`: scaled by
    how the dim's units grew or shrank, the nearest legal factor, within the cores); a split
    that follows past the cores keeps its factor instead. A tiled dim keeps its tile's
    extent: a dim twice as long gets twice the tiles, so a tile's LX buffer keeps its size."""
    gran = _granules(op, plan, pg, hw.stick_bytes)
    index = {d.name: i for i, d in enumerate(op.iter_dims)}
    src_size = {d.name: d.size for d in src_op.iter_dims}

    def carried(follow: bool) -> dict[str, int]:
        split = {}
        for name, f in plan.core_split.items():
            if name not in index:
                continue
            units = split_units(op.iter_dims[index[name]].size, gran.get(index[name], 1))
            want = f
            if follow:
                src_units = split_units(src_size.get(name, 1), gran.get(index[name], 1))
                want = max(1, min(hw.cores, round(f * units / max(1, src_units))))
            g = _largest_factor_at_most(units, want)
            if g > 1:
                split[name] = g
        return split

    split = carried(grow)
    if grow and check_split(op, split, gran, hw.cores):
        split = carried(False)
    if check_split(op, split, gran, hw.cores):
        repairs.append(f"{op.id}: split {split} not legal at the new size, left unsplit")
        split = {}
    for name, f in plan.core_split.items():
        if split.get(name, 1) != f and name in index:
            repairs.append(f"{op.id}: {name} split {f} -> {split.get(name, 1)}")
    tiles = {}
    for name, t in plan.temporal_tiles.items():
        if name not in index:
            continue
        size = op.iter_dims[index[name]].size
        want = max(1, round(t * size / src_size.get(name, size)))
        units = split_units(size, gran.get(index[name], 1)) // split.get(name, 1)
        g = _largest_factor_at_most(max(1, units), want)
        if g != want:
            repairs.append(f"{op.id}: {name} tiles {want} -> {g}")
        if g > 1:
            tiles[name] = g
    slices = plan.core_slices if split == plan.core_split else None
    return replace(plan, core_split=split, temporal_tiles=tiles, core_slices=slices)


def _repacked(pg: PrimGraph, hw, d: PlanDecisions, repairs: list[str]) -> PlanDecisions:
    """`d` with every LX residency at a fresh first-fit address for its size at the new
    shapes (the old addresses were packed for the old sizes); one that no longer fits
    beside the others leaves LX."""
    if not d.resident:
        return d
    program, _ = program_and_issues(pg, hw, d)
    if program is None:
        return d
    spans = lx_live_spans(program)
    wanted = {t.id: LxRequest(*spans[t.id], t.memory.size_per_core) for t in program.tensors
              if isinstance(t.memory, LxMemory) and t.id in d.resident}
    addresses = place_first_fit(program, wanted, hw.lx_capacity_bytes, hw.stick_bytes)
    left = sorted(set(wanted) - set(addresses))
    if left:
        repairs.append(f"no LX room at the new sizes: {', '.join(left)}")
    resident = {t: replace(r, lx_address=addresses[t], size_per_core=None)
                for t, r in d.resident.items() if t in addresses}
    return replace(d, resident=resident)


def transfer_decisions(src_pg: PrimGraph, src: PlanDecisions, dst_pg: PrimGraph, hw) -> Optional[Transferred]:
    """`src` (a plan of `src_pg`, a graph with `dst_pg`'s structure) carried to `dst_pg`'s
    sizes and repaired until its program validates: once with every split keeping its
    factor, once with splits following their dims; the faster valid one. None when neither
    validates even without LX residencies and tiles (a cold solve is then the way)."""
    if structure_key(src_pg) != structure_key(dst_pg):
        raise NotTransferable("the graphs differ in more than their sizes")
    missing = [op.id for op in dst_pg.ops if op.id not in src.ops]
    if missing:
        raise NotTransferable(f"{len(missing)} ops of the graph have no decision in the plan "
                              f"(first: {missing[0]})")
    best: Optional[Transferred] = None
    best_us = float("inf")
    for grow in (False, True):
        got = _transferred(src_pg, src, dst_pg, hw, grow)
        if got is None:
            continue
        us = time_program(got.program, hw).total_us
        if us < best_us:
            best, best_us = got, us
    return best


def _transferred(src_pg: PrimGraph, src: PlanDecisions, dst_pg: PrimGraph, hw, grow: bool) -> Optional[Transferred]:
    repairs: list[str] = []
    src_ops = {op.id: op for op in src_pg.ops}
    ops = {op.id: _repair_op(src_ops[op.id], op, src.ops[op.id], dst_pg, hw, repairs, grow) for op in dst_pg.ops}
    restick = dict(src.restick_ops)
    d = _repacked(dst_pg, hw, replace(src, ops=ops, restick_ops=restick, resident=dict(src.resident), stats={}),
                  repairs)
    program, issues = checked_program(dst_pg, hw, d)
    if program is None and restick:
        # a restickify's split was made for the old sizes: the emitter's default instead
        d = replace(d, restick_ops={})
        repairs.append("restickify splits left to the emitter")
        program, issues = checked_program(dst_pg, hw, d)
    for _ in range(REPAIR_ROUNDS):
        if program is not None:
            break
        named = {getattr(i, "tensor", None) for i in issues} & set(d.resident)
        if not named:
            break
        repairs.append(f"LX residencies dropped: {', '.join(sorted(named))}")
        d = replace(d, resident={t: r for t, r in d.resident.items() if t not in named})
        program, issues = checked_program(dst_pg, hw, d)
    if program is None:
        repairs.append("tile buffers and temporal tiles dropped")
        d = replace(d, resident={t: r for t, r in d.resident.items() if not r.per_tile},
                    ops={k: replace(p, temporal_tiles={}) for k, p in d.ops.items()})
        program, issues = checked_program(dst_pg, hw, d)
    if program is None:
        repairs.append("all LX residencies dropped")
        d = replace(d, resident={})
        program, issues = checked_program(dst_pg, hw, d)
    if program is None:
        return None
    d, program = _replace_dropped(dst_pg, hw, src, d, program, repairs)
    policy = "splits following their dims" if grow else "splits keeping their factors"
    d.stats = {"notes": [f"transferred from a plan of another size, {policy} ({len(repairs)} repairs)"]}
    return Transferred(d, program, repairs)


def _replace_dropped(pg: PrimGraph, hw, src: PlanDecisions, d: PlanDecisions, program: Program,
                     repairs: list[str]) -> tuple[PlanDecisions, Program]:
    """LX residencies the transfer dropped (their old addresses collide at the new sizes)
    placed again first-fit around the ones kept: tile buffers of the fused kernels, then the
    whole residencies, each kept only when the program stays valid and gets faster."""
    lost = set(src.resident) - set(d.resident)
    if not lost:
        return d, program
    best_us = time_program(program, hw).total_us
    for add in (lambda: add_tile_buffers(pg, hw, d, program),
                lambda: add_whole_residencies(pg, hw, d, program, only=lost - {
                    t for t, r in src.resident.items() if r.per_tile})):
        got = add()
        if got is None or got.issues:
            continue
        us = time_program(got.program, hw).total_us
        if us < best_us:
            repairs.append(f"LX placed again: {', '.join(sorted(set(got.buffers) & lost)) or 'new buffers'}")
            d, program, best_us = got.decisions, got.program, us
    return d, program
