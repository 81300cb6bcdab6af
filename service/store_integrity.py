"""What the program store knows about its own soundness (docs/reliability.md, "The store"):
its failure types and how a database error is classified (`StoreError`, `StoreDamaged`,
`StoreFull`, `classify_failure`), the reports of its health, check and backup, the
acknowledgement journal outside the WAL that names writes a garbled WAL tail lost
(`AckJournal`), and the per-row checksum (`row_checksum`)."""
from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

# -- the store's own failures --------------------------------------------------------------

class StoreError(RuntimeError):
    """The store cannot do what was asked for a reason that is the store's, not the
    request's. `code` is the problem code the service answers with (service/problems.py
    maps it to its HTTP status)."""

    code = "store_error"


class StoreDamaged(StoreError):
    """The database file is damaged (SQLite: a malformed page; PostgreSQL: data
    corruption): reads of the damaged part fail until the store is restored."""

    code = "store_damaged"


class StoreFull(StoreError):
    """A write failed because the disk (or the database's quota) is full."""

    code = "store_full"


def sqlite_error_name(exc: BaseException) -> str:
    return str(getattr(exc, "sqlite_errorname", "") or "")


def classify_failure(exc: BaseException) -> Optional[type[StoreError]]:
    """StoreDamaged / StoreFull for a database exception that means one, else None."""
    if isinstance(exc, sqlite3.DatabaseError):
        name, text = sqlite_error_name(exc), str(exc).lower()
        if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")) or "malformed" in text or "not a database" in text:
            return StoreDamaged
        if name.startswith("SQLITE_FULL") or "disk is full" in text:
            return StoreFull
        return None
    kind = type(exc).__name__
    if kind == "DiskFull":  # psycopg.errors, SQLSTATE 53100
        return StoreFull
    if kind in ("DataCorrupted", "IndexCorrupted"):  # psycopg.errors, SQLSTATE XX001 / XX002
        return StoreDamaged
    return None


@dataclass
class StoreHealth:
    """What /readyz reports about the store: `ok` is False while the store cannot answer
    (a damaged page found by the quick check or by a read, a full disk on the last write)."""

    ok: bool
    problems: list[str] = field(default_factory=list)
    lost_writes: int = 0       # acknowledged writes found missing when the store was opened
    quarantined: int = 0       # rows moved to quarantine by this process

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "problems": list(self.problems), "lost_writes": self.lost_writes,
                "quarantined": self.quarantined}


@dataclass
class StoreCheck:
    """The result of `ProgramStore.check()` (`sticksat store check`)."""

    backend: str
    integrity: list[str]                 # SQLite's integrity check findings ([] when "ok")
    programs: int = 0
    graphs: int = 0
    quarantined: list[dict[str, Any]] = field(default_factory=list)   # rows moved aside by this check
    bad_graphs: list[str] = field(default_factory=list)               # graph documents that do not parse
    orphans: int = 0                     # programs whose graph is missing
    lost_writes: list[dict[str, Any]] = field(default_factory=list)   # recorded lost-write events
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not (self.integrity or self.quarantined or self.bad_graphs or self.orphans or self.lost_writes)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "backend": self.backend, "integrity": self.integrity, "programs": self.programs,
                "graphs": self.graphs, "quarantined": self.quarantined, "bad_graphs": self.bad_graphs,
                "orphans": self.orphans, "lost_writes": self.lost_writes, "seconds": round(self.seconds, 3)}


@dataclass(frozen=True)
class BackupResult:
    path: str
    bytes: int
    graphs: int
    programs: int
    seconds: float


# -- the acknowledgement journal (SQLite) ---------------------------------------------------

@dataclass(frozen=True)
class Ack:
    seq: int
    kind: str   # "graph" | "program"
    ident: str  # graph hash or program key


class AckJournal:
    """`<store>.acks`: one line `seq kind id` per acknowledged write transaction, appended
    after its COMMIT returned. It lives outside the WAL, so when SQLite's recovery drops a
    damaged WAL tail (and every transaction after it) the journal still names them.
    Appends and compaction hold an exclusive flock, so a compaction never drops a line
    another process is appending. Lines past a torn last write are ignored."""

    HEADER = "sticksat.acks v1\n"
    # Compact (after a checkpoint) once the journal passes this size.
    COMPACT_BYTES = 4 * 1024 * 1024

    def __init__(self, path: Path):
        self.path = path

    @contextmanager
    def _locked(self, mode: int = os.O_RDWR) -> Iterator[int]:
        fd = os.open(self.path, mode | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            os.close(fd)  # releases the lock

    def append(self, acks: list[Ack]) -> int:
        """Append; returns the journal's size afterwards."""
        text = "".join(f"{a.seq} {a.kind} {a.ident}\n" for a in acks)
        with self._locked(os.O_WRONLY | os.O_APPEND) as fd:
            if os.fstat(fd).st_size == 0:
                text = self.HEADER + text
            os.write(fd, text.encode())
            return os.fstat(fd).st_size

    def read(self) -> list[Ack]:
        try:
            return self._parse(self.path.read_text(errors="replace"))
        except FileNotFoundError:
            return []

    def keep_after(self, seq: int) -> None:
        """Drop the entries up to `seq` (the caller made sure they are in the main file)."""
        with self._locked() as fd:
            with open(fd, "rb", closefd=False) as f:
                data = f.read()
            keep = [a for a in self._parse(data.decode(errors="replace")) if a.seq > seq]
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            if keep:
                os.write(fd, (self.HEADER + "".join(f"{a.seq} {a.kind} {a.ident}\n" for a in keep)).encode())

    def _parse(self, text: str) -> list[Ack]:
        out = []
        for line in text.splitlines()[1:] if text.startswith(self.HEADER) else []:
            parts = line.split(" ")
            if len(parts) == 3 and parts[0].isdigit() and parts[1] in ("graph", "program"):
                out.append(Ack(int(parts[0]), parts[1], parts[2]))
        return out


def row_checksum(text: str) -> str:
    """CRC-32 of the program text (8 hex digits). It guards against accidental damage (a
    bad sector, a torn or garbled write, a tool editing the file), not against someone who
    can write the database, who could rewrite the checksum too; and it is cheap on every
    hit: 4 ms for a 5 MB program here (SHA-256: 12 ms)."""
    return f"{zlib.crc32(text.encode('utf-8', 'surrogatepass')):08x}"


def json_object_problem(text: Any, what: str) -> Optional[str]:
    """Why `text` is not a JSON object (None when it is)."""
    if not isinstance(text, str):
        return f"{what} is not text"
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return f"{what} does not parse: {str(exc)[:200]}"
    if not isinstance(value, dict):
        return f"{what} is a JSON {type(value).__name__}, not an object"
    return None
