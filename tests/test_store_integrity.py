"""The store checks itself (docs/reliability.md, "The store"): a row whose program does not
hold up is quarantined and compiled again, never served; a clean close leaves the whole
store in the main file; an online backup restores; acknowledged writes a damaged WAL tail
dropped are named on the next open; a damaged page makes the store unhealthy and its
reads raise StoreDamaged (not a generic error)."""
from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from service.cli import main
from service.store import ProgramRecord, ProgramStore
from service.store_integrity import StoreDamaged, StoreError
from test_store_backends import store_url  # noqa: F401 - the fixture

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "benchmarks" / "graphs" / "tiny"


def _record(key: str, graph: str = "g" * 64, payload: int = 0, version: str = "1.0") -> ProgramRecord:
    return ProgramRecord(key=key, graph_hash=graph, compiler_version=version, options_hash="o" * 64,
                         options={"planner": "naive"}, hardware="spyre", hardware_digest="d" * 64,
                         program=json.dumps({"ops": [payload] * 8, "key": key}), stats={"predicted_us": 1.0},
                         solution=None, complete=True, created_at=1.0, updated_at=1.0)


def _raw(store_url: str):
    """A raw connection (sqlite3 or psycopg) to poison rows behind the store's back."""
    if store_url.startswith("postgresql"):
        import psycopg

        return psycopg.connect(store_url, autocommit=True), "%s"
    return sqlite3.connect(store_url, isolation_level=None), "?"


def _poison(store_url: str, key: str, column: str, value: str) -> None:
    conn, q = _raw(store_url)
    try:
        conn.execute(f"UPDATE programs SET {column} = {q} WHERE key = {q}", (value, key))
    finally:
        conn.close()


@pytest.mark.parametrize("column,value,reason", [
    ("program", '{"ops": [0, 0, 0', "checksum"),                 # cut short: would be a 200 whose body is not JSON
    ("program", '{"ops": [1, 0, 0, 0, 0, 0, 0, 0]}', "checksum"),  # parses, but not what was written
    ("stats", "{not json", "stats does not parse"),               # used to 500 on every lookup of the key
    ("options", "[]", "options is a JSON list"),
])
def test_an_unsound_row_is_quarantined_not_served(store_url, column, value, reason):
    store = ProgramStore(store_url)
    store.put_program(_record("k1"))
    store.put_program(_record("k2", payload=2))
    _poison(store_url, "k1", column, value)
    assert store.get_program("k1") is None          # a miss: the key compiles again
    assert store.get_program("k2").program == _record("k2", payload=2).program
    [q] = store.quarantined_rows()
    assert q["key"] == "k1" and reason in q["reason"]
    assert store.counts()["programs"] == 1 and store.quarantined == 1
    assert store.put_program(_record("k1"))           # the recompiled program takes its key again
    assert json.loads(store.get_program("k1").program)["key"] == "k1"


def test_an_unsound_row_never_competes_with_its_replacement(store_url):
    store = ProgramStore(store_url)
    store.put_program(_record("k1"))
    _poison(store_url, "k1", "program", "garbage")
    # the poisoned row is complete and as fast: without the check it would be kept
    assert store.put_program(_record("k1", payload=5))
    assert json.loads(store.get_program("k1").program)["ops"][0] == 5


def test_the_service_recompiles_a_poisoned_key(store_url):
    """Through /compile: the poisoned row is not served (it was a 200 with a body that is
    not JSON), the key is compiled again (cached: false) and then served from the store."""
    from fastapi.testclient import TestClient

    from service.app import ServiceConfig, create_app

    document = json.loads((TINY / "linear_tiny_m16_k64_n128.json").read_text())
    request = {"graph": document, "options": {"planner": "heuristic"}}
    with TestClient(create_app(ServiceConfig(store_path=store_url, workers=1))) as client:
        deadline = time.time() + 120
        while client.get("/readyz").status_code != 200 and time.time() < deadline:
            time.sleep(0.1)
        first = client.post("/compile", json=request)
        assert first.status_code == 200, first.text
        key = first.json()["key"]
        _poison(store_url, key, "program", first.text[:40])
        again = client.post("/compile", json=request)
        assert again.status_code == 200, again.text
        body = again.json()  # JSON, and a fresh compile
        assert body["key"] == key and body["cached"] is False
        assert body["program"]["ops"] == first.json()["program"]["ops"]
        third = client.post("/compile", json=request)
        assert third.status_code == 200 and third.json()["cached"] is True
    assert [q["key"] for q in ProgramStore(store_url).quarantined_rows()] == [key]


def test_rows_from_before_checksums_are_verified_then_given_one(tmp_path):
    path = tmp_path / "store.sqlite"
    store = ProgramStore(path)
    store.put_program(_record("good"))
    store.put_program(_record("bad"))
    store.close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("UPDATE programs SET program_crc32 = NULL")  # as migration 3 leaves older rows
    conn.execute("UPDATE programs SET program = 'not json' WHERE key = 'bad'")
    conn.close()
    store = ProgramStore(path)
    assert store.get_program("good") is not None and store.get_program("bad") is None
    sha = sqlite3.connect(path).execute("SELECT program_crc32 FROM programs WHERE key = 'good'").fetchone()[0]
    assert sha is not None and len(sha) == 8


def test_a_clean_close_leaves_the_whole_store_in_the_main_file(tmp_path):
    path = tmp_path / "store.sqlite3"
    store = ProgramStore(path)
    for i in range(20):
        store.put_program(_record(f"k{i}", payload=i))
    # while open, the rows are in the -wal file: the main file alone is an empty store
    shutil.copy(path, tmp_path / "copy_open.sqlite3")
    assert ProgramStore(tmp_path / "copy_open.sqlite3").counts()["programs"] == 0
    store.close()
    wal = Path(str(path) + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0
    shutil.copy(path, tmp_path / "copy_closed.sqlite3")
    assert ProgramStore(tmp_path / "copy_closed.sqlite3").counts()["programs"] == 20


def test_backup_of_a_live_store_restores(tmp_path, capsys):
    path = tmp_path / "store.sqlite3"
    store = ProgramStore(path)
    store.put_graph("g" * 64, json.dumps({"name": "g"}), "g")
    for i in range(30):
        store.put_program(_record(f"k{i}", payload=i))
    # the store stays open (its rows in the WAL) while the backup runs
    dest = tmp_path / "backups" / "store-backup.sqlite3"
    assert main(["store", "backup", str(dest), "--store", str(path)]) == 0
    assert "30 programs" in capsys.readouterr().out
    assert not Path(str(dest) + "-wal").exists()
    # restore: stop the server, put the backup in place, start again
    restored = tmp_path / "restored.sqlite3"
    shutil.copy(dest, restored)
    again = ProgramStore(restored)
    assert again.counts() == {"graphs": 1, "programs": 30}
    assert again.check().ok
    assert json.loads(again.get_program("k7").program)["ops"][0] == 7
    # a backup never overwrites a file
    assert main(["store", "backup", str(dest), "--store", str(path)]) == 2
    assert "exists" in capsys.readouterr().err
    store.put_program(_record("k-late"))


def test_backup_of_postgres_points_to_pg_dump(store_url):
    if not store_url.startswith("postgresql"):
        pytest.skip("PostgreSQL only")
    with pytest.raises(StoreError, match="pg_dump"):
        ProgramStore(store_url).backup("/tmp/never-written.sqlite3")


_WRITER = """
import json, os, sys
from service.store import ProgramRecord, ProgramStore
store = ProgramStore(sys.argv[1])
for i in range(60):
    store.put_program(ProgramRecord(key=f"key{i:02d}", graph_hash="g" * 64, compiler_version="1.0",
        options_hash="o" * 64, options={}, hardware="spyre", hardware_digest="d" * 64,
        program=json.dumps({"i": i, "pad": "x" * 600}), stats={"predicted_us": 1.0}, solution=None,
        complete=True, created_at=1.0, updated_at=1.0))
    print(f"key{i:02d}", flush=True)   # acknowledged: put_program returned
os._exit(0)   # like kill -9: no close, no checkpoint
"""


def _wal_frames(wal: Path) -> tuple[int, int]:
    header = wal.read_bytes()[:32]
    page_size = int.from_bytes(header[8:12], "big")
    return page_size, (wal.stat().st_size - 32) // (24 + page_size)


def test_acknowledged_writes_a_garbled_wal_dropped_are_reported(tmp_path):
    path = tmp_path / "store.sqlite3"
    out = subprocess.run([sys.executable, "-c", _WRITER, str(path)], capture_output=True, text=True, check=True,
                         cwd=REPO, timeout=120)
    acknowledged = out.stdout.split()
    assert len(acknowledged) == 60
    wal = Path(str(path) + "-wal")
    page_size, frames = _wal_frames(wal)
    assert frames > 60
    # garble one frame two thirds in: SQLite's recovery drops it and every frame after it
    at = 32 + (2 * frames // 3) * (24 + page_size) + 24 + 100
    data = bytearray(wal.read_bytes())
    data[at:at + 64] = b"\xa5" * 64
    wal.write_bytes(bytes(data))

    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"   # SQLite alone sees nothing wrong
    present = {r[0] for r in raw.execute("SELECT key FROM programs")}
    raw.close()
    missing = set(acknowledged) - present
    assert missing and len(present) < 60, (len(missing), len(present))
    print(f"garbled WAL: {len(missing)} of 60 acknowledged programs lost")

    store = ProgramStore(path)
    assert {a.ident for a in store.lost_writes if a.kind == "program"} == missing
    check = store.check()
    assert not check.ok and check.integrity == []
    [event] = check.lost_writes
    assert event["writes"] == len(missing) and {x["id"] for x in event["lost"]} == missing
    assert store.health().ok and store.health().lost_writes == len(missing)   # reported, still serving
    # new writes go on past the lost numbers; the loss is reported once, not on every open
    store.put_program(_record("after"))
    store.close()
    again = ProgramStore(path)
    assert again.lost_writes == [] and again.get_program("after") is not None
    assert len(again.check().lost_writes) == 1
    again.close()
    # the operator has seen it: report once more, then forget it
    assert main(["store", "check", "--store", str(path), "--clear-lost-writes"]) == 1
    assert ProgramStore(path).check().lost_writes == []


def _damage_a_table_page(path: Path) -> None:
    conn = sqlite3.connect(path)
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.close()
    data = bytearray(path.read_bytes())
    for page in range(pages // 2, pages - 1):   # pages of the programs table (the bulk of the file)
        at = page * page_size
        data[at:at + 16] = b"\xff" * 16            # a b-tree page header no reader accepts
    path.write_bytes(bytes(data))


def test_a_damaged_page_makes_the_store_unhealthy(tmp_path, capsys):
    path = tmp_path / "store.sqlite3"
    store = ProgramStore(path)
    for i in range(200):
        store.put_program(_record(f"k{i:03d}", payload=i))
    store.close()
    _damage_a_table_page(path)
    store = ProgramStore(path)
    health = store.health()
    assert not health.ok and health.problems[0].startswith("integrity:")
    from service.problems import store_problem

    errors = []
    for i in range(200):
        try:
            store.get_program(f"k{i:03d}")
        except StoreDamaged as exc:
            errors.append(exc)
    assert errors   # the damaged keys raise StoreDamaged, not a generic error
    problem = store_problem(errors[0])
    assert (problem.status, problem.code, problem.headers["Retry-After"]) == (503, "store_damaged", "60")
    assert main(["store", "check", "--store", str(path)]) == 1
    out = capsys.readouterr().out
    assert "problems found" in out and "integrity (integrity_check):" in out


def test_store_check_command(tmp_path, capsys):
    path = tmp_path / "store.sqlite3"
    store = ProgramStore(path)
    store.put_graph("g" * 64, json.dumps({"name": "g"}), "g")
    store.put_program(_record("k1"))
    store.put_program(_record("k2"))
    store.close()
    assert main(["store", "check", "--store", str(path)]) == 0
    assert capsys.readouterr().out.strip().endswith("ok")
    _poison(str(path), "k2", "program", "{")
    assert main(["store", "check", "--store", str(path), "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["quarantined"][0]["key"] == "k2" and result["programs"] == 1
    assert main(["store", "check", "--store", str(path), "--quick"]) == 0   # quarantined: sound again


def test_a_served_store_is_one_file_after_sigterm(tmp_path):
    """The issue's case on a real `sticksat serve`: compile, stop it with SIGTERM, copy
    only store.sqlite3: the copy holds the program (it used to be an empty store)."""
    import httpx

    from service_helpers import ServiceProcess

    path = tmp_path / "store.sqlite3"
    server = ServiceProcess(path, tmp_path / "server.log", ["--workers", "1"]).start()
    try:
        document = json.loads((TINY / "linear_tiny_m16_k64_n128.json").read_text())
        reply = httpx.post(server.url + "/compile", json={"graph": document, "options": {"planner": "heuristic"}},
                           timeout=120)
        assert reply.status_code == 200, reply.text
    finally:
        server.stop()
    shutil.copy(path, tmp_path / "copy.sqlite3")
    copy = ProgramStore(tmp_path / "copy.sqlite3")
    assert copy.get_program(reply.json()["key"]) is not None and copy.check().ok


def test_a_full_disk_is_store_full_until_a_write_succeeds(tmp_path):
    """SQLite's SQLITE_FULL (here from max_page_count, what a full disk returns too) is
    StoreFull (the service's 507 store_full), and health() says so until a write works."""
    from service.problems import store_problem
    from service.store_integrity import StoreFull

    store = ProgramStore(tmp_path / "store.sqlite3")
    store.put_program(_record("k0"))
    conn = store._conn()
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages}")
    big = replace(_record("k1"), program=json.dumps({"pad": "x" * 200_000}))
    with pytest.raises(StoreFull) as info:
        store.put_program(big)
    health = store.health()
    assert not health.ok and health.problems[0].startswith("full:")
    problem = store_problem(info.value)
    assert (problem.status, problem.code, problem.headers["Retry-After"]) == (507, "store_full", "30")
    assert store.get_program("k0") is not None  # reads go on
    conn.execute("PRAGMA max_page_count = 1073741823")
    assert store.put_program(big)
    assert store.health().ok


_CONCURRENT = """
import json, sys
from service.store import ProgramRecord, ProgramStore
store = ProgramStore(sys.argv[1])
for i in range(60):
    key = f"{sys.argv[2]}{i:02d}"
    store.put_graph(key.ljust(64, "0"), "{}", key)
    store.put_program(ProgramRecord(key=key, graph_hash=key.ljust(64, "0"), compiler_version="1.0",
        options_hash="o" * 64, options={}, hardware="spyre", hardware_digest="d" * 64,
        program=json.dumps({"i": i}), stats={"predicted_us": 1.0}, solution=None, complete=True,
        created_at=1.0, updated_at=1.0))
    if i % 20 == 19:
        store.close()   # checkpoints and compacts the journal while the other process writes
store.close()
"""


def test_processes_sharing_a_store_raise_no_false_alarm(tmp_path):
    path = tmp_path / "store.sqlite3"
    ProgramStore(path).close()
    procs = [subprocess.Popen([sys.executable, "-c", _CONCURRENT, str(path), tag], cwd=REPO) for tag in "ab"]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    store = ProgramStore(path)
    assert store.lost_writes == [] and store.counts() == {"graphs": 120, "programs": 120}
    assert store.write_seq() == 240 and store.check().lost_writes == []
