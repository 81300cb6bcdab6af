"""`sticksat store add` / `sticksat store list` on both backends: documents validated as
/compile validates them (a bad one is rejected with its code, nothing stored), a
torch.export-free path, the listing's fields for a graph with and without programs."""
import json
from pathlib import Path

from service.cli import main
from service.store import ProgramStore
from test_store_backends import store_url  # noqa: F401 - the fixture

TINY = Path(__file__).resolve().parent.parent / "benchmarks" / "graphs" / "tiny"


def test_store_add_validates_and_list_reports(store_url, tmp_path, capsys):
    good = [str(TINY / "linear_tiny_m16_k64_n128.json"), str(TINY / "bmm_tiny_b4_m32_k64_n32.json")]
    bad = tmp_path / "bad.json"
    doc = json.loads(Path(good[0]).read_text())
    doc["nodes"][0]["target"] = "aten.not_an_op.default"  # parses, but /compile would answer 422
    bad.write_text(json.dumps(doc))
    assert main(["store", "add", *good, str(bad), "--store", store_url, "--json"]) == 1
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["ok"] for x in lines] == [True, True, False]
    assert lines[0]["new"] and lines[2]["error"]["code"] in ("unsupported_op", "unknown_op", "schema")
    store = ProgramStore(store_url)
    assert store.counts() == {"graphs": 2, "programs": 0}
    # adding again: already stored, still success
    assert main(["store", "add", good[0], "--store", store_url]) == 0
    assert "already stored" in capsys.readouterr().out

    from service.batch.inventory import compile_into_store

    linear_hash = lines[0]["graph_hash"]
    row = compile_into_store(store, linear_hash, planner="heuristic")
    assert row is not None and row.complete
    assert main(["store", "list", "--store", store_url, "--json"]) == 0
    listing = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(listing) == {"linear_tiny_m16_k64_n128", "bmm_tiny_b4_m32_k64_n32"}
    lin = listing["linear_tiny_m16_k64_n128"]
    assert lin["graph_hash"] == linear_hash and lin["programs"] == 1 and lin["planner"] == "heuristic"
    assert lin["current"] is True and lin["complete"] is True and lin["key"] == row.key
    assert lin["simulated_us"] == row.stats["simulated_us"] > 0
    assert lin["gap"] == row.stats["simulated_us"] / row.stats["lower_bound_us"] - 1.0 >= 0
    assert lin["solved_at"] == row.updated_at and len(lin["hardware_digest"]) == 64
    assert listing["bmm_tiny_b4_m32_k64_n32"]["programs"] == 0
    assert listing["bmm_tiny_b4_m32_k64_n32"]["simulated_us"] is None
    # the readable table names both graphs
    assert main(["store", "list", "--store", store_url]) == 0
    out = capsys.readouterr().out
    assert "linear_tiny_m16_k64_n128" in out and "bmm_tiny_b4_m32_k64_n32" in out and "heuristic" in out
