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
    result = run_load(server.url, clients=6, seconds=8, seed=1)
    assert result["errors"] == []
    assert result["programs_lost"] == [] and result["programs_returned"] >= 5
    compile_statuses = result["routes"]["/compile"]["statuses"]
    assert set(compile_statuses) <= {"200", "503"} and compile_statuses["200"] >= 5
    for route in result["routes"].values():
        assert route["p50_ms"] <= route["p90_ms"] <= route["p99_ms"] <= route["max_ms"]
    assert server.metric("sticksat_requests_total", {"status": "500"}) == 0
    assert server.metric("sticksat_worker_crashes_total") == 0
