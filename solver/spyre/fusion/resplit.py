"""The start the planner searches first (`resplit_for_tiling`): matmuls moved to the
non-reduction split that would be fastest once tiled."""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from target.op_rules import default_choice
from target.primitives import PrimGraph
from solver.plan import OpPlan, PlanDecisions
from solver.spyre.strategies import compatible_residency

# Alternatives whose tiled estimates lie within this share of the best are tied: the
# estimate is the double-buffered body alone, so splits that slice the same bytes over as
# many cores price alike (BERT's attention scores: b1 x m, b1 x n, m x n all 69.4 us).
TIE_SHARE = 0.005
# The tie-break follows what a tied split writes this many readers deep (GPT-2's scores:
# the causal mask, then the softmax's row max), trying at most this many strategies a reader.
READER_HOPS = 3
READER_OPTIONS = 4


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
        best = _best_of_ties(pg, op, alts, d, strategies)
        now_ns = now.parts.base.total_ns if now.reduction_split else _tiled_ns(now)
        if best.core_split != now.core_split and _tiled_ns(best) < margin * now_ns:
            ops[op.id] = replace(cur_plan, core_split=dict(best.core_split), core_slices=None)
            moved.append(op.id)
            touched.update([a.tensor for a in op.inputs] + [op.output.tensor])
    if not moved:
        return None
    resident = {t: r for t, r in d.resident.items() if t not in touched}
    return replace(d, ops=ops, resident=resident), moved


def _best_of_ties(pg: PrimGraph, op, alts: list, d: PlanDecisions, strategies: dict):
    """The alternative with the lowest tiled estimate; among those tied with it
    (`TIE_SHARE`), the one the most of the op's neighbours can hand its operands to or read
    its result from in LX (`_holdable_neighbours`), then the first. The estimate sees the op
    alone: on BERT's attention scores it tied a split of the key dim, which the softmax
    after it can read only by splitting its reduction (its result then goes through device
    memory, fused 540.8 against 328.4 us), with the split of heads and rows its neighbours
    share."""
    ranked = sorted(alts, key=_tiled_ns)
    top = _tiled_ns(ranked[0])
    tied = [s for s in ranked if _tiled_ns(s) <= top * (1.0 + TIE_SHARE)]
    if len(tied) == 1:
        return tied[0]
    return max(tied, key=lambda s: (_holdable_neighbours(pg, op, s, d, strategies), -tied.index(s)))


def _holdable_neighbours(pg: PrimGraph, op, s, d: PlanDecisions, strategies: dict) -> int:
    """How many operand hand-offs around `op` could stay in LX under strategy `s`: each
    producer of an input that has a strategy of its planned stick choice, splitting no
    reduction dim, that slices the tensor like `s`; and down the chain of what `s` writes
    (`READER_HOPS` readers deep, through ops that are not matmuls), each reader that has
    such a strategy reading its producer's slices, the deepest such chain counted. A
    pointwise reader (a causal mask) reads any slicing; the reduction after it decides."""
    producer = {o.output.tensor: o for o in pg.ops}
    readers: dict[str, list] = {}
    for o in pg.ops:
        for slot, a in enumerate(o.inputs):
            readers.setdefault(a.tensor, []).append((o, slot))

    def own(o) -> list:
        stick = d.ops.get(o.id, OpPlan()).stick or default_choice(o)
        return [x for x in strategies.get(o.id, ()) if x.stick == stick and not x.alias and not x.reduction_split]

    def down(sp, t: str, hops: int) -> int:
        count = 0
        for r, slot in readers.get(t, ()):
            fits = [x for x in own(r) if compatible_residency(sp, x, slot)]
            if not fits:
                continue
            deeper = 0
            if hops > 1 and r.body.kind != "matmul":
                deeper = max(down(x, r.output.tensor, hops - 1) for x in fits[:READER_OPTIONS])
            count += 1 + deeper
        return count

    count = 0
    for slot, a in enumerate(op.inputs):
        p = producer.get(a.tensor)
        if p is not None and any(compatible_residency(x, s, slot) for x in own(p)):
            count += 1
    return count + down(s, op.output.tensor, READER_HOPS)
