"""The program store: content-addressed, on SQLite (the embedded default, WAL mode) or
PostgreSQL (a store shared by several service replicas and batch workers).

A program is keyed by (graph hash, compiler version, options hash, hardware digest):
the same computation compiled by the same compiler with the same solve options for
the same machine description is the same program, so a repeated /compile is a lookup.
Because the compiler version is part of the key, a store written by an older compiler
never answers a lookup of the current one; its rows stay readable by key and are
marked as not current.

Each row keeps what a later re-optimization needs: the graph document, the program,
its stats, the solver's solution (a warm-start hint) and timestamps. `complete` says
whether the solve ran with the time limit the options asked for; a row cut short by a
client's deadline is a valid plan but not the answer to those options, so lookups
treat it as a warm start, not as a hit.

`ProgramStore(location)`: a file path or `sqlite:///path` for SQLite, a
`postgresql://user:password@host:port/db` URL for PostgreSQL. Both run the same schema,
built by numbered migrations (`MIGRATIONS`) applied when a store is opened and recorded
in `schema_migrations`; a store written by a newer build (a migration this one does not
know) refuses to open. `meta.schema_version` mirrors the latest applied migration.

One connection per thread: sqlite3 and psycopg connections must not be shared across
threads without care, and the service reads on the event loop while writing from a
worker thread. WAL lets SQLite readers proceed while a write is in flight. Every
read-modify-write runs in one transaction that excludes other writers (SQLite `BEGIN
IMMEDIATE`, a PostgreSQL advisory lock on the row's key), so two processes sharing a
store never interleave a replacement decision.
"""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

# Each migration: (version, what it does, statements). `{real}` is the dialect's 8-byte
# float (SQLite REAL, PostgreSQL DOUBLE PRECISION: PostgreSQL's REAL is 4 bytes, too few
# for a timestamp). Migration 1 is the schema every store before migrations had (meta
# schema_version 1), written with IF NOT EXISTS so it applies to such a store unchanged.
MIGRATIONS: tuple[tuple[int, str, tuple[str, ...]], ...] = (
    (1, "graphs, programs and meta", (
        """CREATE TABLE IF NOT EXISTS meta (
            k TEXT PRIMARY KEY,
            v TEXT NOT NULL
        )""",
        """CREATE TABLE IF NOT EXISTS graphs (
            graph_hash TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            document TEXT NOT NULL,
            created_at {real} NOT NULL
        )""",
        """CREATE TABLE IF NOT EXISTS programs (
            key TEXT PRIMARY KEY,
            graph_hash TEXT NOT NULL,
            compiler_version TEXT NOT NULL,
            options_hash TEXT NOT NULL,
            options TEXT NOT NULL,
            hardware TEXT NOT NULL,
            hardware_digest TEXT NOT NULL,
            program TEXT NOT NULL,
            stats TEXT NOT NULL,
            solution TEXT,
            complete INTEGER NOT NULL,
            created_at {real} NOT NULL,
            updated_at {real} NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS programs_by_graph ON programs (graph_hash)",
    )),
    (2, "reoptimizations: what each batch re-optimization processed (sticksat reoptimize)", (
        """CREATE TABLE IF NOT EXISTS reoptimizations (
            program_key TEXT NOT NULL,
            compiler_version TEXT NOT NULL,
            hardware_digest TEXT NOT NULL,
            budget_s {real} NOT NULL,
            graph_hash TEXT NOT NULL,
            run_id TEXT NOT NULL,
            outcome TEXT NOT NULL,
            before_us {real},
            after_us {real},
            solver_status TEXT,
            seconds {real},
            error TEXT,
            finished_at {real} NOT NULL,
            PRIMARY KEY (program_key, compiler_version, hardware_digest, budget_s)
        )""",
    )),
)
SCHEMA_VERSION = MIGRATIONS[-1][0]

_REAL = {"sqlite": "REAL", "postgresql": "DOUBLE PRECISION"}
# Any constant: the advisory lock that serializes migrations of one PostgreSQL database.
_MIGRATION_LOCK = 0x5717C5A7


def is_postgres_url(location: str | os.PathLike[str]) -> bool:
    text = str(location)
    return text.startswith("postgresql://") or text.startswith("postgres://")


def describe_location(location: str | os.PathLike[str]) -> str:
    """The store location without a password (for logs and tables)."""
    text = str(location)
    if is_postgres_url(text) and "@" in text.split("//", 1)[1]:
        scheme, rest = text.split("//", 1)
        creds, host = rest.rsplit("@", 1)
        return f"{scheme}//{creds.split(':', 1)[0]}:***@{host}" if ":" in creds else text
    return text


def program_key(graph_hash: str, compiler_version: str, options_hash: str, hardware_digest: str) -> str:
    """The content address of a compiled program."""
    material = "\x1f".join(("sticksat.program.v1", graph_hash, compiler_version, options_hash, hardware_digest))
    return hashlib.sha256(material.encode()).hexdigest()


@dataclass(frozen=True)
class GraphRecord:
    graph_hash: str
    name: str
    document: str  # the graph document JSON as received (after validation)
    created_at: float


@dataclass(frozen=True)
class ProgramRecord:
    key: str
    graph_hash: str
    compiler_version: str
    options_hash: str
    options: dict[str, Any]
    hardware: str
    hardware_digest: str
    program: str  # the SuperDSC program JSON, exactly as the planner emitted it
    stats: dict[str, Any]
    solution: Optional[str]  # the planner's warm-start hint (JSON), if it exposes one
    complete: bool
    created_at: float
    updated_at: float

    @classmethod
    def empty(cls, *, key: str, graph_hash: str, compiler_version: str, options_hash: str,
              options: dict[str, Any], hardware: str, hardware_digest: str) -> "ProgramRecord":
        """A row's key fields, no program yet (`StoreSlot.record` fills it in)."""
        return cls(key, graph_hash, compiler_version, options_hash, options, hardware, hardware_digest,
                   program="", stats={}, solution=None, complete=False, created_at=0.0, updated_at=0.0)

    def summary(self, current_version: str) -> dict[str, Any]:
        return {
            "key": self.key,
            "graph_hash": self.graph_hash,
            "compiler_version": self.compiler_version,
            "current": self.compiler_version == current_version,
            "options": self.options,
            "hardware": self.hardware,
            "hardware_digest": self.hardware_digest,
            "complete": self.complete,
            "predicted_us": self.stats.get("predicted_us"),
            "simulated_us": self.stats.get("simulated_us"),
            "solver_status": self.stats.get("solver_status"),
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


def _predicted(stats: dict[str, Any]) -> float:
    # The simulated time when the service measured it, else the planner's prediction.
    value = stats.get("simulated_us", stats.get("predicted_us"))
    return float(value) if isinstance(value, (int, float)) else float("inf")


def _simulated(stats: dict[str, Any]) -> float:
    value = stats.get("simulated_us")
    return float(value) if isinstance(value, (int, float)) else float("inf")


def faster_or_proven(new_stats: dict[str, Any], old_stats: dict[str, Any], old_complete: bool = True,
                     rel_tol: float = 1e-9) -> bool:
    """Whether a re-optimized plan (`new_stats`) should replace a stored one: strictly
    faster on the simulator, or as fast and either proven optimal where the stored one
    is not or answering its options where the stored one was cut short. Never a slower
    plan, and never one without a simulated time."""
    new, old = _simulated(new_stats), _simulated(old_stats)
    if new == float("inf"):
        return False
    if new < old * (1.0 - rel_tol):
        return True
    if new > old * (1.0 + rel_tol):
        return False
    new_optimal = str(new_stats.get("solver_status") or "").upper() == "OPTIMAL"
    old_optimal = str(old_stats.get("solver_status") or "").upper() == "OPTIMAL"
    return (new_optimal and not old_optimal) or not old_complete


@dataclass(frozen=True)
class Reoptimization:
    """One processed (program key, compiler version, hardware digest, budget): the row
    `sticksat reoptimize` writes with its result, so a rerun skips it."""

    program_key: str
    compiler_version: str
    hardware_digest: str
    budget_s: float
    graph_hash: str
    run_id: str
    outcome: str  # improved | proved | unchanged | new | failed
    before_us: Optional[float] = None
    after_us: Optional[float] = None
    solver_status: Optional[str] = None
    seconds: Optional[float] = None
    error: Optional[str] = None
    finished_at: float = 0.0


_REOPT_COLUMNS = ("program_key, compiler_version, hardware_digest, budget_s, graph_hash, run_id, outcome, "
                  "before_us, after_us, solver_status, seconds, error, finished_at")


class ProgramStore:
    """Thread-safe access to one store (a SQLite file or a PostgreSQL database)."""

    def __init__(self, location: str | os.PathLike[str]):
        text = str(location)
        self.location = text
        if is_postgres_url(text):
            self.backend = "postgresql"
            self.path: Optional[Path] = None
        else:
            self.backend = "sqlite"
            self.path = Path(text[len("sqlite:///"):] if text.startswith("sqlite:///") else text)
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._write_lock = threading.Lock()
        self._migrate()

    def __repr__(self) -> str:
        return f"ProgramStore({describe_location(self.location)!r})"

    # -- connections ---------------------------------------------------------------
    def _conn(self):
        conn = getattr(self._local, "conn", None)
        if conn is not None and self.backend == "postgresql" and (conn.closed or conn.broken):
            self._local.conn = conn = None  # the server went away: reconnect on next use
        if conn is None:
            if self.backend == "sqlite":
                # Autocommit: transactions are explicit (`_transaction`, BEGIN IMMEDIATE).
                conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
                conn.execute("PRAGMA journal_mode=WAL")
                # WAL + NORMAL: a commit is durable against a process crash, and does not
                # fsync on every write (an OS crash may lose the last few compiles, which a
                # cache can afford).
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.execute("PRAGMA busy_timeout=30000")
            else:
                import psycopg

                conn = psycopg.connect(self.location, autocommit=True, connect_timeout=30)
            self._local.conn = conn
        return conn

    def _execute(self, sql: str, params: tuple = ()):
        if self.backend == "postgresql":
            sql = sql.replace("?", "%s")
        return self._conn().execute(sql, params)

    @contextmanager
    def _transaction(self, lock_key: Optional[str] = None) -> Iterator[None]:
        """One write transaction that excludes other writers of the same row (PostgreSQL:
        an advisory lock on `lock_key`) or of the whole store (SQLite: BEGIN IMMEDIATE)."""
        conn = self._conn()
        with self._write_lock:
            if self.backend == "sqlite":
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
            else:
                with conn.transaction():
                    if lock_key is not None:
                        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (lock_key,))
                    yield

    def _migrate(self) -> None:
        real = _REAL[self.backend]
        with self._transaction():
            if self.backend == "postgresql":
                self._execute("SELECT pg_advisory_xact_lock(?)", (_MIGRATION_LOCK,))
            self._execute(f"CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, "
                          f"name TEXT NOT NULL, applied_at {real} NOT NULL)")
            applied = {int(r[0]) for r in self._execute("SELECT version FROM schema_migrations").fetchall()}
            known = {version for version, _, _ in MIGRATIONS}
            unknown = sorted(applied - known)
            if unknown:
                raise RuntimeError(f"store {describe_location(self.location)} has schema migrations {unknown} "
                                   f"this build does not know (it reads up to {SCHEMA_VERSION}): "
                                   f"a newer sticksat wrote it")
            for version, name, statements in MIGRATIONS:
                if version in applied:
                    continue
                for statement in statements:
                    self._execute(statement.format(real=real))
                self._execute("INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                              (version, name, time.time()))
            self._execute("INSERT INTO meta (k, v) VALUES ('schema_version', ?) "
                          "ON CONFLICT (k) DO UPDATE SET v = excluded.v", (str(SCHEMA_VERSION),))

    def schema_migrations(self) -> list[tuple[int, str]]:
        rows = self._execute("SELECT version, name FROM schema_migrations ORDER BY version").fetchall()
        return [(int(v), str(n)) for v, n in rows]

    def journal_mode(self) -> str:
        if self.backend != "sqlite":
            return self.backend
        return str(self._conn().execute("PRAGMA journal_mode").fetchone()[0])

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    # -- graphs --------------------------------------------------------------------
    def put_graph(self, graph_hash: str, document: str, name: str = "") -> bool:
        """Store a graph document once (by hash). Returns whether it was new."""
        with self._transaction(graph_hash):
            cur = self._execute(
                "INSERT INTO graphs (graph_hash, name, document, created_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (graph_hash) DO NOTHING",
                (graph_hash, name, document, time.time()),
            )
            return cur.rowcount == 1

    def get_graph(self, graph_hash: str) -> Optional[GraphRecord]:
        row = self._execute(
            "SELECT graph_hash, name, document, created_at FROM graphs WHERE graph_hash = ?", (graph_hash,)
        ).fetchone()
        return GraphRecord(*row) if row else None

    def has_graph(self, graph_hash: str) -> bool:
        row = self._execute("SELECT 1 FROM graphs WHERE graph_hash = ?", (graph_hash,)).fetchone()
        return row is not None

    def graph_hashes(self) -> list[tuple[str, str]]:
        """(graph hash, name) of every stored graph, by name then hash."""
        rows = self._execute("SELECT graph_hash, name FROM graphs ORDER BY name, graph_hash").fetchall()
        return [(str(h), str(n)) for h, n in rows]

    # -- programs ------------------------------------------------------------------
    _PROGRAM_COLUMNS = (
        "key, graph_hash, compiler_version, options_hash, options, hardware, hardware_digest, "
        "program, stats, solution, complete, created_at, updated_at"
    )

    @staticmethod
    def _program_from_row(row: tuple) -> ProgramRecord:
        (key, graph_hash, version, options_hash, options, hardware, digest, program, stats, solution,
         complete, created_at, updated_at) = row
        return ProgramRecord(key, graph_hash, version, options_hash, json.loads(options), hardware, digest,
                             program, json.loads(stats), solution, bool(complete), created_at, updated_at)

    def get_program(self, key: str) -> Optional[ProgramRecord]:
        row = self._execute(
            f"SELECT {self._PROGRAM_COLUMNS} FROM programs WHERE key = ?", (key,)
        ).fetchone()
        return self._program_from_row(row) if row else None

    def programs_for_graph(self, graph_hash: str) -> list[ProgramRecord]:
        rows = self._execute(
            f"SELECT {self._PROGRAM_COLUMNS} FROM programs WHERE graph_hash = ? ORDER BY created_at", (graph_hash,)
        ).fetchall()
        return [self._program_from_row(r) for r in rows]

    def _write_program(self, record: ProgramRecord, created_at: float) -> None:
        self._execute(
            f"INSERT INTO programs ({self._PROGRAM_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?) "
            "ON CONFLICT (key) DO UPDATE SET graph_hash = excluded.graph_hash, "
            "compiler_version = excluded.compiler_version, options_hash = excluded.options_hash, "
            "options = excluded.options, hardware = excluded.hardware, hardware_digest = excluded.hardware_digest, "
            "program = excluded.program, stats = excluded.stats, solution = excluded.solution, "
            "complete = excluded.complete, created_at = excluded.created_at, updated_at = excluded.updated_at",
            (record.key, record.graph_hash, record.compiler_version, record.options_hash,
             json.dumps(record.options, sort_keys=True), record.hardware, record.hardware_digest,
             record.program, json.dumps(record.stats, sort_keys=True), record.solution,
             int(record.complete), created_at, record.updated_at),
        )

    def put_program(self, record: ProgramRecord) -> bool:
        """Insert, or replace the row under the same key when the new one is better:
        a complete solve replaces an incomplete one; among equals, a lower predicted
        time wins. Returns whether the row now holds `record`."""
        with self._transaction(record.key):
            row = self._execute("SELECT complete, stats, created_at FROM programs WHERE key = ?",
                                (record.key,)).fetchone()
            created_at = record.created_at
            if row is not None:
                old_complete, old_stats, created_at = bool(row[0]), json.loads(row[1]), row[2]
                better = (record.complete and not old_complete) or (
                    record.complete == old_complete and _predicted(record.stats) < _predicted(old_stats))
                if not better:
                    return False
            self._write_program(record, created_at)
            return True

    def counts(self) -> dict[str, int]:
        return {
            "graphs": int(self._execute("SELECT COUNT(*) FROM graphs").fetchone()[0]),
            "programs": int(self._execute("SELECT COUNT(*) FROM programs").fetchone()[0]),
        }

    # -- batch re-optimization ---------------------------------------------------------
    def get_reoptimization(self, program_key: str, compiler_version: str, hardware_digest: str,
                           budget_s: float) -> Optional[Reoptimization]:
        row = self._execute(
            f"SELECT {_REOPT_COLUMNS} FROM reoptimizations WHERE program_key = ? AND compiler_version = ? "
            "AND hardware_digest = ? AND budget_s = ?",
            (program_key, compiler_version, hardware_digest, float(budget_s)),
        ).fetchone()
        return Reoptimization(*row) if row else None

    def reoptimizations(self) -> list[Reoptimization]:
        rows = self._execute(f"SELECT {_REOPT_COLUMNS} FROM reoptimizations ORDER BY finished_at").fetchall()
        return [Reoptimization(*r) for r in rows]

    def finish_reoptimization(self, entry: Reoptimization, record: Optional[ProgramRecord]) -> tuple[bool, bool]:
        """Commit one re-optimization result in one transaction: replace the program under
        `record.key` when `faster_or_proven` says so, and record `entry` as processed.
        Returns (recorded, replaced): `recorded` is False when this (key, version, digest,
        budget) was already processed (another worker or an earlier run), and then
        nothing changes."""
        with self._transaction(entry.program_key):
            done = self._execute(
                "SELECT 1 FROM reoptimizations WHERE program_key = ? AND compiler_version = ? "
                "AND hardware_digest = ? AND budget_s = ?",
                (entry.program_key, entry.compiler_version, entry.hardware_digest, float(entry.budget_s)),
            ).fetchone()
            if done is not None:
                return False, False
            replaced = False
            outcome = entry.outcome
            if record is not None:
                row = self._execute("SELECT complete, stats, created_at FROM programs WHERE key = ?",
                                    (record.key,)).fetchone()
                if row is None:
                    replaced = _simulated(record.stats) < float("inf")
                    created_at = record.created_at
                else:
                    replaced = faster_or_proven(record.stats, json.loads(row[1]), bool(row[0]))
                    created_at = row[2]
                if replaced:
                    self._write_program(record, created_at)
                elif outcome in ("improved", "proved", "new"):
                    outcome = "unchanged"  # the row changed since the job started; it stays
            values = (entry.program_key, entry.compiler_version, entry.hardware_digest, float(entry.budget_s),
                      entry.graph_hash, entry.run_id, outcome, entry.before_us, entry.after_us,
                      entry.solver_status, entry.seconds, entry.error, entry.finished_at or time.time())
            self._execute(f"INSERT INTO reoptimizations ({_REOPT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                          values)
            return True, replaced

    def integrity_errors(self) -> list[str]:
        """What is wrong with the store's tables: SQLite's integrity check, and for both
        backends rows whose JSON does not parse or whose graph is missing."""
        errors: list[str] = []
        if self.backend == "sqlite":
            verdict = [str(r[0]) for r in self._execute("PRAGMA integrity_check").fetchall()]
            if verdict != ["ok"]:
                errors.extend(verdict)
        for key, graph_hash, program, stats in self._execute(
                "SELECT key, graph_hash, program, stats FROM programs").fetchall():
            try:
                json.loads(program)
                json.loads(stats)
            except ValueError as exc:
                errors.append(f"program {key}: {exc}")
        orphans = self._execute("SELECT COUNT(*) FROM programs p WHERE NOT EXISTS "
                                "(SELECT 1 FROM graphs g WHERE g.graph_hash = p.graph_hash)").fetchone()[0]
        if orphans:
            errors.append(f"{orphans} programs without their graph")
        return errors
