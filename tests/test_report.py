"""Issue 17: the compile summary, the per-op report, its diff, the HTML report."""
import json

import pytest

from service.cli import main
from simulator.report import fmt_bytes, fmt_us, summary
from simulator.superdsc import Program
from simulator.timing import time_program

from tests.test_cli_compile_simulate import DOC


@pytest.fixture()
def graph_file(tmp_path):
    p = tmp_path / "graph.json"
    p.write_text(json.dumps(DOC))
    return p


def _compile(graph_file, tmp_path, planner="heuristic", name="p.json", extra=()):
    out = tmp_path / name
    assert main(["compile", str(graph_file), "--planner", planner, "-o", str(out), *extra]) == 0
    return out


def test_formatting_for_people():
    assert fmt_us(32.86784447922038) == "32.87 µs"
    assert fmt_us(0.4736) == "473.6 ns"
    assert fmt_us(12345.6) == "12.35 ms"
    assert fmt_bytes(3 * 1024 * 1024) == "3.00 MiB"
    assert fmt_bytes(100) == "100 B"


def test_compile_prints_summary_on_stderr_only(graph_file, tmp_path, capsys):
    assert main(["compile", str(graph_file), "--planner", "heuristic", "-o", "-"]) == 0
    cap = capsys.readouterr()
    prog = Program.from_json(cap.out)          # stdout is the program, nothing else
    assert "compiled linear_relu with heuristic" in cap.err
    assert "simulated" in cap.err and "lower bound" in cap.err and "bundles" in cap.err
    s = summary(prog, time_program(prog))
    assert s["ops"] == len(prog.ops) and s["simulated_us"] > 0
    assert main(["compile", str(graph_file), "--planner", "heuristic", "-o", str(tmp_path / "q.json"),
                 "--quiet"]) == 0
    assert capsys.readouterr().err == ""
