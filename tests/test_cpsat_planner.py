"""The CP-SAT planner: valid, numerically right, never worse than its hint, finds residency."""
import pytest

import tests.primgraphs as primgraphs
from simulator.api import simulate
from target.hardware import load_target
from target.superdsc import LxMemory
from simulator.timing import time_program
from solver.spyre.cost_model import predict_program_us
from solver.spyre.cpsat_planner import plan_cpsat
from solver.spyre.start import decisions_from_program
from solver.planners import plan

HW = load_target()
FAST = dict(time_limit_s=5, deterministic=True)


@pytest.mark.parametrize("builder", ["mlp", "softmax", "attention_scores", "copies", "embedding", "colsum"])
def test_plans_are_valid_right_and_no_worse_than_the_baselines(builder):
    pg, _ = getattr(primgraphs, builder)()
    program = plan(pg, HW, "cpsat", **FAST)  # plan() validates
    res = simulate(program, HW, inputs=primgraphs.inputs_for(pg), graph=pg, numerics=True)
    assert res.valid, res.errors
    assert res.max_rel_err is not None and res.max_rel_err < 2e-2, (builder, res.max_rel_err)
    cp = predict_program_us(program, HW)
    for other in ("naive", "heuristic"):
        assert cp <= predict_program_us(plan(pg, HW, other), HW) + 1e-9, other
    assert program.stats.planner == "cpsat"
    assert program.stats.solver_status in ("OPTIMAL", "FEASIBLE")
    assert program.stats.bound is not None and program.stats.bound <= program.stats.objective + 1e-6


def test_softmax_chain_that_fits_lx_stays_resident():
    """Softmax 512x1024 over 32 cores: every intermediate fits one core's LX slice, and the
    row split is the same for all five ops, so the optimum keeps the chain resident."""
    pg, _ = primgraphs.softmax(M=512, N=1024)
    program = plan(pg, HW, "cpsat", **FAST)
    lx = {t.id for t in program.tensors if isinstance(t.memory, LxMemory)}
    assert lx == {"mx", "sh", "ex", "sm"}
    assert program.stats.gap == pytest.approx(0.0, abs=1e-6)
    through_memory = plan(pg, HW, "naive")
    assert time_program(program, HW).total_us < 0.6 * time_program(through_memory, HW).total_us


def test_returns_the_hint_when_given_no_time():
    """Whatever the solver finds in its budget, the plan is never predicted slower than the
    hint it was given."""
    pg, _ = primgraphs.mlp(M=64, K=128, N=192)
    hint = plan(pg, HW, "heuristic")
    d = plan_cpsat(pg, HW, time_limit_s=0.01, deterministic=True, hint=decisions_from_program(pg, hint))
    assert d.stats["predicted_us"] <= predict_program_us(hint, HW) + 1e-9


def test_deterministic_mode_repeats():
    pg, _ = primgraphs.softmax(M=128, N=512)
    a = plan(pg, HW, "cpsat", **FAST)
    b = plan(pg, HW, "cpsat", **FAST)
    assert a.to_dict()["ops"] == b.to_dict()["ops"] and a.to_dict()["tensors"] == b.to_dict()["tensors"]


def test_warm_start_from_a_stored_program_keeps_its_decisions():
    pg, _ = primgraphs.softmax(M=64, N=256)
    stored = plan(pg, HW, "heuristic")
    d = decisions_from_program(pg, stored)
    assert set(d.resident) == {t.id for t in stored.tensors if isinstance(t.memory, LxMemory)}
    again = plan(pg, HW, "cpsat", hint=stored, **FAST)
    assert predict_program_us(again, HW) <= predict_program_us(stored, HW) + 1e-9


def test_warm_start_from_a_stored_fused_program_is_valid_and_no_worse_than_a_cold_start():
    """A stored CP-SAT program has fused kernels: its tile buffers hold one tile of a tensor,
    which no untiled op fits in, so the warm start reads back the solve's view (no tiles, no
    tile buffers), and the default start competes with it: the search never falls back to
    the naive plan, and ends no slower than from a cold start."""
    from tests.test_split_k_hold import MLP, gated_mlp

    pg = gated_mlp(*MLP)   # (tall enough for fused row-tiled kernels on the recalibrated judge)
    stored = plan(pg, HW, "cpsat", **FAST)
    assert any(getattr(t.memory, "per_tile", False) for t in stored.tensors)
    d = decisions_from_program(pg, stored)
    whole = {t.id for t in stored.tensors if isinstance(t.memory, LxMemory) and not t.memory.per_tile}
    assert set(d.resident) == whole and not any(p.temporal_tiles for p in d.ops.values())
    again = plan_cpsat(pg, HW, hint=stored, **FAST)
    assert "naive" not in again.stats["notes"][0] and "invalid" not in again.stats["notes"][0]
    cold = plan(pg, HW, "cpsat", **FAST)
    assert time_program(plan(pg, HW, "cpsat", hint=stored, **FAST), HW).total_us <= \
        time_program(cold, HW).total_us + 1e-6


def test_a_hint_whose_residencies_do_not_validate_loses_those_not_its_decisions():
    """LX residencies that overlap in this planner's op order are dropped from the hint (the
    ones the validator names), not the whole hint for the naive plan."""
    from dataclasses import replace

    from solver.oracle import checked_program
    from solver.spyre.start import hint_repaired

    pg, _ = primgraphs.softmax(M=64, N=256)
    d = decisions_from_program(pg, plan(pg, HW, "heuristic"))
    bad = replace(d, resident={t: replace(r, lx_address=0) for t, r in d.resident.items()})
    prog, issues = checked_program(pg, HW, bad)
    assert prog is None and {i.code for i in issues} == {"lx_overlap"}
    fixed, prog = hint_repaired(pg, HW, bad, issues)
    assert prog is not None and fixed.ops == bad.ops
    assert set(fixed.resident) and set(fixed.resident) < set(bad.resident)
    out = plan_cpsat(pg, HW, hint=bad, **FAST)
    assert out.stats["notes"][0].startswith("hint: heuristic (without the LX residencies")


# Capturing and planning a model costs 20-40 s on a loaded 2-core machine: llama runs by
# default, the others under -m slow.
@pytest.mark.parametrize("name", ["llama"] + [pytest.param(n, marks=pytest.mark.slow)
                                              for n in ("gpt2", "bert", "vit")])
def test_tiny_models_run_correctly(name):
    torch = pytest.importorskip("torch")
    from tests.models import tiny_primgraph

    pg = tiny_primgraph(name, dtype=torch.float16)
    program = plan(pg, HW, "cpsat", time_limit_s=8, deterministic=True)
    res = simulate(program, HW, graph=pg, numerics=True)
    assert res.valid, res.errors
    assert res.max_rel_err is not None and res.max_rel_err < 5e-2, (name, res.max_rel_err)
    heur = plan(pg, HW, "heuristic")
    assert predict_program_us(program, HW) <= predict_program_us(heur, HW) + 1e-9
