"""The program store: content addressing, compiler-version isolation, replacement rule,
persistence across reopen, WAL mode. Each store test runs on SQLite and on PostgreSQL
(`store_url`, tests/test_store_backends.py)."""
import json

from service.store import ProgramRecord, ProgramStore, program_key
from test_store_backends import store_url  # noqa: F401 - the fixture

GRAPH = "a" * 64


def _record(key, version="1.0", complete=True, predicted=10.0, solution=None):
    return ProgramRecord(key=key, graph_hash=GRAPH, compiler_version=version, options_hash="o" * 64,
                         options={"planner": "naive"}, hardware="spyre", hardware_digest="d" * 64,
                         program=json.dumps({"p": predicted}), stats={"predicted_us": predicted},
                         solution=solution, complete=complete, created_at=1.0, updated_at=1.0)


def test_key_depends_on_every_component():
    base = program_key(GRAPH, "1.0", "o" * 64, "d" * 64)
    assert len(base) == 64
    assert program_key(GRAPH, "1.1", "o" * 64, "d" * 64) != base
    assert program_key("b" * 64, "1.0", "o" * 64, "d" * 64) != base
    assert program_key(GRAPH, "1.0", "p" * 64, "d" * 64) != base
    assert program_key(GRAPH, "1.0", "o" * 64, "e" * 64) != base
    assert program_key(GRAPH, "1.0", "o" * 64, "d" * 64) == base


def test_sqlite_store_uses_wal(tmp_path):
    assert ProgramStore(tmp_path / "store.sqlite").journal_mode() == "wal"


def test_roundtrip_survives_reopen(store_url):
    path = store_url
    store = ProgramStore(path)
    store.put_graph(GRAPH, '{"doc": 1}', "g")
    key = program_key(GRAPH, "1.0", "o" * 64, "d" * 64)
    assert store.put_program(_record(key, solution='{"s": 1}'))
    store.close()

    again = ProgramStore(path)
    rec = again.get_program(key)
    assert rec is not None and rec.program == json.dumps({"p": 10.0}) and rec.solution == '{"s": 1}'
    assert rec.options == {"planner": "naive"} and rec.complete
    assert again.get_graph(GRAPH).document == '{"doc": 1}'
    assert again.counts() == {"graphs": 1, "programs": 1}
    assert again.get_program("f" * 64) is None


def test_other_compiler_versions_are_not_current(store_url):
    store = ProgramStore(store_url)
    old_key = program_key(GRAPH, "0.9", "o" * 64, "d" * 64)
    store.put_program(_record(old_key, version="0.9"))
    # The current compiler computes a different key, so the old row is never a hit...
    assert store.get_program(program_key(GRAPH, "1.0", "o" * 64, "d" * 64)) is None
    # ...and where it is listed, it says it is not current.
    (summary,) = [p.summary("1.0") for p in store.programs_for_graph(GRAPH)]
    assert summary["compiler_version"] == "0.9" and summary["current"] is False


def test_replacement_prefers_complete_then_faster(store_url):
    store = ProgramStore(store_url)
    key = program_key(GRAPH, "1.0", "o" * 64, "d" * 64)
    assert store.put_program(_record(key, complete=False, predicted=5.0))
    # a complete solve replaces an incomplete one even when predicted slower
    assert store.put_program(_record(key, complete=True, predicted=8.0))
    assert store.get_program(key).complete
    # an incomplete one never replaces a complete one
    assert not store.put_program(_record(key, complete=False, predicted=1.0))
    # among complete ones, only a faster plan replaces
    assert not store.put_program(_record(key, complete=True, predicted=9.0))
    assert store.put_program(_record(key, complete=True, predicted=7.0))
    assert store.get_program(key).stats["predicted_us"] == 7.0


def test_the_service_side_never_imports_torch():
    """The service image has no torch: the app, a full in-process compile and the HTTP
    client's service half must not pull it in."""
    import subprocess
    import sys

    from service_helpers import chain_graph

    code = (
        "import json, sys\n"
        "import service.http, service.commands.serve, service.pipeline as p\n"
        f"p.compile_in_process({json.dumps(chain_graph(rows=64))!r}, planner='naive')\n"
        "p.warm_worker()\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:5]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_the_service_compiles_into_either_backend(store_url):
    """The service on a store URL: a miss is solved by a pool worker and stored (the
    worker opens the same store), the repeat is a hit, GET /graphs lists the program."""
    from pathlib import Path

    from fastapi.testclient import TestClient

    from service.http import ServiceConfig, create_app

    tiny = Path(__file__).resolve().parent.parent / "benchmarks" / "graphs" / "tiny"
    document = json.loads((tiny / "linear_tiny_m16_k64_n128.json").read_text())
    request = {"graph": document, "options": {"planner": "heuristic"}}
    with TestClient(create_app(ServiceConfig(store_path=store_url, workers=1))) as client:
        import time

        deadline = time.time() + 120
        while client.get("/readyz").status_code != 200 and time.time() < deadline:
            time.sleep(0.1)
        first = client.post("/compile", json=request)
        assert first.status_code == 200, first.text
        assert first.json()["cached"] is False
        second = client.post("/compile", json=request)
        assert second.status_code == 200 and second.json()["cached"] is True
        assert second.json()["key"] == first.json()["key"]
        graph = client.get(f"/graphs/{first.json()['graph_hash']}").json()
        assert [p["key"] for p in graph["programs"]] == [first.json()["key"]]
    assert ProgramStore(store_url).get_program(first.json()["key"]).complete


def test_store_locations_are_logged_without_their_password():
    from service.store import describe_location
    assert describe_location("postgresql://ci:s3cret@127.0.0.1:5432/db") == "postgresql://ci:***@127.0.0.1:5432/db"
    assert "s3cret" not in describe_location("postgres://u:s3cret@h/db")
    assert describe_location("postgresql://u@h/db") == "postgresql://u@h/db"
    assert describe_location("/var/lib/store.sqlite") == "/var/lib/store.sqlite"
