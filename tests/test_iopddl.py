"""IOPDDL instance loading and solution checking (solver.core.iopddl)."""
import json
from pathlib import Path

import pytest

from solver.core import SolveOptions, solve
from solver.core.iopddl import evaluate_solution, load_best_known, load_instance, problem_from_dict

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "iopddl"
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


def test_malformed_instance_errors_name_the_field():
    d = json.loads(json.dumps(EXAMPLE))
    d["problem"]["edges"]["costs"][2] = [1, 2, 3]
    with pytest.raises(ValueError, match=r"edges\.costs\[2\].*expected 4"):
        problem_from_dict(d)
    d = json.loads(json.dumps(EXAMPLE))
    del d["problem"]["nodes"]["intervals"]
    with pytest.raises(ValueError, match=r"nodes\.intervals is missing"):
        problem_from_dict(d)
    d = json.loads(json.dumps(EXAMPLE))
    d["problem"]["edges"]["nodes"][0] = [0, 9]
    with pytest.raises(ValueError, match=r"edges\.nodes\[0\].*out of range"):
        problem_from_dict(d)


def test_optimize_finds_the_example_optimum():
    from solver.core.search import optimize
    p = problem_from_dict(EXAMPLE)
    r = optimize(p, time_limit_s=2, workers=1)
    assert r.feasible and r.cost == 445 and r.bound <= 445
    assert evaluate_solution(p, r.choice).cost == 445


def test_cli_solves_and_writes_solution(tmp_path, capsys):
    from service.cli import main
    path = tmp_path / "example.json"
    path.write_text(json.dumps(EXAMPLE))
    sol = tmp_path / "sol.json"
    assert main(["iopddl", str(path), "--time-limit", "2", "--workers", "1", "--json",
                 "--solution", str(sol)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(out) == {"instance", "cost", "feasible", "bound", "seconds"}
    assert out["instance"] == "example" and out["cost"] == 445 and out["feasible"] is True
    choice = json.loads(sol.read_text())
    assert len(choice) == 5 and evaluate_solution(problem_from_dict(EXAMPLE), choice).cost == 445
    assert main(["iopddl", str(path), "--time-limit", "1", "--workers", "1"]) == 0
    text = capsys.readouterr().out
    assert "cost: 445" in text and "feasible: yes" in text


def test_cli_rejects_malformed_instance(tmp_path, capsys):
    from service.cli import main
    d = json.loads(json.dumps(EXAMPLE))
    d["problem"]["nodes"]["usages"][1] = [1]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))
    assert main(["iopddl", str(path), "--json"]) == 2
    err = capsys.readouterr().err
    assert "malformed instance" in err and "usages[1]" in err
    path.write_text("{not json")
    assert main(["iopddl", str(path)]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_cli_infeasible_memory_reports_no_solution(tmp_path, capsys):
    from service.cli import main
    d = json.loads(json.dumps(EXAMPLE))
    d["problem"]["usage_limit"] = 10  # below the least usage at some step
    path = tmp_path / "tight.json"
    path.write_text(json.dumps(d))
    assert main(["iopddl", str(path), "--json", "--time-limit", "1"]) == 1
    out = json.loads(capsys.readouterr().out.strip())
    assert out["feasible"] is False and out["cost"] is None
