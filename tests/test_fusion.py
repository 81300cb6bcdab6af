"""Fused coarse-tiled groups (solver.spyre.fusion): the CP-SAT planner tiles runs of ops the
timing model runs faster as one fused kernel, and never makes a plan slower."""
from dataclasses import replace

import tests.primgraphs as primgraphs
from simulator.hardware import load_target
from simulator.timing import time_program
from simulator.validate import validate_program
from solver.spyre.cpsat_planner import plan_cpsat
from solver.emit import emit_program
from solver.spyre.fusion import fuse_tiled_groups
from solver.plan import PlanDecisions
from solver.planners import plan

HW = load_target()
FAST = dict(time_limit_s=5, deterministic=True)


def _untiled(d: PlanDecisions) -> PlanDecisions:
    """`d` without temporal tiles, and so without tile buffers (they exist only in a tiled kernel)."""
    return replace(d, ops={k: replace(p, temporal_tiles={}) for k, p in d.ops.items()},
                   resident={t: r for t, r in d.resident.items() if not r.per_tile})


def test_softmax_too_big_for_lx_gets_a_faster_fused_tiled_group():
    """Softmax 2048x8192 fp16 over 32 cores: x (1 MiB per core) cannot stay in LX with the
    chain, so amax and the shift both read it from device memory; one coarse-tiled kernel
    over both reads it once."""
    pg, _ = primgraphs.softmax(M=2048, N=8192)
    d = plan_cpsat(pg, HW, **FAST)
    tiled = {k: p.temporal_tiles for k, p in d.ops.items() if p.temporal_tiles}
    assert len(tiled) >= 2 and all(max(t.values()) > 1 for t in tiled.values())
    program = plan(pg, HW, "cpsat", **FAST)  # plan() validates
    rep = time_program(program, HW)
    groups = {o.fused_group for o in rep.ops if o.fused_group is not None}
    assert groups
    assert any("already on chip" in e for o in rep.ops for e in o.effects)
    without = emit_program(pg, HW, _untiled(d))
    assert not validate_program(without, HW)
    assert rep.total_us < 0.9 * time_program(without, HW).total_us
    assert any(n.startswith("fusion:") for n in program.stats.notes)


def test_fusion_never_slows_a_plan_and_keeps_it_valid():
    for builder in ("mlp", "softmax", "attention_scores", "colsum"):
        pg, _ = getattr(primgraphs, builder)()
        d = plan_cpsat(pg, HW, time_limit_s=2, deterministic=True)
        res = fuse_tiled_groups(pg, HW, _untiled(d))
        assert res is not None
        assert res.fused_us <= res.base_us + 1e-9
        assert not validate_program(res.program, HW)
        assert res.report.total_us == time_program(res.program, HW).total_us


def test_fused_group_member_reads_a_result_on_chip_only_from_its_own_core():
    """In a coarse-tiled group each tile of a result is produced on the core that computed
    it: a later member with the same work division reads it there; one that needs other
    cores' parts (another split) makes the program invalid."""
    from tests.test_timing import _plan, _program, unary_chain
    pg = unary_chain(2048, 2048, n_ops=2)
    tiles = {"op1": {"r": 4}, "op2": {"r": 4}}
    same = time_program(_program(pg, _plan({"op1": {"r": 32}, "op2": {"r": 32}}, tiles=tiles)), HW)
    op2 = same.op("op2")
    assert op2.fused_group is not None and op2.fused_group == same.op("op1").fused_group
    assert op2.hbm_read_bytes == 0 and any("produced on chip" in e for e in op2.effects)
    # the result still reaches device memory: the program stores it there
    assert same.op("op1").hbm_write_bytes == 2048 * 2048 * 2
    # a member that needs other cores' parts cannot be in the kernel at all: the tile loops
    # of different cores do not wait for each other
    from solver.emit import emit_program
    other = emit_program(pg, HW, _plan({"op1": {"r": 32}, "op2": {"c": 32}}, tiles=tiles))
    assert {i.code for i in validate_program(other, HW)} == {"kernel_tile_order"}


def _two_readers_of_x(rows, cols):
    """x -> neg -> t1 and x -> exp -> t2: two members of one kernel read the same input."""
    from lowering.primitives import Access, Call, In, IterDim, PointwiseBody, PrimGraph, PrimOp, PrimTensor
    t = {"x": PrimTensor("x", (rows, cols), "float16", "user_input"),
         "t1": PrimTensor("t1", (rows, cols), "float16"), "t2": PrimTensor("t2", (rows, cols), "float16")}
    dims = (IterDim("r", rows), IterDim("c", cols))
    ops = [PrimOp(f"op{i}", dims, (Access("x", (0, 1)),), Access(out, (0, 1)), PointwiseBody(Call(fn, (In(0),))))
           for i, (out, fn) in enumerate((("t1", "neg"), ("t2", "exp")), start=1)]
    return PrimGraph("two_readers", t, ops, ["x"], ["t1", "t2"])


def test_fused_member_rereads_an_input_its_cores_did_not_load():
    """Inside one kernel a later read of an input is free only where each core already
    holds the box it needs: with another work division its cores load their own boxes."""
    from tests.test_timing import _plan, _program
    pg = _two_readers_of_x(2048, 2048)
    tiles = {"op1": {"r": 4}, "op2": {"r": 4}}
    x_bytes = 2048 * 2048 * 2
    same = time_program(_program(pg, _plan({"op1": {"r": 32}, "op2": {"r": 32}}, tiles=tiles)), HW)
    assert same.op("op2").fused_group == same.op("op1").fused_group is not None
    assert same.op("op2").hbm_read_bytes == 0
    assert any("already on chip" in e for e in same.op("op2").effects)
    crossed = time_program(_program(pg, _plan({"op1": {"r": 32}, "op2": {"c": 32}}, tiles=tiles)), HW)
    assert crossed.op("op2").fused_group == crossed.op("op1").fused_group is not None
    assert crossed.op("op2").hbm_read_bytes == x_bytes
    assert crossed.total_us > same.total_us


def test_a_lone_prefill_matmul_is_tiled_so_its_loads_overlap_its_compute():
    """An untiled kernel overlaps little of its weight stream with its PT time (the
    calibrated `untiled_overlap_chunks`); tiled, the loads of tile j+1 run under the compute
    of tile j. A lone matmul is a run of its own."""
    from calibration.cases import matmul_graph

    pg = matmul_graph(512, 4096, 4096)
    d = plan_cpsat(pg, HW, **FAST)
    assert max(d.ops["mm"].temporal_tiles.values(), default=1) > 1
    program = plan(pg, HW, "cpsat", **FAST)
    without = emit_program(pg, HW, _untiled(d))
    assert not validate_program(without, HW)
    assert time_program(program, HW).total_us < 0.9 * time_program(without, HW).total_us
