"""`sticksat compile` and `sticksat simulate` end to end (in-process CLI)."""
import json

import pytest

from service.cli import main
from target.superdsc import Program

META = lambda shape: {"shape": shape, "stride": [shape[1], 1], "storage_offset": 0, "dtype": "float32"}
DOC = {
    "format": "sticksat.graph", "version": 1, "name": "linear_relu",
    "inputs": [{"id": "x", "kind": "user_input", "meta": META([16, 64])},
               {"id": "w", "kind": "parameter", "meta": META([64, 96])}],
    "nodes": [
        {"id": "mm", "target": "aten.mm.default",
         "args": [{"kind": "tensor", "node": "x"}, {"kind": "tensor", "node": "w"}],
         "outputs": [META([16, 96])]},
        {"id": "relu", "target": "aten.relu.default", "args": [{"kind": "tensor", "node": "mm"}],
         "outputs": [META([16, 96])]},
    ],
    "outputs": [{"kind": "tensor", "node": "relu"}],
}


@pytest.fixture()
def graph_file(tmp_path):
    p = tmp_path / "graph.json"
    p.write_text(json.dumps(DOC))
    return p


def _run(argv, capsys):
    code = main(argv)
    out = capsys.readouterr().out
    return code, out


def test_compile_then_simulate_with_numerics_and_trace(graph_file, tmp_path, capsys):
    prog_path = tmp_path / "program.json"
    code, _ = _run(["compile", str(graph_file), "--planner", "naive", "-o", str(prog_path)], capsys)
    assert code == 0
    prog = Program.from_json(prog_path.read_text())
    assert prog.stats.planner == "naive" and [o.opfunc for o in prog.ops] == ["matmul", "relu"]
    trace = tmp_path / "trace.json"
    code, out = _run(["simulate", str(prog_path), "--graph", str(graph_file), "--numerics",
                      "--trace", str(trace), "--json"], capsys)
    res = json.loads(out)
    assert code == 0 and res["valid"] is True and res["errors"] == []
    assert res["simulated_us"] > 0
    assert res["max_abs_err"] < 1e-4 and res["max_rel_err"] < 1e-5
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("ph") == "X" for e in events)


def test_simulate_invalid_program_exits_nonzero(graph_file, tmp_path, capsys):
    prog_path = tmp_path / "program.json"
    assert _run(["compile", str(graph_file), "--planner", "naive", "-o", str(prog_path)], capsys)[0] == 0
    d = json.loads(prog_path.read_text())
    relu = next(o for o in d["ops"] if o["opfunc"] == "relu")
    relu["core_split"] = {relu["prim"]["iter_dims"][1]["name"]: 5}   # 96 elements: not 5 whole-stick slices
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(d))
    code, out = _run(["simulate", str(bad), "--json"], capsys)
    res = json.loads(out)
    assert code == 1 and res["valid"] is False
    assert "split_uneven" in {e["code"] for e in res["errors"]}
    assert all(set(e) >= {"code", "message"} for e in res["errors"])


def test_compile_rejects_unsupported_graph(tmp_path, capsys):
    doc = json.loads(json.dumps(DOC))
    doc["nodes"][1]["target"] = "aten.not_an_op.default"
    p = tmp_path / "g.json"
    p.write_text(json.dumps(doc))
    assert main(["compile", str(p), "-o", str(tmp_path / "o.json")]) == 2
    assert "unsupported" in capsys.readouterr().err


def test_simulate_with_unloadable_graph_reports_it(graph_file, tmp_path, capsys):
    prog_path = tmp_path / "program.json"
    assert _run(["compile", str(graph_file), "--planner", "naive", "-o", str(prog_path)], capsys)[0] == 0
    doc = json.loads(json.dumps(DOC))
    doc["nodes"][1]["target"] = "aten.not_an_op.default"
    g = tmp_path / "bad_graph.json"
    g.write_text(json.dumps(doc))
    code, out = _run(["simulate", str(prog_path), "--graph", str(g), "--numerics", "--json"], capsys)
    res = json.loads(out)
    assert code == 2 and res["valid"] is False and res["errors"][0]["code"] == "unsupported_op"


def test_compile_defaults_to_the_cpsat_planner(graph_file, tmp_path, capsys):
    prog_path = tmp_path / "program.json"
    code, _ = _run(["compile", str(graph_file), "--time-limit", "2", "--deterministic", "-o", str(prog_path)], capsys)
    assert code == 0
    stats = json.loads(prog_path.read_text())["stats"]
    assert stats["planner"] == "cpsat" and stats["solver_status"] in ("OPTIMAL", "FEASIBLE")


def test_compile_reads_gzipped_documents_beyond_the_services_request_limits(tmp_path, capsys):
    """The benchmark's whole-model graphs are `.json.gz`; and a local file is held to the
    format's bounds only, not to the service's per-request element limit (2**34)."""
    import gzip
    big = json.loads(json.dumps(DOC))
    big["inputs"][1]["meta"] = META([64, 2**29])  # 2**35 elements: over the service's limit
    big["nodes"][0]["outputs"] = [META([16, 2**29])]
    big["nodes"][1]["outputs"] = [META([16, 2**29])]
    small = tmp_path / "graph.json.gz"
    small.write_bytes(gzip.compress(json.dumps(DOC).encode()))
    code, _ = _run(["compile", str(small), "--planner", "naive", "-o", str(tmp_path / "p.json"), "-q"], capsys)
    assert code == 0 and Program.from_json((tmp_path / "p.json").read_bytes()).ops
    from service.commands.compile import load_primgraph
    from service.batch.common import read_graph_file
    from lowering.errors import GraphError
    path = tmp_path / "big.json"
    path.write_text(json.dumps(big))
    with pytest.raises(GraphError):
        read_graph_file(path)  # the service's limits
    assert load_primgraph(str(path)).ops
