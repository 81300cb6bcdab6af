"""Issue 17: the compile summary, the per-op report, its diff, the HTML report."""
import json

import pytest

from service.cli import main
from simulator.report import fmt_bytes, fmt_us, summary
from target.superdsc import Program
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


def test_report_per_op_times_sum_to_simulated_total(graph_file, tmp_path, capsys):
    from simulator.report import build_report, render_text
    for planner in ("naive", "heuristic"):
        prog = Program.from_json(_compile(graph_file, tmp_path, planner).read_text())
        timing = time_program(prog)
        rep = build_report(prog, timing)
        assert len(rep.ops) == len(prog.ops)
        assert abs(sum(r.simulated_us for r in rep.ops) - timing.total_us) <= 1e-9 * max(1.0, timing.total_us)
        assert abs(sum(r.share for r in rep.ops) - 1.0) < 1e-9
        times = [r.simulated_us for r in sorted(rep.ops, key=lambda r: -r.simulated_us)]
        text = render_text(rep)
        assert "ops by simulated time" in text and "roofline" in text
        mm = next(r for r in rep.ops if r.opfunc == "matmul")
        assert mm.source == "mm" and mm.macs == 16 * 64 * 96 and 0 < mm.compute_fraction < 1
        assert times[0] == max(r.simulated_us for r in rep.ops)


def test_report_on_layer_graph_lists_restickifies_with_consumers():
    from pathlib import Path
    from service.commands.compile import load_primgraph
    from simulator.report import build_report
    from solver.planners import plan
    pg = load_primgraph(str(Path(__file__).parent.parent / "benchmarks/graphs/tiny/gpt2_tiny_block16.json"))
    prog = plan(pg, planner="heuristic")
    rep = build_report(prog, time_program(prog))
    assert rep.restickifies
    for x in rep.restickifies:
        assert x.consumers and x.from_stick != x.to_stick
    assert abs(sum(r.simulated_us for r in rep.ops) - rep.total_us) < 1e-6


def test_diff_against_itself_is_empty_and_against_other_is_not(graph_file, tmp_path, capsys):
    from simulator.report import diff_programs
    a = _compile(graph_file, tmp_path, "naive", "a.json")
    b = _compile(graph_file, tmp_path, "heuristic", "b.json")
    pa, pb = Program.from_json(a.read_text()), Program.from_json(b.read_text())
    ta, tb = time_program(pa), time_program(pb)
    d = diff_programs(pa, ta, pa, ta)
    assert d["ops"] == [] and d["delta_us"] == 0
    d2 = diff_programs(pa, ta, pb, tb)
    assert d2["ops"] and abs(d2["delta_us"] - (tb.total_us - ta.total_us)) < 1e-9
    capsys.readouterr()
    assert main(["report", str(a), "--against", str(a), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["diff"]["ops"] == []
    assert abs(sum(r["simulated_us"] for r in out["ops"]) - out["total_us"]) < 1e-9
    assert main(["report", str(a), "--against", str(b), "--top", "3", "--graph", str(graph_file)]) == 0
    text = capsys.readouterr().out
    assert "diff against" in text and "differing decisions" in text


def test_report_rejects_a_program_of_another_graph(graph_file, tmp_path, capsys):
    from pathlib import Path
    a = _compile(graph_file, tmp_path, "naive", "a.json")
    other = Path(__file__).parent.parent / "benchmarks/graphs/tiny/linear_tiny_m16_k64_n128.json"
    assert main(["report", str(a), "--graph", str(other)]) == 2
    assert "different_graphs" in capsys.readouterr().err


def test_html_report_is_self_contained_with_tables_and_plots(graph_file, tmp_path, capsys):
    from html.parser import HTMLParser
    a = _compile(graph_file, tmp_path, "naive", "a.json")
    b = _compile(graph_file, tmp_path, "heuristic", "b.json")
    html = tmp_path / "r.html"
    assert main(["report", str(b), "--against", str(a), "--html", str(html)]) == 0
    text = html.read_text()

    class P(HTMLParser):
        def __init__(self):
            super().__init__()
            self.ids, self.tags, self.external = set(), [], []

        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            self.tags.append(tag)
            if "id" in a:
                self.ids.add(a["id"])
            for k in ("src", "href"):
                if a.get(k):
                    self.external.append(a[k])

    p = P()
    p.feed(text)
    assert {"ops", "timeline", "roofline", "lx", "diff", "roofline-table"} <= p.ids
    assert p.external == [] and "<script" not in text      # nothing loaded from elsewhere
    assert p.tags.count("svg") == 3 and "circle" in p.tags and "rect" in p.tags
    assert "mm" in text and "relu" in text
