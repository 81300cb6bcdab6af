"""Spyre device layouts (SuperDSC format v2, target/layout.py): the geometry, every dim order
and stick-group position through emit -> validate -> run, stored v1 programs, and the
validator's verdicts on malformed layouts."""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from simulator.api import compare
from simulator.run import Machine, run_program
from simulator.timing import time_program
from simulator.validate import validate_program
from solver.emit import EmitError, emit_program
from solver.naive import plan_naive
from solver.plan import OpPlan, PlanDecisions, Residency, program_dim_orders, restick_id
from target.hardware import HardwareError, load_target
from target.interpreter import interpret
from target.layout import (
    batch_outermost, box_offsets, box_runs, box_span_bytes, box_sticks, default_dim_order, element_offset,
    is_row_major,
    logical_strides, make_layout, outer_dims_order, spyre_default_dim_order, stick_group_position,
)
from target.op_rules import stick_options
from target.primitives import (
    Access, Call, Const, In, IterDim, MatmulBody, PointwiseBody, PrimGraph, PrimOp, PrimTensor,
)
from target.superdsc import PROGRAM_VERSION, Program

HW = load_target()
SB = HW.stick_bytes
FIXTURES = Path(__file__).parent / "fixtures" / "superdsc_v1"
V1_PROGRAMS = sorted(FIXTURES.glob("*.json"))
# the hardware description the v1 programs were made for (target/targets/spyre.json at 9df385d)
V1_HARDWARE = Path(__file__).parent / "fixtures" / "superdsc_v1_hardware" / "spyre_9df385d.json"


# -- the geometry ---------------------------------------------------------------------------------
def test_torch_spyre_generic_stick_layout():
    # torch-spyre's default for a [B, M, K] tensor sticked on K: device [M, K/64, B, 64]
    lay = make_layout([512, 8, 256], "float16", 2, SB, dim_order=[1, 2, 0])
    assert lay.dim_map == [1, 2, 0, 2] and lay.device_size == [8, 4, 512, 64]
    assert outer_dims_order(lay) == [1, 0] and stick_group_position(lay) == 1
    assert not is_row_major(lay) and logical_strides(lay) is None
    # the plain row-major layout (format v1's only one): the stick group right before its elements
    lay = make_layout([512, 8, 256], "float16", 2, SB)
    assert lay.dim_map == [0, 1, 2, 2] and lay.device_size == [512, 8, 4, 64]
    assert is_row_major(lay) and logical_strides(lay) == (8 * 256, 256, 1)
    # torch-spyre's default, from its host dim order (SpyreTensorLayout(host_size, dtype))
    for shape, stick, device_size in [([512, 8, 256], 2, [8, 4, 512, 64]), ([512, 256], 1, [4, 512, 64]),
                                      ([128], 0, [2, 64]), ([2, 3, 5, 100], 3, [3, 5, 2, 2, 64]),
                                      ([4, 64, 128], 1, [128, 1, 4, 64])]:
        lay = make_layout(shape, "float16", stick, SB, spyre_default_dim_order(len(shape), stick))
        assert lay.device_size == device_size, shape
    assert make_layout([100], "float32", 0, SB).device_size == [4, 32]
    assert make_layout([], "float16", None, SB).dim_map == []
    with pytest.raises(ValueError, match="permutation"):
        make_layout([2, 3, 4], "float16", 2, SB, dim_order=[0, 0, 2])


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("stick", [0, 1, 2])
@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_offsets_are_a_bijection_onto_the_padded_device_tensor(order, stick, dtype):
    shape = (3, 5, 70)
    lay = make_layout(shape, dtype, stick, SB, dim_order=order)
    full = tuple((0, s) for s in shape)
    off = box_offsets(lay, full)
    n_dev = int(np.prod(lay.device_size))
    assert off.shape == shape and len(np.unique(off)) == off.size and 0 <= off.min() and off.max() < n_dev
    se = lay.stick_elems
    for idx in [(0, 0, 0), (2, 4, 69), (1, 3, 33), (2, 0, se - 1 if shape[2] > se else 0)]:
        assert element_offset(lay, idx) == off[idx]
        # the stick elements are innermost: the next element along the stick dim is the next
        # element in memory inside a stick
        if idx[stick] % se < se - 1 and idx[stick] + 1 < shape[stick]:
            nxt = list(idx)
            nxt[stick] += 1
            assert off[tuple(nxt)] == off[idx] + 1
    # a sub-box: its span is its corners' (whole sticks), its sticks and runs count what it touches
    box = ((1, 3), (0, 5), (0, shape[2]))
    sub = box_offsets(lay, box)
    touched = np.unique(sub // se)
    assert box_span_bytes(box, lay, dtype) == (touched.max() - touched.min() + 1) * se * (4 if dtype == "float32" else 2)
    assert box_sticks(box, lay) == len(touched)
    runs, per_run = box_runs(box, lay)
    # runs: maximal stretches of consecutive sticks
    gaps = int(np.count_nonzero(np.diff(touched) != 1))
    assert runs == gaps + 1 and runs * per_run == len(touched)
    strides = logical_strides(lay)
    if strides is not None:
        assert (off == sum(np.arange(s).reshape([-1 if d == j else 1 for d in range(3)]) * strides[j]
                           for j, s in enumerate(shape))).all()


def test_batch_outermost_reads_the_device_order():
    shape = (4, 64, 128)
    assert batch_outermost(make_layout(shape, "float16", 2, SB), [0])
    assert not batch_outermost(make_layout(shape, "float16", 2, SB, [1, 0, 2]), [0])
    assert not batch_outermost(make_layout(shape, "float16", 2, SB, [1, 2, 0]), [0])  # torch-spyre default
    assert not batch_outermost(make_layout(shape, "float16", 2, SB, [2, 0, 1]), [0])  # stick groups outside
    # one stick: the stick-group dim holds nothing, wherever it stands
    assert batch_outermost(make_layout((4, 64, 32), "float16", 2, SB, [2, 0, 1]), [0])


# -- every dim order through emit -> validate -> run -------------------------------------------------
def _probe(dtype: str) -> PrimGraph:
    """a = exp(0.1 x) (pointwise over [B, M, K]), o = a @ w per batch (bmm), both outputs."""
    B, M, K, N = 2, 5, 100, 40
    ts = {"x": PrimTensor("x", (B, M, K), dtype, "user_input"), "w": PrimTensor("w", (B, K, N), dtype, "user_input"),
          "a": PrimTensor("a", (B, M, K), dtype, "intermediate"), "o": PrimTensor("o", (B, M, N), dtype, "intermediate")}
    par = (IterDim("b", B), IterDim("m", M), IterDim("k", K))
    ops = [
        PrimOp("exp", par, (Access("x", (0, 1, 2)),), Access("a", (0, 1, 2)),
               PointwiseBody(Call("exp", (Call("mul", (In(0), Const(0.1))),)))),
        PrimOp("bmm", (IterDim("b", B), IterDim("m", M), IterDim("n", N), IterDim("k", K, "reduction")),
               (Access("a", (0, 1, 3)), Access("w", (0, 3, 2))), Access("o", (0, 1, 2)), MatmulBody(1, 2, 3)),
    ]
    return PrimGraph("layout_probe", ts, ops, ["x", "w"], ["a", "o"])


def _inputs(pg: PrimGraph) -> dict:
    rng = np.random.default_rng(7)
    return {n: (rng.standard_normal(pg.tensors[n].shape) * 0.5).astype(pg.tensors[n].dtype) for n in pg.inputs}


def _decisions(pg: PrimGraph, stick: int, order, split: dict) -> PlanDecisions:
    d = plan_naive(pg, HW)
    exp = pg.ops[0]
    d.ops["exp"] = OpPlan(stick=next(c for c in stick_options(exp) if c.output == stick), core_split=dict(split))
    d.ops["bmm"] = OpPlan(core_split={"b": 2, "m": 1})
    d.input_sticks["x"] = stick
    d.restick_ops.clear()
    d.dim_orders = {"x": list(order), "a": list(order), "w": list(order), "o": list(order)}
    if stick != 2:
        d.dim_orders[restick_id("a", 2)] = list(order)
    return d


def _split_for(stick: int) -> dict:
    # slices along a non-stick dim and along the stick dim (whole sticks) when it has two
    names = ("b", "m", "k")
    split = {"b": 2} if stick != 0 else {"m": 5}
    if stick == 2:
        split["k"] = 2
    return {n: f for n, f in split.items() if n in names}


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("stick", [0, 1, 2])
def test_every_dim_order_runs_like_the_reference(stick, dtype):
    pg = _probe(dtype)
    inp = _inputs(pg)
    ref = interpret(pg, inp)
    split = _split_for(stick)
    baseline = None
    for order in itertools.permutations(range(3)):
        prog = emit_program(pg, HW, _decisions(pg, stick, order, split))
        tm = prog.tensor_map()
        # the emitter wrote the planner's order: the stick dim's place is its stick-group dim
        assert tm["x"].layout.dim_map == list(order) + [stick]
        assert tm["o"].layout.dim_map == list(order) + [2]
        assert validate_program(prog, HW) == [], order
        # the functional run puts each element where the layout says
        m = Machine(prog, HW)
        m.load_inputs(inp)
        x = tm["x"]
        flat = m.hbm[x.memory.offset:].view(np.dtype(dtype))
        assert (flat[box_offsets(x.layout, tuple((0, s) for s in x.shape))] == inp["x"]).all()
        outs = run_program(prog, inp, HW)
        err = compare(outs, ref)[1]
        assert err < (2e-3 if dtype == "float16" else 1e-5), (order, err)
        assert np.array_equal(outs[0], ref[0]), order  # elementwise: the very same numbers
        # layout-independent: every order gives the very same numbers
        if baseline is None:
            baseline = outs
        else:
            assert all(np.array_equal(a, b) for a, b in zip(outs, baseline)), order
        time_program(prog, HW)  # every layout times


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_lx_slices_in_every_dim_order(order, dtype):
    """An LX-resident intermediate in every dim order: each core holds its slice laid out in
    the tensor's layout, and the reader finds it there."""
    pg = _probe(dtype)
    pg = PrimGraph(pg.name, pg.tensors, pg.ops, pg.inputs, ["o"])  # a program output is never in LX
    inp = _inputs(pg)
    d = _decisions(pg, 2, order, {"b": 2})
    d.ops["bmm"] = OpPlan(core_split={"b": 2})   # core c reads the batch it wrote
    d.resident["a"] = Residency(lx_address=0)
    prog = emit_program(pg, HW, d)
    assert prog.tensor_map()["a"].memory.kind == "lx"
    assert validate_program(prog, HW) == []
    assert compare(run_program(prog, inp, HW), interpret(pg, inp))[1] < (2e-3 if dtype == "float16" else 1e-5)


def test_planner_orders_are_checked_by_the_emitter():
    pg = _probe("float16")
    d = _decisions(pg, 2, (0, 1, 2), {"b": 2})
    d.dim_orders["x"] = [0, 1]
    with pytest.raises(EmitError, match="x: dim order"):
        emit_program(pg, HW, d)
    d = _decisions(pg, 2, (0, 1, 2), {"b": 2})
    d.dim_orders["nope"] = [0]
    with pytest.raises(EmitError, match="program does not have"):
        emit_program(pg, HW, d)
    d = _decisions(pg, 2, (0, 1, 2), {"b": 2})
    d.dim_orders[restick_id("a", 1)] = [0, 1, 2]
    with pytest.raises(EmitError, match="program does not have"):
        emit_program(pg, HW, d)


def test_default_decisions_emit_row_major_layouts():
    pg = _probe("float16")
    prog = emit_program(pg, HW, plan_naive(pg, HW))
    for t in prog.tensors:
        assert t.layout.dim_order == default_dim_order(len(t.shape), t.layout.stick_dim), t.id
        assert stick_group_position(t.layout) == len(t.shape) - 1


# -- the validator on malformed v2 layouts ----------------------------------------------------------
def _issues(prog: Program, tensor: str, layout: dict):
    d = json.loads(prog.to_json())
    next(t for t in d["tensors"] if t["id"] == tensor)["layout"] = layout
    return [(i.code, i.message) for i in validate_program(d, HW) if i.tensor == tensor and i.op is None]


@pytest.mark.parametrize("layout, code, says", [
    ({"dim_map": [0, 1, 2], "device_size": [2, 5, 64], "stick_elems": 64}, "layout_invalid", "4 (each dim once"),
    ({"dim_map": [0, 1, 1, 2], "device_size": [2, 5, 5, 64], "stick_elems": 64}, "layout_invalid", "once more"),
    ({"dim_map": [2, 2, 1, 2], "device_size": [2, 2, 5, 64], "stick_elems": 64}, "layout_invalid", "once more"),
    ({"dim_map": [0, 3, 2, 2], "device_size": [2, 5, 2, 64], "stick_elems": 64}, "layout_invalid", "not a dim"),
    ({"dim_map": [0, 1, 2, 2], "device_size": [2, 5, 128], "stick_elems": 64}, "layout_invalid", "3 entries"),
    ({"dim_map": [0, 1, 2, 2], "device_size": [2, 5, 2, 32], "stick_elems": 64}, "stick_alignment", "a stick holds 64"),
    ({"dim_map": [0, 1, 2, 2], "device_size": [2, 5, 3, 64], "stick_elems": 64}, "stick_alignment", "takes 2 whole sticks"),
    ({"dim_map": [2, 1, 0, 2], "device_size": [2, 5, 3, 64], "stick_elems": 64}, "layout_invalid", "size of dim 0 is 3"),
    ({"dim_map": [0, 1, 2, 2], "device_size": [2, 5, 4, 32], "stick_elems": 32}, "stick_alignment", "stick_elems 32"),
])
def test_validator_rejects_malformed_v2_layouts(layout, code, says):
    pg = _probe("float16")
    prog = emit_program(pg, HW, _decisions(pg, 2, (0, 1, 2), {"b": 2}))
    got = _issues(prog, "x", layout)
    assert any(c == code and says in m for c, m in got), got


def test_validator_accepts_every_stick_group_position():
    pg = _probe("float16")
    prog = emit_program(pg, HW, _decisions(pg, 2, (0, 1, 2), {"b": 2}))
    for order in itertools.permutations(range(3)):
        lay = make_layout((2, 5, 100), "float16", 2, SB, order)
        assert _issues(prog, "x", lay.model_dump()) == [], order


# -- stored v1 programs ------------------------------------------------------------------------------
def _v1_offset(layout: dict, shape, index) -> int:
    """Format v1's byte placement: row-major over device_size in dim_order (stick dim last, padded)."""
    off = 0
    for d, n in zip(layout["dim_order"], layout["device_size"]):
        off = off * n + index[d]
    return off


def _sample_indices(shape, rng, n=300):
    if not shape:
        return [()]
    corners = [tuple(c) for c in itertools.product(*[(0, s - 1) for s in shape])]
    rand = [tuple(int(rng.integers(0, s)) for s in shape) for _ in range(n)]
    return corners + rand


@pytest.mark.parametrize("path", V1_PROGRAMS, ids=lambda p: p.stem)
def test_v1_program_reads_as_the_same_bytes_in_v2(path):
    doc = json.loads(path.read_text())
    raw = doc["program"]
    assert raw["version"] == 1
    prog = Program.model_validate(raw)
    assert prog.version == PROGRAM_VERSION == 3
    assert Program.from_json(json.dumps(raw)) == prog
    rng = np.random.default_rng(0)
    for t1, t2 in zip(raw["tensors"], prog.tensors):
        lay1 = t1["layout"]
        # the v2 layout is the one today's emitter makes for the v1 dim order
        stick = lay1["dim_order"][-1] if lay1["dim_order"] else None
        assert t2.layout == make_layout(t1["shape"], t1["dtype"], stick, SB, lay1["dim_order"] or None), t1["id"]
        for idx in _sample_indices(t1["shape"], rng):
            assert element_offset(t2.layout, idx) == _v1_offset(lay1, t1["shape"], idx), (t1["id"], idx)
        # everything but the layouts is unchanged
        assert {k: v for k, v in t1.items() if k != "layout"} == {k: v for k, v in t2.model_dump().items()
                                                                 if k != "layout"}
    assert {k: v for k, v in raw.items() if k not in ("tensors", "version")} == \
        {k: v for k, v in prog.to_dict().items() if k not in ("tensors", "version")}


@pytest.mark.parametrize("path", V1_PROGRAMS, ids=lambda p: p.stem)
def test_v1_program_validates_and_times_as_before(path):
    """The stored v1 program validates, and times exactly as it did under format v1 (the
    times recorded with it), on the hardware description it was made for (stored beside it,
    so edits of target/targets/spyre.json do not move it). A timing model that needs
    parameters that description lacks is another model: it times every program anew."""
    doc = json.loads(path.read_text())
    try:
        hw = load_target(V1_HARDWARE)
    except HardwareError as e:
        pytest.skip(f"the timing model changed since the v1 times were recorded: {e}")
    assert hw.digest == doc["hardware_digest"]
    assert validate_program(doc["program"], hw) == []
    rep = time_program(Program.model_validate(doc["program"]), hw)
    assert rep.total_us == doc["timing"]["total_us"]
    assert [o.end_us for o in rep.ops] == doc["timing"]["op_end_us"]
    assert (rep.hbm_read_bytes, rep.hbm_write_bytes) == (doc["timing"]["hbm_read_bytes"],
                                                         doc["timing"]["hbm_write_bytes"])


def test_malformed_v1_layouts_keep_their_verdict():
    doc = json.loads((FIXTURES / "scores_naive.json").read_text())["program"]
    t = doc["tensors"][0]
    t["layout"] = dict(t["layout"], device_size=t["layout"]["device_size"][:-1] + [t["layout"]["device_size"][-1] - 1])
    assert "stick_alignment" in {i.code for i in validate_program(doc, HW)}
    doc = json.loads((FIXTURES / "scores_naive.json").read_text())["program"]
    doc["tensors"][0]["layout"]["dim_order"] = [1, 1, 1]
    assert "layout_invalid" in {i.code for i in validate_program(doc, HW)}
    doc = json.loads((FIXTURES / "scores_naive.json").read_text())["program"]
    doc["tensors"][0]["layout"]["dim_map"] = [0, 1, 2, 2]   # a v2 field in a v1 document
    assert {i.code for i in validate_program(doc, HW)} == {"schema"}
    lay = doc["tensors"][0]["layout"]
    del lay["dim_order"], lay["device_size"]
    lay["device_size"] = [2, 128, 1, 64]    # a whole v2 layout in a v1 document
    issues = validate_program(doc, HW)
    assert {i.code for i in issues} == {"schema"} and any("dim_map_in_a_v1_layout" in i.message for i in issues)


def test_what_a_core_slice_spans_follows_the_dim_order():
    """A core's batch slice of a 512 MiB tensor: one contiguous 32 MiB block with the batch
    outermost; with the batch inside (torch-spyre's default order) it reaches across the whole
    tensor, past the per-core span."""
    B, M, K = 16, 4096, 4096
    ts = {"x": PrimTensor("x", (B, M, K), "float16", "user_input"),
          "y": PrimTensor("y", (B, M, K), "float16", "intermediate")}
    op = PrimOp("exp", (IterDim("b", B), IterDim("m", M), IterDim("k", K)), (Access("x", (0, 1, 2)),),
                Access("y", (0, 1, 2)), PointwiseBody(Call("exp", (In(0),))))
    pg = PrimGraph("big", ts, [op], ["x"], ["y"])
    d = plan_naive(pg, HW)
    d.ops["exp"] = OpPlan(core_split={"b": 16})
    assert validate_program(emit_program(pg, HW, d), HW) == []
    box = ((0, 1), (0, M), (0, K))
    assert box_span_bytes(box, make_layout((B, M, K), "float16", 2, SB), "float16") == M * K * 2
    d.dim_orders = {"x": [1, 2, 0]}
    issues = validate_program(emit_program(pg, HW, d), HW)
    assert [(i.code, i.tensor) for i in issues] == [("span_exceeded", "x")]
    assert box_span_bytes(box, make_layout((B, M, K), "float16", 2, SB, [1, 2, 0]), "float16") > HW.per_core_span_bytes


def test_only_the_integer_1_reads_as_v1():
    raw = json.loads((FIXTURES / "scores_naive.json").read_text())["program"]
    for v in (True, 1.0, "1"):
        with pytest.raises(ValueError):
            Program.model_validate(dict(raw, version=v))
        assert {i.code for i in validate_program(dict(raw, version=v), HW)} == {"version"}


def test_an_alias_needs_plain_row_major_bytes():
    """A reshape shares its input's bytes only between plain row-major layouts: with the
    input's batch dim moved inside, the bytes are not the output's any more."""
    from tests.primgraphs import copies
    pg, ref = copies()
    d = plan_naive(pg, HW)
    d.ops["reshape"].alias = True
    prog = emit_program(pg, HW, d)
    assert validate_program(prog, HW) == []
    d.dim_orders["x"] = [1, 0, 2]
    with pytest.raises(EmitError, match="not a free alias"):
        emit_program(pg, HW, d)
    d.ops["reshape"].alias = False
    prog = emit_program(pg, HW, d)   # a real copy moves the data: right numbers in any order
    assert validate_program(prog, HW) == []
    inp = {"x": (np.random.default_rng(1).standard_normal((4, 8, 64)) * 0.5).astype(np.float16)}
    assert compare(run_program(prog, inp, HW), ref(inp))[1] < 2e-3
    # a program that claims the alias anyway is rejected by the validator
    doc = json.loads(emit_program(pg, HW, _alias_claimed(pg)).to_json())
    x = next(t for t in doc["tensors"] if t["id"] == "x")
    x["layout"] = make_layout((4, 8, 64), "float16", 2, SB, [1, 0, 2]).model_dump()
    assert "alias_illegal" in {i.code for i in validate_program(doc, HW)}


def _alias_claimed(pg):
    d = plan_naive(pg, HW)
    d.ops["reshape"].alias = True
    return d


@pytest.mark.parametrize("name", ["scores_naive", "softmax_lx"])
def test_simulate_takes_a_v1_document_and_runs_it_like_the_reference(name):
    """The simulator's front door reads the stored v1 text as it is: valid, the recorded
    time, and numbers equal to the reference interpreter on the graph it was made from."""
    from simulator.api import simulate
    from tests.primgraphs import attention_scores, softmax
    pg, _ = attention_scores() if name == "scores_naive" else softmax(M=64, N=256)
    doc = json.loads((FIXTURES / f"{name}.json").read_text())
    try:
        hw = load_target(V1_HARDWARE)
    except HardwareError as e:
        pytest.skip(f"the timing model changed since the v1 times were recorded: {e}")
    res = simulate(json.dumps(doc["program"]), hw, graph=pg, numerics=True)
    assert res.valid and res.simulated_us == doc["timing"]["total_us"]
    assert res.max_rel_err < 2e-3


def test_box_geometry_against_brute_force_at_every_rank():
    """Span and contiguity of random boxes of random layouts (rank 1-4, any dim order, boxes
    starting anywhere) equal what the element offsets say."""
    rng = np.random.default_rng(3)
    for _ in range(200):
        rank = int(rng.integers(1, 5))
        shape = tuple(int(rng.integers(1, 7)) if d else int(rng.integers(1, 150)) for d in range(rank))
        stick = int(rng.integers(0, rank))
        order = list(rng.permutation(rank))
        dtype = str(rng.choice(["float16", "float32"]))
        lay = make_layout(shape, dtype, stick, SB, order)
        box = []
        for s in shape:
            a = int(rng.integers(0, s))
            box.append((a, int(rng.integers(a + 1, s + 1))))
        box = tuple(box)
        se, item = lay.stick_elems, (2 if dtype == "float16" else 4)
        sticks = np.unique(box_offsets(lay, box) // se)
        assert box_span_bytes(box, lay, dtype) == (sticks.max() - sticks.min() + 1) * se * item
        runs, per_run = box_runs(box, lay)
        assert runs == int(np.count_nonzero(np.diff(sticks) != 1)) + 1 and runs * per_run == len(sticks), \
            (shape, stick, order, box)
        if box[stick][0] % se == 0:
            assert box_sticks(box, lay) == len(sticks)


def test_a_programs_dim_orders_read_back_as_decisions():
    pg = _probe("float16")
    d = _decisions(pg, 1, (2, 0, 1), {"b": 2})
    prog = emit_program(pg, HW, d)
    assert program_dim_orders(prog) == d.dim_orders
    assert program_dim_orders(emit_program(pg, HW, plan_naive(pg, HW))) == {}


@pytest.mark.parametrize("name", sorted(p.stem for p in FIXTURES.glob("*.json")))
def test_a_v1_program_times_on_todays_model_as_its_v2_form_does(name):
    """Whatever the timing model of the day: a stored v1 program and the same program
    written out in format v2 and read back are judged alike and time to the same numbers,
    op by op (the re-expression of its layouts changes nothing the simulator sees)."""
    text = json.dumps(json.loads((FIXTURES / f"{name}.json").read_text())["program"])
    v1 = Program.from_json(text)
    v2 = Program.from_json(v1.to_json())
    assert json.loads(v2.to_json())["version"] == PROGRAM_VERSION
    # stamped for the hardware file of its day: on today's the digest is the only complaint
    issues = validate_program(v1, HW)
    assert issues == validate_program(v2, HW) and {i.code for i in issues} <= {"hardware_mismatch"}
    a, b = time_program(v1, HW), time_program(v2, HW)
    assert a.total_us == b.total_us
    assert [(o.op_id, o.end_us) for o in a.ops] == [(o.op_id, o.end_us) for o in b.ops]
