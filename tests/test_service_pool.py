"""The solver pool: coalescing of identical jobs, the queue limit, deadlines that stop
the wait but not the job. Jobs are stdlib functions so spawned workers can import them."""
import asyncio
import time

import pytest

from service.pool import PoolFull, PoolNotReady, SolverPool, wait


def test_coalescing_queue_limit_and_deadline():
    async def scenario():
        pool = SolverPool(workers=1, queue_limit=1)
        with pytest.raises(PoolNotReady):
            pool.submit("early", time.sleep, 0)
        await pool.start(time.sleep, 0)
        assert pool.ready
        done: list = []
        try:
            first, joined = pool.submit("a", time.sleep, 0.6, on_done=done.append)
            assert not joined
            again, joined = pool.submit("a", time.sleep, 0.6)
            assert joined and again is first
            second, joined = pool.submit("b", time.sleep, 0.01)
            assert not joined and pool.inflight == 2
            with pytest.raises(PoolFull) as full:
                pool.submit("c", time.sleep, 0.01)
            assert full.value.retry_after_s >= 1
            # The deadline ends the wait; the job keeps running and still reports.
            with pytest.raises(asyncio.TimeoutError):
                await wait(first, 0.05)
            assert not first.done()
            assert await wait(first, 30) is None
            assert done == [None]
            await wait(second, 30)
            assert pool.inflight == 0
            # A new job can start once the slots are free.
            third, joined = pool.submit("c", pow, 2, 10)
            assert await wait(third, 30) == 1024
        finally:
            pool.shutdown()

    asyncio.run(scenario())


def test_job_exception_reaches_every_waiter():
    async def scenario():
        pool = SolverPool(workers=1, queue_limit=0)
        await pool.start(time.sleep, 0)
        try:
            fut, _ = pool.submit("bad", int, "not a number")
            joined, was_joined = pool.submit("bad", int, "not a number")
            assert was_joined
            for f in (fut, joined):
                with pytest.raises(ValueError):
                    await wait(f, 30)
            assert pool.inflight == 0
        finally:
            pool.shutdown()

    asyncio.run(scenario())


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped) counts as gone.
    try:
        with open(f"/proc/{pid}/status") as f:
            return not any(line.startswith("State:") and "Z" in line for line in f)
    except OSError:
        return False


def _wait_gone(pids, timeout_s=15.0) -> list[int]:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.2)
    return [p for p in pids if _alive(p)]


def test_shutdown_stops_workers_even_mid_job():
    async def scenario():
        pool = SolverPool(workers=1, queue_limit=0)
        await pool.start(time.sleep, 0)
        pids = pool.worker_pids()
        assert pids
        pool.submit("long", time.sleep, 60)
        pool.shutdown()
        return pids

    pids = asyncio.run(scenario())
    assert _wait_gone(pids) == []


def test_workers_exit_when_the_service_process_dies_uncleanly():
    import subprocess
    import sys

    code = (
        "import asyncio, os, sys, time\n"
        "from service.pool import SolverPool\n"
        "async def main():\n"
        "    pool = SolverPool(workers=1, queue_limit=0)\n"
        "    await pool.start(time.sleep, 0)\n"
        "    print(' '.join(map(str, pool.worker_pids())), flush=True)\n"
        "    os._exit(0)  # no shutdown: what a SIGKILL or OOM kill leaves behind\n"
        "if __name__ == '__main__':\n"
        "    asyncio.run(main())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    pids = [int(p) for p in out.stdout.split()]
    assert pids and _wait_gone(pids) == []


def _sleep_then_exit(seconds: float) -> None:  # a job whose worker dies under it
    time.sleep(seconds)
    import os

    os._exit(3)


def test_a_crashed_worker_fails_only_its_own_job():
    """Two workers: one job kills its worker (os._exit) while another runs and a third
    is queued. Only the crashing job fails (WorkerCrashed); the others finish with their
    results, and the slot gets a fresh process that takes the next job."""
    from service.pool import WorkerCrashed

    async def scenario():
        events = []
        pool = SolverPool(workers=2, queue_limit=2, on_event=lambda name, **f: events.append((name, f)))
        await pool.start(time.sleep, 0)
        try:
            before = set(pool.worker_pids())
            slow, _ = pool.submit("slow", _sleep_then_return, 1.5, "slow-done")
            crash, _ = pool.submit("crash", _sleep_then_exit, 0.3)
            queued, _ = pool.submit("queued", pow, 3, 4)
            with pytest.raises(WorkerCrashed) as info:
                await wait(crash, 60)
            assert "crash" in str(info.value)
            assert await wait(slow, 60) == "slow-done"
            assert await wait(queued, 60) == 81
            assert pool.crashes == 1 and pool.inflight == 0
            assert [name for name, _ in events].count("worker_crashed") == 1
            assert events[0][1]["key"] == "crash"
            # the dead process was replaced; the survivor kept its pid
            after = set(pool.worker_pids())
            assert len(after) == 2 and len(after & before) == 1
            again, _ = pool.submit("after", pow, 2, 5)
            assert await wait(again, 60) == 32
        finally:
            pool.shutdown()

    asyncio.run(scenario())


def test_sigkill_of_a_busy_worker_fails_only_that_job():
    import os
    import signal

    from service.pool import WorkerCrashed

    async def scenario():
        pool = SolverPool(workers=2, queue_limit=0)
        await pool.start(time.sleep, 0)
        try:
            victim, _ = pool.submit("victim", _sleep_then_return, 30, "never")
            other, _ = pool.submit("other", _sleep_then_return, 1.0, "other-done")
            for _ in range(200):
                if "victim" in pool.running_pids() and pool.began("victim"):
                    break
                await asyncio.sleep(0.05)
            os.kill(pool.running_pids()["victim"], signal.SIGKILL)
            with pytest.raises(WorkerCrashed):
                await wait(victim, 60)
            assert await wait(other, 60) == "other-done"
        finally:
            pool.shutdown()

    asyncio.run(scenario())


def test_a_worker_killed_while_idle_is_replaced_and_the_job_still_runs():
    import os
    import signal

    async def scenario():
        events = []
        pool = SolverPool(workers=1, queue_limit=0, on_event=lambda name, **f: events.append((name, f)))
        await pool.start(time.sleep, 0)
        try:
            (pid,) = pool.worker_pids()
            os.kill(pid, signal.SIGKILL)
            await asyncio.sleep(0.3)  # dead, whether or not its executor noticed yet
            fut, _ = pool.submit("next", pow, 2, 3)
            assert await wait(fut, 120) == 8  # never sent to the dead process: no crash reported
            assert pool.worker_pids() != [pid]
            assert [name for name, _ in events] == ["worker_crashed", "job_retried", "worker_restarted"]
        finally:
            pool.shutdown()

    asyncio.run(scenario())


def test_a_worker_killed_while_idle_then_a_job_within_milliseconds_is_retried_not_crashed():
    """Issue 31: an idle worker killed, then a request at once (before anything noticed
    the death: the job is sent to the dying process) gave 500 worker_crashed. The worker
    marks the job it begins; one it never began is retried on the fresh process."""
    import os
    import signal

    async def scenario():
        events = []
        pool = SolverPool(workers=1, queue_limit=0, on_event=lambda name, **f: events.append((name, f)))
        await pool.start(time.sleep, 0)
        try:
            for round_ in range(3):
                while not pool.worker_pids() or any(slot.warming for slot in pool._slots):
                    await asyncio.sleep(0.05)
                (pid,) = pool.worker_pids()
                os.kill(pid, signal.SIGKILL)
                fut, _ = pool.submit(f"next{round_}", pow, 2, round_)  # no wait: the race
                assert await wait(fut, 120) == 2 ** round_
                assert pid not in pool.worker_pids()
            crashes = [f for name, f in events if name == "worker_crashed"]
            assert len(crashes) == 3 and all(not f.get("job_started", False) for f in crashes)
            assert sum(1 for name, _ in events if name == "job_retried") == 3
        finally:
            pool.shutdown()

    asyncio.run(scenario())


def test_a_job_past_its_hard_wall_time_is_killed_and_the_slot_replaced():
    from service.pool import JobTimedOut

    async def scenario():
        pool = SolverPool(workers=1, queue_limit=1)
        await pool.start(time.sleep, 0)
        try:
            (pid,) = pool.worker_pids()
            fut, _ = pool.submit("forever", _sleep_then_return, 3600, "never", hard_timeout_s=1.0)
            with pytest.raises(JobTimedOut):
                await wait(fut, 60)
            assert pool.timed_out == 1
            again, _ = pool.submit("after", pow, 3, 2)
            assert await wait(again, 120) == 9
            assert pid not in pool.worker_pids()
        finally:
            pool.shutdown()

    asyncio.run(scenario())


def test_workers_die_with_their_parent(tmp_path):
    """A parent killed with SIGKILL leaves no pool worker behind."""
    import os
    import signal
    import subprocess
    import sys

    pids_file = tmp_path / "pids"
    code = (
        "import asyncio, time, sys\n"
        "from service.pool import SolverPool\n"
        "async def main():\n"
        "    pool = SolverPool(workers=2, queue_limit=0)\n"
        "    await pool.start(time.sleep, 0)\n"
        "    pool.submit('a', time.sleep, 3600)\n"
        f"    open({str(pids_file)!r}, 'w').write(' '.join(map(str, pool.worker_pids())))\n"
        "    await asyncio.sleep(3600)\n"
        "asyncio.run(main())\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.time() + 120
        while not (pids_file.exists() and pids_file.read_text().strip()) and time.time() < deadline:
            time.sleep(0.1)
        pids = [int(p) for p in pids_file.read_text().split()]
        assert len(pids) == 2
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
    deadline = time.time() + 10
    alive = pids
    while alive and time.time() < deadline:
        alive = [pid for pid in pids if _alive(pid)]
        time.sleep(0.05)
    assert alive == []


def _alive(pid: int) -> bool:
    import os

    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_queued_job_nobody_waits_for_is_dropped():
    from service.pool import JobDropped

    async def scenario():
        pool = SolverPool(workers=1, queue_limit=2)
        await pool.start(time.sleep, 0)
        try:
            busy, _ = pool.submit("busy", _sleep_then_return, 1.0, "busy-done")
            queued, _ = pool.submit("queued", pow, 2, 2)
            joined, was_joined = pool.submit("queued", pow, 2, 2)
            assert was_joined and pool.state("queued") == "queued" and pool.state("busy") == "running"
            assert pool.leave("queued") == "queued"    # one waiter left, another still waits
            assert pool.leave("queued") == "dropped"   # the last one: removed, never runs
            assert pool.inflight == 1 and pool.dropped == 1
            with pytest.raises(JobDropped):
                await wait(queued, 1)
            assert pool.leave("busy") == "running"     # a running job runs to the end
            assert await wait(busy, 60) == "busy-done"
            assert pool.leave("busy") is None
        finally:
            pool.shutdown()

    asyncio.run(scenario())


def _sleep_then_return(seconds: float, value):
    time.sleep(seconds)
    return value


def test_a_running_job_whose_worker_vanished_unnoticed_fails_as_a_crash(monkeypatch):
    """ProcessPoolExecutor can miss a worker killed while it hands back its result and
    wait for ever; the pool looks at the process itself and fails the job as crashed once
    the process has been gone for DEAD_GRACE_S, while a live worker is waited for."""
    import asyncio
    from concurrent.futures.process import BrokenProcessPool
    from types import SimpleNamespace

    import service.pool as pool

    monkeypatch.setattr(pool, "WATCH_S", 0.05)
    monkeypatch.setattr(pool, "DEAD_GRACE_S", 0.2)
    alive = SimpleNamespace(is_alive=lambda: True, pid=1)
    dead = SimpleNamespace(is_alive=lambda: False, pid=2)

    async def scenario():
        slot = pool._Slot(0)
        slot.executor = SimpleNamespace(_processes={2: dead})
        never = asyncio.get_running_loop().create_future()
        with pytest.raises(BrokenProcessPool):
            await asyncio.wait_for(pool._watched(slot, never), timeout=5)
        assert never.cancelled()
        slot.executor = SimpleNamespace(_processes={1: alive})
        later = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.5, later.set_result, "plan")
        assert await asyncio.wait_for(pool._watched(slot, later), timeout=5) == "plan"

    asyncio.run(scenario())


def test_a_memory_limit_caps_every_worker_and_fails_only_the_job_past_it():
    import resource

    limit = 3 * 2**30

    async def scenario():
        pool = SolverPool(workers=1, queue_limit=1, memory_bytes=limit)
        await pool.start(time.sleep, 0)
        try:
            fut, _ = pool.submit("limit", resource.getrlimit, resource.RLIMIT_AS)
            soft, _hard = await wait(fut, 60)
            assert soft == limit
            hog, _ = pool.submit("hog", bytearray, 8 * 2**30)  # past the cap: MemoryError, not the host's RAM
            with pytest.raises(MemoryError):
                await wait(hog, 60)
            after, _ = pool.submit("after", pow, 2, 5)
            assert await wait(after, 60) == 32
        finally:
            pool.shutdown()

    asyncio.run(scenario())
