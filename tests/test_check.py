"""`sticksat check`, the CI gate: passes on an unchanged baseline, fails on an injected
regression, on an invalid / uncompilable graph and on a planner that fell back; the JUnit
file parses and names each failure; a store works as the source."""
import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from service.cli import main

TINY = Path(__file__).resolve().parent.parent / "benchmarks" / "graphs" / "tiny"
FAST = ("linear_tiny_m16_k64_n128", "bmm_tiny_b4_m32_k64_n32")  # CP-SAT proves these optimal at once


@pytest.fixture
def graphs(tmp_path):
    d = tmp_path / "graphs"
    d.mkdir()
    for name in FAST:
        shutil.copy(TINY / f"{name}.json", d / f"{name}.json")
    return d


def _junit(path):
    root = ET.parse(path).getroot()
    cases = {tc.get("name"): tc for tc in root.iter("testcase")}
    return root, cases


def test_unchanged_baseline_passes_and_injected_regression_fails(graphs, tmp_path, capsys):
    base, junit = tmp_path / "baseline.json", tmp_path / "junit.xml"
    assert main(["check", str(graphs), "--baseline", str(base), "--update-baseline", "--time-limit", "2"]) == 0
    data = json.loads(base.read_text())
    assert data["format"] == "sticksat.check-baseline" and data["version"] == 1
    assert data["planner"] == "cpsat" and data["deterministic"] is True and set(data["graphs"]) == set(FAST)
    assert all(e["simulated_us"] > 0 and len(e["graph_hash"]) == 64 for e in data["graphs"].values())

    # unchanged: passes, every case in the JUnit file without a failure
    assert main(["check", str(graphs), "--baseline", str(base), "--junit", str(junit), "--time-limit", "2"]) == 0
    root, cases = _junit(junit)
    assert set(cases) == set(FAST) and root.get("failures") == "0"
    assert all(tc.find("failure") is None for tc in cases.values())

    # a baseline entry 20% faster than what the compiler makes: a regression beyond 5%
    data["graphs"][FAST[0]]["simulated_us"] *= 0.8
    base.write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["check", str(graphs), "--baseline", str(base), "--junit", str(junit), "--time-limit", "2"]) == 1
    root, cases = _junit(junit)
    assert root.get("failures") == "1"
    failure = cases[FAST[0]].find("failure")
    assert failure is not None and failure.get("type") == "regression"
    assert "+25.0%" in failure.get("message") and "tolerance 5%" in failure.get("message")
    assert cases[FAST[1]].find("failure") is None
    # ...which a wider tolerance accepts
    assert main(["check", str(graphs), "--baseline", str(base), "--tolerance", "30", "--time-limit", "2"]) == 0


def test_gzipped_documents_are_read(graphs, tmp_path):
    import gzip

    src = graphs / f"{FAST[0]}.json"
    (graphs / "zipped.json.gz").write_bytes(gzip.compress(src.read_bytes()))  # named by its file
    src.unlink()
    junit = tmp_path / "junit.xml"
    assert main(["check", str(graphs), "--planner", "heuristic", "--junit", str(junit)]) == 0
    _, cases = _junit(junit)
    assert set(cases) == {"zipped", FAST[1]}


def test_uncompilable_and_invalid_graphs_fail(graphs, tmp_path):
    doc = json.loads((graphs / f"{FAST[0]}.json").read_text())
    doc["name"] = "unsupported"
    doc["nodes"][0]["target"] = "aten.not_an_op.default"
    (graphs / "unsupported.json").write_text(json.dumps(doc))
    (graphs / "broken.json").write_text('{"format": "sticksat.graph", "nodes": [')
    junit = tmp_path / "junit.xml"
    assert main(["check", str(graphs), "--junit", str(junit), "--time-limit", "2"]) == 1
    root, cases = _junit(junit)
    assert root.get("tests") == "4" and root.get("failures") == "2"
    for name in ("unsupported", "broken"):
        failure = cases[name].find("failure")
        assert failure is not None and failure.get("type") == "compile"
        assert failure.get("message").startswith("invalid graph:")
    assert "not_an_op" in cases["unsupported"].find("failure").get("message")
    assert all(cases[n].find("failure") is None for n in FAST)


def test_a_planner_that_falls_back_fails_the_gate(graphs, tmp_path, monkeypatch):
    from solver import planners

    planners.ensure_registered("cpsat")

    def broken(pg, hw, **kw):
        raise RuntimeError("injected planner bug")

    monkeypatch.setitem(planners.PLANNERS, "cpsat", broken)
    junit = tmp_path / "junit.xml"
    # in this process (--graph-timeout 0): the injected bug lives in this process only
    assert main(["check", str(graphs), "--junit", str(junit), "--graph-timeout", "0"]) == 1
    _, cases = _junit(junit)
    for name in FAST:
        failure = cases[name].find("failure")
        assert failure.get("type") == "fallback" and "injected planner bug" in failure.get("message")
    assert main(["check", str(graphs), "--allow-fallback", "--graph-timeout", "0"]) == 0


def test_a_graph_past_the_per_graph_time_limit_fails_alone(graphs, tmp_path):
    """Each compile runs in a worker under the per-graph limit (the default): a limit no
    compile can meet fails every graph with reason 'limit', and a generous one passes them,
    with no worker left behind either way."""
    junit = tmp_path / "junit.xml"
    assert main(["check", str(graphs), "--junit", str(junit), "--graph-timeout", "0.05", "--time-limit", "2"]) == 1
    _, cases = _junit(junit)
    for name in FAST:
        failure = cases[name].find("failure")
        assert failure is not None and failure.get("type") == "limit", name
    assert main(["check", str(graphs), "--graph-timeout", "60", "--time-limit", "2"]) == 0
    assert not _children()


def _children() -> list[int]:
    """Live processes whose parent is this one (Linux /proc), but multiprocessing's resource
    tracker, which lives as long as this process by design."""
    import os

    me, out = str(os.getpid()), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me and fields[0] != "Z":
            with open(f"/proc/{pid}/cmdline") as fh:
                if "resource_tracker" not in fh.read():
                    out.append(int(pid))
    return out


def test_check_a_store_without_rich(tmp_path, monkeypatch, capsys):
    """A store as the source; and the plain table when rich is not installed (the Docker
    image has only the base dependencies)."""
    import sys

    for module in ("rich", "rich.console", "rich.table"):
        monkeypatch.setitem(sys.modules, module, None)  # `import rich...` raises ImportError
    store = str(tmp_path / "s.sqlite")
    assert main(["store", "add", str(TINY / f"{FAST[0]}.json"), "--store", store]) == 0
    base = tmp_path / "b.json"
    assert main(["check", store, "--planner", "heuristic", "--baseline", str(base), "--update-baseline"]) == 0
    assert list(json.loads(base.read_text())["graphs"]) == [FAST[0]]
    capsys.readouterr()
    assert main(["check", store, "--planner", "heuristic", "--baseline", str(base)]) == 0
    out = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(out) if line.startswith("graph "))
    assert out[header].split()[:3] == ["graph", "result", "simulated"] and set(out[header + 1]) <= {"-", " "}
    assert out[header + 2].split()[:2] == [FAST[0], "PASS"]


def test_usage_errors(tmp_path, graphs):
    assert main(["check", str(tmp_path / "nope")]) == 2
    assert main(["check", str(graphs), "--baseline", str(tmp_path / "missing.json")]) == 2
    (tmp_path / "bad.json").write_text('{"format": "other"}')
    assert main(["check", str(graphs), "--baseline", str(tmp_path / "bad.json")]) == 2
    # an output it could not write is a usage error before any compile, not a traceback
    assert main(["check", str(graphs), "--junit", str(tmp_path / "no" / "such" / "dir" / "j.xml")]) == 2
    assert main(["check", str(graphs), "--baseline", str(tmp_path / "none" / "b.json"), "--update-baseline"]) == 2
