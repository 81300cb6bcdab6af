"""The generic CP-SAT strategy core (solver.core) on small problems with known answers."""
import itertools

import numpy as np

import solver.core.reduction as reduction_module
from solver.core import (
    SolveOptions, StrategyProblem, best_start, evaluate, local_search, maximal_live_sets, presolve, solve,
    tree_dp_start,
)


def _example() -> StrategyProblem:
    """The IOPDDL contest's example instance (google/iopddl example.json)."""
    return StrategyProblem(
        node_costs=[[15], [55, 65], [25, 45, 35], [85, 75], [95]],
        node_usages=[[10], [25, 25], [15, 20, 15], [10, 10], [15]],
        intervals=[(30, 70), (40, 70), (50, 120), (110, 140), (110, 150)],
        edges=[(0, 1), (0, 2), (1, 3), (2, 4), (3, 4)],
        edge_costs=[[30, 40], [50, 10, 40], [90, 10, 20, 80], [60, 20, 30], [70, 60]],
        usage_limit=50, name="example")


def _random_problem(seed: int, n: int = 40, k: int = 5, limit: int = 60) -> StrategyProblem:
    rng = np.random.default_rng(seed)
    costs = [rng.integers(0, 100, size=k) for _ in range(n)]
    usages = [rng.integers(1, 20, size=k) for _ in range(n)]
    intervals = []
    for i in range(n):
        a = int(rng.integers(0, 30))
        intervals.append((a, a + int(rng.integers(1, 10))))
    edges, tables = [], []
    for i in range(1, n):
        for j in rng.choice(i, size=min(i, 2), replace=False):
            edges.append((int(j), i))
            tables.append(rng.integers(0, 60, size=(k, k)))
    return StrategyProblem(costs, usages, intervals, edges, tables, usage_limit=limit, name=f"rand{seed}")


def _brute_force(p: StrategyProblem) -> int:
    best = None
    for choice in itertools.product(*[range(len(c)) for c in p.node_costs]):
        ev = evaluate(p, choice)
        if ev.feasible and (best is None or ev.cost < best):
            best = ev.cost
    return best


def test_evaluate_matches_the_contest_reference():
    p = _example()
    # the values of iopddl_test.cc
    assert evaluate(p, [0, 1, 2, 0, 0]).cost == 495 and evaluate(p, [0, 1, 2, 0, 0]).feasible
    over = evaluate(p, [0, 0, 1, 1, 0])
    assert not over.feasible and "usage" in over.reason and over.cost == 415
    assert not evaluate(p, [0, 0, 0, 0]).feasible
    assert not evaluate(p, [0, 0, 3, 0, 0]).feasible
    assert not evaluate(p, [0, 0, -1, 0, 0]).feasible


def test_example_optimum():
    sol = solve(_example(), SolveOptions(time_limit_s=5))
    assert sol.status == "OPTIMAL"
    assert sol.choice == [0, 0, 2, 1, 0]
    assert sol.cost == 445 == _brute_force(_example())
    assert sol.gap == 0.0


def test_random_problems_match_brute_force_and_evaluator():
    for seed in range(3):
        p = _random_problem(seed, n=7, k=3)
        sol = solve(p, SolveOptions(time_limit_s=5))
        assert sol.status == "OPTIMAL"
        ev = evaluate(p, sol.choice)
        assert ev.feasible and ev.cost == sol.cost == _brute_force(p)


def test_forbidden_entries_are_never_chosen():
    big = 10**18
    p = StrategyProblem([[0, 0], [0, 0]], [[1, 1], [1, 1]], [(0, 1), (0, 1)], [(0, 1)],
                        [[[big, 5], [7, big]]], usage_limit=None)
    sol = solve(p, SolveOptions(time_limit_s=2))
    assert sol.cost == 5 and sol.choice == [0, 1]


def test_dominated_strategies_are_pruned_and_hints_map_to_dominators():
    # node 0: strategy 1 costs more and uses more memory with the same edge rows as 0
    p = StrategyProblem([[1, 5, 3], [0, 0]], [[1, 2, 1], [1, 1]], [(0, 2), (1, 2)], [(0, 1)],
                        [[[0, 4], [0, 4], [9, 0]]], usage_limit=10)
    red = presolve(p)
    assert list(red.alive[0]) == [0, 2]
    assert red.replaced_by[0][1] == 0
    sol = solve(p, SolveOptions(time_limit_s=2), hint=[1, 0])
    assert evaluate(p, sol.choice).cost == sol.cost == 1


def test_maximal_live_sets():
    rows = maximal_live_sets([(0, 3), (1, 2), (2, 5), (4, 6), (7, 7)])
    assert rows == [[0, 1], [0, 2], [2, 3]]


def test_hint_is_respected_and_never_worsened():
    p = _random_problem(7, limit=150)
    start = local_search(p, presolve(p))
    assert start is not None and evaluate(p, start).feasible
    # a tiny deterministic budget: whatever the search finds, the result is no worse
    sol = solve(p, SolveOptions(time_limit_s=0.05, deterministic=True, deterministic_time=0.001),
                hint=start)
    assert sol.cost <= evaluate(p, start).cost
    assert evaluate(p, sol.choice).feasible


def test_deterministic_mode_repeats_exactly():
    p = _random_problem(11, n=60, k=6)
    opts = SolveOptions(time_limit_s=20, num_workers=2, deterministic=True, deterministic_time=0.5)
    a = solve(p, opts)
    b = solve(p, opts)
    assert a.choice == b.choice and a.cost == b.cost and a.bound == b.bound


def test_tree_dp_start_is_optimal_on_a_tree_without_memory_limit():
    rng = np.random.default_rng(3)
    n, k = 7, 3
    edges = [(i, int(rng.integers(0, i))) for i in range(1, n)]  # a random tree
    p = StrategyProblem([rng.integers(0, 50, size=k) for _ in range(n)], [np.ones(k)] * n,
                        [(0, 1)] * n, edges, [rng.integers(0, 50, size=(k, k)) for _ in edges],
                        usage_limit=None)
    start = tree_dp_start(p, presolve(p))
    assert evaluate(p, start).cost == _brute_force(p)
    assert evaluate(p, best_start(p, presolve(p))).cost == _brute_force(p)


def test_running_sum_memory_chain_matches_explicit_rows(monkeypatch):
    """Large instances use a running-sum chain instead of one row per live set: same optima."""
    for seed in range(3):
        p = _random_problem(seed, n=7, k=3, limit=25)
        rows = solve(p, SolveOptions(time_limit_s=5))
        monkeypatch.setattr(reduction_module, "ROW_MEMBERSHIP_LIMIT", 0)
        red = presolve(p)
        assert red.memory_rows == [] and (red.binding is not None)
        chain = solve(p, SolveOptions(time_limit_s=5))
        monkeypatch.setattr(reduction_module, "ROW_MEMBERSHIP_LIMIT", 2_000_000)
        assert chain.status == rows.status
        assert chain.cost == rows.cost == _brute_force(p)
