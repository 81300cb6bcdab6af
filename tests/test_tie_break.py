"""The solve's second, lexicographic objective (`model.add_tie_break`): of strategies the
cost model prices alike, every seed's solve picks the one whose core split cuts the output's
sticks least, whatever order the strategies come in."""
import math

from ortools.sat.python import cp_model

from benchmarks.suite import load_suite
from lowering import lower_document
from solver.spyre import budget
from solver.spyre.model import SpyreModel, add_tie_break, build_model, stick_split_pieces
from solver.spyre.schedule import chain_order
from solver.spyre.start import starting_plan
from target.hardware import load_target

HW = load_target()


def _picked(sm: SpyreModel, seed: int):
    add_tie_break(sm)
    sm.m.Minimize(sum(sm.objective_terms))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = seed
    assert solver.Solve(sm.m) == cp_model.OPTIMAL
    (k,) = [k for k, v in enumerate(sm.pick["mm"]) if solver.Value(v)]
    return sm.S["mm"][k]


def test_tied_splits_resolve_rows_first_for_every_seed_and_order():
    pg = chain_order(next(lower_document(d) for _, d in load_suite("tiny", only="linear_tiny_m16_k64_n128")))
    hint_d, _, _, _ = starting_plan(pg, HW, None)
    ctx, strategies, sm = build_model(pg, HW, hint_d)
    op = sm.ops["mm"]
    # two strategies the objective prices alike (whole ns, the same cores busy), one cutting
    # the output's sticks in two, the other not (m 4 x n 2 against m 8)
    by_price: dict = {}
    for s in strategies["mm"]:
        by_price.setdefault((round(s.cost_ns(HW)), math.prod(s.core_split.values())), []).append(s)
    tied = next(v for _, v in sorted(by_price.items(), key=lambda kv: kv[0])
                if len({stick_split_pieces(op, s) for s in v}) > 1)
    best = round(tied[0].cost_ns(HW))
    picks = set()
    for order in (tied, tied[::-1]):
        for seed in (1, 2, 3):
            got = _picked(SpyreModel(pg, HW, ctx, {"mm": list(order)}), seed)
            assert round(got.cost_ns(HW)) == best
            assert stick_split_pieces(op, got) == min(stick_split_pieces(op, s) for s in tied)
            picks.add((tuple(sorted(got.core_split.items())), got.stick))
    assert len(picks) == 1


def test_the_term_is_off_at_zero(monkeypatch):
    pg = chain_order(next(lower_document(d) for _, d in load_suite("tiny", only="linear_tiny_m16_k64_n128")))
    hint_d, _, _, _ = starting_plan(pg, HW, None)
    _, _, sm = build_model(pg, HW, hint_d)
    n = len(sm.objective_terms)
    monkeypatch.setattr(budget, "STICK_SPLIT_TIE_NS", 0)
    assert add_tie_break(sm) == 0 and len(sm.objective_terms) == n
    monkeypatch.setattr(budget, "STICK_SPLIT_TIE_NS", 1)
    assert add_tie_break(sm) == 1 and len(sm.objective_terms) == n + 1
