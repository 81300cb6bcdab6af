"""The depth step of the CP-SAT planner (`plan_whole`): the repeated-structure plan when the
graph repeats a block, the windowed plan when it is large and irregular, else nothing (the
registered entry then plans the whole graph as one model). docs/depth.md."""
from __future__ import annotations

from typing import Optional

from target.primitives import PrimGraph
from solver.plan import PlanDecisions
from solver.spyre import budget
from solver.spyre.depth.repeats import plan_depth
from solver.spyre.depth.windows import plan_windowed
from solver.spyre.schedule import chain_order


def plan_whole(pg: PrimGraph, hw, *, time_limit_s: Optional[float], deterministic: bool, t0: float,
               hint_d: Optional[PlanDecisions] = None, seed: int = 1) -> Optional[PlanDecisions]:
    """The planner's depth step (called by `solver.spyre.cpsat_planner.plan_cpsat`): the repeated-
    structure plan (`plan_depth`) when `pg` repeats, else the windowed plan
    (`plan_windowed`) when it has more than `budget.WINDOWS_ABOVE_OPS` ops, else None (one CP-SAT
    model for the whole graph). The result's op order is set. `seed`: the representative's
    (`plan_depth`)."""
    limit = float(time_limit_s) if time_limit_s else budget.DEFAULT_TIME_LIMIT_S
    pg = chain_order(pg)
    d = plan_depth(pg, hw, time_limit_s=limit, deterministic=deterministic, t0=t0, hint_d=hint_d, seed=seed)
    if d is None and len(pg.ops) > budget.WINDOWS_ABOVE_OPS:
        d = plan_windowed(pg, hw, time_limit_s=limit, deterministic=deterministic, t0=t0, hint_d=hint_d)
    if d is not None and not d.op_order:
        d.op_order = [op.id for op in pg.ops]
    return d


