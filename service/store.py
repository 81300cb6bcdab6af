"""The program store: SQLite in WAL mode, content-addressed.

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

One connection per thread: sqlite3 connections must not be shared across threads
without care, and the service reads on the event loop while writing from a worker
thread. WAL lets those readers proceed while a write is in flight.
"""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    k TEXT PRIMARY KEY,
    v TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS graphs (
    graph_hash TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    document TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS programs (
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
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS programs_by_graph ON programs (graph_hash);
"""


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


class ProgramStore:
    """Thread-safe access to one store file."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._write_lock = threading.Lock()
        conn = self._conn()
        with self._write_lock:
            conn.executescript(_SCHEMA)
            row = conn.execute("SELECT v FROM meta WHERE k = 'schema_version'").fetchone()
            if row is None:
                conn.execute("INSERT INTO meta (k, v) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) != SCHEMA_VERSION:
                raise RuntimeError(f"store {self.path} has schema version {row[0]}, this build reads {SCHEMA_VERSION}")
            conn.commit()

    # -- connections ---------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30.0, isolation_level="DEFERRED")
            conn.execute("PRAGMA journal_mode=WAL")
            # WAL + NORMAL: a commit is durable against a process crash, and does not
            # fsync on every write (an OS crash may lose the last few compiles, which a
            # cache can afford).
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=30000")
            self._local.conn = conn
        return conn

    def journal_mode(self) -> str:
        return str(self._conn().execute("PRAGMA journal_mode").fetchone()[0])

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    # -- graphs --------------------------------------------------------------------
    def put_graph(self, graph_hash: str, document: str, name: str = "") -> None:
        conn = self._conn()
        with self._write_lock:
            conn.execute(
                "INSERT OR IGNORE INTO graphs (graph_hash, name, document, created_at) VALUES (?, ?, ?, ?)",
                (graph_hash, name, document, time.time()),
            )
            conn.commit()

    def get_graph(self, graph_hash: str) -> Optional[GraphRecord]:
        row = self._conn().execute(
            "SELECT graph_hash, name, document, created_at FROM graphs WHERE graph_hash = ?", (graph_hash,)
        ).fetchone()
        return GraphRecord(*row) if row else None

    def has_graph(self, graph_hash: str) -> bool:
        row = self._conn().execute("SELECT 1 FROM graphs WHERE graph_hash = ?", (graph_hash,)).fetchone()
        return row is not None

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
        row = self._conn().execute(
            f"SELECT {self._PROGRAM_COLUMNS} FROM programs WHERE key = ?", (key,)
        ).fetchone()
        return self._program_from_row(row) if row else None

    def programs_for_graph(self, graph_hash: str) -> list[ProgramRecord]:
        rows = self._conn().execute(
            f"SELECT {self._PROGRAM_COLUMNS} FROM programs WHERE graph_hash = ? ORDER BY created_at", (graph_hash,)
        ).fetchall()
        return [self._program_from_row(r) for r in rows]

    def put_program(self, record: ProgramRecord) -> bool:
        """Insert, or replace the row under the same key when the new one is better:
        a complete solve replaces an incomplete one; among equals, a lower predicted
        time wins. Returns whether the row now holds `record`."""
        conn = self._conn()
        with self._write_lock:
            row = conn.execute("SELECT complete, stats, created_at FROM programs WHERE key = ?",
                               (record.key,)).fetchone()
            created_at = record.created_at
            if row is not None:
                old_complete, old_stats, created_at = bool(row[0]), json.loads(row[1]), row[2]
                better = (record.complete and not old_complete) or (
                    record.complete == old_complete and _predicted(record.stats) < _predicted(old_stats))
                if not better:
                    return False
            conn.execute(
                f"INSERT OR REPLACE INTO programs ({self._PROGRAM_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (record.key, record.graph_hash, record.compiler_version, record.options_hash,
                 json.dumps(record.options, sort_keys=True), record.hardware, record.hardware_digest,
                 record.program, json.dumps(record.stats, sort_keys=True), record.solution,
                 int(record.complete), created_at, record.updated_at),
            )
            conn.commit()
            return True

    def counts(self) -> dict[str, int]:
        conn = self._conn()
        return {
            "graphs": int(conn.execute("SELECT COUNT(*) FROM graphs").fetchone()[0]),
            "programs": int(conn.execute("SELECT COUNT(*) FROM programs").fetchone()[0]),
        }
