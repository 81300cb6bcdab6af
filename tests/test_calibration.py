"""The timing model reproduces every published device measurement in DESIGN.md (+-25%).

Each case is built as the plan that produced the measurement is described: the graph as a
PrimGraph, the plan as explicit decisions turned into a program by the emitter, and the
program must pass the validator before it is timed. The timing model has no knowledge of
these cases: every rate comes from the hardware file. docs/simulator-timing.md lists the
predictions next to the measurements and what each case exercises.
"""
import pytest

from lowering.primitives import (Access, Call, Const, In, IterDim, MatmulBody, PointwiseBody,
                                 PrimGraph, PrimOp, PrimTensor, ReduceBody)
from simulator.geometry import make_layout
from simulator.hardware import load_target
from simulator.timing import time_program
from simulator.validate import validate_program
from solver.emit import emit_program
from solver.plan import OpPlan, PlanDecisions, Residency

HW = load_target("spyre")
TOL = 0.25
F16 = "float16"


def _timed(pg, decisions):
    program = emit_program(pg, HW, decisions)
    issues = validate_program(program, HW)
    assert not issues, [(i.code, i.message) for i in issues]
    return program, time_program(program, HW)


def _within(pred_us, measured_us):
    assert measured_us * (1 - TOL) <= pred_us <= measured_us * (1 + TOL), \
        f"predicted {pred_us:.2f} us vs measured {measured_us:.2f} us"


# -- softmax 512x1024 fp16 on one core ---------------------------------------------------------
def softmax_graph(rows=512, cols=1024):
    t = {
        "x": PrimTensor("x", (rows, cols), F16, "user_input"),
        "m": PrimTensor("m", (rows, 1), F16), "e": PrimTensor("e", (rows, cols), F16),
        "s": PrimTensor("s", (rows, 1), F16), "y": PrimTensor("y", (rows, cols), F16),
    }
    red = (IterDim("r", rows), IterDim("c", cols, "reduction"))
    pw = (IterDim("r", rows), IterDim("c", cols))
    ops = [
        PrimOp("max", red, (Access("x", (0, 1)),), Access("m", (0, None)), ReduceBody("max")),
        PrimOp("exp", pw, (Access("x", (0, 1)), Access("m", (0, None))), Access("e", (0, 1)),
               PointwiseBody(Call("exp", (Call("sub", (In(0), In(1))),)))),
        PrimOp("sum", red, (Access("e", (0, 1)),), Access("s", (0, None)), ReduceBody("sum")),
        PrimOp("div", pw, (Access("e", (0, 1)), Access("s", (0, None))), Access("y", (0, 1)),
               PointwiseBody(Call("div", (In(0), In(1))))),
    ]
    return PrimGraph("softmax", t, ops, ["x"], ["y"])


def softmax_plan(pg, in_lx: bool, row_tiles: int = 4):
    """One core, one coarse-tiled kernel over row tiles (the same kernel in both plans);
    the intermediates m, e, s in device memory or staged in LX."""
    d = PlanDecisions(planner="calibration")
    for op in pg.ops:
        d.ops[op.id] = OpPlan(temporal_tiles={"r": row_tiles})
    if in_lx:
        addr = 0
        for t in ("m", "e", "s"):
            d.resident[t] = Residency(lx_address=addr)
            rows, cols = pg.tensors[t].shape
            addr += rows * max(cols * 2, HW.stick_bytes)
    return d


def test_softmax_one_core_through_device_memory():
    pg = softmax_graph()
    _, rep = _timed(pg, softmax_plan(pg, in_lx=False))
    _within(rep.total_us, 32.51)


def test_softmax_one_core_intermediates_in_lx():
    pg = softmax_graph()
    _, hbm = _timed(pg, softmax_plan(pg, in_lx=False))
    _, lx = _timed(pg, softmax_plan(pg, in_lx=True))
    _within(lx.total_us, 23.67)
    assert lx.total_us < hbm.total_us
    # only the graph input and output cross device memory
    assert lx.hbm_read_bytes == 512 * 1024 * 2 and lx.hbm_write_bytes == 512 * 1024 * 2


# -- decode matmul [M,4096] x [4096,25600], N split over 25 cores ------------------------------
def matmul_graph(m, k, n):
    t = {"x": PrimTensor("x", (m, k), F16, "user_input"), "w": PrimTensor("w", (k, n), F16, "parameter"),
         "y": PrimTensor("y", (m, n), F16)}
    op = PrimOp("mm", (IterDim("m", m), IterDim("n", n), IterDim("k", k, "reduction")),
                (Access("x", (0, 2)), Access("w", (2, 1))), Access("y", (0, 1)), MatmulBody(0, 1, 2))
    return PrimGraph(f"mm{m}x{k}x{n}", t, [op], ["x", "w"], ["y"])


def matmul_plan(split):
    d = PlanDecisions(planner="calibration")
    d.ops["mm"] = OpPlan(core_split=dict(split))
    return d


@pytest.mark.parametrize("batch,measured_us", [(1, 1762.0), (4, 1389.0)])
def test_decode_matmul_n_split_25_cores(batch, measured_us):
    pg = matmul_graph(batch, 4096, 25600)
    program, rep = _timed(pg, matmul_plan({"n": 25}))
    op = program.ops[0]
    assert op.num_cores_used == 25 and op.core_split == {"n": 25}
    _within(rep.total_us, measured_us)
    # the weight stream dominates: ~200 MB through the shared bus
    assert rep.ops[0].bound_by in ("memory", "replicated_load")


# -- SDPA, materialized scores, B1 H32 M512 D128 fp16 ----------------------------------------
SDPA_INTERMEDIATES = ("mx", "d", "e", "sm")


def sdpa_graph(b=1, h=32, m=512, dh=128):
    t = {n: PrimTensor(n, (b, h, m, dh), F16, "user_input") for n in ("q", "k", "v")}
    for n, shape in [("qs", (b, h, m, dh)), ("ks", (b, h, m, dh)), ("sc", (b, h, m, m)),
                     ("mx", (b, h, m, 1)), ("d", (b, h, m, m)), ("e", (b, h, m, m)),
                     ("sm", (b, h, m, 1)), ("p", (b, h, m, m)), ("o", (b, h, m, dh))]:
        t[n] = PrimTensor(n, shape, F16)

    def pw(last):
        return (IterDim("b", b), IterDim("h", h), IterDim("m", m), IterDim("j", last))

    red = (IterDim("b", b), IterDim("h", h), IterDim("m", m), IterDim("j", m, "reduction"))
    s = (1.0 / dh ** 0.5) ** 0.5  # q*s and k*s, as torch-spyre's decomposition scales both
    full, row = (0, 1, 2, 3), (0, 1, 2, None)
    ops = [
        PrimOp("qs", pw(dh), (Access("q", full),), Access("qs", full), PointwiseBody(Call("mul", (In(0), Const(s))))),
        PrimOp("ks", pw(dh), (Access("k", full),), Access("ks", full), PointwiseBody(Call("mul", (In(0), Const(s))))),
        PrimOp("qk", (IterDim("b", b), IterDim("h", h), IterDim("m", m), IterDim("n", m), IterDim("k", dh, "reduction")),
               (Access("qs", (0, 1, 2, 4)), Access("ks", (0, 1, 3, 4))), Access("sc", full), MatmulBody(2, 3, 4)),
        PrimOp("max", red, (Access("sc", full),), Access("mx", row), ReduceBody("max")),
        PrimOp("sub", pw(m), (Access("sc", full), Access("mx", row)), Access("d", full), PointwiseBody(Call("sub", (In(0), In(1))))),
        PrimOp("exp", pw(m), (Access("d", full),), Access("e", full), PointwiseBody(Call("exp", (In(0),)))),
        PrimOp("sum", red, (Access("e", full),), Access("sm", row), ReduceBody("sum")),
        PrimOp("div", pw(m), (Access("e", full), Access("sm", row)), Access("p", full), PointwiseBody(Call("div", (In(0), In(1))))),
        PrimOp("pv", (IterDim("b", b), IterDim("h", h), IterDim("m", m), IterDim("n", dh), IterDim("k", m, "reduction")),
               (Access("p", (0, 1, 2, 4)), Access("v", (0, 1, 4, 3))), Access("o", full), MatmulBody(2, 3, 4)),
    ]
    return PrimGraph("sdpa", t, ops, ["q", "k", "v"], ["o"])


def sdpa_program(pg, chain_in_lx: bool):
    """Every op split over the 32 heads (the same split producer -> consumer). With
    `chain_in_lx`, the softmax-chain intermediates (max, sub, exp, sum outputs) stay in LX
    at one per-core base each; the scores and probabilities stay in device memory, as in
    torch-spyre's pass. The bmm operands keep torch-spyre's default device tile order (a
    batch dim just inside the stick), the layout its compiler emitted for this measurement."""
    d = PlanDecisions(planner="calibration")
    for op in pg.ops:
        d.ops[op.id] = OpPlan(core_split={"h": 32})
    if chain_in_lx:
        addr = 0
        for t in SDPA_INTERMEDIATES:
            d.resident[t] = Residency(lx_address=addr)
            _, _, m, last = pg.tensors[t].shape
            addr += m * max(last * 2, HW.stick_bytes)
        d.bundle_starts = ["max"]
    program = emit_program(pg, HW, d)
    for td in program.tensors:
        if td.id in ("qs", "p", "v") or td.id.startswith("ks@"):
            st = td.layout.stick_dim
            order = [0, 2, 1, 3] if st == 3 else [0, 3, 1, 2]
            td.layout = make_layout(td.shape, td.dtype, st, HW.stick_bytes, order)
    issues = validate_program(program, HW)
    assert not issues, [(i.code, i.message) for i in issues]
    return program


def test_sdpa_softmax_chain_through_device_memory():
    rep = time_program(sdpa_program(sdpa_graph(), chain_in_lx=False), HW)
    _within(rep.total_us, 2557.0)
    assert any("bmm default_bmm" in e for e in rep.op("qk").effects)


def test_sdpa_softmax_chain_in_lx():
    pg = sdpa_graph()
    hbm = time_program(sdpa_program(pg, chain_in_lx=False), HW)
    lx = time_program(sdpa_program(pg, chain_in_lx=True), HW)
    _within(lx.total_us, 1358.0)
    # the published speed-up is 1.88x; the model must show the same effect, not just the totals
    speedup = hbm.total_us / lx.total_us
    assert 1.88 * (1 - TOL) <= speedup <= 1.88 * (1 + TOL), speedup
    # the resident chain moves no device-memory bytes for exp and sum
    assert lx.op("exp").hbm_read_bytes == 0 and lx.op("exp").hbm_write_bytes == 0
    assert lx.op("sum").hbm_read_bytes == 0


# -- large matmul, sustained per-core rate ------------------------------------------------------
@pytest.mark.parametrize("shape,split", [((4096, 4096, 4096), {}),
                                         ((16384, 4096, 16384), {"m": 4, "n": 8})])
def test_large_matmul_sustains_about_1140_mac_per_ns_per_core(shape, split):
    m, k, n = shape
    program, rep = _timed(matmul_graph(m, k, n), matmul_plan(split))
    op = rep.ops[0]
    rate = op.macs / (rep.total_us * 1e3) / op.cores
    assert op.macs == m * k * n
    assert 1140 * (1 - TOL) <= rate <= 1140 * (1 + TOL), rate
    assert op.bound_by == "compute"
