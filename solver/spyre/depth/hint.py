"""The whole graph's hint for the depth step: its simulated time (the plan the depth step's
result must not be slower than), the reserve its emit and simulation time set for what
follows the solves, and its check before it is returned."""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Optional

from target.primitives import PrimGraph
from simulator.timing import time_program
from solver.oracle import emitted_report, issue_text
from solver.plan import PlanDecisions
from solver.spyre import budget
from solver.spyre.start import default_hint, valid_or_naive


def hint_report(pg: PrimGraph, hw, hint_d: PlanDecisions):
    """Simulated time and timing report of the whole graph's hint (emitted, not validated
    here: when it is returned, `planners.plan()` validates it like any plan); (inf, None)
    when it cannot be emitted."""
    report = emitted_report(pg, hw, replace(hint_d, op_order=[]))
    if report is None:
        return float("inf"), None
    return report.total_us, report


def checked_hint(pg: PrimGraph, hw, hint_d: PlanDecisions,
                 hint_us: float) -> tuple[PlanDecisions, float, Optional[str]]:
    """The hint, validated before it is returned, its simulated time, and a note when it was
    replaced: when the validator rejects it (the heuristic fails on some graphs, e.g. a
    cumsum split on GPT-2's position ids), the naive plan takes its place."""
    naive, prog, issues = valid_or_naive(pg, hw, replace(hint_d, op_order=[]))
    if not issues:
        return hint_d, hint_us, None
    return (naive, (time_program(prog, hw).total_us if prog is not None else float("inf")),
            f"the hint is invalid ({issue_text(issues, 2)}): the naive plan stands in")


def reserve_s(n_ops: int, post_s: Optional[float] = None) -> float:
    """Seconds kept for what follows the solves (comment above `budget.RESERVE_S_PER_OP`);
    `post_s`: in wall-clock mode, the measured seconds of emitting and simulating the whole
    graph's hint."""
    if post_s is None:
        return budget.RESERVE_BASE_S + budget.RESERVE_S_PER_OP * n_ops
    return budget.RESERVE_BASE_S + max(budget.RESERVE_FLOOR_S_PER_OP * n_ops, budget.RESERVE_POST_FACTOR * post_s)


def timed_hint_report(pg: PrimGraph, hw, hint_d: PlanDecisions):
    """`hint_report` and the seconds it took."""
    t = time.perf_counter()
    us, report = hint_report(pg, hw, hint_d)
    return us, report, time.perf_counter() - t


def whole_hint(pg: PrimGraph, hw, hint_d: Optional[PlanDecisions]) -> PlanDecisions:
    """The whole graph's starting plan (the heuristic's unless given)."""
    return default_hint(pg, hw)[0] if hint_d is None else hint_d
