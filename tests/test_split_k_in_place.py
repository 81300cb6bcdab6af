"""Split-K readers the plan already has, tiled in place by the split-K step
(`solver.spyre.split_k_hold._tiled_in_place`)."""
from __future__ import annotations

from target.hardware import load_target

HW = load_target()


def _down_projection(M=512, F=14336, N=4096):
    """z = (x * y) @ w: a gated MLP's product into its down projection."""
    from target.primitives import (Access, Call, In, IterDim, MatmulBody, PointwiseBody, PrimGraph,
                                     PrimOp, PrimTensor)
    ts = {t.id: t for t in (PrimTensor("x", (M, F), "float16", "user_input"),
                            PrimTensor("y", (M, F), "float16", "user_input"),
                            PrimTensor("w", (F, N), "float16", "parameter"),
                            PrimTensor("h", (M, F), "float16", "intermediate"),
                            PrimTensor("z", (M, N), "float16", "intermediate"))}
    mul = PrimOp("mul", (IterDim("m", M), IterDim("f", F)), (Access("x", (0, 1)), Access("y", (0, 1))),
                 Access("h", (0, 1)), PointwiseBody(Call("mul", (In(0), In(1)))))
    mm = PrimOp("mm", (IterDim("m", M), IterDim("n", N), IterDim("k", F, "reduction")),
                (Access("h", (0, 2)), Access("w", (2, 1))), Access("z", (0, 1)), MatmulBody(0, 1, 2))
    return PrimGraph("down", ts, [mul, mm], ["x", "y", "w"], ["z"])


def test_a_split_k_reader_of_a_held_result_the_plan_already_has_is_tiled():
    """The plan as solved already reads the product from LX split-K (m8 x k4 over the
    product's m8 x f4 slices) but untiled, so the weight stream does not double-buffer: the
    split-K step tiles the reader along N (64 tiles) and the program is valid and faster.
    (Before, the step skipped a result already in LX: nothing to hold.)"""
    from simulator.timing import time_program
    from solver.oracle import checked_program
    from solver.plan import OpPlan, PlanDecisions, Residency
    from solver.spyre.split_k_hold import hold_for_split_k

    pg = _down_projection()
    d = PlanDecisions("test", ops={"mul": OpPlan(core_split={"m": 8, "f": 4}),
                                   "mm": OpPlan(core_split={"m": 8, "k": 4})},
                      resident={"h": Residency(0)})
    prog, issues = checked_program(pg, HW, d)
    assert prog is not None, issues
    us = time_program(prog, HW).total_us
    got = hold_for_split_k(pg, HW, d, prog, us)
    assert got.best is not None and got.us < 0.8 * us
    plan = got.best[0]
    assert plan.ops["mm"].core_split == {"m": 8, "k": 4} and plan.ops["mm"].temporal_tiles == {"n": 64}
    assert "h" in plan.resident and not plan.resident["h"].per_tile
    assert not issues_of_trial(got.best)


def issues_of_trial(tr):
    from solver.spyre.fusion.trial import issues_of
    return issues_of(tr, HW)
