"""Chain moves in the CP-SAT planner's start (solver.spyre.chain_moves): a run of ops
relabelled onto another stick dim at once, where no single move improves."""
from target.primitives import (
    Access, Call, Const, CopyBody, In, IterDim, PointwiseBody, PrimGraph, PrimOp, PrimTensor, StridedMap,
)
from target.hardware import load_target
from solver.emit import emit_program
from solver.plan import OpPlan
from solver.spyre.chain_moves import ChainMoves, any_operands_ok
from solver.spyre.local_search import local_search
from solver.spyre.model import build_model
from simulator.validate import validate_program

HW = load_target()
F16 = "float16"


def _chain_graph(A=2, B=64, C=64, reshape=True) -> PrimGraph:
    """w (a weight) -> neg -> mul 2 -> add 1 -> copy -> scale 3. With `reshape` the copy is
    [A,B,C] -> [A*B, C], a free alias when its input is sticked on C; without, it is a
    transpose [A,B,C] -> [A,C,B] (never an alias). B == C: both stick dims cost the same."""
    dims = (IterDim("a", A), IterDim("b", B), IterDim("c", C))
    full = (0, 1, 2)
    out_shape = (A * B, C) if reshape else (A, C, B)
    ts = [PrimTensor("w", (A, B, C), F16, "parameter"), PrimTensor("t1", (A, B, C), F16, "intermediate"),
          PrimTensor("t2", (A, B, C), F16, "intermediate"), PrimTensor("t3", (A, B, C), F16, "intermediate"),
          PrimTensor("r", out_shape, F16, "intermediate"), PrimTensor("o", out_shape, F16, "intermediate")]
    if reshape:
        copy_dims = (IterDim("i", A * B), IterDim("j", C))
        copy_map = StridedMap((A * B, C), (C, 1), 0)
        out_dims = (IterDim("i", A * B), IterDim("j", C))
    else:
        copy_dims = (IterDim("a", A), IterDim("c", C), IterDim("b", B))
        copy_map = StridedMap((A, C, B), (B * C, 1, C), 0)
        out_dims = copy_dims
    n_out = len(out_shape)
    ops = [
        PrimOp("neg", dims, (Access("w", full),), Access("t1", full), PointwiseBody(Call("neg", (In(0),)))),
        PrimOp("mul", dims, (Access("t1", full),), Access("t2", full),
               PointwiseBody(Call("mul", (In(0), Const(2.0))))),
        PrimOp("add", dims, (Access("t2", full),), Access("t3", full),
               PointwiseBody(Call("add", (In(0), Const(1.0))))),
        PrimOp("copy", copy_dims, (Access("t3", (None, None, None)),), Access("r", tuple(range(n_out))),
               CopyBody((copy_map,), ((0,) * n_out,))),
        PrimOp("scale", out_dims, (Access("r", tuple(range(n_out))),), Access("o", tuple(range(n_out))),
               PointwiseBody(Call("mul", (In(0), Const(3.0))))),
    ]
    return PrimGraph("chain", {t.id: t for t in ts}, ops, ["w"], ["o"])


def _wrong_stick_start(pg: PrimGraph):
    """The model, and a start with the elementwise chain (and its weight) on stick dim 1
    (B): each op's cheapest strategy there, the copy's cheapest data-moving one, no LX
    residency. The model's hint is the naive plan with the chain moved onto B: the naive
    plan's strategies (chain on C) are always in the space, so its mirror on B keeps the
    two sticks' strategy sets alike (the naive plan's 2-core split is the cheapest on this
    small chain, and the wide-split candidates alone would not offer it on B)."""
    from dataclasses import replace

    from solver.naive import plan_naive
    from target.op_rules import StickChoice

    naive = plan_naive(pg, HW)
    on_b = StickChoice(stick_iter=1, inputs=(1,), output=1)
    mirrored = replace(naive, input_sticks={**naive.input_sticks, "w": 1},
                       ops={**naive.ops, **{o: replace(naive.ops[o], stick=on_b) for o in ("neg", "mul", "add")}})
    _, S, sm = build_model(pg, HW, mirrored)
    price = ChainMoves(sm)._price
    picks = {}
    for op in pg.ops:
        if op.id in ("neg", "mul", "add"):
            ks = [k for k, s in enumerate(S[op.id]) if s.out_stick == 1]
        elif op.id == "copy":
            ks = [k for k, s in enumerate(S[op.id]) if not s.alias and s.out_stick == len(pg.tensors["r"].shape) - 1]
        else:
            ks = [k for k, s in enumerate(S[op.id]) if s.out_stick == len(pg.tensors["o"].shape) - 1]
        picks[op.id] = min(ks, key=lambda k: (price(op.id, k), k))
    start = sm.decisions_of(picks, {}, {"w": 1})
    return sm, S, start, picks


def _objective(sm, pg, d) -> int:
    picks = {op.id: sm.strategy_index(op.id, d.ops.get(op.id, OpPlan())) for op in pg.ops}
    assert None not in picks.values()
    return sm.objective_of(picks, {t for t in d.resident if t in sm.res}, {"w": d.input_sticks["w"]})


def _key(d) -> tuple:
    return (tuple(sorted(d.input_sticks.items())),
            tuple((o, p.stick, tuple(sorted(p.core_split.items())), p.alias) for o, p in sorted(d.ops.items())),
            tuple(sorted(d.resident)))


def test_chain_move_finds_the_alias_plan_single_moves_cannot():
    pg = _chain_graph()
    sm, S, start, picks = _wrong_stick_start(pg)
    copy_cost = sm.combos["copy"][2][picks["copy"]][0]
    assert copy_cost > 0
    before = _objective(sm, pg, start)
    # single moves alone: every one adds a restickify (or breaks the alias's operand rule);
    # the residency moves (hold_moves) are another matter, left out here
    single = local_search(sm, start, None, chains=False, hold_moves=False)
    assert _objective(sm, pg, single) == before
    assert not single.ops["copy"].alias
    # the chain move relabels neg, mul, add (and the weight) onto C; the copy becomes free
    moved = local_search(sm, start, None, chains=True, hold_moves=False)
    assert moved.ops["copy"].alias
    assert moved.input_sticks["w"] == 2
    assert all(moved.ops[o].stick.output == 2 for o in ("neg", "mul", "add"))
    assert _objective(sm, pg, moved) == before - copy_cost
    program = emit_program(pg, HW, moved)
    assert validate_program(program, HW) == []
    assert next(o for o in program.ops if o.id == "copy").alias


def test_no_chain_move_helps_leaves_the_plan_unchanged():
    """The same chain into a transpose copy (no alias on any stick): the chain costs the
    same on B and C, so no move improves and the start comes back as it was."""
    pg = _chain_graph(reshape=False)
    sm, S, start, _ = _wrong_stick_start(pg)
    assert any(True for _ in ChainMoves(sm).moves(
        {op.id: sm.strategy_index(op.id, start.ops[op.id]) for op in pg.ops}, {"w": 1}, set()))
    out = local_search(sm, start, None, chains=True, hold_moves=False)
    assert _key(out) == _key(start)
    assert _objective(sm, pg, out) == _objective(sm, pg, start)


def test_chain_moves_are_deterministic():
    pg = _chain_graph()
    runs = []
    for _ in range(2):
        sm, _, start, picks = _wrong_stick_start(pg)
        runs.append((_key(local_search(sm, start, None, max_passes=3)),
                     [(m.picks, m.inputs) for m in ChainMoves(sm).moves(picks, {"w": 1}, set())]))
    assert runs[0] == runs[1]


def test_an_alias_copy_never_reads_a_forbidden_stick():
    """The alias strategy of the copy is legal only on its input's last dim: with the chain
    on B it is refused, on C accepted."""
    pg = _chain_graph()
    sm, S, start, picks = _wrong_stick_start(pg)
    alias = next(k for k, s in enumerate(S["copy"]) if s.alias)
    trial = dict(picks, copy=alias)
    assert not any_operands_ok(sm, trial, {"w": 1}, ("copy",))
    on_c = {o: next(k for k, s in enumerate(S[o]) if s.out_stick == 2) for o in ("neg", "mul", "add")}
    assert any_operands_ok(sm, dict(trial, **on_c), {"w": 2}, ("neg", "mul", "add", "copy"), ("w",))
