"""The registered CP-SAT planner (`plan_cpsat`, planner name "cpsat"): the entry point that
chooses between the depth step and the single-graph planner.

- The depth step (`solver.spyre.depth.plan_whole`, docs/depth.md): a graph made of repeated
  blocks is planned by solving one block and reusing its plan (the single-graph planner
  solves the block), a large irregular one (and what lies around a repeated block) whole
  by the core's search over its strategy problem (`depth.core_search`).
- Otherwise the single-graph planner (`solver.spyre.single.plan_graph`): one CP-SAT model of
  the whole graph, then the post-solve steps (docs/planner.md).
- A hint that is a plan of another size of the same graph (`transfer.SizedPlan`) is carried
  to this size instead (`solver.spyre.transfer`): a new shape of a known graph costs a
  fraction of a solve. Where the transfer fails, the planner solves as without a hint.
"""
from __future__ import annotations

import time
from typing import Optional

from target.primitives import PrimGraph
from target.superdsc import Program
from solver.events import EventSink
from simulator.timing import time_program
from solver.lower_bound import lower_bound
from solver.oracle import simulated_us
from solver.plan import PlanDecisions
from solver.planners import register
from solver.spyre import budget as budget_table
from solver.spyre.depth import plan_whole
from solver.spyre.progress import phase
from solver.spyre.single import plan_graph
from solver.spyre.start import Hint, decisions_from_program, default_hint
from solver.spyre.transfer import NotTransferable, SizedPlan, program_decisions, transfer_decisions


def plan_cpsat(pg: PrimGraph, hw, *, time_limit_s: Optional[float] = None, deterministic: bool = False,
               hint: Hint = None, num_workers: int = 2, keep: int = 4, keep_resident: int = 2,
               max_rounds: int = budget_table.MAX_ROUNDS, fuse: bool = True, budget: str = "scaled",
               events: Optional[EventSink] = None, seed: int = 1, **_ignored) -> PlanDecisions:
    """Plan `pg`: the depth step first when the budget is scaled (it returns None for a
    graph it does not take: no repeated block, not above `budget.WINDOWS_ABOVE_OPS` ops),
    else `single.plan_graph`. `budget`: "scaled" (the default) or "fixed" (the whole limit,
    no depth step; kept for comparison, benchmarks/bench_compile_time.py). `events`: an
    optional progress sink (solver.events): phases, and each improving incumbent and bound
    of the CP-SAT solve; it never changes the plan. `seed`: CP-SAT's random seed (another
    seed, another of the model's optima, which fusion may turn into a faster program)."""
    t0 = time.perf_counter()
    if isinstance(hint, SizedPlan):
        phase(events, "transfer", True, "a plan of another size of this graph")
        moved, kept = _transferred(hint, pg, hw)
        phase(events, "transfer", False, "taken" if kept else "failed: solving" if moved is None
              else "further from its bound than its source: solving from it")
        if kept:
            return moved
        hint = moved
    if budget == "scaled":
        phase(events, "repeats", True, "repeated structure and windows")
        # a stored program (re-optimization) is the hint as its decisions
        hint_d = decisions_from_program(pg, hint) if isinstance(hint, Program) else hint
        d = plan_whole(pg, hw, time_limit_s=time_limit_s, deterministic=deterministic, t0=t0, hint_d=hint_d,
                       seed=seed)
        phase(events, "repeats", False, "not taken" if d is None else d.stats["notes"][0])
        if d is not None:
            return d
    return plan_graph(pg, hw, time_limit_s=time_limit_s, deterministic=deterministic, hint=hint,
                      num_workers=num_workers, keep=keep, keep_resident=keep_resident, max_rounds=max_rounds,
                      fuse=fuse, budget_mode=budget, events=events, seed=seed, t0=t0)


def _transferred(source: SizedPlan, pg: PrimGraph, hw) -> tuple[Optional[PlanDecisions], bool]:
    """The source plan carried to `pg` (None when it does not transfer), and whether it is
    kept as the plan: measured against the baseline heuristic's plan of each size (a
    yardstick that follows the shape), its time at most `TRANSFER_RATIO_GROWTH` times the
    source's relative time (both against their lower bounds when the heuristic has no valid
    plan of either size)."""
    try:
        moved = transfer_decisions(source.pg, program_decisions(source.pg, source.program), pg, hw,
                                   src_program=source.program)
    except NotTransferable:
        return None, False
    if moved is None:
        return None, False
    src_yard, yard = _yardsticks_us(source.pg, pg, hw)
    src_ratio = time_program(source.program, hw).total_us / src_yard
    ratio = time_program(moved.program, hw).total_us / yard
    d = moved.decisions
    d.planner = "cpsat"
    d.stats["notes"] += [f"transfer: {r}" for r in moved.repairs[:8]]
    d.stats["notes"].append(f"transfer: {ratio:.3f}x the yardstick, the source {src_ratio:.3f}x")
    if ratio > budget_table.TRANSFER_RATIO_GROWTH * src_ratio:
        return d, False
    d.stats["predicted_us"] = None
    d.stats["solver_status"] = "TRANSFERRED"
    return d, True


def _yardsticks_us(src_pg: PrimGraph, pg: PrimGraph, hw) -> tuple[float, float]:
    """The yardsticks of the source and the new size, of one kind: the simulated times of
    the heuristic baseline's plans, or both graphs' lower bounds when the baseline has no
    valid plan of either (a ratio to a plan and a ratio to a bound do not compare)."""
    src_us = simulated_us(src_pg, hw, default_hint(src_pg, hw)[0])
    us = simulated_us(pg, hw, default_hint(pg, hw)[0])
    if src_us is not None and us is not None:
        return src_us, us
    return (max(1e-9, lower_bound(src_pg, hw).lower_bound_us), max(1e-9, lower_bound(pg, hw).lower_bound_us))


register("cpsat", plan_cpsat)
