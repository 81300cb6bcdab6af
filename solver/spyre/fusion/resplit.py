"""The start the planner searches first (`resplit_for_tiling`): matmuls moved to the
non-reduction split that would be fastest once tiled."""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from target.primitives import PrimGraph
from solver.plan import OpPlan, PlanDecisions


def _tiled_ns(strategy) -> float:
    """A strategy's time once tiled, estimated from its untiled price: the timing model's
    double-buffered body, max(memory, compute) (plus what never overlaps)."""
    c = strategy.parts.base
    return max(c.memory_ns, c.compute_ns) + c.extra_ns


def resplit_for_tiling(pg: PrimGraph, d: PlanDecisions, strategies: dict, margin: float = 0.9
                       ) -> Optional[tuple[PlanDecisions, list[str]]]:
    """`d` with every matmul moved to the non-reduction split (same stick choice) that
    would be fastest once tiled, where that beats its planned time (untiled for a split-K
    matmul, which cannot be tiled; else its own tiled estimate) by `margin`; None when no
    op moves. Returns the plan and the ops moved.

    Why: the planner prices each op untiled, and untiled a split K often wins (each core
    streams a smaller weight slice and loads overlap compute only over
    `untiled_overlap_chunks`), but a K-split matmul can join no fused kernel (its partial
    sums are combined after the tile loop), while a tiled one overlaps its loads with its
    compute across the tile loop: the timing model's double-buffered body is about
    max(memory, compute). That tiled estimate ranks the alternatives; the fusion pass on
    the result, judged by simulation, decides whether the move pays. Residencies of the
    moved ops' operands are dropped (their boxes change)."""
    ops = dict(d.ops)
    moved: list[str] = []
    touched: set[str] = set()
    for op in pg.ops:
        if op.body.kind != "matmul" or op.id not in strategies:
            continue
        cur_plan = d.ops.get(op.id, OpPlan())
        split = {k: v for k, v in cur_plan.core_split.items() if v > 1}
        cands = [s for s in strategies[op.id] if not s.alias and (cur_plan.stick is None or s.stick == cur_plan.stick)]
        now = next((s for s in cands if s.core_split == split), None)
        if now is None:
            continue
        alts = [s for s in cands if not s.reduction_split]
        if not alts:
            continue
        best = min(alts, key=_tiled_ns)
        now_ns = now.parts.base.total_ns if now.reduction_split else _tiled_ns(now)
        if best.core_split != now.core_split and _tiled_ns(best) < margin * now_ns:
            ops[op.id] = replace(cur_plan, core_split=dict(best.core_split), core_slices=None)
            moved.append(op.id)
            touched.update([a.tensor for a in op.inputs] + [op.output.tensor])
    if not moved:
        return None
    resident = {t: r for t, r in d.resident.items() if t not in touched}
    return replace(d, ops=ops, resident=resident), moved
