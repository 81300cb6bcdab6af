"""The planner steps that form fused kernels: op order (solver.spyre.schedule), split alignment and
tile buffers in the fusion search (solver.spyre.fusion, solver.spyre.tile_buffers), and the emitter's
op_order check."""
from dataclasses import replace

import numpy as np
import pytest

import tests.primgraphs as primgraphs
from target.interpreter import interpret
from target.primitives import Access, Call, In, IterDim, MatmulBody, PointwiseBody, PrimGraph, PrimOp, PrimTensor
from target.hardware import load_target
from simulator.run import run_program
from target.superdsc import LxMemory
from simulator.timing import time_program
from simulator.validate import validate_program
from solver.emit import EmitError, emit_program
from solver.spyre.fusion import fuse_tiled_groups
from solver.naive import plan_naive
from solver.planners import plan
from solver.spyre.schedule import chain_order
from tests.test_timing import unary_chain

HW = load_target()
F16 = "float16"


def gated_mlp(M=64, K=128, N=256):
    """An activation chain on x @ Wg, times x @ Wu, in source order: the up projection sits
    between the chain and the product that reads both (as captured transformers MLPs do)."""
    t = {n: PrimTensor(n, s, F16, r) for n, s, r in [
        ("x", (M, K), "user_input"), ("wg", (K, N), "parameter"), ("wu", (K, N), "parameter")]}
    for n in ("g", "a1", "a2", "a3", "u", "y"):
        t[n] = PrimTensor(n, (M, N), F16)

    def mm(name, w, out):
        return PrimOp(name, (IterDim("m", M), IterDim("n", N), IterDim("k", K, "reduction")),
                      (Access("x", (0, 2)), Access(w, (2, 1))), Access(out, (0, 1)), MatmulBody(0, 1, 2))

    def unary(name, src, out, fn):
        return PrimOp(name, (IterDim("r", M), IterDim("c", N)), (Access(src, (0, 1)),), Access(out, (0, 1)),
                      PointwiseBody(Call(fn, (In(0),))))
    ops = [mm("mm_g", "wg", "g"), unary("neg", "g", "a1", "neg"), unary("abs", "a1", "a2", "abs"),
           unary("sig", "a2", "a3", "neg"), mm("mm_u", "wu", "u"),
           PrimOp("mul", (IterDim("r", M), IterDim("c", N)), (Access("a3", (0, 1)), Access("u", (0, 1))),
                  Access("y", (0, 1)), PointwiseBody(Call("mul", (In(0), In(1)))))]
    return PrimGraph("gated", t, ops, ["x", "wg", "wu"], ["y"])


def _topological(pg: PrimGraph) -> bool:
    made = set(pg.inputs)
    for op in pg.ops:
        if any(a.tensor not in made for a in op.inputs):
            return False
        made.add(op.output.tensor)
    return True


def test_chain_order_runs_the_chain_straight_into_its_consumer():
    pg = gated_mlp()
    ordered = chain_order(pg)
    ids = [op.id for op in ordered.ops]
    assert sorted(ids) == sorted(op.id for op in pg.ops) and _topological(ordered)
    # the short branch (up projection) first, then the long chain ending right before mul
    assert ids.index("mm_u") < ids.index("mm_g")
    assert ids[ids.index("mm_g"):] == ["mm_g", "neg", "abs", "sig", "mul"]
    # an order that is already chain-shaped is left alone (same object)
    chain = unary_chain(64, 128, n_ops=3)
    assert chain_order(chain) is chain


def test_emitter_checks_op_order():
    pg = gated_mlp()
    d = plan_naive(pg, HW)
    good = [op.id for op in chain_order(pg).ops]
    program = emit_program(pg, HW, replace(d, op_order=good))
    assert [o.id for o in program.ops if o.kind == "compute"] == good
    with pytest.raises(EmitError, match="before"):
        emit_program(pg, HW, replace(d, op_order=list(reversed(good))))
    with pytest.raises(EmitError, match="exactly once"):
        emit_program(pg, HW, replace(d, op_order=good[:-1]))


def test_fusion_aligns_a_chains_splits_and_keeps_its_results_in_tile_buffers():
    """A chain whose ops were given different core splits cannot read each other on chip;
    the fusion search gives them one split, a tile count, and tile buffers for the results
    only the kernel uses: fewer device bytes, faster, valid, and numerically the same."""
    pg = unary_chain(2048, 4096, n_ops=4, fn="neg")
    d = plan_naive(pg, HW)
    for i, op in enumerate(pg.ops):  # alternate two 32-core splits along the chain
        d.ops[op.id].core_split = {"r": 32} if i % 2 == 0 else {"r": 4, "c": 8}
    base = emit_program(pg, HW, d)
    assert validate_program(base, HW) == []
    res = fuse_tiled_groups(pg, HW, d)
    assert res is not None and res.fused_us < 0.7 * res.base_us
    program = res.program
    assert validate_program(program, HW) == []
    splits = {tuple(sorted(o.core_split.items())) for o in program.ops if o.kind == "compute"}
    assert len(splits) == 1
    buffers = [t.id for t in program.tensors if isinstance(t.memory, LxMemory) and t.memory.per_tile]
    assert set(buffers) == {"t1", "t2", "t3"}  # every intermediate; the output is written
    rep, rep0 = time_program(program, HW), time_program(base, HW)
    assert rep.hbm_bytes < rep0.hbm_bytes / 2
    x = primgraphs.inputs_for(pg)
    (got,) = run_program(program, x, HW)
    (want,) = interpret(pg, x)
    np.testing.assert_array_equal(got, np.asarray(want, dtype=np.float16))


def test_cpsat_plans_gated_mlp_with_a_fused_chain_and_matches_the_reference():
    pg = gated_mlp(M=512, K=256, N=1024)
    program = plan(pg, HW, "cpsat", time_limit_s=5, deterministic=True)  # plan() validates
    ids = [o.id for o in program.ops if o.kind == "compute"]
    assert ids.index("sig") + 1 == ids.index("mul")
    x = primgraphs.inputs_for(pg)
    (got,) = run_program(program, x, HW)
    want = np.asarray(interpret(pg, x)[0], dtype=np.float32)
    assert np.max(np.abs(got.astype(np.float32) - want)) <= 5e-3 * max(1.0, float(np.max(np.abs(want))))


def test_one_kernels_problem_does_not_cost_another_kernel_its_tile_buffers():
    """A fusion trial may be invalid elsewhere (it only ranks choices): tile buffers still go
    where the validator does not object, as long as they add no problem of their own."""
    from solver.spyre.tile_buffers import add_tile_buffers
    from tests.test_timing import _plan
    a = unary_chain(256, 256, n_ops=2)
    ts = dict(a.tensors)
    ops = list(a.ops)
    # a second, independent chain y -> u1 -> u2 whose u1 is resident under mismatched splits
    ts["y"] = PrimTensor("y", (256, 256), "float16", "user_input")
    for name in ("u1", "u2"):
        ts[name] = PrimTensor(name, (256, 256), "float16")
    dims = (IterDim("r", 256), IterDim("c", 256))
    ops += [PrimOp("op3", dims, (Access("y", (0, 1)),), Access("u1", (0, 1)), PointwiseBody(Call("neg", (In(0),)))),
            PrimOp("op4", dims, (Access("u1", (0, 1)),), Access("u2", (0, 1)), PointwiseBody(Call("exp", (In(0),))))]
    pg = PrimGraph("two_chains", ts, ops, ["x", "y"], ["t2", "u2"])
    d = _plan({"op1": {"r": 32}, "op2": {"r": 32}, "op3": {"r": 32}, "op4": {"c": 4}},
              tiles={"op1": {"r": 4}, "op2": {"r": 4}}, resident={"u1": 512 * 1024})
    prog = emit_program(pg, HW, d)
    before = {i.code for i in validate_program(prog, HW)}
    assert before == {"lx_slice_mismatch"}
    res = add_tile_buffers(pg, HW, d, prog)
    assert res is not None and res.buffers == ["t1"]
    assert {i.code for i in validate_program(res.program, HW)} == before
