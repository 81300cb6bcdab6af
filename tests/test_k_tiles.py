"""K tiles: the fusion search tiles a matmul along its reduction dim where the timing model
runs it faster that way (a K tile re-reads no operand), as a kernel of its own, and the
validator rejects a kernel member that reads a K-tiled member's result (a partial sum until
the kernel's last tile)."""
import pytest

from target.hardware import load_target
from target.primitives import Access, Call, In, IterDim, MatmulBody, PointwiseBody, PrimGraph, PrimOp, PrimTensor
from simulator.api import simulate
from simulator.timing import time_program
from simulator.validate import validate_program
from solver.emit import emit_program
from solver.plan import OpPlan, PlanDecisions
from solver.spyre.fusion import fuse_tiled_groups
from solver.spyre.fusion.runs import with_tiles

HW = load_target()


def _projection_with_epilogue(M=512, K=4096, N=4096):
    """y = x @ w, z = -y: a prefill-sized projection and a pointwise reader of its result."""
    ts = {t.id: t for t in (PrimTensor("x", (M, K), "float16", "user_input"),
                            PrimTensor("w", (K, N), "float16", "parameter"),
                            PrimTensor("y", (M, N), "float16", "intermediate"),
                            PrimTensor("z", (M, N), "float16", "intermediate"))}
    mm = PrimOp("mm", (IterDim("m", M), IterDim("n", N), IterDim("k", K, "reduction")),
                (Access("x", (0, 2)), Access("w", (2, 1))), Access("y", (0, 1)), MatmulBody(0, 1, 2))
    neg = PrimOp("neg", (IterDim("r", M), IterDim("c", N)), (Access("y", (0, 1)),), Access("z", (0, 1)),
                 PointwiseBody(Call("neg", (In(0),))))
    return PrimGraph("mm_neg", ts, [mm, neg], ["x", "w"], ["z"])


def _split_plan() -> PlanDecisions:
    d = PlanDecisions(planner="test")
    d.ops["mm"] = OpPlan(core_split={"m": 4, "n": 8})
    d.ops["neg"] = OpPlan(core_split={"r": 4, "c": 8})
    return d


def test_a_prefill_projection_is_k_tiled_where_that_pays():
    """512x4096x4096 on m4 x n8: a row tile re-reads the weight and a column tile the
    input, a K tile neither; the search puts K tiles on the matmul (its reader a kernel of
    its own after it), the program validates and is much faster than without K tiles (the
    best the search finds along parallel dims only)."""
    pg = _projection_with_epilogue()
    d = _split_plan()
    res = fuse_tiled_groups(pg, HW, d)
    assert res is not None and not validate_program(res.program, HW)
    assert res.decisions.ops["mm"].temporal_tiles.get("k", 1) > 1
    mm = next(o for o in res.program.ops if o.id == "mm")
    neg = next(o for o in res.program.ops if o.id == "neg")
    assert neg.bundle != mm.bundle    # a kernel of its own: the reader sees the whole result
    # without K tiles (the search along parallel dims only) it is far slower
    import solver.spyre.fusion.search as search
    orig = search._Search.pick_k_tiles
    try:
        search._Search.pick_k_tiles = lambda self, *a, **k: None
        parallel_only = fuse_tiled_groups(pg, HW, d)
    finally:
        search._Search.pick_k_tiles = orig
    assert not any("k" in p.temporal_tiles for p in parallel_only.decisions.ops.values())
    assert res.fused_us < 0.85 * parallel_only.fused_us


def test_a_kernel_member_reading_a_k_tiled_result_is_invalid():
    """In one kernel the reader's tile j would see the matmul's partial sum over the first
    j+1 K tiles: the validator names it; with the bundle cut `with_tiles` puts after a
    K-tiled op the two are separate kernels and the program is valid."""
    pg = _projection_with_epilogue(M=256, K=512, N=512)
    d = _split_plan()
    tiles = {"mm": {"k": 4}, "neg": {"r": 4}}
    for oid, t in tiles.items():
        d.ops[oid].temporal_tiles = dict(t)
    joined = emit_program(pg, HW, d)
    assert {i.code for i in validate_program(joined, HW)} == {"kernel_tile_order"}
    cut = with_tiles(_split_plan(), tiles, [["mm", "neg"]], HW, pg)
    assert "neg" in cut.bundle_starts
    program = emit_program(pg, HW, cut)
    assert not validate_program(program, HW)
    rep = time_program(program, HW)
    assert rep.op("mm").fused_group != rep.op("neg").fused_group
    # the K-tiled program computes what the graph does
    res = simulate(program, HW, graph=pg, numerics=True, timing=False)
    assert res.max_rel_err is not None and res.max_rel_err < 5e-2


def test_the_objective_ranks_splits_as_the_fused_program_runs_them(monkeypatch):
    """With tile classes (budget.TILE_CLASSES) the model prices each split of a prefill
    projection at what the fusion search makes of it (K-tiled here), so its ranking of the
    splits is the fused programs' ranking; priced untiled, splits the fused programs run
    apart tie (m4 x n8 and m8 x n4) and the ranking differs."""
    from calibration.cases import matmul_graph
    from solver.naive import plan_naive
    from solver.spyre import budget
    from solver.spyre.model import build_model

    pg = matmul_graph(512, 4096, 14336)
    hint = plan_naive(pg, HW)

    def prices(tile_classes: bool) -> dict:
        monkeypatch.setattr(budget, "TILE_CLASSES", tile_classes)
        _, strategies, _ = build_model(pg, HW, hint)
        return {tuple(sorted(s.core_split.items())): (s.stick, s.cost_ns(HW) / 1e3) for s in strategies["mm"]}
    tiled, untiled = prices(True), prices(False)
    fused = {}
    for split, (stick, _) in tiled.items():
        d = PlanDecisions(planner="test")
        d.ops["mm"] = OpPlan(stick=stick, core_split=dict(split))
        fused[split] = fuse_tiled_groups(pg, HW, d).fused_us
    order = sorted(fused, key=fused.get)
    assert sorted(tiled, key=lambda k: tiled[k][1]) == order
    for split in fused:
        assert tiled[split][1] == pytest.approx(fused[split], rel=0.01)
    # untiled, two splits tie that the fused programs run more than 1% apart
    assert any(abs(untiled[a][1] - untiled[b][1]) <= 1e-3 * untiled[a][1] and
               abs(fused[a] - fused[b]) > 0.01 * fused[a] for a in fused for b in fused if a != b)
