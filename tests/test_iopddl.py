"""IOPDDL instance loading and solution checking (solver.core.iopddl)."""
import json
from pathlib import Path

import pytest

from solver.core import SolveOptions, solve
from solver.core.iopddl import evaluate_solution, load_best_known, load_instance, problem_from_dict

DATA = Path("/work/shared/iopddl")
EXAMPLE = {"problem": {
    "name": "example",
    "nodes": {"intervals": [[30, 70], [40, 70], [50, 120], [110, 140], [110, 150]],
              "costs": [[15], [55, 65], [25, 45, 35], [85, 75], [95]],
              "usages": [[10], [25, 25], [15, 20, 15], [10, 10], [15]]},
    "edges": {"nodes": [[0, 1], [0, 2], [1, 3], [2, 4], [3, 4]],
              "costs": [[30, 40], [50, 10, 40], [90, 10, 20, 80], [60, 20, 30], [70, 60]]},
    "usage_limit": 50}}


def test_example_round_trip(tmp_path):
    path = tmp_path / "example.json"
    path.write_text(json.dumps(EXAMPLE))
    p = load_instance(path)
    assert p.num_nodes == 5 and len(p.edges) == 5 and p.usage_limit == 50
    # edge tables are row-major over (first node's strategy, second node's strategy)
    assert p.edge_costs[2].shape == (2, 2) and int(p.edge_costs[2][1, 0]) == 20
    assert evaluate_solution(p, [0, 0, 2, 1, 0]).cost == 445
    assert solve(p, SolveOptions(time_limit_s=5)).cost == 445


def test_no_usage_limit():
    d = json.loads(json.dumps(EXAMPLE))
    del d["problem"]["usage_limit"]
    p = problem_from_dict(d)
    assert p.usage_limit is None
    ev = evaluate_solution(p, [0, 0, 1, 1, 0])
    assert ev.feasible and ev.cost == 415  # iopddl_test.cc LegalSolutionNoUsageLimit


def test_malformed_instances_are_rejected():
    d = json.loads(json.dumps(EXAMPLE))
    d["problem"]["edges"]["costs"][0] = [1, 2, 3]  # wrong table size for a 1x2 edge
    with pytest.raises(ValueError):
        problem_from_dict(d)
    d = json.loads(json.dumps(EXAMPLE))
    d["problem"]["nodes"]["usages"][1] = [1]
    with pytest.raises(ValueError):
        problem_from_dict(d)


@pytest.mark.skipif(not (DATA / "asplos-2025-iopddl-B.json.gz").exists(), reason="contest data not present")
def test_contest_instance_loads_and_best_known_reads():
    p = load_instance(DATA / "asplos-2025-iopddl-B.json.gz")
    assert p.num_nodes == 816 and len(p.edges) == 1096
    best = load_best_known(DATA / "best_known.csv")
    assert best["asplos-2025-iopddl-B"] == 532843
    assert all(len(t.shape) == 2 for t in p.edge_costs)
