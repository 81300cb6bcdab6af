"""`sticksat bench --suite tiny --json`: output shape, and numbers that hang together."""
from __future__ import annotations

import json
import math

from benchmarks.suite import PLANNER_NAMES
from service.cli import main

ROW_KEYS = {"graph", "naive_us", "heuristic_us", "cpsat_us", "lower_bound_us", "cpsat_gap", "solve_s", "valid"}


def test_bench_tiny_json(capsys):
    code = main(["bench", "--suite", "tiny", "--json", "--only", "_k64_", "--time-limit", "1",
                 "--deterministic", "--numerics"])
    out = json.loads(capsys.readouterr().out)
    assert out["suite"] == "tiny"
    assert {"date", "machine", "graphs", "geomean_speedup_vs_heuristic"} <= set(out)
    names = [g["graph"] for g in out["graphs"]]
    assert names == sorted(names) and len(names) >= 2
    assert any(n.startswith("linear_tiny") for n in names)
    speedups = []
    for g in out["graphs"]:
        assert ROW_KEYS <= set(g)
        if "lowering" in g["errors"]:
            continue  # reported, never hidden: valid is then False
        assert g["heuristic_us"] > 0 and g["naive_us"] > 0
        assert g["lower_bound_us"] <= min(g["naive_us"], g["heuristic_us"])
        if g["cpsat_us"] is not None:
            assert g["lower_bound_us"] <= g["cpsat_us"]
            assert g["speedup_vs_heuristic"] == g["heuristic_us"] / g["cpsat_us"]
            speedups.append(g["speedup_vs_heuristic"])
            if g["torch-spyre-coopt_us"] is not None:
                assert g["coopt/cpsat"] == g["torch-spyre-coopt_us"] / g["cpsat_us"]
        assert g["valid"] == (not g["errors"])
        # --numerics: every planner's program was run and compared with the reference
        ran = {p for p in PLANNER_NAMES if g[f"{p}_us"] is not None}
        assert set(g["max_rel_err"]) == ran
        assert all(e < 5e-2 for e in g["max_rel_err"].values())
    if speedups:
        geo = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
        assert math.isclose(out["geomean_speedup_vs_heuristic"], geo)
    assert code == (0 if all(g["valid"] for g in out["graphs"]) else 1)


def test_bench_unknown_suite(capsys):
    assert main(["bench", "--suite", "no_such_suite"]) == 2
    assert "no suite" in capsys.readouterr().err
