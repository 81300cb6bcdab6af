"""The solver pool: worker processes that run compile and simulate jobs off the event loop.

- One worker process per slot, each in its own single-process executor, and the queue
  kept here on the event loop: a slot takes the next queued job only when it is free.
  So a worker that dies (os._exit, SIGKILL, the OOM killer, a crash in native code)
  takes down exactly the job it was running: that job fails with WorkerCrashed, its
  slot gets a fresh process, and every other job, running or queued, goes on
  untouched. (One shared ProcessPoolExecutor cannot do this: its BrokenProcessPool
  fails every pending future and does not say which job was running in the dead
  process.) A job whose executor broke before it could start (its slot died while
  warming up) is retried once on the fresh process.
- Request coalescing: jobs carry a key; while a job with that key is in flight, another
  submission with the same key joins it instead of starting a second solve.
- Queue limit: at most `workers + queue_limit` distinct jobs are in flight; one more is
  refused with PoolFull (the service answers 503 + Retry-After) instead of queueing
  without bound.
- Deadlines and clients that leave are the caller's: `wait()` stops waiting at the
  deadline and `leave()` says a waiter is gone. A job nobody waits for any more is
  dropped while it is still queued (JobDropped; nothing runs, nothing is stored); once
  running it runs to the end (a process cannot be interrupted safely mid-solve) and its
  result still goes to the `on_done` callback, so a late plan lands in the store.

Workers are started with the "spawn" method: the parent runs an event loop and threads,
which a fork would copy in an undefined state.
"""
from __future__ import annotations

import asyncio
import collections
import math
import multiprocessing
import itertools
import os
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Awaitable, Callable, Optional


def _watch_parent(parent_pid: int) -> None:
    """Exit when the parent process is gone. A worker blocks reading its job queue,
    whose write end it holds itself, so a parent that dies without shutting the pool
    down (SIGKILL, OOM kill, a crash) would otherwise leave it blocked, or solving,
    forever. On Linux the kernel kills the worker at once (PR_SET_PDEATHSIG); the thread
    covers other systems and the window before the prctl."""
    _die_with_parent()

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent_pid:
                os._exit(0)

    threading.Thread(target=watch, name="sticksat-parent-watch", daemon=True).start()


def _die_with_parent() -> None:
    """Linux: ask the kernel to SIGKILL this process when its parent dies."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: the watch thread remains
        pass


def limit_memory(memory_bytes: Optional[int]) -> None:
    """Cap this process's address space (RLIMIT_AS): an allocation past it fails
    (MemoryError, or the process dies in native code) instead of the machine swapping."""
    if not memory_bytes:
        return
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = memory_bytes if hard == resource.RLIM_INFINITY else min(memory_bytes, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


# Which job a worker process has begun, written by the worker as its first act for a job:
# when the process dies, the pool tells a job that never started (the worker died idle;
# retried once on a fresh process) from one that was running (WorkerCrashed).
_started_marker = None


def init_worker(parent_pid: int, started_marker=None, memory_bytes: Optional[int] = None) -> None:
    """Runs first in every pool worker: die with the parent, leave Ctrl-C to the parent
    (it terminates the workers; a worker interrupted mid-job would only print a
    traceback), cap the memory when asked."""
    global _started_marker
    _started_marker = started_marker
    _watch_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    limit_memory(memory_bytes)


def _run_marked(seq: int, fn: Callable[..., Any], *args: Any) -> Any:
    if _started_marker is not None:
        _started_marker.value = seq
    return fn(*args)


class PoolFull(Exception):
    def __init__(self, retry_after_s: int):
        super().__init__(f"solver pool is full; retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s


class PoolNotReady(Exception):
    pass


class WorkerCrashed(RuntimeError):
    """The worker process running this job died (the job's own doing, or the OS's)."""


class JobTimedOut(WorkerCrashed):
    """The job ran past its hard wall-time limit and its worker process was killed."""


class JobDropped(RuntimeError):
    """The job was removed from the queue before it ran: nobody waited for it any more."""


class _Job:
    __slots__ = ("key", "fn", "args", "on_done", "future", "submitted", "started", "waiters", "attempts",
                 "state", "seq", "hard_timeout_s", "expected_s")

    def __init__(self, key: str, fn: Callable[..., Any], args: tuple, on_done, future: asyncio.Future,
                 hard_timeout_s: Optional[float] = None, expected_s: Optional[float] = None):
        self.key = key
        self.fn = fn
        self.args = args
        self.on_done = on_done
        self.future = future
        self.submitted = time.monotonic()
        self.started: Optional[float] = None
        self.waiters = 1
        self.attempts = 0
        self.state = "queued"  # queued | running | done
        self.seq = 0  # this attempt's number (the started marker's value once the worker begins it)
        # Wall seconds the job may run before its worker is killed (None: no limit).
        self.hard_timeout_s = hard_timeout_s
        # The caller's estimate of the job's run time (for Retry-After), when it has one.
        self.expected_s = expected_s


class _Slot:
    """One worker process in its own single-process executor."""

    def __init__(self, index: int):
        self.index = index
        self.executor: Optional[ProcessPoolExecutor] = None
        self.job: Optional[_Job] = None
        self.warming = False
        self.started_marker = None  # shared with the process: the seq of the job it began

    def kill(self) -> None:
        for process in list((getattr(self.executor, "_processes", None) or {}).values()):
            if process.is_alive():
                process.kill()

    def pid(self) -> Optional[int]:
        processes = getattr(self.executor, "_processes", None) or {}
        pids = [p.pid for p in list(processes.values()) if p.pid is not None]
        return pids[0] if pids else None

    def process_alive(self) -> bool:
        processes = list((getattr(self.executor, "_processes", None) or {}).values())
        return bool(processes) and all(p.is_alive() for p in processes)


# How often a running job's worker is looked at, and how long a dead worker's executor
# may take to notice before the pool declares the job crashed itself: a worker killed
# while it hands back its result can leave ProcessPoolExecutor waiting for ever (seen
# once in the kill-under-load test: a job "running" for 300 s with its worker gone).
WATCH_S = 1.0
DEAD_GRACE_S = 3.0


async def _watched(slot: _Slot, work: asyncio.Future, hard_deadline: Optional[float] = None) -> Any:
    """`work`'s result; BrokenProcessPool also when the slot's process has been gone for
    DEAD_GRACE_S and its executor has not failed the job; JobTimedOut (the process
    killed) when the job is still running at `hard_deadline` (time.monotonic())."""
    dead_since: Optional[float] = None
    while True:
        timeout = WATCH_S if hard_deadline is None else max(0.0, min(WATCH_S, hard_deadline - time.monotonic()))
        done, _ = await asyncio.wait({work}, timeout=timeout)
        if done:
            return work.result()
        if hard_deadline is not None and time.monotonic() >= hard_deadline:
            slot.kill()
            work.cancel()
            raise JobTimedOut("the job ran past its wall-time limit; its worker process was killed")
        if slot.process_alive():
            dead_since = None
            continue
        dead_since = dead_since or time.monotonic()
        if time.monotonic() - dead_since >= DEAD_GRACE_S:
            work.cancel()
            raise BrokenProcessPool("the worker process died and its executor did not fail the job")


class SolverPool:
    def __init__(self, workers: int, queue_limit: int,
                 on_inflight_change: Optional[Callable[[int], None]] = None,
                 on_event: Optional[Callable[..., None]] = None, memory_bytes: Optional[int] = None):
        if workers < 1:
            raise ValueError("workers must be >= 1")
        if queue_limit < 0:
            raise ValueError("queue_limit must be >= 0")
        self.workers = workers
        self.queue_limit = queue_limit
        self._slots = [_Slot(i) for i in range(workers)]
        self._queue: collections.deque[_Job] = collections.deque()
        self._inflight: dict[str, _Job] = {}
        self._ready = asyncio.Event()
        self._on_inflight_change = on_inflight_change
        # on_event(name, **fields): worker_crashed, worker_restarted, job_dropped, job_retried
        self._on_event = on_event
        self._recent_seconds: list[float] = []
        self._warm: Optional[tuple] = None
        self._closed = False
        self._seq = itertools.count(1)
        # Address-space cap of every worker process (RLIMIT_AS; None: none).
        self.memory_bytes = memory_bytes
        self.crashes = 0
        self.dropped = 0
        self.retried = 0
        self.timed_out = 0

    # -- lifecycle -----------------------------------------------------------------
    def _new_executor(self, slot: _Slot) -> ProcessPoolExecutor:
        context = multiprocessing.get_context("spawn")
        slot.started_marker = context.Value("q", 0, lock=False)
        return ProcessPoolExecutor(max_workers=1, mp_context=context, initializer=init_worker,
                                   initargs=(os.getpid(), slot.started_marker, self.memory_bytes))

    def worker_pids(self) -> list[int]:
        # ProcessPoolExecutor does not expose its process; `_processes` is the only way
        # to reach it (for shutdown and tests). Absent, nothing is listed.
        return [pid for pid in (slot.pid() for slot in self._slots) if pid is not None]

    def began(self, key: str) -> bool:
        """The worker running job `key` has begun it (not merely been sent it)."""
        for slot in self._slots:
            if slot.job is not None and slot.job.key == key and slot.started_marker is not None:
                return slot.started_marker.value == slot.job.seq
        return False

    def running_pids(self) -> dict[str, int]:
        """Key -> pid of the worker running it (tests, diagnostics)."""
        out = {}
        for slot in self._slots:
            pid = slot.pid()
            if slot.job is not None and pid is not None:
                out[slot.job.key] = pid
        return out

    async def start(self, warm: Callable[..., Any], *warm_args: Any) -> None:
        """Start one process per slot and run `warm` in each; ready when all return."""
        self._warm = (warm, warm_args)
        loop = asyncio.get_running_loop()
        for slot in self._slots:
            slot.executor = self._new_executor(slot)
        await asyncio.gather(*(loop.run_in_executor(slot.executor, warm, *warm_args) for slot in self._slots))
        self._ready.set()
        self._dispatch()

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def shutdown(self) -> None:
        """Stop now: queued jobs are cancelled and running ones are terminated (a solve
        can take minutes; a stopping service should not wait for it, and its waiters are
        gone with the event loop)."""
        self._ready.clear()
        self._closed = True
        processes = []
        for slot in self._slots:
            processes += list((getattr(slot.executor, "_processes", None) or {}).values())
            self._stop_executor(slot.executor)
            slot.executor = None
        self._queue.clear()
        # SIGTERM first; a worker deep in native code (a CP-SAT solve) may not stop at once:
        # whatever still runs after a moment is killed, so no solve outlives the pool.
        deadline = time.monotonic() + 2.0
        for process in processes:
            try:
                process.join(max(0.0, deadline - time.monotonic()))
                if process.is_alive():
                    process.kill()
                    process.join(1.0)
            except Exception:  # noqa: BLE001 - already gone
                pass

    @staticmethod
    def _stop_executor(executor: Optional[ProcessPoolExecutor]) -> None:
        if executor is None:
            return
        try:
            processes = list((getattr(executor, "_processes", None) or {}).values())
            executor.shutdown(wait=False, cancel_futures=True)
            for process in processes:
                if process.is_alive():
                    process.terminate()
        except Exception:  # noqa: BLE001 - a broken executor is being discarded anyway
            pass

    # -- jobs ----------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self.workers + self.queue_limit

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    def state(self, key: str) -> Optional[str]:
        """'queued' or 'running' for a job in flight, else None."""
        job = self._inflight.get(key)
        return job.state if job is not None else None

    def retry_after_s(self) -> int:
        """A client-facing estimate of when the backlog drains: the expected remaining
        time of every job in flight (queued ones whole, running ones less what they ran),
        spread over the workers; at least one second. A job's expected time is the
        caller's estimate (`expected_s`: a compile's time limit) when it gave one, else
        the mean recent job time; without a finished job yet, the age of the oldest job in
        flight (a lower bound of its time: a 30 s solve that has not finished is not a
        1 s wait)."""
        now = time.monotonic()
        if self._recent_seconds:
            mean = sum(self._recent_seconds) / len(self._recent_seconds)
        else:
            mean = max((now - job.submitted for job in self._inflight.values()), default=1.0)
        if not self._inflight:
            return max(1, math.ceil(mean / self.workers))
        total = 0.0
        for job in self._inflight.values():
            expected = job.expected_s if job.expected_s is not None else mean
            ran = now - job.started if job.state == "running" and job.started is not None else 0.0
            total += max(expected - ran, 0.0)
        return max(1, math.ceil(total / self.workers))

    def submit(self, key: str, fn: Callable[..., Any], *args: Any,
               on_done: Optional[Callable[[Any], Awaitable[None] | None]] = None,
               hard_timeout_s: Optional[float] = None,
               expected_s: Optional[float] = None) -> tuple[asyncio.Future, bool]:
        """Start (or join) the job `key`. Returns (future, joined). `on_done(result)` runs
        once on the event loop when a newly started job finishes, before its waiters
        are woken, whether or not anyone is still waiting. Every caller that got a
        future and stops waiting before it is done should call `leave(key)`.
        `hard_timeout_s`: once running that long, the job's worker is killed and the job
        fails with JobTimedOut. `expected_s`: the caller's estimate of its run time
        (Retry-After)."""
        existing = self._inflight.get(key)
        if existing is not None:
            existing.waiters += 1
            return existing.future, True
        if not self.ready:
            raise PoolNotReady("solver pool is not up yet")
        if len(self._inflight) >= self.capacity:
            raise PoolFull(self.retry_after_s())
        loop = asyncio.get_running_loop()
        job = _Job(key, fn, args, on_done, loop.create_future(), hard_timeout_s, expected_s)
        self._inflight[key] = job
        self._queue.append(job)
        self._changed()
        self._dispatch()
        return job.future, False

    def leave(self, key: str, reason: str = "gone") -> Optional[str]:
        """A waiter of `key` stopped waiting (deadline, client disconnected). Returns what
        becomes of the job: 'dropped' (it was queued and nobody else waits: removed, it
        will not run), 'queued' (others still wait for it), 'running' (it runs to the
        end and reports to on_done), or None (not in flight: already finished)."""
        job = self._inflight.get(key)
        if job is None:
            return None
        job.waiters = max(0, job.waiters - 1)
        if job.state == "queued" and job.waiters == 0:
            try:
                self._queue.remove(job)
            except ValueError:
                pass
            self.dropped += 1
            self._emit("job_dropped", key=key, reason=reason)
            self._settle(job, exc=JobDropped(f"job {key} dropped from the queue: nobody waits for it ({reason})"))
            return "dropped"
        return job.state

    def _dispatch(self) -> None:
        if self._closed or not self.ready:
            return
        for slot in self._slots:
            if not self._queue:
                return
            if slot.job is None and not slot.warming and slot.executor is not None:
                self._run(slot, self._queue.popleft())

    def _run(self, slot: _Slot, job: _Job) -> None:
        loop = asyncio.get_running_loop()
        slot.job = job
        job.state = "running"
        job.attempts += 1
        job.started = time.monotonic()
        job.seq = next(self._seq)
        try:
            # A process that died while idle may not be noticed by its executor yet: look
            # first, so the job is not sent to (and failed with) a dead process.
            processes = list((getattr(slot.executor, "_processes", None) or {}).values())
            if any(not process.is_alive() for process in processes):
                raise BrokenProcessPool("the worker process died while idle")
            work = loop.run_in_executor(slot.executor, _run_marked, job.seq, job.fn, *job.args)
        except Exception:  # noqa: BLE001 - BrokenProcessPool, shut down, a broken pipe: the job never left
            # The slot's process died while idle (killed between jobs): this job never
            # reached it. Back to the head of the queue, once, for the fresh process.
            slot.job = None
            self.crashes += 1
            self._emit("worker_crashed", key=None, slot=slot.index, attempt=0, seconds=0.0)
            if job.attempts < 2:
                job.state = "queued"
                self._queue.appendleft(job)
                self._emit("job_retried", key=job.key, slot=slot.index)
            else:
                self._settle(job, exc=WorkerCrashed(f"no worker process could take job {job.key}"))
            self._restart(slot)
            return
        loop.create_task(self._finish(slot, job, work))

    async def _finish(self, slot: _Slot, job: _Job, work: asyncio.Future) -> None:
        marker = slot.started_marker
        hard_deadline = None if job.hard_timeout_s is None else job.started + job.hard_timeout_s
        try:
            result = await _watched(slot, work, hard_deadline)
        except JobTimedOut as exc:
            if self._closed:
                return
            slot.job = None
            self.timed_out += 1
            self._emit("job_timed_out", key=job.key, slot=slot.index, seconds=round(job.hard_timeout_s or 0, 3))
            self._restart(slot)
            self._settle(job, exc=JobTimedOut(f"job {job.key} ran past its wall-time limit of "
                                              f"{job.hard_timeout_s:g} s; its worker process was killed ({exc})"))
            return
        except BrokenProcessPool:
            if self._closed:
                return
            slot.job = None
            ran_for = time.monotonic() - (job.started or time.monotonic())
            self.crashes += 1
            began = marker is None or marker.value == job.seq
            self._emit("worker_crashed", key=job.key, slot=slot.index, attempt=job.attempts,
                       seconds=round(ran_for, 3), job_started=began)
            self._restart(slot)
            if not began and job.attempts < 2:
                # The process died before it took this job (killed while idle, the kill not
                # yet noticed when the job was sent): the job goes first to the fresh process.
                job.state = "queued"
                self._queue.appendleft(job)
                self.retried += 1
                self._emit("job_retried", key=job.key, slot=slot.index)
                return
            self._settle(job, exc=WorkerCrashed(
                f"the worker process running job {job.key} died after {ran_for:.1f} s "
                f"(killed, out of memory, or a crash in native code); other jobs were not affected"))
            return
        except BaseException as exc:  # noqa: BLE001 - delivered to the waiters
            slot.job = None
            self._settle(job, exc=exc)
            self._dispatch()
            return
        slot.job = None
        self._recent_seconds = (self._recent_seconds + [time.monotonic() - (job.started or job.submitted)])[-32:]
        if job.on_done is not None:
            try:
                maybe = job.on_done(result)
                if asyncio.iscoroutine(maybe):
                    await maybe
            except Exception as exc:  # noqa: BLE001
                self._settle(job, exc=exc)
                self._dispatch()
                return
        self._settle(job, result=result)
        self._dispatch()

    def _restart(self, slot: _Slot) -> None:
        """A fresh process for a slot whose worker died; warmed before it takes a job.
        Starting the process or warming it may fail too (the new process killed while
        it boots: the spawn's pipe breaks, or the executor breaks): then it is tried
        again after a short back-off, so a slot never stays empty or stuck."""
        old, slot.executor = slot.executor, None
        self._stop_executor(old)
        slot.warming = True
        self._emit("worker_restarted", slot=slot.index)
        asyncio.get_running_loop().create_task(self._start_slot(slot))

    async def _start_slot(self, slot: _Slot) -> None:
        loop = asyncio.get_running_loop()
        delay = 0.0
        while not self._closed:
            if delay:
                await asyncio.sleep(delay)
            try:
                slot.executor = self._new_executor(slot)
                if self._warm is not None:
                    warm, warm_args = self._warm
                    await loop.run_in_executor(slot.executor, warm, *warm_args)
                break
            except (BrokenProcessPool, OSError, RuntimeError, EOFError):
                self._stop_executor(slot.executor)
                slot.executor = None
                delay = min(5.0, max(0.25, 2 * delay))
            except Exception:  # noqa: BLE001 - warm itself failed: the process is up; each job reports its own error
                break
        slot.warming = False
        self._dispatch()

    def _settle(self, job: _Job, result: Any = None, exc: Optional[BaseException] = None) -> None:
        job.state = "done"
        if self._inflight.get(job.key) is job:
            del self._inflight[job.key]
            self._changed()
        future = job.future
        if future.done():
            return
        if exc is not None:
            future.set_exception(exc)
            # Nobody may be waiting any more (all callers hit their deadline).
            future.exception()
        else:
            future.set_result(result)

    def _changed(self) -> None:
        if self._on_inflight_change is not None:
            self._on_inflight_change(len(self._inflight))

    def _emit(self, name: str, **fields: Any) -> None:
        if self._on_event is not None:
            try:
                self._on_event(name, **fields)
            except Exception:  # noqa: BLE001 - reporting never breaks the pool
                pass


async def wait(future: asyncio.Future, timeout_s: Optional[float]) -> Any:
    """Wait for a (possibly shared) job without cancelling it on timeout."""
    if timeout_s is None:
        return await asyncio.shield(future)
    return await asyncio.wait_for(asyncio.shield(future), timeout=max(0.0, timeout_s))
