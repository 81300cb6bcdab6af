"""Consolidating draws (`solver.spyre.draw_crossover`): segments of other draws that run
faster are taken where the two plans can switch without a seam cost, the result is judged
whole, and the same draws give the same plan in any order."""
from dataclasses import replace

import pytest

from benchmarks.suite import load_suite
from lowering import lower_document
from solver.plan import Residency
from solver.spyre import draw_crossover as X
from solver.spyre.schedule import chain_order
from solver.spyre.start import default_hint
from target.hardware import load_target

HW = load_target()


@pytest.fixture(scope="module")
def tiny():
    pg = chain_order(next(lower_document(doc) for _, doc in load_suite("tiny", only="llama_tiny_prefill16")))
    h, _ = default_hint(pg, HW)
    ids = [op.id for op in pg.ops]
    # no LX residency (each may span bundles) and bundles cut at 32 and 52: three segments
    base = replace(h, resident={}, bundle_starts=[ids[0], ids[32], ids[52]], op_order=ids)
    return pg, ids, base


def _one_core(d, op_id):
    p = d.ops[op_id]
    return replace(d, ops={**d.ops, op_id: replace(p, core_split={}, temporal_tiles={})})


def test_each_draw_keeps_its_faster_segment(tiny):
    pg, ids, base = tiny
    # each draw has one matmul on one core, in another segment: neither is the base, the
    # crossover of the two is
    a, b = _one_core(base, ids[8]), _one_core(base, ids[62])
    t_base, t_a, t_b = (X.timed(pg, HW, d).us for d in (base, a, b))
    assert t_base < t_a < t_b
    got, notes = X.crossover(pg, HW, [a, b])
    assert got.us == pytest.approx(t_base, abs=1e-6), notes
    assert X.plan_key(got.decisions) != X.plan_key(a)
    assert got.decisions.ops[ids[8]].core_split == base.ops[ids[8]].core_split
    assert got.decisions.ops[ids[62]].core_split == base.ops[ids[62]].core_split
    assert X.timed(pg, HW, got.decisions) is not None     # validated as returned


def test_the_same_draws_give_the_same_plan_in_any_order(tiny):
    pg, ids, base = tiny
    draws = [_one_core(base, ids[8]), _one_core(base, ids[62]), _one_core(base, ids[12])]
    keys = {X.plan_key(X.crossover(pg, HW, order)[0].decisions)
            for order in (draws, draws[::-1], draws[1:] + draws[:1])}
    assert len(keys) == 1
    # equal plans under another op order of their dicts: one key
    shuffled = replace(base, ops=dict(reversed(list(base.ops.items()))))
    assert X.plan_key(shuffled) == X.plan_key(base)


def test_no_switch_where_a_crossing_tensor_differs(tiny):
    pg, ids, base = tiny
    t_base = X.timed(pg, HW, base)
    # op 31's result is read after the cut at 32: written another way, no switch there
    other = X.timed(pg, HW, _one_core(base, ids[31]))
    cuts = X.common_cuts(t_base, other)
    assert 32 in cuts
    assert 32 not in X.seamless_cuts(pg, t_base, other, cuts)
    assert 52 in X.seamless_cuts(pg, t_base, other, cuts)
    # a residency across the cut at 32 (a result made before it, read after it, held in LX)
    readers = {}
    for j, op in enumerate(pg.ops):
        for a in op.inputs:
            readers.setdefault(a.tensor, []).append(j)
    held = t_held = None
    for i in range(31, -1, -1):
        t = pg.ops[i].output.tensor
        if max(readers.get(t, [0])) >= 32:
            held = replace(base, resident={t: Residency(lx_address=0)})
            t_held = X.timed(pg, HW, held)
            if t_held is not None:
                break
    assert t_held is not None
    assert 32 not in X.seamless_cuts(pg, t_base, t_held, X.common_cuts(t_base, t_held))
    # held alike by both plans (same address and size): the switch keeps it held
    t_held2 = X.timed(pg, HW, _one_core(held, ids[62]))
    assert 32 in X.seamless_cuts(pg, t_held, t_held2, X.common_cuts(t_held, t_held2))
    got = X.compose(pg, [(held, ids[:32]), (_one_core(held, ids[62]), ids[32:])])
    assert got.resident == held.resident


def test_compose_of_one_plan_is_that_plan(tiny):
    pg, ids, base = tiny
    pieces = [(base, ids[:32]), (base, ids[32:52]), (base, ids[52:])]
    got = X.compose(pg, pieces)
    assert got.ops == base.ops and got.op_order == ids and got.input_sticks == base.input_sticks
    assert X.timed(pg, HW, got).us == pytest.approx(X.timed(pg, HW, base).us, abs=1e-6)
