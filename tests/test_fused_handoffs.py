"""Fused hand-offs (budget.FUSED_HANDOFFS): the CP-SAT model prices a pointwise chain whose
intermediates the fusion search hands from member to member on chip (a fused kernel's tile
buffers) at its on-chip price, with one tile's LX, so its objective of the plan is near the
fused program's simulated time; the read-back keeps whole only what fits."""
import pytest

from target.hardware import load_target
from target.primitives import Access, Call, In, IterDim, PointwiseBody, PrimGraph, PrimOp, PrimTensor
from solver.oracle import checked_program
from solver.plan import OpPlan, PlanDecisions
from solver.spyre import budget
from solver.spyre.fusion import fuse_tiled_groups
from solver.spyre.model import build_model

HW = load_target()


def _chain(M=512, N=24576):
    """z = exp(-x) * x + y in fp32: every intermediate 48 MiB, 1.5 MiB a core on 32 cores,
    so no two whose live ranges meet fit in LX whole together."""
    names = ("x", "y", "a", "b", "c", "z")
    roles = {"x": "user_input", "y": "user_input"}
    ts = {t: PrimTensor(t, (M, N), "float32", roles.get(t, "intermediate")) for t in names}
    dims = (IterDim("r", M), IterDim("c", N))

    def pw(oid, fn, ins, out):
        return PrimOp(oid, dims, tuple(Access(t, (0, 1)) for t in ins), Access(out, (0, 1)),
                      PointwiseBody(Call(fn, tuple(In(i) for i in range(len(ins))))))
    ops = [pw("neg", "neg", ("x",), "a"), pw("exp", "exp", ("a",), "b"), pw("mul", "mul", ("b", "x"), "c"),
           pw("add", "add", ("c", "y"), "z")]
    return PrimGraph("chain", ts, ops, ["x", "y"], ["z"])


def _plan(pg) -> PlanDecisions:
    d = PlanDecisions(planner="test")
    for op in pg.ops:
        d.ops[op.id] = OpPlan(core_split={"r": 32})
    return d


def test_the_objective_prices_a_fused_chain_as_the_fused_program_runs_it(monkeypatch):
    pg = _chain()
    d = _plan(pg)
    fused = fuse_tiled_groups(pg, HW, d).fused_us

    def objective(on: bool):
        monkeypatch.setattr(budget, "FUSED_HANDOFFS", on)
        _, _, sm = build_model(pg, HW, d)
        picks = {op.id: sm.strategy_index(op.id, d.ops[op.id]) for op in pg.ops}
        held = {t for t in sm.handoffs if sm.residency_ok(t, picks)}
        return sm, sm.objective_of(picks, held) / 1e3
    sm, with_handoffs = objective(True)
    assert sm.handoffs == {"a", "b", "c"}
    _, without = objective(False)
    # each intermediate is too large to hold whole beside the others: without hand-offs the
    # model prices the chain through device memory, far from what the fused kernel runs
    print(without, with_handoffs, fused)
    assert without > 1.5 * fused
    assert with_handoffs == pytest.approx(fused, rel=0.3)
    assert abs(with_handoffs - fused) < abs(without - fused) / 3
    # one tile's LX in the model, the whole box in the plan
    s = sm.S["neg"][sm.strategy_index("neg", d.ops["neg"])]
    assert sm.lx_bytes("a", s) * budget.HANDOFF_TILES >= s.out_lx_bytes > sm.lx_bytes("a", s)


def test_the_read_back_keeps_whole_only_the_hand_offs_that_fit(monkeypatch):
    monkeypatch.setattr(budget, "FUSED_HANDOFFS", True)
    pg = _chain()
    d = _plan(pg)
    _, _, sm = build_model(pg, HW, d)
    picks = {op.id: sm.strategy_index(op.id, d.ops[op.id]) for op in pg.ops}
    sizes = {t: sm.S[sm.producer[t].id][picks[sm.producer[t].id]].out_lx_bytes for t in sm.handoffs}
    from solver.plan import Residency
    kept = sm.full_size_residencies({t: Residency(0, sm.lx_bytes(t, sm.S[sm.producer[t].id][0]))
                                     for t in sm.handoffs}, sizes)
    assert set(kept) == {"a", "c"}   # b lives beside a and c
    assert all(r.size_per_core == sizes[t] for t, r in kept.items())
    out = sm.decisions_of(picks, kept, {})
    prog, issues = checked_program(pg, HW, out)
    assert prog is not None and not issues


def test_a_matmul_hands_on_its_result_only_where_its_k_tiled_price_is_known(monkeypatch):
    """Priced untiled, a matmul's hand-off to its epilogue looks free while the search
    K-tiles a prefill-sized matmul (its result then a partial sum until the last tile): the
    hand-off counts only with the tile classes on, which price the held result untiled."""
    from calibration.cases import matmul_graph
    from target.primitives import PrimGraph
    from solver.naive import plan_naive

    base = matmul_graph(512, 4096, 4096)
    mm = base.ops[0]
    y = mm.output.tensor
    shape = base.tensors[y].shape
    ts = dict(base.tensors)
    ts[y] = PrimTensor(y, shape, base.tensors[y].dtype, "intermediate")
    ts["z"] = PrimTensor("z", shape, base.tensors[y].dtype, "intermediate")
    neg = PrimOp("neg", tuple(IterDim(f"d{i}", n) for i, n in enumerate(shape)),
                 (Access(y, tuple(range(len(shape)))),), Access("z", tuple(range(len(shape)))),
                 PointwiseBody(Call("neg", (In(0),))))
    pg = PrimGraph("mm_neg", ts, [mm, neg], list(base.inputs), ["z"])
    hint = plan_naive(pg, HW)
    monkeypatch.setattr(budget, "FUSED_HANDOFFS", True)
    monkeypatch.setattr(budget, "TILE_CLASSES", False)
    _, untiled, sm = build_model(pg, HW, hint)
    assert sm.handoffs == set()
    monkeypatch.setattr(budget, "TILE_CLASSES", True)
    _, tiled, sm = build_model(pg, HW, hint)
    assert sm.handoffs == {y}
    # with its result held the matmul keeps its untiled price; in device memory the tile
    # classes price it K-tiled, faster
    before = {s.key(): s.parts.combos for s in untiled[mm.id]}
    held = faster = 0
    for s in tiled[mm.id]:
        for key, c in s.parts.combos.items():
            if key[-1]:
                assert c.total_ns == before[s.key()][key].total_ns
                held += 1
            elif c.total_ns < before[s.key()][key].total_ns:
                faster += 1
    assert held and faster
