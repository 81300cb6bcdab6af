"""The fusion search's re-split start (`solver.spyre.fusion.resplit_for_tiling`, re-aligned by
`solver.spyre.steps.realigned`) on a small attention head: a query biased and scaled
(pointwise), the scores matmul, the softmax's row max and subtraction after it.

The regression these guard (BERT base, 2026-12-05): the solve put the scores on a row split;
the re-split start moved them to the first of four splits its tiled estimate ties (a split
of the key dim, which the softmax's row max reads only by splitting its reduction) and
dropped the residencies around them, so the start lost to the plan as solved (338.6 against
the 276.5 us a plan with the scores split by heads and rows fuses to)."""
from __future__ import annotations

from target.hardware import load_target
from target.primitives import Access, Call, Const, In, IterDim, MatmulBody, PointwiseBody, PrimOp, ReduceBody
from solver.naive import plan_naive
from solver.plan import OpPlan, PlanDecisions, Residency
from solver.spyre.fusion import resplit_for_tiling
from solver.spyre.model import build_model
from solver.spyre.steps import realigned
from solver.spyre.strategies import compatible_residency
from tests.primgraphs import _g, _t

HW = load_target()
B, S, D = 4, 512, 64


def _head():
    ts = [_t("q", (B, S, D), role="user_input"), _t("k", (B, S, D), role="user_input"),
          _t("bq", (D,), role="parameter"), _t("qb", (B, S, D)), _t("qs", (B, S, D)), _t("s", (B, S, S)),
          _t("mx", (B, S, 1)), _t("sh", (B, S, S))]
    par3 = (IterDim("b", B), IterDim("m", S), IterDim("d", D))
    ops = [PrimOp("bias", par3, (Access("q", (0, 1, 2)), Access("bq", (2,))), Access("qb", (0, 1, 2)),
                  PointwiseBody(Call("add", (In(0), In(1))))),
           PrimOp("scale", par3, (Access("qb", (0, 1, 2)),), Access("qs", (0, 1, 2)),
                  PointwiseBody(Call("mul", (In(0), Const(0.125))))),
           PrimOp("qk", (IterDim("b", B), IterDim("m", S), IterDim("n", S), IterDim("k", D, "reduction")),
                  (Access("qs", (0, 1, 3)), Access("k", (0, 2, 3))), Access("s", (0, 1, 2)), MatmulBody(1, 2, 3)),
           PrimOp("amax", (IterDim("b", B), IterDim("m", S), IterDim("n", S, "reduction")),
                  (Access("s", (0, 1, 2)),), Access("mx", (0, 1, None)), ReduceBody("max")),
           PrimOp("sub", (IterDim("b", B), IterDim("m", S), IterDim("n", S)),
                  (Access("s", (0, 1, 2)), Access("mx", (0, 1, None))), Access("sh", (0, 1, 2)),
                  PointwiseBody(Call("sub", (In(0), In(1)))))]
    return _g("head", ts, ops, ["q", "k", "bq"], ["sh"])


def _rows_plan(pg, strategies) -> PlanDecisions:
    """Every op on a 32-core row split (of the naive plan's stick choice where it has one),
    the query chain and the scores held."""
    naive = plan_naive(pg, HW)
    ops = {}
    for op in pg.ops:
        rows = [s for s in strategies[op.id] if s.core_split == {"m": 32} and not s.alias]
        s = next((s for s in rows if s.stick == naive.ops[op.id].stick), rows[0])
        ops[op.id] = OpPlan(stick=s.stick, core_split=dict(s.core_split))
    return PlanDecisions("test", ops=ops, resident={"qb": Residency(0), "qs": Residency(0), "s": Residency(0)})


def test_tied_resplit_keeps_the_readers_reduction_whole():
    pg = _head()
    d0 = plan_naive(pg, HW)
    _, strategies, sm = build_model(pg, HW, d0)
    d = _rows_plan(pg, strategies)
    out = resplit_for_tiling(pg, d, strategies)
    assert out is not None
    moved_d, moved = out
    assert moved == ["qk"]
    split = moved_d.ops["qk"].core_split
    # the estimate ties splits of heads x rows with splits of the key dim; the row max reads
    # the scores in LX only when the key dim stays whole on each core
    assert "n" not in split, split
    qk = next(s for s in strategies["qk"] if s.core_split == split and s.stick == moved_d.ops["qk"].stick)
    assert any(compatible_residency(qk, s, 0) for s in strategies["amax"] if not s.reduction_split)


def test_realigned_start_holds_the_chain_feeding_the_pinned_matmul():
    """After the re-split the scaled query is sliced by rows and the scores read it by heads
    and rows: the re-aligned start moves the scaling and the bias add before it together
    (the upstream chain hold: moving the scaling alone would trade the biased query's
    residency for the scaled one's) and holds both; the scores keep their new split."""
    pg = _head()
    _, strategies, sm = build_model(pg, HW, plan_naive(pg, HW))
    d = _rows_plan(pg, strategies)
    moved_d, moved = resplit_for_tiling(pg, d, strategies)
    assert "qs" not in moved_d.resident            # the re-split dropped it
    out = realigned(sm, moved_d, moved)
    assert out.ops["qk"].core_split == moved_d.ops["qk"].core_split
    assert {"qb", "qs"} <= set(out.resident)
    assert out.ops["scale"].core_split != {"m": 32} and out.ops["bias"].core_split != {"m": 32}


def test_fusion_runner_up_goes_through_the_steps_after_the_search():
    """The fusion search keeps the start that fuses faster; the other (fact
    `fusion_runner_up`) goes through the steps after the search too, and is proposed when it
    ends faster than the kept plan did: a gated MLP whose down projection, split-K over the
    held product, gains after the search (the kept plan is set just faster than the
    runner-up fused, as GPT-2's plan as solved stood against its re-split start)."""
    from solver.spyre.fusion import fuse_tiled_groups
    from solver.spyre.post_solve import PostSolveState, run_steps
    from solver.spyre.steps import FusionRunnerUp
    from tests.test_split_k_hold import _product_on_the_up_split

    pg, d = _product_on_the_up_split()
    _, strategies, sm = build_model(pg, HW, d)
    fused = fuse_tiled_groups(pg, HW, d, reorder=True, end_with_fewer_tiles=False)
    kept_us = 0.99 * fused.fused_us
    state = PostSolveState(pg, HW, d, strategies, plan_deadline=None, us=kept_us, start_us=kept_us, model=sm,
                           facts={"fusion_runner_up": fused})
    run_steps([FusionRunnerUp()], state)
    assert [r.status for r in state.records] == ["accepted"]
    assert state.us < kept_us and state.decisions is not d
    assert any("split-K" in n for n in state.notes)
