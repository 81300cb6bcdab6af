"""LX relayouts after the solve (solver.spyre.relayout): a restickify whose source and copy can
both stay in LX becomes an on-chip relayout when the program validates and runs faster."""
from __future__ import annotations

import numpy as np

from target.primitives import Access, IterDim, MatmulBody, PrimGraph, PrimOp, PrimTensor
from simulator.api import simulate
from target.hardware import load_target
from simulator.timing import time_program
from solver.emit import emit_program
from solver.baseline.passes import plan_heuristic
from solver.spyre.relayout import add_lx_relayouts, relayout_candidates

HW = load_target()


def projected_keys(B=32, S=256, D=128):
    """ks = k @ w (written sticked on D, as a matmul output must be), then s = q @ ks^T, which
    reads ks as its y operand sticked on S: a restickify of ks is unavoidable."""
    f = "float16"
    ts = {"k": PrimTensor("k", (B, S, D), f, "user_input"), "q": PrimTensor("q", (B, S, D), f, "user_input"),
          "w": PrimTensor("w", (D, D), f, "parameter"), "ks": PrimTensor("ks", (B, S, D), f),
          "s": PrimTensor("s", (B, S, S), f)}
    proj = PrimOp("proj", (IterDim("b", B), IterDim("m", S), IterDim("n", D), IterDim("k", D, "reduction")),
                  (Access("k", (0, 1, 3)), Access("w", (3, 2))), Access("ks", (0, 1, 2)), MatmulBody(1, 2, 3))
    scores = PrimOp("scores", (IterDim("b", B), IterDim("m", S), IterDim("n", S), IterDim("k", D, "reduction")),
                    (Access("q", (0, 1, 3)), Access("ks", (0, 2, 3))), Access("s", (0, 1, 2)), MatmulBody(1, 2, 3))
    return PrimGraph("projected_keys", ts, [proj, scores], ["k", "q", "w"], ["s"])


def test_restickify_between_resident_tensors_becomes_an_lx_relayout():
    pg = projected_keys()
    d = plan_heuristic(pg, HW)
    for op in ("proj", "scores"):
        d.ops[op].core_split = {"b": 32}
    prog = emit_program(pg, HW, d)
    assert [c for c, _ in relayout_candidates(pg, prog)] == ["ks"]
    got = add_lx_relayouts(pg, HW, d, prog)
    new_d, new_prog, notes, gain_us = got.decisions, got.program, got.notes, got.gain_us
    assert [o.kind for o in new_prog.ops if o.src == "ks"] == ["relayout"]
    assert gain_us > 0 and time_program(new_prog, HW).total_us < time_program(prog, HW).total_us
    assert "ks" in new_d.resident and notes
    rng = np.random.default_rng(0)
    inputs = {n: (rng.standard_normal(pg.tensors[n].shape) / 4).astype(np.float16) for n in ("k", "q", "w")}
    res = simulate(new_prog, HW, inputs=inputs, graph=pg, numerics=True, timing=False)
    assert res.valid and res.max_rel_err is not None and res.max_rel_err < 2e-2


def test_cpsat_planner_finishes_with_relayouts():
    """The planner's steps after the solve end with this one (the CP-SAT model itself prices
    restickifies through device memory and does not choose splits for a relayout)."""
    from solver.spyre.steps import post_solve
    pg = projected_keys()
    d = plan_heuristic(pg, HW)
    for op in ("proj", "scores"):
        d.ops[op].core_split = {"b": 32}
    after = post_solve(pg, HW, d, deadline=None, strategies={}, fuse=False)
    out, gain_ns, notes = after.decisions, after.gain_ns(), after.notes
    assert "ks" in out.resident and gain_ns > 0
    assert any(n.startswith("lx relayout: ks") for n in notes)
