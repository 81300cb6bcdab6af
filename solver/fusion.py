"""Fused coarse-tiled groups: temporal tiles for runs of consecutive compute ops.

The timing model (`simulator.superdsc.fused_group_key`, `simulator.timing` `close_group`) runs consecutive compute
ops of one bundle with the same temporal tiling (T > 1) and the same core count as one
coarse-tiled fused kernel, as torch-spyre's back end does: each external device-memory
tensor is read once for the whole group (a later read of it is served on chip), the loads
and compute of all members overlap across the tile loop, and the loop overhead
(`loop_overhead_us` per tile) is paid once. Against that stand the per-op costs of tiling:
a small per-tile stream underfills, double buffering needs LX room, a working set past
the spill knee derates. Whether a run of ops gains is therefore a question for the timing
model itself, so this pass asks it: one whole-program simulation per candidate tile count,
every candidate run tiled at once (runs are separated by an op outside any group, another
bundle or another core count, so their times add up independently), then per run the tile
count whose simulated time is lowest (T = 1, untiled, included), then one final
emit/validate/simulate of the combination, kept only if it is faster than the plan it
started from.

Which ops may join a run: compute ops that are not free aliases, with a pointwise, reduce
or matmul body (a matmul followed by its elementwise epilogue overlaps the epilogue's
memory traffic with the array's compute). Each op is tiled along its parallel iteration dim
with the most whole split units per core (the validator's `temporal_tiles` rule: T may not
exceed the units a core has); an op that cannot take T tiles breaks the run at that T.
Nothing here is keyed on op names or shapes.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Optional

from lowering.primitives import PrimGraph, op_from_json
from lowering.op_rules import split_units
from simulator.geometry import core_ranges, op_granules
from simulator.superdsc import Program
from simulator.timing import TimingReport, time_program
from simulator.validate import validate_program
from solver.emit import emit_program
from solver.plan import OpPlan, PlanDecisions

TILE_COUNTS = (2, 4, 8, 16, 32, 64)
_FUSABLE_BODIES = frozenset({"pointwise", "reduce", "matmul"})


@dataclass
class FusionResult:
    decisions: PlanDecisions
    program: Program
    report: TimingReport
    base_us: float                # simulated time of the plan before this pass
    fused_us: float               # simulated time of the returned plan
    groups: int = 0               # runs given temporal tiles
    notes: list[str] = field(default_factory=list)


def _tile_dims(program: Program, hw) -> dict[str, tuple[str, int]]:
    """Per fusable op: (the parallel iteration dim it is tiled along, the most tiles it can
    take there = the fewest whole split units any of its cores has on that dim)."""
    layouts = {t.id: t.layout for t in program.tensors}
    dtypes = {t.id: t.dtype for t in program.tensors}
    out: dict[str, tuple[str, int]] = {}
    for o in program.ops:
        if o.kind != "compute" or o.alias or o.prim is None:
            continue
        prim = op_from_json(o.prim)
        if prim.body.kind not in _FUSABLE_BODIES:
            continue
        gran = op_granules(prim, layouts, dtypes, hw.stick_bytes)
        split = {n: f for n, f in o.core_split.items() if f > 1}
        ranges = core_ranges(prim, split, o.core_slices, gran)
        # a coarse-tiled kernel walks row tiles: prefer a dim outside the output's stick dim,
        # so the members of a group tile the same rows
        st = layouts[prim.output.tensor].stick_dim
        stick_iter = prim.output.dims[st] if st is not None and st < len(prim.output.dims) else None
        best: Optional[tuple[bool, int, str]] = None
        for i, d in enumerate(prim.iter_dims):
            if d.kind != "parallel":
                continue
            units = min(split_units(r[i][1] - r[i][0], gran.get(i, 1)) for r in ranges.values())
            cand = (i != stick_iter, units, d.name)
            if units >= 2 and (best is None or cand[:2] > best[:2]):
                best = cand
        if best is not None:
            out[o.id] = (best[2], best[1])
    return out


def _runs(program: Program, tileable: dict[str, tuple[str, int]], graph_ops: set[str]) -> list[list[str]]:
    """Maximal runs (length >= 2) of consecutive tileable graph ops with one bundle and one
    core count: the only places a fused group can form."""
    runs: list[list[str]] = []
    cur: list[str] = []
    key = None
    for o in program.ops:
        k = (o.bundle, o.num_cores_used) if (o.id in tileable and o.id in graph_ops) else None
        if k is None or k != key:
            if len(cur) >= 2:
                runs.append(cur)
            cur = []
        key = k
        if k is not None:
            cur.append(o.id)
    if len(cur) >= 2:
        runs.append(cur)
    return runs


def _with_tiles(d: PlanDecisions, tiles: dict[str, dict[str, int]]) -> PlanDecisions:
    ops = {}
    for oid, p in d.ops.items():
        ops[oid] = replace(p, temporal_tiles=dict(tiles[oid])) if oid in tiles else p
    return replace(d, ops=ops)


def _assign(run: list[str], tileable: dict[str, tuple[str, int]], t: int) -> dict[str, dict[str, int]]:
    """Tiles for the ops of `run` at tile count t: every maximal sub-run (>= 2 ops) of ops
    that can take t tiles; a lone op gains nothing from tiling and stays untiled."""
    out: dict[str, dict[str, int]] = {}
    seg: list[str] = []
    for oid in run + [None]:  # type: ignore[list-item]
        if oid is not None and tileable[oid][1] >= t:
            seg.append(oid)
            continue
        if len(seg) >= 2:
            for s in seg:
                out[s] = {tileable[s][0]: t}
        seg = []
    return out


def _run_us(rep_ops: dict, run: list[str]) -> float:
    return sum(rep_ops[o].end_us - rep_ops[o].start_us for o in run)


def _joined_starts(program: Program, d: PlanDecisions, tileable: dict) -> Optional[list[str]]:
    """The planner's bundle starts without those that cut between two tileable ops of one
    core count (a fused kernel cannot span bundles); None when none is dropped. The emitter
    still cuts wherever the external-tensor limit demands."""
    prev = None
    inside = set()
    for o in program.ops:
        if prev is not None and o.id in tileable and prev.id in tileable \
                and o.num_cores_used == prev.num_cores_used:
            inside.add(o.id)
        prev = o
    starts = [s for s in d.bundle_starts if s not in inside]
    return starts if len(starts) < len(d.bundle_starts) else None


def _valid_program(pg: PrimGraph, hw, d: PlanDecisions) -> Optional[Program]:
    try:
        prog = emit_program(pg, hw, d)
    except ValueError:
        return None
    return None if validate_program(prog, hw) else prog


def fuse_tiled_groups(pg: PrimGraph, hw, d: PlanDecisions, deadline: Optional[float] = None,
                      tile_counts=TILE_COUNTS) -> Optional[FusionResult]:
    """`d` with temporal tiles on the runs of ops where the timing model's fused
    coarse-tiled kernel is faster (and, if that is faster still, fewer planner-forced bundle
    cuts inside such runs); None when `d` does not emit to a valid program. Stops trying at
    `deadline` (perf_counter seconds); the result is always a validated program no slower
    (simulated) than `d`'s."""
    base_prog = _valid_program(pg, hw, d)
    if base_prog is None:
        return None
    base_rep = time_program(base_prog, hw)
    result = FusionResult(d, base_prog, base_rep, base_rep.total_us, base_rep.total_us)
    if deadline is not None and time.perf_counter() > deadline:
        result.notes.append("fusion: skipped (time limit)")
        return result
    stopped: list[str] = []
    starts = _joined_starts(base_prog, d, _tile_dims(base_prog, hw))
    if starts is not None:
        joined_d = replace(d, bundle_starts=starts)
        joined_prog = _valid_program(pg, hw, joined_d)
        if joined_prog is not None:
            joined = _fuse_runs(pg, hw, joined_d, joined_prog, time_program(joined_prog, hw),
                                deadline, tile_counts)
            stopped += joined.notes
            if joined.fused_us < result.fused_us:
                result = joined
    plain = _fuse_runs(pg, hw, d, base_prog, base_rep, deadline, tile_counts)
    stopped += plain.notes
    if plain.fused_us < result.fused_us:
        result = plain
    result.base_us = base_rep.total_us
    result.notes = list(dict.fromkeys(stopped))
    if result.groups:
        result.notes.append(f"fusion: {result.groups} runs tiled as fused coarse-tiled groups, "
                            f"simulated {base_rep.total_us:.1f} -> {result.fused_us:.1f} us")
    return result


def _fuse_runs(pg: PrimGraph, hw, d: PlanDecisions, base_prog: Program, base_rep: TimingReport,
               deadline: Optional[float], tile_counts) -> FusionResult:
    """The tile-count search on the runs of one emitted program (module docstring)."""
    result = FusionResult(d, base_prog, base_rep, base_rep.total_us, base_rep.total_us)
    tileable = _tile_dims(base_prog, hw)
    runs = _runs(base_prog, tileable, {op.id for op in pg.ops})
    if not runs:
        return result
    base_ops = {o.op_id: o for o in base_rep.ops}
    best = [(_run_us(base_ops, r), 1, {}) for r in runs]   # (us, tile count, tiles)
    for t in tile_counts:
        if deadline is not None and time.perf_counter() > deadline:
            result.notes.append(f"fusion: stopped before T={t} (time limit)")
            break
        per_run = [_assign(r, tileable, t) for r in runs]
        if not any(per_run):
            continue
        trial = {k: v for a in per_run for k, v in a.items()}
        try:
            prog = emit_program(pg, hw, _with_tiles(d, trial))
        except ValueError:
            continue
        rep_ops = {o.op_id: o for o in time_program(prog, hw).ops}
        for i, (r, a) in enumerate(zip(runs, per_run)):
            if a:
                us = _run_us(rep_ops, r)
                if us < best[i][0]:
                    best[i] = (us, t, a)
    chosen = {k: v for _, t, a in best if t > 1 for k, v in a.items()}
    if not chosen:
        return result
    fused_d = _with_tiles(d, chosen)
    try:
        prog = emit_program(pg, hw, fused_d)
    except ValueError as exc:
        result.notes.append(f"fusion: tiled plan did not emit ({exc}); kept untiled")
        return result
    issues = validate_program(prog, hw)
    if issues:
        result.notes.append(f"fusion: tiled plan failed validation ({issues[0].code}); kept untiled")
        return result
    rep = time_program(prog, hw)
    if rep.total_us >= base_rep.total_us:
        return result
    result.decisions, result.program, result.report = fused_d, prog, rep
    result.fused_us, result.groups = rep.total_us, sum(1 for _, t, _ in best if t > 1)
    return result
