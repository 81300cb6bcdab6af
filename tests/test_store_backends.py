"""The program store on both backends (SQLite and PostgreSQL): numbered migrations applied
on open (a legacy schema-1 store is upgraded, a newer store refuses to open), round trip,
the replacement rules, and the re-optimization bookkeeping (recorded once, never a
slower plan). PostgreSQL cases need STICKSAT_TEST_PG_URL (.ci/setup/postgres.sh exports
it); each test gets its own schema.

The `store_url` fixture is imported by the other store and reoptimize tests."""
import json
import os
import sqlite3
import uuid

import pytest

from service.store import (MIGRATIONS, SCHEMA_VERSION, ProgramRecord, ProgramStore, Reoptimization,
                           faster_or_proven, program_key)

PG_URL = os.environ.get("STICKSAT_TEST_PG_URL")
GRAPH = "a" * 64


def _with_schema(url: str, schema: str) -> str:
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options=-csearch_path%3D{schema}"


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path):
    """A fresh, empty store location on each backend."""
    if request.param == "sqlite":
        yield str(tmp_path / "store.sqlite")
        return
    if not PG_URL:
        pytest.skip("PostgreSQL store tests need STICKSAT_TEST_PG_URL (set by .ci/setup/postgres.sh)")
    import psycopg

    schema = "t_" + uuid.uuid4().hex[:16]
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield _with_schema(PG_URL, schema)
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def _record(key, version="1.0", complete=True, predicted=10.0, simulated=None, status=None):
    stats = {"predicted_us": predicted}
    if simulated is not None:
        stats["simulated_us"] = simulated
    if status is not None:
        stats["solver_status"] = status
    return ProgramRecord(key=key, graph_hash=GRAPH, compiler_version=version, options_hash="o" * 64,
                         options={"planner": "naive"}, hardware="spyre", hardware_digest="d" * 64,
                         program=json.dumps({"p": predicted}), stats=stats, solution=None, complete=complete,
                         created_at=1.0, updated_at=1.0)


def _entry(key, budget=5.0, outcome="improved", run="r1"):
    return Reoptimization(program_key=key, compiler_version="1.0", hardware_digest="d" * 64, budget_s=budget,
                          graph_hash=GRAPH, run_id=run, outcome=outcome, before_us=10.0, after_us=9.0)


def test_fresh_store_applies_every_migration_once(store_url):
    store = ProgramStore(store_url)
    assert store.schema_migrations() == [(v, name) for v, name, _ in MIGRATIONS]
    assert SCHEMA_VERSION == MIGRATIONS[-1][0] >= 2
    store.put_graph(GRAPH, "{}", "g")
    store.close()
    again = ProgramStore(store_url)  # reopening applies nothing twice and keeps the data
    assert again.schema_migrations() == [(v, name) for v, name, _ in MIGRATIONS]
    assert again.counts() == {"graphs": 1, "programs": 0}
    assert again.integrity_errors() == []


def test_roundtrip_and_replacement_rule(store_url):
    store = ProgramStore(store_url)
    key = program_key(GRAPH, "1.0", "o" * 64, "d" * 64)
    assert store.put_graph(GRAPH, '{"doc": 1}', "g") is True
    assert store.put_graph(GRAPH, '{"doc": 1}', "g") is False
    assert store.put_program(_record(key, complete=False, predicted=5.0))
    assert store.put_program(_record(key, complete=True, predicted=8.0))  # complete beats incomplete
    assert not store.put_program(_record(key, complete=False, predicted=1.0))
    assert not store.put_program(_record(key, complete=True, predicted=9.0))
    assert store.put_program(_record(key, complete=True, predicted=7.0))
    rec = store.get_program(key)
    assert rec.stats["predicted_us"] == 7.0 and rec.complete and rec.options == {"planner": "naive"}
    assert rec.created_at == 1.0  # a replacement keeps when the row was first made
    assert store.graph_hashes() == [(GRAPH, "g")]
    assert [p.key for p in store.programs_for_graph(GRAPH)] == [key]


def test_timestamps_keep_full_precision(store_url):
    store = ProgramStore(store_url)
    key = program_key(GRAPH, "1.0", "o" * 64, "d" * 64)
    rec = _record(key)
    ts = 1764600000.123456
    store.put_program(ProgramRecord(**{**rec.__dict__, "created_at": ts, "updated_at": ts}))
    assert store.get_program(key).updated_at == pytest.approx(ts, abs=1e-5)


def test_reoptimization_is_recorded_once_and_never_stores_a_slower_plan(store_url):
    store = ProgramStore(store_url)
    store.put_graph(GRAPH, "{}", "g")
    key = program_key(GRAPH, "1.0", "o" * 64, "d" * 64)
    store.put_program(_record(key, simulated=10.0, status="FEASIBLE"))
    # slower: recorded as processed, the stored plan stays
    assert store.finish_reoptimization(_entry(key, budget=1.0), _record(key, simulated=11.0)) == (True, False)
    assert store.get_program(key).stats["simulated_us"] == 10.0
    assert store.get_reoptimization(key, "1.0", "d" * 64, 1.0).outcome == "unchanged"
    # faster: replaces
    assert store.finish_reoptimization(_entry(key, budget=2.0), _record(key, simulated=9.0)) == (True, True)
    assert store.get_program(key).stats["simulated_us"] == 9.0
    # the same (key, version, digest, budget) a second time: nothing changes
    assert store.finish_reoptimization(_entry(key, budget=2.0, run="r2"), _record(key, simulated=1.0)) == (False,
                                                                                                          False)
    assert store.get_program(key).stats["simulated_us"] == 9.0
    assert store.get_reoptimization(key, "1.0", "d" * 64, 2.0).run_id == "r1"
    # as fast but proven optimal: replaces (the proof is worth keeping)
    assert store.finish_reoptimization(_entry(key, budget=3.0), _record(key, simulated=9.0, status="OPTIMAL"))[1]
    assert store.get_program(key).stats["solver_status"] == "OPTIMAL"
    # a plan without a simulated time is never stored
    assert store.finish_reoptimization(_entry(key, budget=4.0), _record(key)) == (True, False)
    # a failure is recorded without a program
    assert store.finish_reoptimization(_entry(key, budget=5.0, outcome="failed"), None) == (True, False)
    assert [r.budget_s for r in store.reoptimizations()] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert store.integrity_errors() == []


def test_faster_or_proven_rule():
    assert faster_or_proven({"simulated_us": 9.0}, {"simulated_us": 10.0})
    assert not faster_or_proven({"simulated_us": 10.5}, {"simulated_us": 10.0})
    assert not faster_or_proven({"simulated_us": 10.0}, {"simulated_us": 10.0})
    assert faster_or_proven({"simulated_us": 10.0}, {"simulated_us": 10.0}, old_complete=False)
    assert faster_or_proven({"simulated_us": 10.0, "solver_status": "OPTIMAL"},
                            {"simulated_us": 10.0, "solver_status": "FEASIBLE"})
    assert not faster_or_proven({"predicted_us": 1.0}, {"simulated_us": 10.0})
    assert faster_or_proven({"simulated_us": 10.0}, {"predicted_us": 1.0})  # the old one was never simulated


def test_legacy_schema_1_sqlite_store_is_migrated(tmp_path):
    """A store written before migrations existed (meta schema_version 1, no
    schema_migrations) opens, keeps its rows and gains the reoptimizations table."""
    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
        CREATE TABLE graphs (graph_hash TEXT PRIMARY KEY, name TEXT NOT NULL, document TEXT NOT NULL,
                             created_at REAL NOT NULL);
        CREATE TABLE programs (key TEXT PRIMARY KEY, graph_hash TEXT NOT NULL, compiler_version TEXT NOT NULL,
            options_hash TEXT NOT NULL, options TEXT NOT NULL, hardware TEXT NOT NULL,
            hardware_digest TEXT NOT NULL, program TEXT NOT NULL, stats TEXT NOT NULL, solution TEXT,
            complete INTEGER NOT NULL, created_at REAL NOT NULL, updated_at REAL NOT NULL);
        INSERT INTO meta VALUES ('schema_version', '1');
    """)
    conn.execute("INSERT INTO graphs VALUES (?, 'old', '{}', 1.0)", (GRAPH,))
    conn.commit()
    conn.close()
    store = ProgramStore(path)
    assert [v for v, _ in store.schema_migrations()] == [v for v, _, _ in MIGRATIONS]
    assert store.get_graph(GRAPH).name == "old"
    assert store.reoptimizations() == []
    assert store._execute("SELECT v FROM meta WHERE k = 'schema_version'").fetchone()[0] == str(SCHEMA_VERSION)


def test_a_store_from_a_newer_build_refuses_to_open(store_url):
    store = ProgramStore(store_url)
    with store._transaction():
        store._execute("INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, 'future', 0)",
                       (SCHEMA_VERSION + 1,))
    store.close()
    with pytest.raises(RuntimeError, match="newer sticksat"):
        ProgramStore(store_url)


def test_sqlite_url_form(tmp_path):
    path = tmp_path / "u.sqlite"
    ProgramStore(f"sqlite:///{path}").put_graph(GRAPH, "{}", "g")
    assert ProgramStore(path).has_graph(GRAPH)


def test_postgres_store_reconnects_after_the_server_drops_it(store_url):
    if not store_url.startswith("postgresql"):
        pytest.skip("PostgreSQL only: a SQLite file has no server connection")
    import psycopg

    store = ProgramStore(store_url)
    store.put_graph(GRAPH, "{}", "g")
    pid = store._execute("SELECT pg_backend_pid()").fetchone()[0]
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(psycopg.OperationalError):
        store.has_graph(GRAPH)  # the request in flight when the server dropped the connection fails...
    assert store.has_graph(GRAPH)  # ...the next one reconnects


def _hammer(url, key, values):
    store = ProgramStore(url)
    for v in values:
        store.put_program(_record(key, predicted=v))
    store.close()


def test_concurrent_writers_keep_the_best_row(store_url):
    """Two processes replacing one row with random predicted times: the replacement
    decision and the write are one transaction, so the row ends at the minimum of all."""
    import multiprocessing
    import random

    store = ProgramStore(store_url)
    key = program_key(GRAPH, "1.0", "o" * 64, "d" * 64)
    # decreasing and interleaved: nearly every write of each process replaces the row, so
    # a decision made on a row the other process has just replaced would show
    rng = random.Random(7)
    batches = [sorted((rng.uniform(1.0, 100.0) for _ in range(60)), reverse=True) for _ in range(2)]
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_hammer, args=(store_url, key, b)) for b in batches]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    assert store.get_program(key).stats["predicted_us"] == min(min(b) for b in batches)


def test_graphs_by_structure_key(store_url):
    """`graph_structures` (migration 4): a graph is recorded under its structure key once,
    the lookup lists the newest first and nothing for an unknown key."""
    import time as _time

    store = ProgramStore(store_url)
    assert store.put_structure("shape-free-key", "graph-a") is True
    assert store.put_structure("shape-free-key", "graph-a") is False
    _time.sleep(0.01)
    assert store.put_structure("shape-free-key", "graph-b") is True
    assert store.put_structure("other-key", "graph-c") is True
    assert store.graphs_with_structure("shape-free-key") == ["graph-b", "graph-a"]
    assert store.graphs_with_structure("shape-free-key", limit=1) == ["graph-b"]
    assert store.graphs_with_structure("unknown") == []
