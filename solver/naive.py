"""The naive planner: the plan a compiler with no optimizer emits.

Every op takes its default stick choice (output sticked on its last dim; matmul x on k,
y on n), restickifies wherever that rule demands, splits the outermost parallel dim evenly
across as many cores as divide it (whole sticks), keeps every tensor in device memory, and
leaves bundle cuts to the external-tensor limit. Graph inputs are sticked on their last dim.

Like torch-spyre's mandatory span-reduction pass (work_division_planning.md, Pass 1), a split
that leaves some core touching more than `hw.per_core_span_bytes` of one tensor is replaced:
first the fewest-core legal split that brings every span under the limit (outer dims first),
then the remaining cores on the outermost parallel dim it leaves unsplit. Spans are judged as
the validator judges them: a copy's inputs by the box its slice reads (a KV-cache concat
reads its core's part of the cache, not all of it).
"""
from __future__ import annotations

from typing import Optional

from target.op_rules import ANY, check_split, default_choice, legal_core_splits, outermost_split, split_granules
from target.primitives import PrimGraph, PrimOp
from target.geometry import first_slice_spans, make_layout
from solver.plan import OpPlan, PlanDecisions


def _prod(split: dict[str, int]) -> int:
    n = 1
    for f in split.values():
        n *= f
    return n


def span_reduced_split(op: PrimOp, split: dict[str, int], gran: dict[int, int], layouts, shapes, dtypes,
                       hw) -> dict[str, int]:
    """`split` if every operand's per-core span fits; else the torch-spyre span-reduction
    answer (see module docstring). If no split fits, the one with the smallest span (the
    validator then reports span_exceeded)."""
    limit = hw.per_core_span_bytes
    if max(first_slice_spans(op, split, gran, layouts, shapes, dtypes, copy_reads=True).values()) <= limit:
        return split
    order = {d.name: i for i, d in enumerate(op.iter_dims)}
    best, best_key = split, None
    for cand in legal_core_splits(op, gran, hw.cores):
        worst = max(first_slice_spans(op, cand, gran, layouts, shapes, dtypes, copy_reads=True).values())
        fits = worst <= limit
        # fitting first; then fewest cores; then outer dims first
        key = (not fits, _prod(cand) if fits else worst, sorted(order[n] for n in cand))
        if best_key is None or key < best_key:
            best, best_key = cand, key
    if best_key is None or best_key[0]:
        return best
    rest = hw.cores // _prod(best)
    free = [d for d in op.iter_dims if d.name not in best]
    if rest > 1 and free:
        sub = PrimOp(op.id, tuple(free), (), op.output, op.body)
        sub_gran = {free.index(d): gran[i] for i, d in enumerate(op.iter_dims) if d in free and i in gran}
        extra = outermost_split(sub, sub_gran, rest)
        merged = {**best, **extra}
        if not check_split(op, merged, gran, hw.cores):
            return merged
    return best


def plan_naive(pg: PrimGraph, hw, input_sticks: Optional[dict] = None, **_ignored) -> PlanDecisions:
    """`input_sticks`: graph inputs in other layouts than their last dim (a window of a
    larger graph reads its boundary tensors in their producers' layouts)."""
    decisions = PlanDecisions(planner="naive", input_sticks=dict(input_sticks or {}))
    stick_of = {}
    for t in pg.tensors.values():
        stick_of[t.id] = (input_sticks or {}).get(t.id, len(t.shape) - 1 if t.shape else None)
    for op in pg.ops:
        ch = default_choice(op)
        stick_of[op.output.tensor] = ch.output
        ins = [stick_of[a.tensor] if s == ANY else s for s, a in zip(ch.inputs, op.inputs)]
        dts = [pg.tensors[a.tensor].dtype for a in op.inputs] + [pg.tensors[op.output.tensor].dtype]
        gran = split_granules(op, ins, ch.output, dts, hw.stick_bytes)
        split = outermost_split(op, gran, hw.cores)
        names = [a.tensor for a in op.inputs] + [op.output.tensor]
        sticks = ins + [ch.output]
        layouts = {n: make_layout(pg.tensors[n].shape, pg.tensors[n].dtype, s, hw.stick_bytes,
                                  pg.tensors[n].dim_order) for n, s in zip(names, sticks)}
        shapes = {n: pg.tensors[n].shape for n in names}
        dtypes = {n: pg.tensors[n].dtype for n in names}
        split = span_reduced_split(op, split, gran, layouts, shapes, dtypes, hw)
        decisions.ops[op.id] = OpPlan(stick=ch, core_split=split)
    return decisions
