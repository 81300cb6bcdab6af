"""Batch jobs in worker processes with per-job limits: the local engine of `sticksat
reoptimize` (and any batch command that runs one job per graph).

Each job runs in a pool worker (service.pool.SolverPool: one spawned process per slot,
a crash takes down only its own job) with
- a wall-time limit: a job still running at `wall_s` has its worker killed and comes
  back as `JobLimitExceeded` (the slot gets a fresh process; the other jobs go on);
- a memory limit: every worker's address space is capped (RLIMIT_AS), so a job that
  keeps allocating fails (MemoryError, or its process dies) instead of growing for
  minutes;
- workers that die with the driver (PR_SET_PDEATHSIG on Linux and a parent-watch thread)
  and ignore Ctrl-C: on KeyboardInterrupt (SIGINT, or SIGTERM through
  `signals_as_interrupt`) the driver kills its workers before the exception leaves
  `run_isolated`, so no solve outlives the command.
"""
from __future__ import annotations

import asyncio
import signal
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Optional, TypeVar

from service.pool import JobTimedOut, SolverPool, WorkerCrashed

T = TypeVar("T")


class JobLimitExceeded(RuntimeError):
    """The job ran past its wall-time limit (its worker was killed)."""


def default_memory_bytes(jobs: int) -> int:
    """The default cap per worker: the machine's memory shared among the workers and the
    driver, at least 2 GiB (what a planner worker maps before it allocates anything)."""
    import os

    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 16 * 2**30
    return max(2 * 2**30, total // (jobs + 1))


def run_isolated(tasks: Iterable[T], fn: Callable[[T], Any], *, jobs: int, wall_s: Callable[[T], Optional[float]],
                 memory_bytes: Optional[int], warm: Optional[Callable[[], Any]] = None,
                 on_event: Optional[Callable[..., None]] = None) -> Iterator[tuple[T, Any]]:
    """Yield (task, result) as jobs finish, `jobs` at a time. A job that failed yields its
    exception as the result: JobLimitExceeded (wall time), WorkerCrashed (its process
    died: the memory limit, a crash in native code), or what `fn` raised."""
    tasks = list(tasks)
    if not tasks:
        return
    loop = asyncio.new_event_loop()
    pool = SolverPool(workers=max(1, jobs), queue_limit=len(tasks), memory_bytes=memory_bytes, on_event=on_event)
    by_future: dict[asyncio.Future, T] = {}
    try:
        loop.run_until_complete(pool.start(warm or time.time))

        async def submit_all() -> None:
            for i, task in enumerate(tasks):
                future, _ = pool.submit(f"job-{i}", fn, task, hard_timeout_s=wall_s(task))
                by_future[future] = task

        loop.run_until_complete(submit_all())
        pending = set(by_future)
        while pending:
            done, pending = loop.run_until_complete(asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED))
            for future in done:
                try:
                    result: Any = future.result()
                except JobTimedOut as exc:
                    result = JobLimitExceeded(str(exc))
                except (WorkerCrashed, Exception) as exc:  # noqa: BLE001 - the job's failure is its result
                    result = exc
                yield by_future[future], result
    finally:
        # Also on KeyboardInterrupt and on GeneratorExit: no worker outlives the run.
        pool.shutdown()
        try:
            loop.run_until_complete(asyncio.sleep(0))
        finally:
            loop.close()


@contextmanager
def signals_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM (and SIGHUP) raise KeyboardInterrupt like SIGINT does, so
    a command stopped by its supervisor cleans up as one stopped with Ctrl-C."""

    def interrupt(signum, frame):  # noqa: ARG001
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            previous[sig] = signal.signal(sig, interrupt)
        except (ValueError, OSError):  # not the main thread
            pass
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
