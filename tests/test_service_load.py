"""A short load test (benchmarks/load_test.py, issue 16): concurrent clients against a
real `sticksat serve` on 127.0.0.1 with one worker and a queue of one, for a bounded
time. Nothing but 200 and honest 503s (problem+json pool_full with Retry-After >= 1),
and every program a /compile returned is still served afterwards."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from service_helpers import ServiceProcess

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from load_test import run_load  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("load")
    proc = ServiceProcess(base / "store.sqlite", base / "server.log", ["--workers", "1", "--queue-limit", "1"])
    proc.start()
    yield proc
    proc.stop()


def test_concurrent_clients_get_200_or_an_honest_503_and_nothing_is_lost(server):
    result = run_load(server.url, clients=6, seconds=6, seed=1)
    assert result["errors"] == []
    assert result["programs_lost"] == [] and result["programs_returned"] >= 5
    compile_statuses = result["routes"]["/compile"]["statuses"]
    assert set(compile_statuses) <= {"200", "503"} and compile_statuses["200"] >= 5
    for route in result["routes"].values():
        assert route["p50_ms"] <= route["p90_ms"] <= route["p99_ms"] <= route["max_ms"]
    assert server.metric("sticksat_requests_total", {"status": "500"}) == 0
    assert server.metric("sticksat_worker_crashes_total") == 0


def test_workers_killed_under_load_fail_only_their_own_jobs(tmp_path):
    """The same load with a solver worker SIGKILLed every 1.5 s (2 workers): each kill
    fails at most the one request whose job that worker ran (500 worker_crashed), every
    other request is a 200 or an honest 503, and nothing returned is lost."""
    proc = ServiceProcess(tmp_path / "store.sqlite", tmp_path / "server.log",
                          ["--workers", "2", "--queue-limit", "2"]).start()
    try:
        result = run_load(proc.url, clients=6, seconds=6, seed=2, n_graphs=200, kill_every_s=1.5,
                          server_pid=proc.proc.pid)
        assert result["workers_killed"] >= 2
        assert result["errors"] == []
        assert result["jobs_failed_by_kills"] <= result["workers_killed"]
        assert result["programs_lost"] == [] and result["programs_returned"] >= 5
        assert proc.metric("sticksat_worker_crashes_total") == result["requests_failed_by_kills"]
        assert proc.metric("sticksat_requests_total", {"status": "500"}) == result["requests_failed_by_kills"]
    finally:
        proc.stop()
