"""The CP-SAT solve of a built model (`solve_rounds`): rounds that stop once the plan is
proven within the gap limits, each solution checked by the validator and repaired when its
bundles break the external-tensor limit (`solver.spyre.bundle_repair`), the groups that broke
it added as lazy no-goods and the model solved again warm-started from the repaired plan.

CP-SAT's presolve is off for this model (seconds of wall time for almost no reduction).
Deterministic mode: CP-SAT stops on its deterministic clock (a share of the budget), one
sequential worker, the seed it is given (the pipeline's draws give each solve its own:
`single.plan_graph`); the wall limit is only a safety net.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

from ortools.sat.python import cp_model

from target.primitives import PrimGraph
from target.superdsc import Program
from solver.core import SolveOptions, gap_of, solver_parameters
from solver.events import EventSink
from solver.plan import PlanDecisions
from solver.spyre import budget
from solver.spyre.bundle_repair import repair_bundles
from solver.spyre.cost_model import predict_program_ns
from solver.spyre.model import SpyreModel
from solver.spyre.progress import ProgressCallback


@dataclass
class Solved:
    """The best valid plan of the rounds (None when none), its program and predicted ns, the
    last round's status, objective and bound (ns), and the rounds' notes."""

    decisions: Optional[PlanDecisions] = None
    program: Optional[Program] = None
    predicted_ns: float = float("inf")
    status: str = "UNKNOWN"
    objective: Optional[float] = None
    bound: Optional[float] = None
    notes: list[str] = field(default_factory=list)


def solve_rounds(pg: PrimGraph, hw, sm: SpyreModel, input_sticks: dict, *, limit_s: float, cap_s: float,
                 t0: float, keep_s: float, deterministic: bool, num_workers: int, seed: int, max_rounds: int,
                 gaps: dict, events: Optional[EventSink] = None) -> Solved:
    """Solve `sm` (hinted, objective set) in at most `max_rounds` rounds within `limit_s`
    counted from `t0`, keeping `keep_s` seconds for what follows the solve. `gaps`: the gap
    limits of a scaled budget ({} for a fixed one)."""
    out = Solved()
    t_solve = time.perf_counter()
    for round_ in range(max_rounds):
        remaining = limit_s - (time.perf_counter() - t0) - keep_s
        if round_ > 0 and remaining < budget.MIN_ROUND_SHARE * limit_s and not deterministic:
            break
        # the first round gets most of the budget; repair rounds (lazy no-goods) the rest
        round_s = max(budget.MIN_ROUND_S, remaining * (budget.FIRST_ROUND_SHARE if round_ + 1 < max_rounds else 1.0))
        if deterministic:
            # nothing measured on the wall clock may shape a deterministic solve: the
            # deterministic time (a share of the budget) stops it; the wall limit is only a
            # safety net, at 3x the caller's limit as before budgets scaled
            round_s = cap_s
        opts = SolveOptions(time_limit_s=round_s, num_workers=num_workers, deterministic=deterministic, seed=seed,
                            # deterministic: a fixed share of the limit, never the wall clock
                            deterministic_time=budget.DETERMINISTIC_PER_SECOND * limit_s / (round_ + 2),
                            deterministic_wall_factor=budget.DETERMINISTIC_WALL_FACTOR, **gaps)
        solver = solver_parameters(opts)
        # CP-SAT's presolve spends seconds of wall time on this model for almost no
        # reduction (measured on a 143-op graph: 3.3 s, model 2447 -> 2021 variables); the
        # complete hint and LNS do better with that time
        solver.parameters.cp_model_presolve = False
        if events is not None:
            progress = ProgressCallback(events, round_, t_solve)
            solver.best_bound_callback = progress.on_bound
            st = solver.Solve(sm.m, progress)
        else:
            st = solver.Solve(sm.m)
        out.status = solver.StatusName(st)
        if st in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            out.objective, out.bound = solver.ObjectiveValue(), solver.BestObjectiveBound()
            gap_note = f", gap {gap_of(out.objective, out.bound):.2%}"
        else:
            gap_note = ""
        out.notes.append(f"round {round_}: {out.status} after {solver.WallTime():.1f} s "
                         f"(deterministic time {solver.deterministic_time:.2f}{gap_note})")
        if deterministic and st == cp_model.FEASIBLE and \
                solver.deterministic_time < 0.99 * opts.deterministic_time and \
                solver.WallTime() >= 0.99 * round_s * budget.DETERMINISTIC_WALL_FACTOR:
            out.notes.append(f"round {round_}: stopped by the wall safety net before its deterministic time "
                             f"({opts.deterministic_time:.2f}): this plan depends on the machine's load")
        if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            break
        d = sm.decisions(solver, input_sticks)
        d, prog, groups, issues = repair_bundles(pg, hw, sm, d)
        if prog is not None:
            pred = predict_program_ns(prog, hw)
            if out.program is None or pred < out.predicted_ns:
                out.decisions, out.program, out.predicted_ns = d, prog, pred
        if not groups:
            if prog is None:
                out.notes.append("cpsat plan failed validation: " + "; ".join(
                    f"{getattr(i, 'code', '')}: {getattr(i, 'message', i)}" for i in issues[:3]))
            break
        # lazy no-goods: each group of windows whose bundle broke the limit cannot all stay
        # resident together; the next round starts from the repaired solution
        out.notes.append(f"round {round_}: {len(groups)} LX window groups over the bundle limit "
                         "(no-goods added, repaired solution kept)")
        for ts in groups:
            sm.m.AddBoolOr([sm.res[t].Not() for t in ts])
        sm.m.ClearHints()
        sm.add_hint(d)
    return out
