"""Bounded work per request (issue 16): the validator's overlap check is a sweep line,
not a pairwise scan, so a program declaring tens of thousands of LX or device-memory
tensors costs a linear number of overlap tests."""
from __future__ import annotations

import copy
import time

import pytest

from target.hardware import load_target
from simulator.validate import _Checker, validate_program
from solver.planners import plan
from tests.primgraphs import softmax

HW = load_target()
N = 20_000


def _checker():
    pg, _ = softmax(M=64, N=256)
    return _Checker(plan(pg, HW, planner="naive"), HW)


def _count(items):
    ck = _checker()
    ck._overlaps(items, "lx_overlap", "LX")
    return ck.overlap_tests, [i.message for i in ck.issues]


def test_overlap_check_is_linear_in_buffers():
    # Same address, disjoint lifetimes (legal reuse): the old scan kept all of them
    # "active" by address and compared every pair (n^2/2 = 2e8 tests).
    reuse = [(f"t{i}", i, i, 0, 4096) for i in range(N)]
    tests, issues = _count(reuse)
    assert issues == [] and tests <= 2 * N
    # All live at once, disjoint addresses: no overlap, at most two tests per buffer.
    side_by_side = [(f"t{i}", 0, 10, i * 128, i * 128 + 128) for i in range(N)]
    tests, issues = _count(side_by_side)
    assert issues == [] and tests <= 2 * N
    # All live at once at one address: every buffer after the first clashes; the check
    # reports 20 and stops.
    tests, issues = _count([(f"t{i}", 0, 10, 0, 4096) for i in range(N)])
    assert len(issues) == 20 and tests <= 2 * 21
    assert "t0 [0, 4096) and t1 [0, 4096)" in issues[0]


@pytest.mark.parametrize("items, overlapping", [
    ([("a", 0, 3, 0, 100), ("b", 3, 5, 99, 200)], True),      # share op 3 and byte 99
    ([("a", 0, 3, 0, 100), ("b", 4, 5, 0, 100)], False),      # a dead before b is written
    ([("a", 0, 3, 0, 100), ("b", 0, 3, 100, 200)], False),    # adjacent bytes
    ([("a", 0, 9, 0, 100), ("b", 1, 2, 200, 300), ("c", 5, 6, 50, 60)], True),  # c inside a
    ([("a", 0, 9, 0, 100), ("b", 2, 1, 0, 100)], False),      # b never live
    ([("a", 0, 9, 0, 100), ("b", 0, 9, 50, 50)], False),      # b has no bytes
])
def test_overlap_check_agrees_with_the_pairwise_definition(items, overlapping):
    _, issues = _count(items)
    assert bool(issues) == overlapping


def test_overlap_check_matches_brute_force_on_random_layouts():
    import random

    rng = random.Random(7)
    for _ in range(300):
        items = []
        for i in range(rng.randint(1, 12)):
            s = rng.randint(0, 8)
            a = rng.randint(0, 10) * 64
            items.append((f"t{i}", s, s + rng.randint(0, 4), a, a + rng.randint(1, 4) * 64))
        brute = any(x[1] <= y[2] and y[1] <= x[2] and x[3] < y[4] and y[3] < x[4]
                    for i, x in enumerate(items) for y in items[i + 1:])
        _, issues = _count(items)
        assert bool(issues) == brute, items


def test_validating_a_program_with_20000_lx_tensors_is_bounded():
    pg, _ = softmax(M=64, N=256)
    d = copy.deepcopy(plan(pg, HW, planner="naive").to_dict())
    template = next(t for t in d["tensors"] if t["role"] == "intermediate")
    n_ops = len(d["ops"])
    for i in range(N):
        t = copy.deepcopy(template)
        t["id"] = f"extra{i}"
        t["memory"] = {"kind": "lx", "lx_address": 0, "size_per_core": 128, "live_from": 0,
                       "live_to": n_ops - 1}
        d["tensors"].append(t)
    started = time.perf_counter()
    issues = validate_program(d, HW)
    seconds = time.perf_counter() - started
    assert sum(i.code == "lx_overlap" for i in issues) == 20
    # Generous: the pairwise scan took minutes here; the sweep takes well under a second
    # of its own (parsing 20,000 declarations dominates).
    assert seconds < 20, seconds


def test_operator_caps_from_flags_and_environment(monkeypatch, tmp_path):
    """`sticksat serve --max-time-limit/--body-timeout/--max-numerics-elements` and
    STICKSAT_MAX_TIME_LIMIT / STICKSAT_BODY_TIMEOUT reach the service's config."""
    import argparse

    import uvicorn

    from service.http import config_from_env
    from service.commands import serve

    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(config=app.state.service.config,
                                                                      http=kw["http"]))

    def run(argv, env):
        for k in ("STICKSAT_MAX_TIME_LIMIT", "STICKSAT_BODY_TIMEOUT"):
            monkeypatch.delenv(k, raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        parser = argparse.ArgumentParser()
        serve.register(parser.add_subparsers())
        args = parser.parse_args(["serve", "--store", str(tmp_path / "s.sqlite"), "--workers", "1", *argv])
        assert args.func(args) == 0
        return seen["config"]

    config = run(["--max-time-limit", "30", "--body-timeout", "4", "--max-numerics-elements", "1000"], {})
    assert (config.max_time_limit_s, config.body_read_timeout_s, config.max_numerics_elements) == (30, 4, 1000)
    config = run([], {"STICKSAT_MAX_TIME_LIMIT": "12.5", "STICKSAT_BODY_TIMEOUT": "7"})
    assert (config.max_time_limit_s, config.body_read_timeout_s) == (12.5, 7)
    config = run([], {})
    assert config.max_time_limit_s == 3600 and config.body_read_timeout_s == 30
    assert seen["http"].__name__ == "HeaderTimeoutProtocol"
    with pytest.raises(SystemExit):
        run(["--max-time-limit", "0"], {})
    monkeypatch.setenv("STICKSAT_MAX_TIME_LIMIT", "9")
    assert config_from_env().max_time_limit_s == 9


def test_time_limit_cap_in_request_preparation():
    """Above the cap: refused (422 invalid_option naming it), never clamped; without a
    time limit the default is held under the cap."""
    import json as _json

    from service.prepare import RequestLimits, prepare_compile
    from service.pipeline import GraphLimits
    from service_helpers import chain_graph

    limits = RequestLimits(GraphLimits(), max_time_limit_s=5.0, max_numerics_elements=1000)
    body = {"graph": chain_graph(rows=32), "options": {"planner": "naive", "time_limit_s": 6}}
    refused = prepare_compile(_json.dumps(body).encode(), limits)
    assert refused["problem"]["code"] == "invalid_option" and "cap of 5 s" in refused["problem"]["detail"]
    body["options"]["time_limit_s"] = 5
    assert prepare_compile(_json.dumps(body).encode(), limits).options.time_limit_s == 5
    del body["options"]["time_limit_s"]
    assert prepare_compile(_json.dumps(body).encode(), limits).options.time_limit_s == 5  # default 10, capped
