"""Fused coarse-tiled groups (solver.fusion): the CP-SAT planner tiles runs of ops the
timing model runs faster as one fused kernel, and never makes a plan slower."""
from dataclasses import replace

import tests.primgraphs as primgraphs
from simulator.hardware import load_target
from simulator.timing import time_program
from simulator.validate import validate_program
from solver.cpsat_planner import plan_cpsat
from solver.emit import emit_program
from solver.fusion import fuse_tiled_groups
from solver.plan import PlanDecisions
from solver.planners import plan

HW = load_target()
FAST = dict(time_limit_s=5, deterministic=True)


def _untiled(d: PlanDecisions) -> PlanDecisions:
    return PlanDecisions(planner=d.planner, ops={k: replace(p, temporal_tiles={}) for k, p in d.ops.items()},
                         input_sticks=d.input_sticks, restick_ops=d.restick_ops, resident=d.resident,
                         bundle_starts=d.bundle_starts, stats=d.stats)


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
