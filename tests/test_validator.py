"""Negative tests: for each validator check, a valid program mutated to break exactly that
rule is rejected with that check's code (simulator/validate.py)."""
import copy

import pytest

from target.primitives import Access, Call, In, IterDim, PointwiseBody, PrimGraph, PrimOp, PrimTensor
from target.hardware import load_target
from simulator.validate import validate_program
from solver.emit import emit_program
from solver.naive import plan_naive
from solver.plan import Residency
from solver.planners import plan
from tests.hw_variants import strict_bundles
from tests.primgraphs import attention_scores, colsum, copies, mlp, softmax

HW = load_target()


def codes(prog) -> set[str]:
    return {i.code for i in validate_program(prog, HW)}


def _d(prog):
    return copy.deepcopy(prog.to_dict())


def _op(d, op_id):
    return next(o for o in d["ops"] if o["id"] == op_id)


def _t(d, tid):
    return next(t for t in d["tensors"] if t["id"] == tid)


@pytest.fixture(scope="module")
def naive_mlp():
    pg, _ = mlp()
    return plan(pg, HW, planner="naive")


def _lx_softmax(hw=HW, **resident):
    pg, _ = softmax(M=64, N=256)
    d = plan_naive(pg, hw)
    for op_id in ("amax", "sub", "exp", "sum", "div"):
        d.ops[op_id].core_split = {"m": 32}
    for t, addr in (resident or {"mx": 0, "sh": 8192, "ex": 16384, "sm": 24576}).items():
        d.resident[t] = Residency(addr)
    return emit_program(pg, hw, d)


@pytest.fixture(scope="module")
def lx_softmax():
    prog = _lx_softmax()
    assert validate_program(prog, HW) == []
    return prog


def test_valid_programs_pass(naive_mlp, lx_softmax):
    assert codes(naive_mlp) == set() and codes(lx_softmax) == set()


def test_version_and_schema(naive_mlp):
    d = _d(naive_mlp)
    d["version"] = 4
    assert codes(d) == {"version"}
    d["version"] = "2"
    assert codes(d) == {"version"}
    d = _d(naive_mlp)
    d["ops"][0]["surprise"] = 1
    assert codes(d) == {"schema"}
    assert codes("{not json") == {"schema"}
    d = _d(naive_mlp)
    d["ops"][0]["prim"]["body"] = {"kind": "nonsense"}
    assert "schema" in codes(d)


def test_hardware_mismatch(naive_mlp):
    d = _d(naive_mlp)
    d["stats"]["hardware_digest"] = "0" * 64
    assert codes(d) == {"hardware_mismatch"}


def test_unknown_tensor_and_shape_mismatch(naive_mlp):
    d = _d(naive_mlp)
    _op(d, "relu")["prim"]["inputs"][0]["tensor"] = "nope"
    assert "unknown_tensor" in codes(d)
    d = _d(naive_mlp)
    _op(d, "relu")["prim"]["iter_dims"][1]["size"] = 100
    assert "shape_mismatch" in codes(d)


def test_read_before_write(naive_mlp):
    d = _d(naive_mlp)
    d["ops"][1], d["ops"][2] = d["ops"][2], d["ops"][1]   # relu before the bias add it reads
    d["bundles"][0]["ops"] = [o["id"] for o in d["ops"]]
    assert codes(d) == {"read_before_write"}


def test_multiple_producers(naive_mlp):
    d = _d(naive_mlp)
    _op(d, "relu")["prim"]["output"]["tensor"] = "z"
    assert "multiple_producers" in codes(d)


def test_layout_invalid_and_stick_alignment(naive_mlp):
    d = _d(naive_mlp)
    _t(d, "y")["layout"]["dim_map"] = [1, 1, 1]
    assert "layout_invalid" in codes(d)
    d = _d(naive_mlp)
    _t(d, "b")["layout"]["device_size"] = [2, 64]   # 192 elements are 3 sticks
    assert "stick_alignment" in codes(d)
    d = _d(naive_mlp)
    _t(d, "y")["memory"]["offset"] += 2
    assert "stick_alignment" in codes(d)


def test_uneven_split(naive_mlp):
    d = _d(naive_mlp)
    o = _op(d, "relu")
    o["core_split"] = {"n": 2}   # n = 192 = 3 sticks
    o["core_slices"] = [{"core": 0, "slice": {"n": 0}}, {"core": 1, "slice": {"n": 1}}]
    o["num_cores_used"] = 2
    assert codes(d) == {"split_uneven"}
    o["core_split"] = {"zz": 2}
    assert "split_unknown_dim" in codes(d)


def test_cores_over_limit(naive_mlp):
    d = _d(naive_mlp)
    o = _op(d, "relu")
    o["core_split"] = {"m": 64}
    o["core_slices"] = [{"core": c, "slice": {"m": c}} for c in range(64)]
    o["num_cores_used"] = 64
    assert "cores_over_limit" in codes(d)
    d = _d(naive_mlp)
    _op(d, "relu")["core_slices"][5]["core"] = HW.cores + 3
    assert "cores_over_limit" in codes(d)


def test_multi_reduction_split():
    x = PrimTensor("x", (64, 128), "float16", "user_input")
    s = PrimTensor("s", (1, 1), "float16")
    op = PrimOp("tot", (IterDim("a", 64, "reduction"), IterDim("b", 128, "reduction")),
                (Access("x", (0, 1)),), Access("s", (None, None)),
                __import__("target.primitives", fromlist=["ReduceBody"]).ReduceBody("sum"))
    pg = PrimGraph("tot", {"x": x, "s": s}, [op], ["x"], ["s"])
    d = _d(plan(pg, HW, planner="naive"))
    o = d["ops"][0]
    o["core_split"] = {"a": 2, "b": 2}
    o["core_slices"] = [{"core": c, "slice": {"a": c // 2, "b": c % 2}} for c in range(4)]
    o["num_cores_used"] = 4
    assert "multi_reduction_split" in codes(d)


def test_core_slices_not_a_bijection(naive_mlp):
    d = _d(naive_mlp)
    o = _op(d, "relu")
    o["core_slices"][1]["slice"] = dict(o["core_slices"][0]["slice"])   # two cores, one slice
    assert codes(d) == {"core_slices"}
    d = _d(naive_mlp)
    o = _op(d, "relu")
    o["core_slices"][1]["core"] = o["core_slices"][0]["core"]           # one core, two slices
    assert codes(d) == {"core_slices"}
    d = _d(naive_mlp)
    o = _op(d, "relu")
    o["core_slices"].pop()                                               # a slice nobody runs
    o["num_cores_used"] -= 1
    assert codes(d) == {"core_slices"}


def test_temporal_tiles(naive_mlp):
    d = _d(naive_mlp)
    _op(d, "relu")["temporal_tiles"] = {"n": 50}   # a core has 3 sticks along n
    assert codes(d) == {"temporal_tiles"}
    _op(d, "relu")["temporal_tiles"] = {"n": 3}
    assert codes(d) == set()


def test_op_rule(naive_mlp):
    d = _d(naive_mlp)
    w = _t(d, "w")   # [128, 192] sticked on n; make it sticked on k: the matmul rule needs n
    w["layout"] = {"dim_map": [1, 0, 0], "device_size": [192, 2, 64], "stick_elems": 64}
    assert codes(d) == {"op_rule"}


def test_restickify_invalid():
    pg, _ = attention_scores()
    d = _d(plan(pg, HW, planner="naive"))
    r = next(o for o in d["ops"] if o["kind"] == "restickify")
    r["kind"] = r["opfunc"] = "relayout"    # both tensors are in device memory
    assert codes(d) == {"restickify_invalid"}
    d = _d(plan(pg, HW, planner="naive"))
    r = next(o for o in d["ops"] if o["kind"] == "restickify")
    r["src"] = "q"
    assert "restickify_invalid" in codes(d)


def test_io_memory(lx_softmax):
    d = _d(lx_softmax)
    d["outputs"] = ["ex"]
    assert "io_memory" in codes(d)


def test_lx_capacity(lx_softmax):
    d = _d(lx_softmax)
    _t(d, "ex")["memory"]["lx_address"] = HW.lx_capacity_bytes - 512
    assert "lx_capacity" in codes(d)
    d = _d(lx_softmax)
    # live bytes over the capacity without any buffer ending past it
    half = (HW.lx_capacity_bytes // 2 // 128) * 128
    for tid, addr in (("sh", 0), ("ex", half)):
        m = _t(d, tid)["memory"]
        m["lx_address"], m["size_per_core"] = addr, half
    _t(d, "mx")["memory"]["lx_address"] = 2 * half - 128 if 2 * half + 128 > HW.lx_capacity_bytes else 2 * half
    _t(d, "mx")["memory"]["size_per_core"] = 1024
    assert "lx_capacity" in codes(d)


def test_lx_overlap(lx_softmax):
    d = _d(lx_softmax)
    _t(d, "ex")["memory"]["lx_address"] = _t(d, "sh")["memory"]["lx_address"]  # sh is live when ex is written
    assert codes(d) == {"lx_overlap"}
    d = _d(lx_softmax)
    _t(d, "sm")["memory"]["lx_address"] = _t(d, "sh")["memory"]["lx_address"]  # sh dead by then: legal reuse
    assert codes(d) == set()


def test_lx_size(lx_softmax):
    d = _d(lx_softmax)
    _t(d, "ex")["memory"]["size_per_core"] = 512
    assert codes(d) == {"lx_size"}


def test_lx_live_range(lx_softmax):
    d = _d(lx_softmax)
    _t(d, "ex")["memory"]["live_to"] -= 1     # div still reads it
    assert codes(d) == {"lx_live_range"}


def _cut_before_div(prog):
    d = _d(prog)
    ids = [o["id"] for o in d["ops"]]
    cut = ids.index("div")
    for o in d["ops"][cut:]:
        o["bundle"] = 1
    d["bundles"] = [{"id": 0, "ops": ids[:cut], "external_tensors": ["x"]},
                    {"id": 1, "ops": ids[cut:], "external_tensors": ["p"]}]
    return d


def test_lx_cross_bundle():
    """Where LX contents die at a bundle boundary, div (bundle 1) may not read ex and sm
    written in bundle 0."""
    hw = strict_bundles()
    prog = _lx_softmax(hw=hw)
    assert validate_program(prog, hw) == []
    assert {i.code for i in validate_program(_cut_before_div(prog), hw)} == {"lx_cross_bundle"}


def test_lx_read_in_a_later_bundle_is_valid_where_lx_persists(lx_softmax):
    """Spyre (hw.lx_persists_across_bundles): the next kernel launch reads LX by address."""
    assert HW.lx_persists_across_bundles
    assert codes(_cut_before_div(lx_softmax)) == set()


def test_lx_slice_mismatch(lx_softmax):
    d = _d(lx_softmax)
    o = _op(d, "exp")   # reads sh from LX with a permuted core -> slice map
    for cs in o["core_slices"]:
        cs["slice"]["m"] = (cs["slice"]["m"] + 1) % 32
    assert codes(d) == {"lx_slice_mismatch"}


def test_lx_reduction_split():
    pg, _ = colsum(M=256, N=128)
    d = plan_naive(pg, HW)
    pg.tensors["s2"] = PrimTensor("s2", (1, 128), "float16")
    pg.ops.append(PrimOp("neg", (IterDim("a", 1), IterDim("n", 128)), (Access("s", (None, 1)),),
                         Access("s2", (None, 1)), PointwiseBody(Call("neg", (In(0),)))))
    pg.outputs[:] = ["s2"]
    d = plan_naive(pg, HW)
    d.ops["colsum"].core_split = {"r": 4}
    d.ops["neg"].core_split = {}
    prog = emit_program(pg, HW, d)
    assert validate_program(prog, HW) == []
    d.resident["s"] = Residency(0)
    assert "lx_reduction_split" in codes(emit_program(pg, HW, d))


def test_hbm_overlap_and_device_memory(naive_mlp):
    d = _d(naive_mlp)
    _t(d, "z")["memory"]["offset"] = _t(d, "y")["memory"]["offset"]   # y is still read when z is written
    assert codes(d) == {"hbm_overlap"}
    d = _d(naive_mlp)
    _t(d, "o")["memory"]["offset"] = HW.device_memory_usable_bytes
    assert codes(d) == {"device_memory"}


def test_span_exceeded():
    n = 16384   # 16384 x 16384 fp16 = 512 MiB: one core touching all of it exceeds 256 MB
    x = PrimTensor("x", (n, n), "float16", "user_input")
    y = PrimTensor("y", (n, n), "float16")
    op = PrimOp("e", (IterDim("m", n), IterDim("n", n)), (Access("x", (0, 1)),), Access("y", (0, 1)),
                PointwiseBody(Call("exp", (In(0),))))
    pg = PrimGraph("big", {"x": x, "y": y}, [op], ["x"], ["y"])
    d = plan_naive(pg, HW)
    assert validate_program(emit_program(pg, HW, d), HW) == []   # split 32 ways: 16 MiB per core
    d.ops["e"].core_split = {}
    assert codes(emit_program(pg, HW, d)) == {"span_exceeded"}


def _extra_relu(d, out, is_output):
    """A copy of relu writing a new device-memory tensor `out`, added to bundle 0."""
    d["tensors"].append(dict(_t(d, "o"), id=out, is_output=is_output,
                             memory={"kind": "hbm", "offset": (10 + len(d["tensors"])) * 2 ** 20,
                                     "alias_of": None}))
    if is_output:
        d["outputs"].append(out)
    extra = copy.deepcopy(_op(d, "relu"))
    extra["id"], extra["prim"]["id"] = f"relu_{out}", f"relu_{out}"
    extra["prim"]["output"]["tensor"] = out
    d["ops"].append(extra)
    d["bundles"][0]["ops"].append(extra["id"])
    d["bundles"][0]["external_tensors"].append(out)


def test_bundle_structure_and_limit():
    """The old count (every device-memory tensor), on a target that says so."""
    hw = strict_bundles()
    naive_mlp = plan(mlp()[0], hw, planner="naive")
    codes_ = lambda d: {i.code for i in validate_program(d, hw)}  # noqa: E731
    d = _d(naive_mlp)
    d["ops"][2]["bundle"] = 7
    assert "bundle_structure" in codes_(d)
    d = _d(naive_mlp)
    d["bundles"][0]["external_tensors"] = ["x"]
    assert codes_(d) == {"bundle_structure"}
    d = _d(naive_mlp)   # x w b y z o: 6 device-memory tensors; one more op writing a new tensor
    assert len(d["bundles"]) == 1 and len(d["bundles"][0]["external_tensors"]) == 6
    _extra_relu(d, "o2", is_output=False)
    assert codes_(d) == {"bundle_limit"}


def test_bundle_limit_counts_inputs_outputs_and_the_pool(naive_mlp):
    """Spyre: program inputs and outputs count one each, device-memory intermediates one
    together. x w b o + the pool (y, z) = 5 slots; a new intermediate is free, a new output
    takes the sixth slot, a second one is one too many."""
    d = _d(naive_mlp)
    assert len(d["bundles"]) == 1 and len(d["bundles"][0]["external_tensors"]) == 6
    _extra_relu(d, "t2", is_output=False)
    _extra_relu(d, "o2", is_output=True)
    assert codes(d) == set()
    _extra_relu(d, "o3", is_output=True)
    got = validate_program(d, HW)
    assert {i.code for i in got} == {"bundle_limit"}
    assert "7 of its 6" in got[0].message and "<intermediate pool>" in got[0].message


def test_alias_illegal():
    pg, _ = copies()
    d = _d(plan(pg, HW, planner="naive"))
    _op(d, "transpose")["alias"] = True      # a transpose moves data: not a free alias
    assert "alias_illegal" in codes(d)
    d = _d(plan(pg, HW, planner="naive"))
    _t(d, "tr")["memory"]["alias_of"] = "r"   # claimed alias without an alias op
    assert "alias_illegal" in codes(d)


def test_op_decl_mismatch(naive_mlp):
    d = _d(naive_mlp)
    _op(d, "mm")["ex_unit"] = "sfp"      # a matmul runs on the PT array
    assert codes(d) == {"op_decl_mismatch"}
    d = _d(naive_mlp)
    _op(d, "relu")["opfunc"] = "exp"
    assert codes(d) == {"op_decl_mismatch"}
