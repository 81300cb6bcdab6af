"""The registered CP-SAT planner (`plan_cpsat`, planner name "cpsat"): the entry point that
chooses between the depth step and the single-graph planner.

- The depth step (`solver.spyre.depth.plan_whole`, docs/depth.md): a graph made of repeated
  blocks is planned by solving one block and reusing its plan, a large irregular one in
  windows; it calls the single-graph planner for each piece.
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
from solver.plan import PlanDecisions
from solver.planners import register
from solver.spyre import budget as budget_table
from solver.spyre.depth import plan_whole
from solver.spyre.progress import phase
from solver.spyre.single import plan_graph
from solver.spyre.start import Hint, decisions_from_program
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
        moved = _transferred(hint, pg, hw)
        phase(events, "transfer", False, "taken" if moved is not None else "failed: solving")
        if moved is not None:
            return moved
        hint = None
    if budget == "scaled":
        phase(events, "repeats", True, "repeated structure and windows")
        # a stored program (re-optimization) is the hint as its decisions
        hint_d = decisions_from_program(pg, hint) if isinstance(hint, Program) else hint
        d = plan_whole(pg, hw, time_limit_s=time_limit_s, deterministic=deterministic, t0=t0, hint_d=hint_d)
        phase(events, "repeats", False, "not taken" if d is None else d.stats["notes"][0])
        if d is not None:
            return d
    return plan_graph(pg, hw, time_limit_s=time_limit_s, deterministic=deterministic, hint=hint,
                      num_workers=num_workers, keep=keep, keep_resident=keep_resident, max_rounds=max_rounds,
                      fuse=fuse, budget_mode=budget, events=events, seed=seed, t0=t0)


def _transferred(source: SizedPlan, pg: PrimGraph, hw) -> Optional[PlanDecisions]:
    try:
        moved = transfer_decisions(source.pg, program_decisions(source.pg, source.program), pg, hw)
    except NotTransferable:
        return None
    if moved is None:
        return None
    moved.decisions.planner = "cpsat"
    moved.decisions.stats["predicted_us"] = None
    moved.decisions.stats["solver_status"] = "TRANSFERRED"
    moved.decisions.stats["notes"] += [f"transfer: {r}" for r in moved.repairs[:8]]
    return moved.decisions


register("cpsat", plan_cpsat)
