"""A full disk is the operator's problem, not a bug: a write the store cannot make for
lack of space answers 507 `store_full` with Retry-After (not 500
internal_error), and /readyz reports the service not ready while the store's disk is
full, so a load balancer sends compiles elsewhere.

`is_disk_full(exc)` recognizes the ways a store write fails on a full disk: OSError
ENOSPC/EDQUOT, SQLite's SQLITE_FULL ("database or disk is full"), PostgreSQL's
disk_full (SQLSTATE 53100), including when raised in a pool worker (pickled: only the
message survives). `StorageWatch` remembers a failed write and, for a SQLite store,
looks at the free space of its directory.
"""
from __future__ import annotations

import errno
import os
import time
from typing import Optional

from service.problems import STORE_PROBLEMS, ProblemError, store_problem

# Retry-After of a 507 (service.problems.STORE_PROBLEMS, shared with the store's own
# StoreFull): an operator has to free space; a client should not hammer.
FULL_RETRY_AFTER_S = STORE_PROBLEMS["store_full"][2]
# After a failed write, the store counts as writable again once this much more space (or
# the reserve, if larger) is free, or a write succeeded.
FREED_BYTES = 1024 * 1024

_FULL_ERRNOS = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
_FULL_TEXT = ("database or disk is full", "no space left on device", "disk quota exceeded", "could not extend file")


def is_disk_full(exc: BaseException) -> bool:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS:
            return True
        if getattr(exc, "sqlite_errorcode", None) == 13:  # SQLITE_FULL
            return True
        if getattr(exc, "sqlstate", None) == "53100" or getattr(exc, "pgcode", None) == "53100":
            return True
        if getattr(exc, "code", None) == "store_full":  # service.store.StoreFull
            return True
        text = str(exc).lower()
        if any(marker in text for marker in _FULL_TEXT):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def store_failure(exc: BaseException) -> Optional[ProblemError]:
    """The problem for a store failure: the store's own errors by their code
    (`store_damaged` 503, `store_full` 507: service.problems.store_problem), and a write
    that failed for lack of space however it surfaced (507 `store_full`); None for
    anything else."""
    seen = set()
    cur: Optional[BaseException] = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if getattr(cur, "code", None) in STORE_PROBLEMS:
            return store_problem(cur)  # type: ignore[arg-type]
        cur = cur.__cause__ or cur.__context__
    if is_disk_full(exc):
        return ProblemError(507, "store_full", f"the program store's disk is full ({type(exc).__name__}: {exc}); "
                                               f"retry once space is freed",
                            headers={"Retry-After": str(FULL_RETRY_AFTER_S)})
    return None


class StorageWatch:
    """Whether the store can take writes: not after a write failed for lack of space
    (until a write succeeds, or the free space grew by `min_free_bytes`), and, for a
    SQLite store, not while its directory has less than `min_free_bytes` free."""

    def __init__(self, store_location: str, min_free_bytes: int):
        self.min_free_bytes = min_free_bytes
        self.directory: Optional[str] = None
        location = str(store_location)
        if "://" not in location or location.startswith("sqlite:///"):
            path = location[len("sqlite:///") - 1:] if location.startswith("sqlite:///") else location
            self.directory = os.path.dirname(os.path.abspath(path))
        self.failed_at: Optional[float] = None
        self.free_at_failure: Optional[int] = None

    def free_bytes(self) -> Optional[int]:
        if self.directory is None:
            return None
        try:
            st = os.statvfs(self.directory)
        except OSError:
            return None
        return st.f_bavail * st.f_frsize

    def write_failed(self) -> None:
        self.failed_at = time.time()
        self.free_at_failure = self.free_bytes()

    def write_succeeded(self) -> None:
        self.failed_at = None
        self.free_at_failure = None

    def problem(self) -> Optional[str]:
        """Why the store cannot take writes now, or None."""
        free = self.free_bytes()
        if free is not None and free < self.min_free_bytes:
            return (f"the store's disk ({self.directory}) has {free} bytes free, less than the "
                    f"{self.min_free_bytes} this service keeps in reserve (sticksat serve --min-free-bytes)")
        if self.failed_at is not None:
            regained = max(self.min_free_bytes, FREED_BYTES)
            if free is not None and self.free_at_failure is not None and free >= self.free_at_failure + regained:
                self.write_succeeded()  # the operator freed space
                return None
            return "a store write failed for lack of space; the store takes no writes until space is freed"
        return None
