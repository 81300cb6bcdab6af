"""The CP-SAT planner's layout decisions beyond the stick dim (solver/spyre/layout_choice.py)
and its small-op moves (solver/spyre/hold_moves.py, strategies._few_cores_strategy)."""
from __future__ import annotations

from dataclasses import replace

import torch

from lowering import lower_document
from target.hardware import load_target
from target.layout import batch_outer_order, default_dim_order, preferred_orders
from solver.oracle import checked_program, simulated_us
from solver.spyre.cost_model import predict_program_ns
from solver.plan import OpPlan
from solver.planners import plan
from solver.spyre.cpsat_planner import plan_cpsat
from solver.spyre.local_search import local_search
from solver.spyre.model import build_model
from solver.spyre.schedule import chain_order
from solver.spyre.start import starting_plan
from tests.lowering_helpers import DocBuilder
from benchmarks.suite import load_suite

HW = load_target()


def _rnd(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(torch.float16)


def _bmm_then_transpose(B=64, M=32, K=64, N=16):
    """o = p @ v (a bmm), transposed to [M, B, N] and flattened to [M, B*N], then scaled: the
    transpose folds into the bmm (it writes [M, B, N], the batch inside its rows), and the
    flatten of 16-wide rows into 64-wide ones moves data in any order. 64 batches: a core's
    slice holds two of them on 32 cores, so the batch-inside drain stalls (the timing model
    charges the batches one core interleaves)."""
    b = DocBuilder()
    p = b.input(_rnd(B, M, K, seed=1))
    v = b.input(_rnd(B, K, N, seed=2))
    o = b.call("aten.bmm.default", p, v)
    t = b.call("aten.transpose.int", o, 0, 1)
    r = b.call("aten.reshape.default", t, [M, B * N])
    out = b.call("aten.mul.Tensor", r, 0.5)
    return lower_document(b.document(out))


def _bmm_result(pg) -> str:
    mm = next(op for op in pg.ops if op.body.kind == "matmul")
    return mm.output.tensor


def test_the_order_a_bmm_prefers_is_proposed():
    pg = _bmm_then_transpose()
    mm = next(op for op in pg.ops if op.body.kind == "matmul")
    t = mm.output.tensor
    shape = pg.tensors[t].shape
    assert shape == (32, 64, 16)
    orders = preferred_orders(mm, mm.output, shape, len(shape) - 1)
    assert batch_outer_order(shape, 2, [1]) == [1, 0, 2]
    assert [1, 0, 2] in orders and default_dim_order(3, 2) not in orders


def test_planner_picks_the_dim_order_that_wins_on_the_judge():
    """The bmm's result kept batch-outermost removes the timing model's drain stall and costs
    the reshape copy nothing (it moves data either way): the planner chooses that order, the
    program is valid, and the same plan in the default order simulates slower. Fails if the
    dim-order decision is removed from the model."""
    pg = _bmm_then_transpose()
    t = _bmm_result(pg)
    d = plan_cpsat(pg, HW, time_limit_s=5, deterministic=True)
    order = d.dim_orders.get(t)
    assert order is not None and order[0] == 1, d.dim_orders   # the batch dim outermost
    prog, issues = checked_program(pg, HW, d)
    assert prog is not None, issues
    assert prog.tensor_map()[t].layout.dim_order == order
    chosen = simulated_us(pg, HW, d)
    default = simulated_us(pg, HW, replace(d, dim_orders={}))
    assert default is not None and chosen < default
    # and through the registry (validated, emitted with the order)
    program = plan(pg, HW, "cpsat", time_limit_s=5, deterministic=True)
    assert program.tensor_map()[t].layout.dim_order[0] == 1


def test_model_prices_each_order_as_the_simulator_does():
    """The order variants' prices are the simulator's: the model's objective of the plan in
    each order equals the predicted time of its emitted program."""
    pg = chain_order(_bmm_then_transpose())
    t = _bmm_result(pg)
    d, _, _, _ = starting_plan(pg, HW, None)
    ctx, _, sm = build_model(pg, HW, d)
    assert t in ctx.alt_orders and all(o[0] == 1 for o in ctx.alt_orders[t])
    for orders in ({}, {t: list(ctx.alt_orders[t][0])}):
        dd = replace(d, dim_orders=orders, resident={})
        picks = {op.id: sm.strategy_index(op.id, dd.ops.get(op.id, OpPlan()), dd.dim_orders) for op in pg.ops}
        assert all(k is not None for k in picks.values())
        assert sm.tensor_order(t, picks) == (tuple(orders[t]) if orders else None)
        prog, issues = checked_program(pg, HW, dd)
        assert prog is not None, issues
        # the model sums whole nanoseconds per op
        assert abs(sm.objective_of(picks, set(), dict(ctx.input_sticks, **dd.input_sticks))
                   - predict_program_ns(prog, HW)) <= len(pg.ops)


def test_small_ops_go_to_one_core_with_their_intermediates_in_lx():
    """BERT at toy size (16 tokens, hidden 64: every op a few hundred ns at most): on the
    timing model one core streams such an op nearly as fast as 32, and a chain on one core
    can keep every intermediate in LX. The local search's hold moves find that (the model
    prices the result below the search without them, with more ops on one core and more
    tensors held), the plan validates, and the planner's result simulates faster than the
    start's. Fails if the one-core strategies or the hold moves are removed."""
    (_, doc), = load_suite("tiny", only="bert_tiny")
    pg = chain_order(lower_document(doc))
    d, _, _, _ = starting_plan(pg, HW, None)
    _, _, sm = build_model(pg, HW, d)
    with_holds = local_search(sm, d, None, max_passes=3)
    without = local_search(sm, d, None, max_passes=3, hold_moves=False)

    def obj(x):
        picks = {op.id: sm.strategy_index(op.id, x.ops[op.id], x.dim_orders) for op in pg.ops}
        return sm.objective_of(picks, set(x.resident), dict(sm.ctx.input_sticks, **x.input_sticks))

    def one_core(x):
        return sum(1 for p in x.ops.values() if not p.core_split)
    assert obj(with_holds) < 0.8 * obj(without)
    assert len(with_holds.resident) > len(without.resident)
    assert one_core(with_holds) > one_core(d)
    assert checked_program(pg, HW, with_holds)[0] is not None
