"""The large-graph path on the core's search (solver/spyre/depth/core_search.py, issue 30):
the Spyre strategy problem in the core's form, read back, and the path against the windows
heuristic it replaced."""
from __future__ import annotations

import time

import pytest

from target.hardware import load_target
from simulator.timing import time_program
from simulator.validate import validate_program
from solver.core.problem import evaluate
from solver.spyre import budget
from solver.spyre.depth import core_search
from solver.spyre.schedule import chain_order
from solver.spyre.start import default_hint
from solver.spyre.strategies import GraphContext

torch = pytest.importorskip("torch")

HW = load_target()


def _tiny_llama(layers: int):
    from tests.test_repeats import _tiny_llama as make

    return make(layers)


@pytest.fixture(scope="module")
def llama2():
    return chain_order(_tiny_llama(2))


def test_a_plan_reads_back_as_itself(llama2):
    """The heuristic plan as a choice of the strategy problem is feasible and reads back to
    the same op strategies; the copy nodes price each shared restickify once."""
    pg = llama2
    hint, _ = default_hint(pg, HW)
    ctx = GraphContext.build(pg, HW, hint.input_sticks)
    sp = core_search.build_problem(pg, HW, ctx, core_search.spyre_strategies(pg, HW, hint, ctx))
    choice = core_search.choice_of(sp, hint)
    assert evaluate(sp.problem, choice).feasible
    d, _ = core_search.decisions_of(sp, choice, HW)
    for op in pg.ops:
        mine, theirs = d.ops[op.id], hint.ops.get(op.id)
        if theirs is not None and theirs.stick is not None:
            assert mine.stick == theirs.stick, op.id
            assert {k: v for k, v in mine.core_split.items() if v > 1} == \
                {k: v for k, v in theirs.core_split.items() if v > 1}, op.id
    assert any(kind == "copy" for kind, _ in sp.nodes)


def test_core_search_beats_the_windows_path_without_repeats(llama2, monkeypatch):
    """Two layers with the block detection off and the windows threshold lowered: the
    large-graph path is the core's search (its note), the program validates, simulates no
    slower than the windows path it replaced (side by side, same limit) and the plan
    keeps the limit (with a margin for a loaded machine)."""
    from solver.planners import plan

    pg = llama2
    monkeypatch.setattr(budget, "MIN_COPIES", 10 ** 9)
    monkeypatch.setattr(budget, "WINDOWS_ABOVE_OPS", 30)
    monkeypatch.setattr(budget, "WINDOW_OPS", 40)
    monkeypatch.setattr(budget, "MIN_WINDOW_S", 0.2)
    limit = 6.0
    t = time.perf_counter()
    new = plan(pg, HW, "cpsat", time_limit_s=limit, fallback=False)
    wall = time.perf_counter() - t
    assert new.stats.notes[0].startswith(f"core search: {len(pg.ops)} ops"), new.stats.notes
    assert not validate_program(new, HW)
    monkeypatch.setattr(core_search, "USE_CORE_SEARCH", False)
    old = plan(pg, HW, "cpsat", time_limit_s=limit, fallback=False)
    assert old.stats.notes[0].startswith("windows:"), old.stats.notes
    new_us, old_us = time_program(new, HW).total_us, time_program(old, HW).total_us
    assert new_us <= old_us * (1 + 1e-9), (new_us, old_us, new.stats.notes)
    assert wall <= 1.5 * limit + 2.0, wall
