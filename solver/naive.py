"""The naive planner: the plan a compiler with no optimizer emits.

Every op takes its default stick choice (output sticked on its last dim; matmul x on k,
y on n), restickifies wherever that rule demands, splits the outermost parallel dim evenly
across as many cores as divide it (whole sticks), keeps every tensor in device memory, and
leaves bundle cuts to the external-tensor limit. Graph inputs are sticked on their last dim.
"""
from __future__ import annotations

from lowering.op_rules import ANY, default_choice, outermost_split, split_granules
from lowering.primitives import PrimGraph
from solver.plan import OpPlan, PlanDecisions


def plan_naive(pg: PrimGraph, hw, **_ignored) -> PlanDecisions:
    decisions = PlanDecisions(planner="naive")
    stick_of = {}
    for t in pg.tensors.values():
        stick_of[t.id] = len(t.shape) - 1 if t.shape else None
    for op in pg.ops:
        ch = default_choice(op)
        stick_of[op.output.tensor] = ch.output
        ins = [stick_of[a.tensor] if s == ANY else s for s, a in zip(ch.inputs, op.inputs)]
        dts = [pg.tensors[a.tensor].dtype for a in op.inputs] + [pg.tensors[op.output.tensor].dtype]
        gran = split_granules(op, ins, ch.output, dts, hw.stick_bytes)
        decisions.ops[op.id] = OpPlan(stick=ch, core_split=outermost_split(op, gran, hw.cores))
    return decisions
