"""The solver pool: worker processes that run compile and simulate jobs off the event loop.

- Request coalescing: jobs carry a key; while a job with that key is in flight, another
  submission with the same key joins it instead of starting a second solve.
- Queue limit: at most `workers + queue_limit` distinct jobs are in flight; one more is
  refused with PoolFull (the service answers 503 + Retry-After) instead of queueing
  without bound.
- Deadlines are the caller's: `wait()` stops waiting at the deadline, the job itself
  keeps running (a process cannot be interrupted safely mid-solve) and its result is
  still delivered to the `on_done` callback, so a late plan lands in the store.

Workers are started with the "spawn" method: the parent runs an event loop and threads,
which a fork would copy in an undefined state.
"""
from __future__ import annotations

import asyncio
import math
import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Awaitable, Callable, Optional


def _watch_parent(parent_pid: int) -> None:
    """Runs first in every worker: exit when the service process is gone. A worker
    blocks reading its job queue, whose write end it holds itself, so a parent that dies
    without shutting the pool down (SIGKILL, OOM kill, a crash) would otherwise leave it
    blocked forever."""

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent_pid:
                os._exit(0)

    threading.Thread(target=watch, name="sticksat-parent-watch", daemon=True).start()


class PoolFull(Exception):
    def __init__(self, retry_after_s: int):
        super().__init__(f"solver pool is full; retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s


class PoolNotReady(Exception):
    pass


class SolverPool:
    def __init__(self, workers: int, queue_limit: int,
                 on_inflight_change: Optional[Callable[[int], None]] = None):
        if workers < 1:
            raise ValueError("workers must be >= 1")
        if queue_limit < 0:
            raise ValueError("queue_limit must be >= 0")
        self.workers = workers
        self.queue_limit = queue_limit
        self._executor: Optional[ProcessPoolExecutor] = None
        self._inflight: dict[str, asyncio.Future] = {}
        self._ready = asyncio.Event()
        self._on_inflight_change = on_inflight_change
        self._recent_seconds: list[float] = []
        self._started: dict[str, float] = {}  # key -> monotonic start of the jobs in flight

    # -- lifecycle -----------------------------------------------------------------
    def _new_executor(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_watch_parent, initargs=(os.getpid(),))

    def worker_pids(self) -> list[int]:
        # ProcessPoolExecutor does not expose its processes; `_processes` is the only way
        # to reach them (for shutdown and tests). Absent, nothing is listed.
        processes = getattr(self._executor, "_processes", None) or {}
        return [p.pid for p in list(processes.values()) if p.pid is not None]

    async def start(self, warm: Callable[..., Any], *warm_args: Any) -> None:
        """Create the executor and run `warm` once per worker; ready when all return."""
        self._executor = self._new_executor()
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(self._executor, warm, *warm_args)
                               for _ in range(self.workers)))
        self._ready.set()

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def shutdown(self) -> None:
        """Stop now: queued jobs are cancelled and running ones are terminated (a solve
        can take minutes; a stopping service should not wait for it, and its waiters are
        gone with the event loop)."""
        self._ready.clear()
        if self._executor is not None:
            processes = list((getattr(self._executor, "_processes", None) or {}).values())
            self._executor.shutdown(wait=False, cancel_futures=True)
            for process in processes:
                if process.is_alive():
                    process.terminate()
            self._executor = None

    # -- jobs ----------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self.workers + self.queue_limit

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    def retry_after_s(self) -> int:
        """A client-facing estimate of when the backlog drains: the jobs in flight
        (queued plus running, at least one) times the mean recent job time, spread over
        the workers; at least one second. Without a finished job yet, the mean is the
        age of the oldest job in flight (a lower bound of its time: a 30 s solve that
        has not finished is not a 1 s wait)."""
        if self._recent_seconds:
            mean = sum(self._recent_seconds) / len(self._recent_seconds)
        else:
            now = time.monotonic()
            mean = max((now - t for t in self._started.values()), default=1.0)
        return max(1, math.ceil(max(1, self.inflight) * mean / self.workers))

    def submit(self, key: str, fn: Callable[..., Any], *args: Any,
               on_done: Optional[Callable[[Any], Awaitable[None] | None]] = None) -> tuple[asyncio.Future, bool]:
        """Start (or join) the job `key`. Returns (future, joined). `on_done(result)` runs
        once on the event loop when a newly started job finishes, before its waiters
        are woken, whether or not anyone is still waiting."""
        existing = self._inflight.get(key)
        if existing is not None:
            return existing, True
        if not self.ready or self._executor is None:
            raise PoolNotReady("solver pool is not up yet")
        if len(self._inflight) >= self.capacity:
            raise PoolFull(self.retry_after_s())
        loop = asyncio.get_running_loop()
        result_future: asyncio.Future = loop.create_future()
        self._inflight[key] = result_future
        self._changed()
        started = self._started[key] = time.monotonic()
        try:
            work = loop.run_in_executor(self._executor, fn, *args)
        except BrokenProcessPool:
            self._restart_executor()
            work = loop.run_in_executor(self._executor, fn, *args)

        async def finish() -> None:
            try:
                result = await work
            except BrokenProcessPool as exc:
                # A worker died (OOM, crash in native code): replace the pool so the
                # service keeps serving; this job fails.
                self._restart_executor()
                self._settle(key, result_future, exc=exc)
                return
            except BaseException as exc:  # noqa: BLE001 - delivered to the waiters
                self._settle(key, result_future, exc=exc)
                return
            self._recent_seconds = (self._recent_seconds + [time.monotonic() - started])[-32:]
            if on_done is not None:
                try:
                    maybe = on_done(result)
                    if asyncio.iscoroutine(maybe):
                        await maybe
                except Exception as exc:  # noqa: BLE001
                    self._settle(key, result_future, exc=exc)
                    return
            self._settle(key, result_future, result=result)

        loop.create_task(finish())
        return result_future, False

    def _settle(self, key: str, future: asyncio.Future, result: Any = None,
                exc: Optional[BaseException] = None) -> None:
        if self._inflight.get(key) is future:
            del self._inflight[key]
            self._started.pop(key, None)
            self._changed()
        if future.done():
            return
        if exc is not None:
            future.set_exception(exc)
            # Nobody may be waiting any more (all callers hit their deadline).
            future.exception()
        else:
            future.set_result(result)

    def _restart_executor(self) -> None:
        old = self._executor
        self._executor = self._new_executor()
        if old is not None:
            old.shutdown(wait=False, cancel_futures=True)

    def _changed(self) -> None:
        if self._on_inflight_change is not None:
            self._on_inflight_change(len(self._inflight))


async def wait(future: asyncio.Future, timeout_s: Optional[float]) -> Any:
    """Wait for a (possibly shared) job without cancelling it on timeout."""
    if timeout_s is None:
        return await asyncio.shield(future)
    return await asyncio.wait_for(asyncio.shield(future), timeout=max(0.0, timeout_s))
