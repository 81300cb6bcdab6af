"""CP-SAT runs: the options of a solve, the solver parameters they set (deterministic mode
included), the gap between objective and bound, and minimizing a model. The Spyre planner
builds its own model and uses `SolveOptions`, `solver_parameters` and `gap_of` from here."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

from ortools.sat.python import cp_model


@dataclass
class SolveOptions:
    time_limit_s: float = 10.0
    num_workers: int = 2
    deterministic: bool = False
    # deterministic mode stops on CP-SAT's deterministic clock (about seconds of work on one
    # core); the wall clock limit stays as a safety net at `deterministic_wall_factor` x.
    deterministic_time: Optional[float] = None
    deterministic_wall_factor: float = 6.0
    seed: int = 1
    log: bool = False
    prune_dominated: bool = True
    # edges whose reduced table has at most this many entries get pair booleans
    pair_table_limit: int = 2048
    # CP-SAT's own presolve (off pays when a complete hint is given and presolve is slow)
    presolve: bool = True
    # stop once the incumbent is proven within this gap of the bound: relative,
    # (objective - bound) / |objective|, or absolute, in objective units (None: CP-SAT's
    # defaults, 0 and 1e-4, i.e. only a proven optimum stops the search early). CP-SAT then
    # reports OPTIMAL; `gap_of` gives the gap actually left.
    relative_gap_limit: Optional[float] = None
    absolute_gap_limit: Optional[float] = None


@dataclass
class ModelSolution:
    status: str  # OPTIMAL, FEASIBLE, INFEASIBLE, UNKNOWN, MODEL_INVALID
    objective: Optional[float]
    bound: Optional[float]
    gap: Optional[float]
    wall_seconds: float
    deterministic_time: float
    solver: Optional[cp_model.CpSolver] = None


def solver_parameters(options: SolveOptions) -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    p = solver.parameters
    p.num_workers = max(1, int(options.num_workers))
    p.random_seed = int(options.seed)
    p.log_search_progress = bool(options.log)
    p.cp_model_presolve = bool(options.presolve)
    if options.relative_gap_limit is not None:
        p.relative_gap_limit = float(options.relative_gap_limit)
    if options.absolute_gap_limit is not None:
        p.absolute_gap_limit = float(options.absolute_gap_limit)
    if options.deterministic:
        # One sequential worker; the deterministic clock (not the wall clock) decides when to
        # stop. CP-SAT's interleaved mode (`interleave_search`, meant to make parallel search
        # reproducible) returned different solutions and bounds for one model proto in fresh
        # processes, with 1 or 2 workers (ortools 9.15, bert layer, 2026-11-29); the
        # sequential search repeated exactly.
        p.num_workers = 1
        p.interleave_search = False
        p.max_deterministic_time = float(options.deterministic_time or options.time_limit_s)
        p.max_time_in_seconds = float(options.time_limit_s * options.deterministic_wall_factor)
    else:
        p.max_time_in_seconds = float(options.time_limit_s)
    return solver


def gap_of(objective: Optional[float], bound: Optional[float]) -> Optional[float]:
    if objective is None or bound is None:
        return None
    if objective == 0:
        return 0.0
    return max(0.0, (objective - bound) / abs(objective))


def solve_model(model: cp_model.CpModel, objective, options: SolveOptions) -> ModelSolution:
    """Minimize `objective` (a linear expression) and report status, objective, bound, gap."""
    model.Minimize(objective)
    solver = solver_parameters(options)
    t0 = time.perf_counter()
    status = solver.Solve(model)
    wall = time.perf_counter() - t0
    name = solver.StatusName(status)
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        obj = float(solver.ObjectiveValue())
        bound = float(solver.BestObjectiveBound())
        return ModelSolution(name, obj, bound, gap_of(obj, bound), wall,
                             solver.deterministic_time, solver)
    return ModelSolution(name, None, None, None, wall, solver.deterministic_time, None)
