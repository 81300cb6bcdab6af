"""The generic strategy problem the Spyre planner builds on (the XLA auto-sharding / IOPDDL
problem): every node picks exactly one strategy (node cost, memory usage), every edge adds
a cost from a table indexed by the strategies of its two ends, and at every time step the
usages of the nodes live then must stay within a limit. Minimize the total cost.

Modules, in the order data flows through them:
- `problem`: `StrategyProblem`, `FORBIDDEN_COST`, `evaluate` (the reference check);
- `timeline`: live intervals on compressed time, maximal live sets;
- `reduction`: `presolve` (forbidden and dominated strategies removed, where memory may bind);
- `starts`: spanning-forest DP and node local search (a complete CP-SAT hint);
- `cpsat`: `SolveOptions`, `solver_parameters`, `gap_of`, `solve_model` (running CP-SAT);
- `whole_model`: the whole problem as one CP-SAT model (`build_core`) and `solve`;
- `merge`, `group_state`, `minsum`, `moves`, `windows`, `search`: the anytime search at
  contest scale (`search.optimize`: node merging, min-sum message passing under Lagrangian
  usage penalties, kicks, CP-SAT and min-sum windows) within a wall-clock limit;
- `iopddl`: the ASPLOS 2025 contest's instance format (loader, evaluator).

The Spyre planner (`solver/spyre/cpsat_planner.py`) builds its own CP-SAT model over the
Spyre strategy problem and uses three helpers from here: `SolveOptions`,
`solver_parameters` and `gap_of` (`from solver.core import ...` stays the supported way).
`sticksat iopddl` and `benchmarks/bench_iopddl.py` run `search.optimize`; docs/iopddl.md
describes the core and its results.
"""
from solver.core.cpsat import ModelSolution, SolveOptions, gap_of, solve_model, solver_parameters
from solver.core.reduction import ROW_MEMBERSHIP_LIMIT, Reduction, presolve
from solver.core.problem import FORBIDDEN_COST, Evaluation, StrategyProblem, evaluate
from solver.core.starts import best_start, forest_min_sum, local_search, tree_dp_start
from solver.core.timeline import Timeline, maximal_live_sets
from solver.core.whole_model import CoreModel, CoreSolution, build_core, solve

__all__ = [
    "CoreModel", "CoreSolution", "Evaluation", "FORBIDDEN_COST", "ModelSolution", "ROW_MEMBERSHIP_LIMIT",
    "Reduction", "SolveOptions", "StrategyProblem", "Timeline", "best_start", "build_core", "evaluate",
    "forest_min_sum", "gap_of", "local_search", "maximal_live_sets", "presolve", "solve", "solve_model",
    "solver_parameters", "tree_dp_start",
]
