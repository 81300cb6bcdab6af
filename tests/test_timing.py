"""Timing model and trace: each device-measured effect shows, in the direction and size the
hardware file says, on small programs built through the emitter and checked by the validator."""
import json

import pytest

from target.primitives import (Access, Call, In, IterDim, MatmulBody, PointwiseBody, PrimGraph,
                                 PrimOp, PrimTensor, ReduceBody)
from target.geometry import make_layout
from target.hardware import TARGETS_DIR, hardware_from_dict, load_target
from simulator.timing import time_program
from simulator.trace import trace_document, write_trace
from simulator.validate import validate_program
from solver.emit import emit_program
from solver.plan import OpPlan, PlanDecisions, Residency

HW = load_target()
F16 = "float16"


def _program(pg, decisions, hw=HW):
    program = emit_program(pg, hw, decisions)
    issues = validate_program(program, hw)
    assert not issues, [(i.code, i.message) for i in issues]
    return program


def _plan(splits=None, tiles=None, resident=None):
    d = PlanDecisions(planner="test")
    for op_id, s in (splits or {}).items():
        d.op(op_id).core_split = dict(s)
    for op_id, t in (tiles or {}).items():
        d.op(op_id).temporal_tiles = dict(t)
    addr = 0
    for t, size in (resident or {}).items():
        d.resident[t] = Residency(lx_address=addr)
        addr += size
    return d


def unary_chain(rows, cols, n_ops=1, fn="neg"):
    """x -> t1 -> ... -> tn, elementwise."""
    t = {"x": PrimTensor("x", (rows, cols), F16, "user_input")}
    ops, prev = [], "x"
    for i in range(1, n_ops + 1):
        name = f"t{i}"
        t[name] = PrimTensor(name, (rows, cols), F16)
        ops.append(PrimOp(f"op{i}", (IterDim("r", rows), IterDim("c", cols)), (Access(prev, (0, 1)),),
                          Access(name, (0, 1)), PointwiseBody(Call(fn, (In(0),)))))
        prev = name
    return PrimGraph("chain", t, ops, ["x"], [prev])


def add_bcast(rows, cols):
    t = {"x": PrimTensor("x", (rows, cols), F16, "user_input"), "b": PrimTensor("b", (1, cols), F16, "parameter"),
         "y": PrimTensor("y", (rows, cols), F16)}
    op = PrimOp("add", (IterDim("r", rows), IterDim("c", cols)), (Access("x", (0, 1)), Access("b", (None, 1))),
                Access("y", (0, 1)), PointwiseBody(Call("add", (In(0), In(1)))))
    return PrimGraph("addb", t, [op], ["x", "b"], ["y"])


def row_sum(rows, cols):
    t = {"x": PrimTensor("x", (rows, cols), F16, "user_input"), "s": PrimTensor("s", (rows, 1), F16)}
    op = PrimOp("sum", (IterDim("r", rows), IterDim("c", cols, "reduction")), (Access("x", (0, 1)),),
                Access("s", (0, None)), ReduceBody("sum"))
    return PrimGraph("rowsum", t, [op], ["x"], ["s"])


def matmul(m, k, n, batch=None):
    if batch is None:
        t = {"x": PrimTensor("x", (m, k), F16, "user_input"), "w": PrimTensor("w", (k, n), F16, "parameter"),
             "y": PrimTensor("y", (m, n), F16)}
        op = PrimOp("mm", (IterDim("m", m), IterDim("n", n), IterDim("k", k, "reduction")),
                    (Access("x", (0, 2)), Access("w", (2, 1))), Access("y", (0, 1)), MatmulBody(0, 1, 2))
        return PrimGraph("mm", t, [op], ["x", "w"], ["y"])
    t = {"x": PrimTensor("x", (batch, m, k), F16, "user_input"), "w": PrimTensor("w", (batch, k, n), F16, "user_input"),
         "y": PrimTensor("y", (batch, m, n), F16)}
    op = PrimOp("bmm", (IterDim("b", batch), IterDim("m", m), IterDim("n", n), IterDim("k", k, "reduction")),
                (Access("x", (0, 1, 3)), Access("w", (0, 3, 2))), Access("y", (0, 1, 2)), MatmulBody(1, 2, 3))
    return PrimGraph("bmm", t, [op], ["x", "w"], ["y"])


def test_shared_bus_one_way_balanced_and_turnaround():
    pg = unary_chain(4096, 1024)
    nbytes = 4096 * 1024 * 2
    many = time_program(_program(pg, _plan({"op1": {"r": 32}})), HW)
    # 32 cores, read + write balanced: the measured ~105 GB/s effective
    assert 2 * nbytes / (many.total_us * 1e3) == pytest.approx(HW.dram_balanced_gbps, rel=0.02)
    assert many.hbm_read_bytes == nbytes and many.hbm_write_bytes == nbytes
    # one core reads no faster than its DMA issues (dram_core_read_gbps), unless the bus
    # share of part of the machine (with the turnaround) is slower still
    one = time_program(_program(pg, _plan({"op1": {}})), HW)
    turnaround = HW.dram_turnaround_ns_per_byte if HW.dram_turnaround_min_cores <= 1 else 0.0
    bus_ns = 2 * nbytes / HW.dram_bus_gbps(1) + turnaround * nbytes
    expect_ns = max(bus_ns, nbytes / HW.dram_core_read_gbps)
    assert one.op("op1").memory_us * 1e3 == pytest.approx(expect_ns, rel=0.02)
    assert HW.dram_bus_gbps(1) == pytest.approx(HW.dram_oneway_gbps * HW.dram_partial_machine_fraction)
    read_only = time_program(_program(row_sum(4096, 1024), _plan({"sum": {"r": 32}})), HW)
    assert read_only.hbm_write_bytes == 4096 * HW.stick_bytes  # one sparse stick per row


def test_lx_resident_intermediate_moves_no_device_memory_bytes():
    pg = unary_chain(1024, 1024, n_ops=2)
    split = {"op1": {"r": 32}, "op2": {"r": 32}}
    hbm = time_program(_program(pg, _plan(split)), HW)
    lx = time_program(_program(pg, _plan(split, resident={"t1": 1024 * 1024 * 2 // 32})), HW)
    per = 1024 * 1024 * 2
    assert hbm.hbm_bytes == 4 * per
    assert lx.hbm_bytes == 2 * per  # graph input read once, graph output written once
    assert lx.op("op1").hbm_write_bytes == 0 and lx.op("op2").hbm_read_bytes == 0
    assert lx.lx_bytes == 2 * per
    assert lx.total_us < 0.75 * hbm.total_us


def test_broadcast_operand_loaded_once_not_per_core():
    rows, cols = 4096, 2048
    rep = time_program(_program(add_bcast(rows, cols), _plan({"add": {"r": 32}})), HW)
    op = rep.op("add")
    assert op.hbm_read_bytes == rows * cols * 2 + cols * 2
    assert "broadcast-operand op" in op.effects
    # the measured broadcast-op rate, not the balanced 105 GB/s
    moved = op.hbm_read_bytes + op.hbm_write_bytes
    assert moved / (rep.total_us * 1e3) == pytest.approx(HW.broadcast_op_gbps, rel=0.02)


def test_shared_matmul_operand_crosses_the_bus_once_and_pays_fanout_delivery():
    m, k, n = 64, 4096, 8192
    by_n = time_program(_program(matmul(m, k, n), _plan({"mm": {"n": 32}})), HW)
    by_m = time_program(_program(matmul(m, k, n), _plan({"mm": {"m": 2}})), HW)
    # N split: x is shared by all 32 cores; its bytes cross the bus once
    op = by_n.op("mm")
    assert any(e.startswith("shared x32: x") for e in op.effects)
    assert op.hbm_read_bytes == m * k * 2 + k * n * 2
    unique_ns = (m * k * 2 + k * n * 2 + m * n * 2) / HW.dram_oneway_gbps
    delivery = HW.shared_read_delivery_ns(m * k * 2, 32)
    assert delivery > 0  # fan-out 32 is past the free fan-out
    assert op.memory_us * 1e3 == pytest.approx(unique_ns + HW.dram_turnaround_ns_per_byte * m * n * 2 + delivery,
                                               rel=1e-6)
    # M split 2 x N split 16: the weight is shared by 2 cores (within the free fan-out: no
    # delivery term), x by 16: the same unique bytes, a smaller delivery term
    mn = time_program(_program(matmul(m, k, n), _plan({"mm": {"m": 2, "n": 16}})), HW).op("mm")
    assert mn.hbm_read_bytes == m * k * 2 + k * n * 2
    assert {e.split(":")[0] for e in mn.effects if e.startswith("shared")} == {"shared x16", "shared x2"}
    assert mn.memory_us * 1e3 == pytest.approx(op.memory_us * 1e3 - delivery + HW.shared_read_delivery_ns(m * k * 2, 16),
                                               rel=1e-6)
    # M split 2 alone: two cores cannot issue the whole bus
    assert by_m.total_us > 3 * by_n.total_us


def test_few_cores_cannot_issue_the_whole_bus():
    m, k, n = 64, 4096, 8192
    few = time_program(_program(matmul(m, k, n), _plan({"mm": {"n": 4}})), HW).op("mm")
    many = time_program(_program(matmul(m, k, n), _plan({"mm": {"n": 32}})), HW).op("mm")
    assert HW.dram_bus_gbps(4) < HW.dram_bus_gbps(32) == pytest.approx(HW.dram_oneway_gbps)
    moved = few.hbm_read_bytes + few.hbm_write_bytes
    assert moved / (few.memory_us * 1e3) <= HW.dram_bus_gbps(4) * 1.001
    # four cores issue at most 4 x dram_core_read_gbps of reads
    assert few.hbm_read_bytes / (few.memory_us * 1e3) <= 4 * HW.dram_core_read_gbps * 1.001
    one = time_program(_program(matmul(m, k, n), _plan({"mm": {}})), HW).op("mm")
    assert any(e.startswith("core-read cap") for e in one.effects)
    assert few.memory_us > many.memory_us


def test_a_reduction_on_few_cores_follows_the_reduction_curve_a_stream_does_not():
    # device (HieronZhang/torch-spyre cost-model sweep): amax on 1 core reaches ~0.11 of the
    # 32-core rate, a+b on 1 core ~0.6 of its 32-core time's rate
    assert HW.dram_bus_gbps(1, "reduction") == pytest.approx(HW.dram_oneway_gbps * 0.11)
    assert HW.dram_bus_gbps(1) > 5 * HW.dram_bus_gbps(1, "reduction")
    red1 = time_program(_program(row_sum(4096, 2048), _plan({"sum": {}})), HW).op("sum")
    red32 = time_program(_program(row_sum(4096, 2048), _plan({"sum": {"r": 32}})), HW).op("sum")
    add1 = time_program(_program(unary_chain(4096, 2048), _plan({"op1": {}})), HW).op("op1")
    add32 = time_program(_program(unary_chain(4096, 2048), _plan({"op1": {"r": 32}})), HW).op("op1")
    assert red1.memory_us / red32.memory_us > 5
    assert add1.memory_us / add32.memory_us < 3


def test_reduction_read_rate_follows_rows_curve():
    few = time_program(_program(row_sum(512, 8192), _plan({"sum": {"r": 32}})), HW)
    many = time_program(_program(row_sum(65536, 64), _plan({"sum": {"r": 32}})), HW)
    rate_few = few.hbm_read_bytes / (few.op("sum").memory_us * 1e3)
    rate_many = many.hbm_read_bytes / (many.op("sum").memory_us * 1e3)
    assert rate_few > rate_many
    assert rate_many < HW.reduction_read_curve.gbps(1000)


def test_cross_row_reduction_rate():
    rows, cols = 4096, 1024
    t = {"x": PrimTensor("x", (rows, cols), F16, "user_input"), "s": PrimTensor("s", (1, cols), F16)}
    op = PrimOp("colsum", (IterDim("c", cols), IterDim("r", rows, "reduction")), (Access("x", (1, 0)),),
                Access("s", (None, 0)), ReduceBody("sum"))
    pg = PrimGraph("colsum", t, [op], ["x"], ["s"])
    rep = time_program(_program(pg, _plan({"colsum": {"c": 16}})), HW)
    assert "cross-row reduction" in rep.op("colsum").effects
    assert rep.hbm_read_bytes / (rep.op("colsum").memory_us * 1e3) < HW.cross_row_reduction_gbps


def _batch_inside_layouts(program, tensors):
    for td in program.tensors:  # batch dim just inside the rows (the compiler default)
        if td.id in tensors:
            st = td.layout.stick_dim
            td.layout = make_layout(td.shape, td.dtype, st, HW.stick_bytes, [d for d in (1, 2) if d != st] + [0, st])


def test_operand_order_stalls_the_pt_array_per_batch_inside_operand():
    # each core holds 16 batches (b split 2, m split 16: 128 rows, full PT passes)
    pg = matmul(2048, 512, 512, batch=32)
    macs_core = 32 * 2048 * 512 * 512 / 32
    times = {}
    for inside in ((), ("x",), ("w",), ("y",), ("x", "w"), ("x", "w", "y")):
        prog = _program(pg, _plan({"bmm": {"b": 2, "m": 16}}))
        _batch_inside_layouts(prog, inside)
        assert not validate_program(prog, HW)
        op = time_program(prog, HW).op("bmm")
        times[inside] = op
        n_in = len([t for t in inside if t != "y"])
        stall = max(n_in * HW.pt_batch_inside_input_ns_per_mac,
                    HW.pt_batch_inside_output_ns_per_mac if "y" in inside else 0.0)  # 16 per core: full interleave
        assert op.compute_us * 1e3 == pytest.approx(macs_core / HW.pt_sustained_mac_per_ns_per_core + macs_core * stall,
                                                    rel=0.01)
    assert not any(e.startswith("batch-inside") for e in times[()].effects)
    # each input on its own, both inputs more, the output drain hidden behind the feed stalls
    assert times[()].compute_us < times[("y",)].compute_us < times[("x",)].compute_us
    assert times[("x",)].compute_us == pytest.approx(times[("w",)].compute_us)
    assert times[("x", "w")].compute_us == pytest.approx(times[("x", "w", "y")].compute_us)


def test_operand_order_stall_grows_with_batch_up_to_saturation():
    stall = [HW.pt_layout_stall_ns_per_mac(2, True, b) for b in (1, 2, 3, 4, 8, 64)]
    assert stall[0] == 0.0
    assert stall[0] < stall[1] < stall[2] <= stall[3] == pytest.approx(stall[4]) == pytest.approx(stall[5])
    # a projection (shared weight) interleaves rows that share the weight: its own, smaller stall
    proj = HW.pt_layout_stall_ns_per_mac(1, True, 64, shared_weight=True)
    assert 0 < proj < HW.pt_layout_stall_ns_per_mac(1, False, 64)


def test_short_m_slices_derate_the_pt_array():
    full = time_program(_program(matmul(2048, 4096, 4096), _plan({"mm": {}})), HW).op("mm")
    short = time_program(_program(matmul(8, 4096, 4096), _plan({"mm": {}})), HW).op("mm")
    rate_full = full.macs / (full.compute_us * 1e3)
    rate_short = short.macs / (short.compute_us * 1e3)
    assert rate_full == pytest.approx(HW.pt_sustained_mac_per_ns_per_core, rel=0.01)
    assert rate_short == pytest.approx(rate_full * HW.pt_pass_efficiency(8), rel=0.01)


def test_temporal_tiles_pay_loop_overhead_and_double_buffer_when_room():
    pg = unary_chain(2048, 1024)
    base = time_program(_program(pg, _plan({"op1": {"r": 32}})), HW)
    tiled = time_program(_program(pg, _plan({"op1": {"r": 32}}, tiles={"op1": {"r": 8}})), HW)
    op = tiled.op("op1")
    assert op.temporal_tiles == 8 and op.double_buffered
    assert op.overhead_us == pytest.approx(8 * HW.loop_overhead_us)
    assert tiled.total_us > base.total_us + 8 * HW.loop_overhead_us * 0.99


def test_a_tiled_kernel_fills_its_pipeline_over_tiles_times_the_untiled_chunks():
    # a double-buffered kernel of T tiles: max(mem, compute) + min(mem, compute) / (T x chunks);
    # an untiled kernel is one tile (T = 1)
    pg = matmul(2048, 2048, 2048)
    chunks = HW.untiled_overlap_chunks
    for tiles in (None, {"mm": {"m": 2}}, {"mm": {"m": 4}}):
        op = time_program(_program(pg, _plan({"mm": {"m": 32}}, tiles=tiles)), HW).op("mm")
        assert op.double_buffered
        t = op.temporal_tiles
        body = max(op.memory_us, op.compute_us) + min(op.memory_us, op.compute_us) / (t * chunks)
        assert op.end_us - op.start_us == pytest.approx(body + op.overhead_us + op.ring_us, rel=1e-6), t


def test_no_double_buffering_when_lx_is_full():
    rows, cols = 2048, 12288
    pg = unary_chain(rows, cols, n_ops=2)
    per_core = rows * cols * 2 // 32  # 1.5 MB: t1 resident nearly fills the 1.55 MB capacity
    split = {"op1": {"r": 32}, "op2": {"r": 32}}
    tiles = {"op2": {"r": 4}}
    roomy = time_program(_program(pg, _plan(split, tiles=tiles)), HW).op("op2")
    full = time_program(_program(pg, _plan(split, tiles=tiles, resident={"t1": per_core})), HW).op("op2")
    assert roomy.double_buffered
    # op2 still streams t2 out in 4 tiles of 384 KB: two of them no longer fit beside t1
    assert not full.double_buffered and "no double buffering" in full.effects
    assert full.end_us - full.start_us == pytest.approx(full.memory_us + full.compute_us + full.overhead_us)


def test_small_tiles_underfill_and_big_tiles_spill():
    small = time_program(_program(unary_chain(64, 128), _plan({"op1": {"r": 32}})), HW).op("op1")
    assert any(e.startswith("underfill") for e in small.effects)
    big = time_program(_program(unary_chain(64, 65536), _plan({"op1": {"r": 2}}, tiles={"op1": {"r": 2}})), HW).op("op1")
    assert any(e.startswith("spill") for e in big.effects)


def test_split_reduction_combines_over_the_ring():
    pg = matmul(256, 8192, 256)
    rep = time_program(_program(pg, _plan({"mm": {"k": 4, "n": 4}})), HW)
    op = rep.op("mm")
    assert op.ring_us > 0 and op.ring_bytes > 0
    assert any("ring combine x4" in e for e in op.effects)


def test_restickify_through_device_memory():
    rows, cols = 1024, 1024
    t = {"x": PrimTensor("x", (rows, cols), F16, "user_input"), "w": PrimTensor("w", (rows, cols), F16, "parameter"),
         "y": PrimTensor("y", (rows, cols), F16)}
    # y = x @ w with w given sticked on its first dim: the emitter must restickify it
    op = PrimOp("mm", (IterDim("m", rows), IterDim("n", cols), IterDim("k", rows, "reduction")),
                (Access("x", (0, 2)), Access("w", (2, 1))), Access("y", (0, 1)), MatmulBody(0, 1, 2))
    pg = PrimGraph("r", t, [op], ["x", "w"], ["y"])
    d = _plan({"mm": {"m": 32}})
    d.input_sticks["w"] = 0
    rep = time_program(_program(pg, d), HW)
    re = [o for o in rep.ops if o.kind == "restickify"]
    assert len(re) == 1 and "restickify" in re[0].effects
    moved = re[0].hbm_read_bytes + re[0].hbm_write_bytes
    assert moved / (re[0].memory_us * 1e3) == pytest.approx(HW.restickify_gbps, rel=0.05)


def test_ops_run_back_to_back_with_barriers_and_core_busy_time():
    pg = unary_chain(1024, 1024, n_ops=3)
    rep = time_program(_program(pg, _plan({"op1": {"r": 32}, "op2": {"r": 8}, "op3": {"r": 32}})), HW)
    for a, b in zip(rep.ops, rep.ops[1:]):
        assert b.start_us == pytest.approx(a.end_us)
    assert rep.total_us == pytest.approx(rep.ops[-1].end_us)
    assert rep.op("op2").cores == 8
    assert rep.core_busy_us[0] > rep.core_busy_us[31] > 0  # core 0..7 also ran op2


def test_rates_come_from_the_hardware_file():
    doc = json.loads((TARGETS_DIR / "spyre.json").read_text())
    doc["name"] = "spyre_slowbus"
    for key in ("dram_oneway_gbps", "dram_balanced_gbps"):
        doc["params"][key]["value"] /= 2
    doc["params"]["dram_turnaround_ns_per_byte"]["value"] *= 2
    slow_hw = hardware_from_dict(doc)
    pg = unary_chain(4096, 1024)
    fast = time_program(_program(pg, _plan({"op1": {"r": 32}})), HW)
    slow_prog = emit_program(pg, slow_hw, _plan({"op1": {"r": 32}}))
    slow = time_program(slow_prog, slow_hw)
    assert slow.total_us == pytest.approx(2 * fast.total_us, rel=0.01)
    assert slow.hardware_digest == slow_hw.digest != fast.hardware_digest


def test_trace_is_a_loadable_chrome_trace(tmp_path):
    pg = unary_chain(1024, 1024, n_ops=2)
    rep = time_program(_program(pg, _plan({"op1": {"r": 32}, "op2": {"r": 32}})), HW)
    path = write_trace(rep, tmp_path / "t.json")
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    xs = [e for e in events if e["ph"] == "X"]
    assert xs and all({"pid", "tid", "ts", "dur", "name"} <= set(e) for e in xs)
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert {"program", "device memory", "core 0", "core 31"} <= names
    ops_track = [e for e in xs if e["pid"] == 0 and e["tid"] == 0]
    assert [e["name"] for e in ops_track] == ["op1", "op2"]
    assert ops_track[1]["ts"] == pytest.approx(ops_track[0]["ts"] + ops_track[0]["dur"])
    # per-core SFP work on every core that ran the op
    sfp = [e for e in xs if e["tid"] == 1 and e["name"] == "op1"]
    assert len(sfp) == 32
    assert trace_document(rep)["otherData"]["total_us"] == rep.total_us


def test_copy_reads_only_the_elements_its_pieces_take():
    from target.primitives import CopyBody, StridedMap
    rows, cols = 1024, 2048
    t = {"x": PrimTensor("x", (rows, cols), F16, "user_input"), "y": PrimTensor("y", (rows, cols // 2), F16)}
    op = PrimOp("slice", (IterDim("r", rows), IterDim("c", cols // 2)), (Access("x", (0, None)),),
                Access("y", (0, 1)), CopyBody((StridedMap((rows, cols // 2), (cols, 1), cols // 2),), ((0, 0),)))
    pg = PrimGraph("slice", t, [op], ["x"], ["y"])
    rep = time_program(_program(pg, _plan({"slice": {"r": 32}})), HW)
    half = rows * cols // 2 * 2
    assert rep.op("slice").hbm_read_bytes == half and rep.op("slice").hbm_write_bytes == half


def test_naive_plan_with_gather_fill_and_scan_times_every_op():
    from target.primitives import FillBody, GatherBody
    from solver.planners import plan
    vocab, hidden, seq = 1000, 256, 64
    t = {"table": PrimTensor("table", (vocab, hidden), F16, "parameter"),
         "idx": PrimTensor("idx", (seq,), "int64", "user_input"),
         "emb": PrimTensor("emb", (seq, hidden), F16), "pos": PrimTensor("pos", (seq, hidden), F16),
         "h": PrimTensor("h", (seq, hidden), F16), "c": PrimTensor("c", (seq, hidden), F16)}
    ops = [
        PrimOp("gather", (IterDim("s", seq), IterDim("d", hidden)), (Access("table", (None, 1)), Access("idx", (0,))),
               Access("emb", (0, 1)), GatherBody(0)),
        PrimOp("fill", (IterDim("s", seq), IterDim("d", hidden)), (), Access("pos", (0, 1)), FillBody(iota_dim=0)),
        PrimOp("add", (IterDim("s", seq), IterDim("d", hidden)), (Access("emb", (0, 1)), Access("pos", (0, 1))),
               Access("h", (0, 1)), PointwiseBody(Call("add", (In(0), In(1))))),
        PrimOp("cumsum", (IterDim("d", hidden), IterDim("s", seq, "reduction")), (Access("h", (1, 0)),),
               Access("c", (1, 0)), ReduceBody("cumsum")),
    ]
    pg = PrimGraph("embed", t, ops, ["idx", "table"], ["c"])
    program = plan(pg, HW, "naive")
    rep = time_program(program, HW)
    assert [o.op_id for o in rep.ops] == [o.id for o in program.ops]
    assert all(o.end_us >= o.start_us >= 0 for o in rep.ops)
    assert rep.total_us == pytest.approx(sum(o.end_us - o.start_us for o in rep.ops))
    g = rep.op("gather")
    # the gather reads one table row per output row (not the whole table) plus the indices
    assert g.hbm_read_bytes < vocab * hidden * 2
    assert g.hbm_read_bytes >= seq * hidden * 2
    assert rep.op("fill").hbm_read_bytes == 0 and rep.op("fill").hbm_write_bytes == seq * hidden * 2


def test_bmm_layout_ignores_size_one_dims():
    # [1, H, M, K] x [1, H, K, N]: the leading size-1 dim is broadcast (None) in the access,
    # yet the batch dim H is outermost among dims with extent: batch-outer
    h, m, k, n = 8, 256, 128, 256
    t = {"x": PrimTensor("x", (1, h, m, k), F16, "user_input"), "w": PrimTensor("w", (1, h, k, n), F16, "user_input"),
         "y": PrimTensor("y", (1, h, m, n), F16)}
    op = PrimOp("bmm", (IterDim("h", h), IterDim("m", m), IterDim("n", n), IterDim("k", k, "reduction")),
                (Access("x", (None, 0, 1, 3)), Access("w", (None, 0, 3, 2))), Access("y", (None, 0, 1, 2)),
                MatmulBody(1, 2, 3))
    pg = PrimGraph("bmm1", t, [op], ["x", "w"], ["y"])
    rep = time_program(_program(pg, _plan({"bmm": {"m": 8}})), HW)
    assert not any(e.startswith("batch-inside") for e in rep.op("bmm").effects)


def test_operand_order_stall_follows_the_batches_of_one_cores_slice():
    # the feed interleaves the batches one core holds: all 8 (split over rows), 2 (batch
    # split 4), or one (batch split 8, one head per core: rows fed in order, no stall)
    pg = matmul(4096, 512, 512, batch=8)
    ops = {}
    for split in ({"m": 32}, {"b": 4, "m": 8}, {"b": 8, "m": 4}):
        prog = _program(pg, _plan({"bmm": split}))
        _batch_inside_layouts(prog, ("x", "w", "y"))
        ops[tuple(split.items())] = time_program(prog, HW).op("bmm")
    full, two, one = ops.values()
    per_mac = {k: HW.pt_layout_stall_ns_per_mac(2, True, b) for k, b in (("full", 8), ("two", 2))}
    assert per_mac["two"] < per_mac["full"]
    assert any(e.startswith("batch-inside x+y+out") for e in full.effects)
    assert any(e.startswith("batch-inside") for e in two.effects)
    assert not any(e.startswith("batch-inside") for e in one.effects)
    # same MACs per core in each: the PT time orders as the per-core batch extent
    assert one.compute_us < two.compute_us < full.compute_us
    macs_core = 8 * 4096 * 512 * 512 / 32
    assert full.compute_us * 1e3 == pytest.approx(
        macs_core / HW.pt_sustained_mac_per_ns_per_core + macs_core * per_mac["full"], rel=0.01)
    assert one.compute_us * 1e3 == pytest.approx(macs_core / HW.pt_sustained_mac_per_ns_per_core, rel=0.01)


def test_temporal_tiles_reread_an_input_the_tiled_dim_does_not_index():
    m, k, n = 2048, 1024, 1024
    w_bytes, x_bytes = k * n * 2, m * k * 2
    one = time_program(_program(matmul(m, k, n), _plan({"mm": {"m": 32}})), HW).op("mm")
    four = time_program(_program(matmul(m, k, n), _plan({"mm": {"m": 32}}, tiles={"mm": {"m": 4}})), HW).op("mm")
    assert four.hbm_read_bytes - one.hbm_read_bytes == 3 * w_bytes  # w every tile, x once
    assert any(e == "re-read x4: w" for e in four.effects) and not any("re-read" in e for e in one.effects)
    assert one.hbm_read_bytes == x_bytes + w_bytes
    # tiling the dim every input indexes re-reads nothing
    n_t = time_program(_program(matmul(m, k, n), _plan({"mm": {"m": 32}}, tiles={"mm": {"n": 4}})), HW).op("mm")
    assert sum("re-read" in e for e in n_t.effects) == 1  # x: N does not index it


def test_k_tiles_move_partial_sums_when_they_do_not_fit_lx():
    # per core the output box is 8 MiB of fp32 partial sums: more than LX holds
    m, k, n = 4096, 4096, 4096
    base = time_program(_program(matmul(m, k, n), _plan({"mm": {"m": 4, "n": 8}})), HW).op("mm")
    kt = time_program(_program(matmul(m, k, n), _plan({"mm": {"m": 4, "n": 8}}, tiles={"mm": {"k": 4}})), HW).op("mm")
    psum_core = (m // 4) * (n // 8) * HW.psum_bytes_per_element
    assert psum_core > HW.lx_capacity_bytes
    assert kt.hbm_write_bytes - base.hbm_write_bytes == 3 * psum_core * 32
    assert any(e.startswith("k-tile partial sums x3") for e in kt.effects)
    # a small output keeps its partial sums on chip
    small = time_program(_program(matmul(512, 4096, 512), _plan({"mm": {"m": 4, "n": 8}}, tiles={"mm": {"k": 4}})),
                         HW).op("mm")
    assert not any("partial sums" in e for e in small.effects)


def test_reading_what_the_previous_op_wrote_pays_the_read_after_write_turnaround():
    pg = unary_chain(2048, 4096, n_ops=2)
    split = {"op1": {"r": 32}, "op2": {"r": 32}}
    rep = time_program(_program(pg, _plan(split)), HW)
    t1 = 2048 * 4096 * 2
    assert any(e.startswith("read-after-write") for e in rep.op("op2").effects)
    assert not any(e.startswith("read-after-write") for e in rep.op("op1").effects)
    no_raw = hardware_from_dict(_doc_with(dram_raw_turnaround_ns_per_byte=1e-12))
    rep0 = time_program(_program(pg, _plan(split), no_raw), no_raw)
    assert (rep.op("op2").memory_us - rep0.op("op2").memory_us) * 1e3 == pytest.approx(
        t1 * HW.dram_raw_turnaround_ns_per_byte, rel=1e-3)
    # kept in LX, the intermediate never crosses the bus: no turnaround
    lx = time_program(_program(pg, _plan(split, resident={"t1": t1 // 32})), HW)
    assert not any(e.startswith("read-after-write") for e in lx.op("op2").effects)


def _doc_with(**values):
    doc = json.loads((TARGETS_DIR / "spyre.json").read_text())
    for k, v in values.items():
        doc["params"][k]["value"] = v
    return doc
