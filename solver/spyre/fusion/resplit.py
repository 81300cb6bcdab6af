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
# the causal mask, then the softmax's row max).
READER_HOPS = 3


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
    (`TIE_SHARE`), the one that cuts the fewest reductions down the chain of its result
    (`_cut_reductions`), then the one the most of the op's neighbours can hand an operand
    to or read its result from in LX (`_holdable_neighbours`), then the first. The
    estimate sees the op alone: on BERT's attention scores it tied a split of the key dim,
    which the softmax's row max reads only by splitting its reduction (the result then
    goes through device memory: the start fused 540.8 against 328.4 us), with the split of
    heads and rows its neighbours share."""
    ranked = sorted(alts, key=_tiled_ns)
    top = _tiled_ns(ranked[0])
    tied = [s for s in ranked if _tiled_ns(s) <= top * (1.0 + TIE_SHARE)]
    if len(tied) == 1:
        return tied[0]
    readers: dict[str, list] = {}
    for o in pg.ops:
        for a in o.inputs:
            readers.setdefault(a.tensor, []).append((o, a))
    return min(tied, key=lambda s: (_cut_reductions(op, s, readers), -_holdable_neighbours(pg, op, s, d, strategies),
                                    tied.index(s)))


def _cut_reductions(op, s, readers: dict) -> int:
    """How many reductions down the chain of `op`'s result (through ops that are not
    matmuls, `READER_HOPS` readers deep) reduce over a tensor dim that strategy `s` cuts
    across cores: each such reader can keep its input in LX only by splitting its
    reduction. The cut dims follow the chain through each reader's accesses (a causal mask
    passes them on to the row max after it)."""
    split_iters = {k for k, (dim) in enumerate(op.iter_dims) if s.core_split.get(dim.name, 1) > 1}
    cut = {j for j, i in enumerate(op.output.dims) if i is not None and i in split_iters}
    count = 0
    frontier = [(op.output.tensor, cut, READER_HOPS)]
    while frontier:
        t, cut, hops = frontier.pop()
        for r, a in readers.get(t, ()):
            iters = {a.dims[j] for j in cut if j < len(a.dims) and a.dims[j] is not None}
            if any(r.iter_dims[i].kind == "reduction" for i in iters):
                count += 1
                continue
            if hops > 1 and r.body.kind != "matmul" and iters:
                out = {j for j, i in enumerate(r.output.dims) if i is not None and i in iters}
                frontier.append((r.output.tensor, out, hops - 1))
    return count


def _holdable_neighbours(pg: PrimGraph, op, s, d: PlanDecisions, strategies: dict) -> int:
    """How many of `op`'s operand hand-offs could stay in LX under strategy `s`: each
    producer of an input and each reader of the output that has a strategy of its planned
    stick choice, splitting no reduction dim, that slices the tensor like `s`."""
    producer = {o.output.tensor: o for o in pg.ops}
    count = 0

    def own(o) -> list:
        stick = d.ops.get(o.id, OpPlan()).stick or default_choice(o)
        return [x for x in strategies.get(o.id, ()) if x.stick == stick and not x.alias and not x.reduction_split]

    for slot, a in enumerate(op.inputs):
        p = producer.get(a.tensor)
        if p is not None and any(compatible_residency(x, s, slot) for x in own(p)):
            count += 1
    for r in pg.ops:
        for slot, a in enumerate(r.inputs):
            if a.tensor == op.output.tensor and any(compatible_residency(s, x, slot) for x in own(r)):
                count += 1
    return count
