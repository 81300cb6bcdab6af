"""Compile time that fits the model: the CP-SAT planner's budget scales with the problem
under the caller's limit, and a solve stops once proven within the gap limits. No test
here measures wall time (the machines are shared and noisy): they check what the planner
asks CP-SAT for and what it reports."""
import pytest

import tests.primgraphs as primgraphs
from target.hardware import load_target
from solver.core import SolveOptions, solver_parameters
from solver.spyre import budget as knobs
from solver.spyre import single, solve
from solver.spyre.budget import ABSOLUTE_GAP_LIMIT, DEFAULT_TIME_LIMIT_S, RELATIVE_GAP_LIMIT, default_budget_s
from solver.spyre.cpsat_planner import plan_cpsat
from solver.spyre.local_search import local_search
from solver.spyre.model import build_model
from solver.spyre.start import decisions_from_program
from solver.plan import OpPlan
from solver.planners import plan
from solver.spyre.schedule import chain_order

HW = load_target()


def test_budget_grows_with_the_number_of_strategies():
    sizes = [1, 50, 200, 400, 800, 2000, 10_000]
    budgets = [default_budget_s(n, start_us=1e6) for n in sizes]
    assert budgets == sorted(budgets)
    assert budgets[0] < budgets[3] < budgets[-1]
    assert budgets[-1] == DEFAULT_TIME_LIMIT_S  # a big model gets the whole default limit


def test_budget_grows_with_the_stakes():
    """A plan whose every run takes microseconds is not worth the time a layer's is."""
    small, big = default_budget_s(1000, start_us=40.0), default_budget_s(1000, start_us=10_000.0)
    assert small < big
    assert small <= 2.0 and big == DEFAULT_TIME_LIMIT_S


@pytest.mark.parametrize("cap", [0.05, 0.5, 2.0, 10.0, 60.0])
def test_budget_never_exceeds_the_callers_limit(cap):
    for n in (1, 100, 1000, 100_000):
        for us in (None, 1.0, 1e3, 1e7):
            assert 0 < default_budget_s(n, us, cap) <= cap
    # an explicit limit is a cap, not a floor: a big problem gets all of it, a bigger cap more
    assert default_budget_s(100_000, 1e7, cap) == cap
    assert default_budget_s(100_000, 1e7, 2 * cap) == 2 * cap


def test_solver_parameters_carry_the_gap_limits():
    p = solver_parameters(SolveOptions(time_limit_s=3, relative_gap_limit=0.01, absolute_gap_limit=5)).parameters
    assert p.relative_gap_limit == pytest.approx(0.01) and p.absolute_gap_limit == pytest.approx(5)
    default = solver_parameters(SolveOptions(time_limit_s=3)).parameters
    assert default.relative_gap_limit == 0  # the generic core keeps CP-SAT's defaults


class _Recorder:
    """Wraps `solver_parameters` in the planner: the options of every CP-SAT round."""

    def __init__(self, monkeypatch):
        self.options: list[SolveOptions] = []
        real = solve.solver_parameters

        def record(options):
            self.options.append(options)
            return real(options)
        monkeypatch.setattr(solve, "solver_parameters", record)


def _note(d, prefix):
    return next(n for n in d.stats["notes"] if n.startswith(prefix))


@pytest.mark.parametrize("deterministic", [True, False])
def test_small_graph_stops_within_the_gap_on_a_budget_below_the_limit(monkeypatch, deterministic):
    pg, _ = primgraphs.softmax(M=128, N=512)
    rec = _Recorder(monkeypatch)
    d = plan_cpsat(pg, HW, time_limit_s=DEFAULT_TIME_LIMIT_S, deterministic=deterministic)
    budget = float(_note(d, "budget:").split()[1])
    assert budget < DEFAULT_TIME_LIMIT_S
    assert rec.options, "no CP-SAT round ran"
    for o in rec.options:
        assert o.relative_gap_limit == RELATIVE_GAP_LIMIT and o.absolute_gap_limit == ABSOLUTE_GAP_LIMIT
        if deterministic:  # the deterministic clock is a share of the budget, not of the limit
            assert o.deterministic_time <= knobs.DETERMINISTIC_PER_SECOND * budget
        else:
            assert o.time_limit_s <= budget
    st = d.stats
    assert st["solver_status"] == "OPTIMAL" or st["gap"] <= RELATIVE_GAP_LIMIT + 1e-9
    assert st["gap"] is not None and (
        st["gap"] <= RELATIVE_GAP_LIMIT + 1e-9
        or (st["objective"] - st["bound"]) * 1000.0 <= ABSOLUTE_GAP_LIMIT + 1e-6)


def test_the_callers_limit_caps_the_budget(monkeypatch):
    pg, _ = primgraphs.mlp()
    rec = _Recorder(monkeypatch)
    d = plan_cpsat(pg, HW, time_limit_s=0.4, deterministic=True)
    assert float(_note(d, "budget:").split()[1]) <= 0.4
    assert all(o.deterministic_time <= knobs.DETERMINISTIC_PER_SECOND * 0.4 + 1e-12 for o in rec.options)


def test_fixed_budget_is_the_old_behaviour(monkeypatch):
    pg, _ = primgraphs.mlp()
    rec = _Recorder(monkeypatch)
    d = plan_cpsat(pg, HW, time_limit_s=3.0, deterministic=True, budget="fixed")
    assert _note(d, "budget:").startswith("budget: 3.0 s of a 3 s limit (fixed)")
    assert all(o.relative_gap_limit is None and o.absolute_gap_limit is None for o in rec.options)
    with pytest.raises(ValueError):
        plan_cpsat(pg, HW, budget="whatever")


def test_deterministic_budget_and_plan_repeat():
    pg, _ = primgraphs.softmax(M=128, N=512)
    a = plan(pg, HW, "cpsat", deterministic=True)
    b = plan(pg, HW, "cpsat", deterministic=True)
    assert a.to_dict()["ops"] == b.to_dict()["ops"] and a.to_dict()["tensors"] == b.to_dict()["tensors"]
    assert [n for n in a.stats.notes if n.startswith("budget")] == [n for n in b.stats.notes if n.startswith("budget")]


def test_local_search_prices_moves_as_the_objective_does():
    """The incremental local search ends where no single move improves `objective_of` (the
    full re-evaluation), from the naive start."""
    from solver.naive import plan_naive

    pg, _ = primgraphs.attention_scores()
    pg = chain_order(pg)
    start = plan_naive(pg, HW)
    _, S, sm = build_model(pg, HW, start)
    d = local_search(sm, start, None)
    picks = {op.id: sm.strategy_index(op.id, d.ops.get(op.id, OpPlan())) for op in pg.ops}
    assert None not in picks.values()
    inputs = {t: d.input_sticks.get(t) for t in sm.ctx.free_inputs}
    resident = {t for t in d.resident if t in sm.res}
    best = sm.objective_of(picks, resident, inputs)
    assert best <= sm.objective_of({op.id: sm.strategy_index(op.id, start.ops.get(op.id, OpPlan())) or 0
                                    for op in pg.ops}, set(start.resident), dict(start.input_sticks))
    for op in pg.ops:  # with residency dropped where a move breaks it, as the search does
        for k in range(len(S[op.id])):
            trial = dict(picks, **{op.id: k})
            keep = {t for t in resident if sm.residency_ok(t, trial, d.resident[t].size_per_core)}
            needed = sm.needed_resticks(trial, inputs)
            keep = set(sm.repair_spans({t: d.resident[t] for t in keep}, needed))
            if sm.spans_ok(keep, needed):
                assert sm.objective_of(trial, keep, inputs) >= best


def test_warm_start_plan_is_never_worse_than_its_hint_on_a_small_budget():
    pg, _ = primgraphs.mlp(M=64, K=128, N=192)
    hint = plan(pg, HW, "heuristic")
    d = plan_cpsat(pg, HW, deterministic=True, hint=decisions_from_program(pg, hint))
    from solver.spyre.cost_model import predict_program_us
    assert d.stats["predicted_us"] <= predict_program_us(hint, HW) + 1e-9


def test_never_slower_than_the_heuristic_in_its_own_order(monkeypatch):
    """A short search can end slower than the heuristic as the heuristic ordered the ops
    (the search starts from it in chain order): the heuristic's plan is returned then."""
    from solver.spyre.cost_model import predict_program_us
    from solver.naive import plan_naive

    pg, _ = primgraphs.softmax(M=128, N=512)
    heur = plan(pg, HW, "heuristic")

    def slow(pg, hw, **_):
        d = plan_naive(pg, hw)
        d.stats.update(predicted_us=1e9, notes=["a bad plan"])
        return d
    monkeypatch.setattr(single, "plan_chain_ordered", slow)
    d = plan_cpsat(pg, HW, deterministic=True)
    assert d.planner == "cpsat" and d.stats["predicted_us"] == pytest.approx(predict_program_us(heur, HW))
    assert "own op order" in d.stats["notes"][-1]
    program = plan(pg, HW, "cpsat", deterministic=True)  # and plan() takes it as any plan
    assert predict_program_us(program, HW) <= predict_program_us(heur, HW) + 1e-9
