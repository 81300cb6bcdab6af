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
