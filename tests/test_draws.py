"""Deterministic draws (`single.plan_graph`, `budget.DETERMINISTIC_DRAWS`): while a solve
stops before its proof, the pipeline solves again with other CP-SAT seeds and keeps the
fastest program; `seed` picks a set of draws no other seed shares, and a run repeats."""
import re

import pytest

from benchmarks.suite import load_suite
from lowering import lower_document
from simulator.timing import time_program
from solver.oracle import checked_program
from solver.spyre import budget
from solver.spyre.single import draw_count, plan_graph
from target.hardware import load_target

HW = load_target()
DRAW = re.compile(r"draw (\d+) of (\d+) \(CP-SAT seed (\d+)\): (\w+), simulated ([0-9.]+) us")


@pytest.fixture(scope="module")
def llama_tiny():
    return next(lower_document(doc) for name, doc in load_suite("tiny", only="llama_tiny_prefill16"))


def _draws(d):
    return [(int(m.group(3)), m.group(4), float(m.group(5))) for n in d.stats["notes"] if (m := DRAW.match(n))]


def test_unproven_solves_draw_again_and_keep_the_fastest(llama_tiny, monkeypatch):
    # a deterministic budget far too short to prove anything: every solve stops unproven
    monkeypatch.setattr(budget, "DETERMINISTIC_PER_SECOND", 0.002)
    d = plan_graph(llama_tiny, HW, time_limit_s=2, deterministic=True, seed=2, draws=3)
    draws = _draws(d)
    assert [s for s, _, _ in draws] == [4, 5, 6], d.stats["notes"]   # seed 2 of 3 draws: 4-6
    assert all(st == "FEASIBLE" for _, st, _ in draws)
    prog, issues = checked_program(llama_tiny, HW, d)
    assert prog is not None, issues
    # the fastest draw, or better where other draws run segments faster (draw_crossover)
    assert time_program(prog, HW).total_us <= min(us for _, _, us in draws) + 0.05
    again = plan_graph(llama_tiny, HW, time_limit_s=2, deterministic=True, seed=2, draws=3)
    assert _draws(again) == draws
    one = plan_graph(llama_tiny, HW, time_limit_s=2, deterministic=True, seed=2, draws=1)
    assert _draws(one) == []


def test_draw_count_follows_the_budget(monkeypatch):
    monkeypatch.setattr(budget, "DETERMINISTIC_DRAWS", 4)
    monkeypatch.setattr(budget, "DETERMINISTIC_DRAW_S", 2.5)
    assert [draw_count(s) for s in (0.5, 2.4, 5.0, 7.4, 10.0, 1000.0)] == [1, 1, 2, 2, 4, 4]
