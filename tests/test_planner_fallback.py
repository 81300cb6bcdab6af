"""No planner failure reaches the user: every op keeps a legal strategy, and a planner that
raises or returns an invalid program falls back along cpsat -> heuristic -> naive (stats,
note and warning say so), while strict mode raises an error naming the op."""
from __future__ import annotations

import logging

import pytest

from target.primitives import Access, Call, Const, In, IterDim, PointwiseBody, PrimGraph, PrimOp, PrimTensor
from target.hardware import load_target
from simulator.validate import validate_program
from solver import planners
from solver.plan import PlanDecisions, Residency
from solver.planners import PlannerFailed, plan
from solver.spyre.strategies import GraphContext, NoLegalStrategy, op_strategies

HW = load_target("spyre")
I64 = "int64"


def index_arithmetic(n: int = 24) -> PrimGraph:
    """Relative positions as T5's bucket computation makes them: a row of positions minus a
    column of positions, int64, tiny. The row vector's one dim cannot be cut in whole sticks
    on every layout it may take, which once left `sub` without any strategy."""
    t = {
        "pos": PrimTensor("pos", (n,), I64, "user_input"),
        "col_in": PrimTensor("col_in", (n, 1), I64, "user_input"),
        "row": PrimTensor("row", (n,), I64), "col": PrimTensor("col", (n, 1), I64),
        "rel": PrimTensor("rel", (n, n), I64), "out": PrimTensor("out", (n, n), I64),
    }
    ops = [
        PrimOp("row", (IterDim("d0", n),), (Access("pos", (0,)),), Access("row", (0,)),
               PointwiseBody(Call("add", (In(0), Const(0))))),
        PrimOp("col", (IterDim("d0", n),), (Access("col_in", (0, None)),), Access("col", (0, None)),
               PointwiseBody(Call("add", (In(0), Const(1))))),
        PrimOp("sub", (IterDim("d0", n), IterDim("d1", n)), (Access("row", (1,)), Access("col", (0, None))),
               Access("rel", (0, 1)), PointwiseBody(Call("sub", (In(0), In(1))))),
        PrimOp("abs", (IterDim("d0", n), IterDim("d1", n)), (Access("rel", (0, 1)),), Access("out", (0, 1)),
               PointwiseBody(Call("abs", (In(0),)))),
    ]
    return PrimGraph("index_arith", t, ops, ["pos", "col_in"], ["out"])


def test_int64_index_arithmetic_keeps_a_legal_strategy_per_op():
    pg = index_arithmetic()
    ctx = GraphContext.build(pg, HW)
    for op in pg.ops:
        assert op_strategies(op, ctx), op.id


def test_cpsat_plans_int64_index_arithmetic_itself():
    program = plan(index_arithmetic(), HW, planner="cpsat", time_limit_s=3, deterministic=True)
    assert program.stats.planner == "cpsat" and program.stats.fallback_from is None
    assert not validate_program(program, HW)


def _lowered_model_graphs():
    torch = pytest.importorskip("torch")
    from backend.capture import capture
    from lowering import lower_document
    from lowering.validate import parse_document
    from tests.models import TINY_MODEL_NAMES, tiny_model

    graphs = []
    for name in TINY_MODEL_NAMES:
        model, inputs = tiny_model(name)
        graphs.append(lower_document(parse_document(capture(model, inputs, name=name))))
    from transformers import T5Config, T5EncoderModel  # relative position buckets: int64 index math

    t5 = T5EncoderModel(T5Config(num_layers=1, d_model=64, d_kv=16, num_heads=4, d_ff=128, vocab_size=128)).eval()
    graphs.append(lower_document(parse_document(capture(t5, (torch.randint(0, 128, (1, 24)),), name="t5"))))
    return graphs


def test_every_op_of_every_tiny_model_keeps_a_legal_strategy():
    kinds = set()
    for pg in _lowered_model_graphs():
        ctx = GraphContext.build(pg, HW)
        for op in pg.ops:
            kinds.add((op.body.kind, pg.tensors[op.output.tensor].dtype))
            assert op_strategies(op, ctx), f"{pg.name}: {op.id}"
    # the zoo covers the primitive kinds, int64 index arithmetic among them
    assert {"matmul", "pointwise", "reduce", "copy", "gather"} <= {k for k, _ in kinds}
    assert ("pointwise", I64) in kinds


# -- the fallback chain ------------------------------------------------------------------------
def _failing(exc: Exception):
    def planner(pg, hw, **kwargs):
        raise exc
    return planner


def test_a_raising_planner_falls_back_to_the_next_one(monkeypatch, caplog):
    planners.ensure_registered("cpsat")
    monkeypatch.setitem(planners.PLANNERS, "cpsat", _failing(NoLegalStrategy("sub")))
    with caplog.at_level(logging.WARNING, logger="sticksat"):
        program = plan(index_arithmetic(), HW, planner="cpsat")
    assert program.stats.planner == "heuristic"
    assert program.stats.fallback_from == "cpsat"
    assert "sub: no legal strategy" in program.stats.fallback_reason
    assert program.stats.notes[0].startswith("planner cpsat failed")
    assert any("falling back to heuristic" in r.message for r in caplog.records)
    assert not validate_program(program, HW)


def test_the_chain_ends_at_naive(monkeypatch):
    planners.ensure_registered("cpsat")
    planners.ensure_registered("heuristic")
    monkeypatch.setitem(planners.PLANNERS, "cpsat", _failing(RuntimeError("model build")))
    monkeypatch.setitem(planners.PLANNERS, "heuristic", _failing(RuntimeError("beam")))
    program = plan(index_arithmetic(), HW, planner="cpsat")
    assert program.stats.planner == "naive"
    assert program.stats.fallback_from == "cpsat"  # the first failure is the one reported
    assert any("heuristic failed" in n for n in program.stats.notes)


def test_an_invalid_program_falls_back_too(monkeypatch):
    pg = index_arithmetic()

    def overlapping(pg, hw, **kwargs):  # two live LX buffers at one address
        d = PlanDecisions(planner="cpsat")
        d.resident["row"] = Residency(lx_address=0)
        d.resident["col"] = Residency(lx_address=0)
        return d
    planners.ensure_registered("cpsat")
    monkeypatch.setitem(planners.PLANNERS, "cpsat", overlapping)
    program = plan(pg, HW, planner="cpsat")
    assert program.stats.fallback_from == "cpsat" and program.stats.planner == "heuristic"
    assert "invalid program" in program.stats.fallback_reason
    with pytest.raises(PlannerFailed) as info:
        plan(pg, HW, planner="cpsat", fallback=False)
    assert "invalid program" in str(info.value)


def test_strict_raises_naming_the_op(monkeypatch):
    planners.ensure_registered("cpsat")
    monkeypatch.setitem(planners.PLANNERS, "cpsat", _failing(NoLegalStrategy("sub")))
    with pytest.raises(PlannerFailed) as info:
        plan(index_arithmetic(), HW, planner="cpsat", fallback=False)
    assert info.value.op == "sub" and info.value.planner == "cpsat"
    assert "at op 'sub'" in str(info.value)


def test_compile_in_process_strict_and_not(monkeypatch):
    from service.pipeline import CompileFailed, compile_in_process
    from tests.service_helpers import chain_graph

    planners.ensure_registered("cpsat")
    monkeypatch.setitem(planners.PLANNERS, "cpsat", _failing(NoLegalStrategy("mul")))
    program = compile_in_process(chain_graph(rows=64), planner="cpsat")
    assert program["stats"]["fallback_from"] == "cpsat" and program["stats"]["planner"] == "heuristic"
    with pytest.raises(CompileFailed) as info:
        compile_in_process(chain_graph(rows=64), planner="cpsat", strict=True)
    assert info.value.op == "mul"


def test_strict_compiles_are_keyed_apart():
    from service.pipeline import resolve_options

    loose, strict = resolve_options("naive"), resolve_options("naive", strict=True)
    assert loose.options_hash() != strict.options_hash()
    assert "strict" not in loose.solve_dict()  # keys of existing stored programs unchanged


def test_full_collections_are_rarer_while_planning_and_restored_after(monkeypatch):
    """While plan() runs (also when the planner raises and falls back), the oldest GC
    generation's threshold is FULL_COLLECTION_THRESHOLD times higher; afterwards the
    process's own thresholds are back."""
    import gc

    from solver.naive import plan_naive

    seen = []

    def recording(pg, hw, **kw):
        seen.append(gc.get_threshold())
        if len(seen) == 1:
            raise RuntimeError("first planner fails")
        return plan_naive(pg, hw)
    before = gc.get_threshold()
    monkeypatch.setitem(planners.PLANNERS, "cpsat", recording)
    monkeypatch.setitem(planners.PLANNERS, "heuristic", recording)
    plan(index_arithmetic(), HW, "cpsat")
    assert len(seen) == 2
    assert all(t == (before[0], before[1], before[2] * planners.FULL_COLLECTION_THRESHOLD) for t in seen), seen
    assert gc.get_threshold() == before

    def failing(pg, hw, **kw):
        raise RuntimeError("fails")
    monkeypatch.setitem(planners.PLANNERS, "cpsat", failing)
    with pytest.raises(PlannerFailed):
        plan(index_arithmetic(), HW, "cpsat", fallback=False)
    assert gc.get_threshold() == before
