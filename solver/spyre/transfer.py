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

Some decisions are about size after all, and are re-derived for the new sizes: with splits
following their dims, a parallel dim the source left unsplit is split by its growth (a
one-core op at 8x the rows on 8 cores); a fused tiled kernel whose per-core tile grew gets
that many times the tiles (`_retile_kernels`, so its tile buffers still fit); and an op the
size change made slower than its work grew (K tiles whose partial sums no longer fit in LX)
gets its tiles re-chosen on the whole program, a few validated trials (`_rederived`).

The result is a complete plan for the new size (valid, or `None`): the planner can use it as
it is, or as the start (hint) of a shorter search.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Optional

from simulator.timing import time_program
from solver.baseline.lx_cpsat import cpsat_place
from solver.baseline.scratchpad import LxBuffer
from solver.emit import emit_program
from solver.oracle import checked_program, program_and_issues
from solver.plan import OpPlan, PlanDecisions, Residency, program_dim_orders
from solver.spyre.tile_buffers import LxRequest, add_tile_buffers, add_whole_residencies, place_first_fit
from target.geometry import first_slice_spans, padded
from target.op_rules import check_split, legal_core_splits, matching_choice, split_granules, split_units
from target.primitives import DTYPE_BYTES, PrimGraph, PrimOp
from target.superdsc import LxMemory, Program, lx_live_spans

# rounds of dropping the residencies the validator names before all tile buffers go
REPAIR_ROUNDS = 4
# rounds of re-splitting the ops the validator names for a core's span over the limit
SPAN_ROUNDS = 4
# a split that follows its dims splits at most this many dims (as the strategy space does),
# or as many as the source's split had
MAX_SPLIT_DIMS = 2
# the re-derivation after the carry (`_rederived`): an op is a suspect when the size change
# made it slower than its work grew by more than this share of the program's time; at most
# this many whole-program trials (each a validation and a timing run)
REDERIVE_EXCESS = 0.01
REDERIVE_TRIALS = 8
# CP-SAT deterministic time for re-placing the carried LX residencies by the traffic they
# save (`_placed_by_value`; a layer's few dozen buffers solve far inside it)
REPACK_DETERMINISTIC_LIMIT = 0.5


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


def _split_grown_dims(op: PrimOp, split: dict[str, int], gran: dict[int, int], src_size: dict[str, int],
                      cores: int, max_dims: int) -> None:
    """Add to `split` (in place) a factor for each parallel dim the source left unsplit and
    the new size grew: its growth (a dim 8x as long on 8x the cores), the nearest legal
    factor within the cores the split leaves, the most grown dim first. A plan that ran a
    small op on one core keeps the op's per-core work at many times the rows instead of
    putting all of it on that core. Reduction dims stay unsplit (their partial sums would
    need combining)."""
    grown = []
    for i, dim in enumerate(op.iter_dims):
        if dim.kind != "parallel" or dim.name in split or dim.name not in src_size:
            continue
        g = gran.get(i, 1)
        units, src_units = split_units(dim.size, g), split_units(src_size[dim.name], g)
        if units > src_units:
            grown.append((units / max(1, src_units), units, dim.name))
    for growth, units, name in sorted(grown, reverse=True):
        used = 1
        for f in split.values():
            used *= f
        if len(split) >= max_dims or used >= cores:
            break
        f = _largest_factor_at_most(units, min(cores // used, max(1, round(growth))))
        if f > 1:
            split[name] = f


def _granules(op: PrimOp, plan: OpPlan, pg: PrimGraph, stick_bytes: int) -> dict[int, int]:
    if plan.stick is None:
        return {}
    dtypes = [pg.tensors[a.tensor].dtype for a in op.inputs] + [pg.tensors[op.output.tensor].dtype]
    return split_granules(op, list(plan.stick.inputs), plan.stick.output, dtypes, stick_bytes)


def _repair_op(src_op: PrimOp, op: PrimOp, plan: OpPlan, pg: PrimGraph, hw, repairs: list[str],
               grow: bool, src_pg: Optional[PrimGraph] = None) -> OpPlan:
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
        if follow:
            _split_grown_dims(op, split, gran, src_size, hw.cores,
                              max(MAX_SPLIT_DIMS, len(plan.core_split)))
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
    src_gran = _granules(src_op, plan, src_pg, hw.stick_bytes) if src_pg is not None else gran
    for name, t in plan.temporal_tiles.items():
        if name not in index:
            continue
        size = op.iter_dims[index[name]].size
        want = max(1, round(t * size / src_size.get(name, size)))
        units = split_units(size, gran.get(index[name], 1)) // split.get(name, 1)
        src_units = split_units(src_size.get(name, size), src_gran.get(index[name], 1)) // \
            max(1, plan.core_split.get(name, 1))
        if src_units % t and want <= units:
            # tiles are balanced (`geometry.tile_ranges`): the source's count did not divide
            # its units either, and the same uneven tiling stays legal (K tiles of a
            # projection whose K did not change keep their count)
            g = want
        else:
            g = _largest_factor_at_most(max(1, units), want)
        if g != want:
            repairs.append(f"{op.id}: {name} tiles {want} -> {g}")
        if g > 1:
            tiles[name] = g
    slices = plan.core_slices if split == plan.core_split else None
    return replace(plan, core_split=split, temporal_tiles=tiles, core_slices=slices)


def _box_elems(op: PrimOp, pg: PrimGraph, split: dict[str, int], tiles: dict[str, int]) -> int:
    """The elements of `op`'s largest operand box one core holds in one tile."""
    largest = 1
    for acc in list(op.inputs) + [op.output]:
        n = 1
        for size, it in zip(pg.tensors[acc.tensor].shape, acc.dims):
            if it is not None and 0 <= it < len(op.iter_dims):
                name = op.iter_dims[it].name
                size = -(-size // (split.get(name, 1) * tiles.get(name, 1)))
            n *= max(1, size)
        largest = max(largest, n)
    return largest


def _retile_kernels(src_pg: PrimGraph, src: PlanDecisions, dst_pg: PrimGraph, src_program: Program,
                    ops: dict[str, OpPlan], hw, repairs: list[str]) -> None:
    """Keep the tile buffers of each fused tiled kernel at the source's size (in place on
    `ops`). Keeping a tiled dim's tile extent is not enough when the size change also grew
    an untiled dim (attention scores of twice the tokens: twice the rows and twice the
    columns, tiled along one), so a kernel's per-core tile grows and its buffers no longer
    fit beside the others. The growth of the largest operand box a core holds per tile,
    over the kernel's members, multiplies the tile count of one parallel tiled dim of every
    member (the same factor, so the members stay tile-aligned); a kernel whose members
    cannot all take a factor of at least 2 is left as carried."""
    src_ops = {op.id: op for op in src_pg.ops}
    dst_ops = {op.id: op for op in dst_pg.ops}
    kernels: dict[int, list[str]] = {}
    for o in src_program.ops:
        if o.kind == "compute" and o.id in ops and o.id in src.ops and src.ops[o.id].temporal_tiles:
            kernels.setdefault(o.bundle, []).append(o.id)
    for members in kernels.values():
        growth = max(_box_elems(dst_ops[m], dst_pg, ops[m].core_split, ops[m].temporal_tiles) /
                     _box_elems(src_ops[m], src_pg, src.ops[m].core_split, src.ops[m].temporal_tiles)
                     for m in members)
        want = int(growth + 0.5)
        for factor in range(want, 1, -1):
            retiled = {m: _tiles_times(dst_ops[m], ops[m], factor, dst_pg, hw) for m in members}
            if all(t is not None for t in retiled.values()):
                for m, tiles in retiled.items():
                    ops[m] = replace(ops[m], temporal_tiles=tiles)
                repairs.append(f"kernel {', '.join(members[:3])}{'...' if len(members) > 3 else ''}: "
                               f"tiles x{factor} (its per-core tile grew {growth:.1f}x)")
                break


def _tiles_times(op: PrimOp, plan: OpPlan, factor: int, pg: PrimGraph, hw) -> Optional[dict[str, int]]:
    """`plan`'s tiles with one parallel tiled dim's count times `factor` (the first whose
    per-core units it divides), or None."""
    gran = _granules(op, plan, pg, hw.stick_bytes)
    for i, d in enumerate(op.iter_dims):
        t = plan.temporal_tiles.get(d.name, 1)
        if d.kind != "parallel" or t <= 1:
            continue
        units = split_units(d.size, gran.get(i, 1)) // plan.core_split.get(d.name, 1)
        if units % (t * factor) == 0:
            return {**plan.temporal_tiles, d.name: t * factor}
    return None


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
    if set(wanted) - set(addresses):
        by_value = _placed_by_value(pg, program, wanted, hw)
        if _kept_value(pg, program, by_value) > _kept_value(pg, program, addresses):
            addresses = by_value
    left = sorted(set(wanted) - set(addresses))
    if left:
        repairs.append(f"no LX room at the new sizes: {', '.join(left)}")
    resident = {t: replace(r, lx_address=addresses[t], size_per_core=None)
                for t, r in d.resident.items() if t in addresses}
    return replace(d, resident=resident)


def _traffic_saved(pg: PrimGraph, program: Program) -> dict[str, int]:
    """Per tensor, the device-memory bytes holding it in LX saves: its write and one read
    per reading op (the whole tensor each time, whatever its LX footprint: a tile buffer
    holds one tile of it)."""
    reads: dict[str, int] = {}
    for o in program.ops:
        for src in (o.prim or {}).get("inputs", []):
            reads[src["tensor"]] = reads.get(src["tensor"], 0) + 1
    out = {}
    for t in program.tensors:
        n = reads.get(t.id, 0)
        if n and t.id in pg.tensors:
            out[t.id] = (n + 1) * pg.tensors[t.id].numel * DTYPE_BYTES.get(t.dtype, 4)
    return out


def _kept_value(pg: PrimGraph, program: Program, addresses: dict[str, int]) -> int:
    saved = _traffic_saved(pg, program)
    return sum(saved.get(t, 0) for t in addresses)


def _placed_by_value(pg: PrimGraph, program: Program, wanted: dict[str, LxRequest], hw) -> dict[str, int]:
    """LX addresses for `wanted` chosen by the traffic they save (`_traffic_saved`), a CP-SAT
    placement over their live spans (`solver.baseline.lx_cpsat`, deterministic): when the
    residencies of the old sizes no longer all fit, first fit in program order keeps the
    early ones, whatever they save; this keeps the set worth the most."""
    saved = _traffic_saved(pg, program)
    buffers = [LxBuffer(t, padded(r.size, hw.stick_bytes), [r.live_from, r.live_to], value=saved.get(t, 0))
               for t, r in wanted.items()]
    cpsat_place(buffers, hw.lx_capacity_bytes, hw.stick_bytes, deterministic_limit=REPACK_DETERMINISTIC_LIMIT)
    return {b.name: b.address for b in buffers if b.address is not None}


def transfer_decisions(src_pg: PrimGraph, src: PlanDecisions, dst_pg: PrimGraph, hw,
                       src_program: Optional[Program] = None) -> Optional[Transferred]:
    """`src` (a plan of `src_pg`, a graph with `dst_pg`'s structure) carried to `dst_pg`'s
    sizes and repaired until its program validates: once with every split keeping its
    factor, once with splits following their dims; the faster valid one, then its ops that
    got slower than their work grew re-derived (`_rederived`; `src_program`: the source's
    program, else built from `src`). None when neither validates even without LX residencies
    and tiles (a cold solve is then the way)."""
    if structure_key(src_pg) != structure_key(dst_pg):
        raise NotTransferable("the graphs differ in more than their sizes")
    missing = [op.id for op in dst_pg.ops if op.id not in src.ops]
    if missing:
        raise NotTransferable(f"{len(missing)} ops of the graph have no decision in the plan "
                              f"(first: {missing[0]})")
    if src_program is None:
        src_program, _ = program_and_issues(src_pg, hw, src)
    best: Optional[Transferred] = None
    best_us = float("inf")
    for grow in (False, True):
        got = _transferred(src_pg, src, dst_pg, hw, grow, src_program)
        if got is None:
            continue
        us = time_program(got.program, hw).total_us
        if us < best_us:
            best, best_us = got, us
    if best is not None and src_program is not None:
        _rederived(src_pg, src_program, dst_pg, hw, best)
    return best


def _op_us(program: Program, hw) -> tuple[float, dict[str, float]]:
    report = time_program(program, hw)
    per_op: dict[str, float] = {}
    for o in report.ops:
        per_op[o.op_id] = per_op.get(o.op_id, 0.0) + o.duration_us
    return report.total_us, per_op


def _work(op: PrimOp) -> int:
    n = 1
    for d in op.iter_dims:
        n *= max(1, d.size)
    return n


def _alternatives(op: PrimOp, plan: OpPlan) -> list[OpPlan]:
    """Other temporal tilings of `op` for the new size, cheapest change first: its
    reduction-dim tiles dropped (K tiles whose partial sums the source's LX held may not fit
    at the new size, and then every tile sends them through device memory), then all of its
    tiles dropped."""
    red = {d.name for d in op.iter_dims if d.kind == "reduction"}
    out = []
    if any(n in red for n in plan.temporal_tiles):
        out.append(replace(plan, temporal_tiles={n: t for n, t in plan.temporal_tiles.items() if n not in red}))
    if plan.temporal_tiles and (not out or out[0].temporal_tiles):
        out.append(replace(plan, temporal_tiles={}))
    return out


def _rederived(src_pg: PrimGraph, src_program: Program, dst_pg: PrimGraph, hw, moved: Transferred) -> None:
    """Re-derive, in place, the decisions of the ops the size change made slower than their
    work grew: an op whose simulated time at the new size exceeds its source time scaled by
    its iteration space by more than `REDERIVE_EXCESS` of the program's time is a suspect
    (a decision that fit the old sizes and does not fit the new ones); the largest excess
    first, each of its `_alternatives` is tried on the whole program (validated and timed)
    and the first that makes the program faster is kept. At most `REDERIVE_TRIALS` trials,
    so a transfer stays a fraction of a solve."""
    _, src_us = _op_us(src_program, hw)
    total, dst_us = _op_us(moved.program, hw)
    src_ops = {op.id: op for op in src_pg.ops}
    suspects = []
    for op in dst_pg.ops:
        if op.id not in moved.decisions.ops or op.id not in src_us:
            continue
        excess = dst_us.get(op.id, 0.0) - src_us[op.id] * _work(op) / _work(src_ops[op.id])
        if excess > REDERIVE_EXCESS * total:
            suspects.append((excess, op.id, op))
    trials = 0
    d, program = moved.decisions, moved.program
    for _, _, op in sorted(suspects, reverse=True):
        for alt in _alternatives(op, d.ops[op.id]):
            if trials >= REDERIVE_TRIALS:
                break
            trials += 1
            trial = replace(d, ops={**d.ops, op.id: alt})
            got, _ = checked_program(dst_pg, hw, trial)
            if got is None:
                continue
            us = time_program(got, hw).total_us
            if us < total:
                moved.repairs.append(f"{op.id}: tiles {d.ops[op.id].temporal_tiles or 'none'} -> "
                                     f"{alt.temporal_tiles or 'none'} ({total:.1f} -> {us:.1f} us)")
                d, program, total = trial, got, us
                break
    moved.decisions, moved.program = d, program


def _transferred(src_pg: PrimGraph, src: PlanDecisions, dst_pg: PrimGraph, hw, grow: bool,
                 src_program: Optional[Program]) -> Optional[Transferred]:
    repairs: list[str] = []
    src_ops = {op.id: op for op in src_pg.ops}
    ops = {op.id: _repair_op(src_ops[op.id], op, src.ops[op.id], dst_pg, hw, repairs, grow, src_pg)
           for op in dst_pg.ops}
    if src_program is not None:
        _retile_kernels(src_pg, src, dst_pg, src_program, ops, hw, repairs)
    restick = dict(src.restick_ops)
    d = _repacked(dst_pg, hw, replace(src, ops=ops, restick_ops=restick, resident=dict(src.resident), stats={}),
                  repairs)
    d = _within_spans(dst_pg, hw, d, None, repairs)

    def check(d: PlanDecisions) -> tuple[PlanDecisions, Optional[Program], list]:
        # the validator names a core's span over the limit only for the ops it reached:
        # each round re-splits those and checks again
        program, issues = checked_program(dst_pg, hw, d)
        for _ in range(SPAN_ROUNDS):
            if program is not None or not any(getattr(i, "code", None) == "span_exceeded" for i in issues):
                break
            resplit = _within_spans(dst_pg, hw, d, issues, repairs)
            if resplit is d:
                break
            d = resplit
            program, issues = checked_program(dst_pg, hw, d)
        return d, program, issues

    d, program, issues = check(d)
    if program is None and restick:
        # a restickify's split was made for the old sizes: the emitter's default instead
        d = replace(d, restick_ops={})
        repairs.append("restickify splits left to the emitter")
        d, program, issues = check(d)
    for _ in range(REPAIR_ROUNDS):
        if program is not None:
            break
        named = {getattr(i, "tensor", None) for i in issues} & set(d.resident)
        if not named:
            break
        repairs.append(f"LX residencies dropped: {', '.join(sorted(named))}")
        d = replace(d, resident={t: r for t, r in d.resident.items() if t not in named})
        d, program, issues = check(d)
    if program is None:
        repairs.append("tile buffers and temporal tiles dropped")
        d = replace(d, resident={t: r for t, r in d.resident.items() if not r.per_tile},
                    ops={k: replace(p, temporal_tiles={}) for k, p in d.ops.items()})
        d, program, issues = check(d)
    if program is None:
        repairs.append("all LX residencies dropped")
        d = replace(d, resident={})
        d, program, issues = check(d)
    if program is None:
        return None
    d, program = _replace_dropped(dst_pg, hw, src, d, program, repairs)
    policy = "splits following their dims" if grow else "splits keeping their factors"
    d.stats = {"notes": [f"transferred from a plan of another size, {policy} ({len(repairs)} repairs)"]}
    return Transferred(d, program, repairs)


def _within_spans(pg: PrimGraph, hw, d: PlanDecisions, issues: Optional[list], repairs: list[str]) -> PlanDecisions:
    """`d` with a new core split for every op the validator named for a core's access span
    above `hw.per_core_span_bytes` (a split that was fine at the old size reaches across a
    tensor grown past the span, as attention scores at 4x the tokens): among the op's legal
    splits for its stick choice whose first slice spans fit, the one using the most cores,
    then sharing the most split dims with the old one; tiles that no longer divide a core's
    units dropped. `issues` None: every op whose first slice spans over the limit (what the
    validator would name, found without validating)."""
    named = {i.op for i in issues or () if getattr(i, "code", None) == "span_exceeded" and i.op in d.ops}
    try:
        program = emit_program(pg, hw, d)
    except ValueError:
        return d
    if issues is None:   # every op whose first slice's span is over the limit, before validating
        named = set(d.ops)
    if not named:
        return d
    tmap = program.tensor_map()
    ops = dict(d.ops)
    for op in pg.ops:
        if op.id not in named:
            continue
        plan = ops[op.id]
        gran = _granules(op, plan, pg, hw.stick_bytes)
        names = [a.tensor for a in op.inputs] + [op.output.tensor]
        if any(t not in tmap for t in names):
            continue
        layouts = {t: tmap[t].layout for t in names}
        shapes = {t: pg.tensors[t].shape for t in names}
        dtypes = {t: pg.tensors[t].dtype for t in names}

        def rank(split: dict[str, int]) -> tuple:
            used = 1
            for f in split.values():
                used *= f
            return (-used, -len(set(split) & set(plan.core_split)), len(split))

        def span(split: dict[str, int]) -> int:
            # a copy's inputs in the box its slice reads, as the validator checks them (a
            # concat of a KV cache reads its own part of the cache, not all of it)
            return max(first_slice_spans(op, split, gran, layouts, shapes, dtypes, copy_reads=True).values())

        if span(plan.core_split) <= hw.per_core_span_bytes and issues is None:
            continue
        fitting = [sp for sp in legal_core_splits(op, gran, hw.cores, max_split_dims=MAX_SPLIT_DIMS)
                   if span(sp) <= hw.per_core_span_bytes]
        if not fitting:
            continue
        split = min(fitting, key=rank)
        index = {x.name: i for i, x in enumerate(op.iter_dims)}
        tiles = {n: t for n, t in plan.temporal_tiles.items() if n in index and
                 (split_units(op.iter_dims[index[n]].size, gran.get(index[n], 1)) // split.get(n, 1)) % t == 0}
        repairs.append(f"{op.id}: split {plan.core_split} -> {split} (a core's span over the limit)")
        ops[op.id] = replace(plan, core_split=split, core_slices=None, temporal_tiles=tiles)
    return replace(d, ops=ops) if ops != d.ops else d


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
