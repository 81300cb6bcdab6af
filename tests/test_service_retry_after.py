"""Retry-After on a full pool follows what is queued: in-flight jobs x mean recent
solve time / workers (at least 1 s); before any job finished, the age of the oldest
job in flight stands in for the mean."""
from __future__ import annotations

import asyncio
import time

import pytest

from service.pool import PoolFull, SolverPool, _Job


def _job(key, loop, age=0.0):
    job = _Job(key, print, (), None, loop.create_future())
    job.submitted = time.monotonic() - age
    return job


def _pool(workers, queue_limit, recent=(), inflight=0, ages=()):
    pool = SolverPool(workers, queue_limit)
    loop = asyncio.new_event_loop()  # only to make (never awaited) futures
    pool._recent_seconds = list(recent)
    for i in range(inflight):
        key = f"job{i}"
        pool._inflight[key] = _job(key, loop, ages[i] if i < len(ages) else 0.0)
    loop.close()
    return pool


def test_backlog_of_30_s_is_not_1_s():
    # 1 worker, 3 jobs in flight, solves take 10 s: the backlog is ~30 s
    assert _pool(1, 2, recent=[10.0, 10.0], inflight=3).retry_after_s() == 30
    # spread over 3 workers
    assert _pool(3, 0, recent=[10.0], inflight=3).retry_after_s() == 10
    # the mean, not the median: one slow job in the window counts
    assert _pool(1, 0, recent=[1.0, 1.0, 28.0], inflight=1).retry_after_s() == 10


def test_without_history_the_oldest_job_bounds_it():
    assert _pool(1, 1, inflight=2, ages=(12.0, 1.0)).retry_after_s() >= 24
    assert _pool(2, 0).retry_after_s() == 1


def test_at_least_one_second():
    assert _pool(4, 0, recent=[0.01], inflight=1).retry_after_s() == 1


def test_pool_full_carries_it():
    async def run():
        pool = _pool(1, 0, recent=[7.0], inflight=0)
        pool._ready.set()  # no worker process: the pool is full before one is needed
        pool._inflight["busy"] = _job("busy", asyncio.get_running_loop())
        with pytest.raises(PoolFull) as info:
            pool.submit("other", print)
        return info.value.retry_after_s
    assert asyncio.run(run()) == 7
