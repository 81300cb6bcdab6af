"""The planner's cost model against the simulator's timing model."""
import pytest

from target.hardware import load_target
from simulator.timing import time_program
from solver.spyre.cost_model import OpView, op_cost_parts, predict_program_us
from solver.emit import emit_program
from solver.naive import plan_naive
from solver.plan import OpPlan, PlanDecisions, Residency
from solver.planners import plan
from tests.primgraphs import ALL, mlp, softmax

HW = load_target()


@pytest.mark.parametrize("name", sorted(ALL))
@pytest.mark.parametrize("planner", ["naive", "heuristic"])
def test_matches_timing_model_on_untiled_plans(name, planner):
    pg, _ = ALL[name]()
    prog = plan(pg, HW, planner=planner)
    sim = time_program(prog, HW).total_us
    assert predict_program_us(prog, HW) == pytest.approx(sim, rel=1e-6, abs=1e-6)


def test_split_choice_changes_matmul_cost_like_the_simulator():
    """M split replicates the weight at the per-core ceiling; N split does not: both models
    must rank them the same way and agree on the numbers."""
    pg, _ = mlp(M=64, K=128, N=1024)
    times = {}
    for split in ({"m": 4}, {"n": 16}):
        d = plan_naive(pg, HW)
        d.ops["mm"] = OpPlan(core_split=split)
        prog = emit_program(pg, HW, d)
        times[tuple(split)] = (predict_program_us(prog, HW), time_program(prog, HW).total_us)
    (pm, sm), (pn, sn) = times[("m",)], times[("n",)]
    assert pm == pytest.approx(sm, rel=1e-6) and pn == pytest.approx(sn, rel=1e-6)
    assert pn < pm


def test_residency_removes_device_traffic():
    pg, _ = softmax(M=64, N=256)
    d = plan_naive(pg, HW)
    for op in pg.ops:
        d.ops[op.id] = OpPlan(core_split={"m": 32})
    base = emit_program(pg, HW, d)
    d.resident = {"mx": Residency(0), "sh": Residency(4096), "ex": Residency(16384), "sm": Residency(32768)}
    lx = emit_program(pg, HW, d)
    assert predict_program_us(lx, HW) < predict_program_us(base, HW)
    assert predict_program_us(lx, HW) == pytest.approx(time_program(lx, HW).total_us, rel=1e-6)


def test_parts_price_every_residency_combination_exactly():
    pg, _ = softmax(M=64, N=256)
    op = pg.ops[1]  # sub(x, mx) -> sh
    from target.geometry import make_layout
    layouts = {t: make_layout(pg.tensors[t].shape, "float16", len(pg.tensors[t].shape) - 1, HW.stick_bytes)
               for t in ("x", "mx", "sh")}
    shapes = {t: pg.tensors[t].shape for t in layouts}
    dtypes = {t: "float16" for t in layouts}
    view = OpView(op, "compute", shapes, dtypes, layouts, {"m": 32}, [])
    parts = op_cost_parts(view, HW, [False, True, True])
    assert len(parts.combos) == 4  # mx and sh may be resident, x may not
    from solver.spyre.cost_model import op_time
    for key, c in parts.combos.items():
        assert c == op_time(view, key[:-1], key[-1], HW)
    both = parts.cost((False, True), True)
    assert both.total_ns < parts.cost((False, False), False).total_ns
