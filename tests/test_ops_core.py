"""The core ATen opset sweep: every op added to reach Inductor's post-decomposition opset
(docs/ops.md, "Core ATen coverage"), one generated test each against torch eager in float32
and float16 (integer ops in int64). Inputs are drawn inside each op's domain; the shared
tolerance is tests/lowering_helpers.TOLERANCE."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lowering import lower_document
from target.interpreter import interpret
from tests.lowering_helpers import DocBuilder

FLOATS = [torch.float32, torch.float16]
IDS = ["fp32", "fp16"]
SHAPE = (5, 12)


def _rand(seed, lo, hi, shape=SHAPE):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g) * (hi - lo) + lo


def _special(x: torch.Tensor, values) -> torch.Tensor:
    """x with its first elements replaced by edge values (exact ties, zeros, infinities)."""
    flat = x.clone().reshape(-1)
    flat[:len(values)] = torch.tensor(values, dtype=flat.dtype)
    return flat.reshape(x.shape)


# op -> input range (a unary float op's domain)
UNARY_FLOAT = {
    "log1p": (-0.9, 3.0), "expm1": (-3.0, 3.0), "log2": (0.01, 40.0), "log10": (0.01, 40.0),
    "tan": (-1.4, 1.4), "atan": (-6.0, 6.0), "asin": (-0.99, 0.99), "acos": (-0.99, 0.99), "sinh": (-4.0, 4.0),
    "cosh": (-4.0, 4.0), "asinh": (-20.0, 20.0), "acosh": (1.0, 20.0), "atanh": (-0.95, 0.95),
    "erfc": (-4.0, 9.0),
}


@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
@pytest.mark.parametrize("op", sorted(UNARY_FLOAT))
def test_unary_float_ops(op, dtype):
    lo, hi = UNARY_FLOAT[op]
    x = _rand(len(op), lo, hi).to(dtype)
    b = DocBuilder()
    b.check(b.call(f"aten.{op}.default", b.input(x)))


@pytest.mark.parametrize("op", sorted(UNARY_FLOAT))
def test_unary_float_ops_of_integers_give_float32(op):
    lo, hi = UNARY_FLOAT[op]
    x = torch.arange(math.ceil(lo), math.floor(hi) + 1)   # the integers in the domain
    b = DocBuilder()
    out = b.call(f"aten.{op}.default", b.input(x))
    assert out.value.dtype == torch.float32
    b.check(out)


@pytest.mark.parametrize("op,x", [("log1p", [1e-7, -3e-8, 2.5e-6, 1e-10, -1e-5]),
                                  ("expm1", [1e-7, -3e-8, 2.5e-6, 1e-10, -1e-5]),
                                  ("erfc", [2.5, 4.0, 6.0, 8.5, 9.0])])
def test_functions_keep_relative_precision_where_naive_forms_cancel(op, x):
    """log1p and expm1 exist for |x| << 1, where log(1 + x) and exp(x) - 1 lose every
    digit; erfc for large x, where 1 - erf(x) does: the lowering must not be such a
    decomposition."""
    x = torch.tensor(x)
    b = DocBuilder()
    out = b.call(f"aten.{op}.default", b.input(x))
    got = interpret(lower_document(b.document(out)), b.values)[0]
    want = out.value.numpy()
    assert np.max(np.abs(got / want - 1)) < 1e-6


@pytest.mark.parametrize("dtype", FLOATS + [torch.int64], ids=IDS + ["int64"])
@pytest.mark.parametrize("op", ["floor", "ceil", "trunc", "round", "sign"])
def test_roundings_and_sign(op, dtype):
    x = _special(_rand(3, -6.0, 6.0), [0.5, 1.5, 2.5, -0.5, -2.5, 0.0, -0.0, 3.0, -7.0])
    if op == "sign" and dtype.is_floating_point:
        x = _special(x, [float("nan"), 0.0, -0.0, float("inf"), -float("inf")])
    x = (x * 3).to(dtype) if not dtype.is_floating_point else x.to(dtype)
    b = DocBuilder()
    out = b.call(f"aten.{op}.default", b.input(x))
    b.check(out)
    got = interpret(lower_document(b.document(out)), b.values)[0]
    np.testing.assert_array_equal(got, out.value.numpy())   # exact: no rounding error is allowed here


@pytest.mark.parametrize("dtype", FLOATS + [torch.int64], ids=IDS + ["int64"])
@pytest.mark.parametrize("form", ["Tensor", "Scalar"])
def test_fmod(dtype, form):
    a = (_rand(5, -9.0, 9.0) * (1 if dtype.is_floating_point else 3)).to(dtype)
    b_ = _rand(6, 0.5, 4.0) * torch.where(_rand(7, 0, 1) < 0.5, -1.0, 1.0)
    if not dtype.is_floating_point:
        b_ = b_.round().clamp(min=1) * b_.sign()
    b_ = b_.to(dtype)
    b = DocBuilder()
    other = b.input(b_) if form == "Tensor" else (-2.5 if dtype.is_floating_point else -3)
    out = b.call(f"aten.fmod.{form}", b.input(a), other)
    b.check(out)
    if dtype == torch.float32:   # fmod is exact in floating point
        got = interpret(lower_document(b.document(out)), b.values)[0]
        np.testing.assert_array_equal(got, out.value.numpy())


@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
def test_atan2(dtype):
    y = _special(_rand(8, -3.0, 3.0), [0.0, 0.0, -0.0, 1.0, -1.0]).to(dtype)
    x = _special(_rand(9, -3.0, 3.0), [0.0, -1.0, -1.0, 0.0, 0.0]).to(dtype)
    b = DocBuilder()
    b.check(b.call("aten.atan2.default", b.input(y), b.input(x)))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool], ids=["int64", "int32", "bool"])
@pytest.mark.parametrize("form", ["Tensor", "Scalar"])
def test_bitwise_xor(dtype, form):
    g = torch.Generator().manual_seed(3)
    a = torch.randint(-50, 50, SHAPE, generator=g).to(dtype)
    other = torch.randint(-50, 50, SHAPE, generator=g).to(dtype)
    b = DocBuilder()
    arg = b.input(other) if form == "Tensor" else (True if dtype == torch.bool else 13)
    b.check(b.call(f"aten.bitwise_xor.{form}", b.input(a), arg))


@pytest.mark.parametrize("dtype", FLOATS + [torch.bool], ids=IDS + ["bool"])
def test_logical_xor(dtype):
    a = torch.where(_rand(1, 0, 1) < 0.5, 0.0, _rand(2, -2, 2)).to(dtype)
    c = torch.where(_rand(3, 0, 1) < 0.5, 0.0, _rand(4, -2, 2)).to(dtype)
    b = DocBuilder()
    b.check(b.call("aten.logical_xor.default", b.input(a), b.input(c)))


@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
def test_div_trunc_of_floats(dtype):
    a, c = _rand(1, -9, 9).to(dtype), _rand(2, 0.3, 3).to(dtype)
    b = DocBuilder()
    b.check(b.call("aten.div.Tensor_mode", b.input(a), b.input(c), rounding_mode="trunc"))


class _HeldOut(torch.nn.Module):
    """softplus (mamba2 hybrids: log1p after Inductor's decomposition) and fmod, the two ops
    that kept held-out models off the device."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x):
        h = torch.nn.functional.softplus(self.proj(x))
        return torch.fmod(h * 7.0, 1.5) + torch.log1p(h)


@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
def test_softplus_and_fmod_compile_strict(dtype):
    from tests.lowering_helpers import assert_close, to_numpy

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _HeldOut().eval().to(dtype)
    x = torch.randn(4, 16).to(dtype)
    with torch.no_grad():
        want = model(x)
        got = torch.compile(model, backend="sticksat", dynamic=False,
                            options={"planner": "heuristic", "strict": True})(x)
    assert_close(to_numpy(got), to_numpy(want), dtype, "softplus/fmod")


# -- reductions -----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS + [torch.int64], ids=IDS + ["int64"])
@pytest.mark.parametrize("op", ["argmax", "argmin"])
@pytest.mark.parametrize("dim,keepdim", [(1, False), (0, True), (-1, True), (None, False), (None, True)])
def test_arg_reductions(op, dtype, dim, keepdim):
    # few distinct values: ties everywhere (torch returns the first)
    x = (_rand(11, -3, 3) * 2).round().to(dtype)
    b = DocBuilder()
    b.check(b.call(f"aten.{op}.default", b.input(x), dim, keepdim))


def test_arg_reductions_nan_is_the_extreme():
    x = _special(_rand(12, -3, 3), [1.0, float("nan"), 5.0])
    x[3, 4] = float("nan")
    b = DocBuilder()
    xi = b.input(x)
    b.check(b.call("aten.argmax.default", xi, 1), b.call("aten.argmin.default", xi, 1),
            b.call("aten.argmax.default", xi))


@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
@pytest.mark.parametrize("op", ["max", "min"])
def test_max_min_dim_indices(op, dtype):
    x = (_rand(13, -3, 3, (3, 7, 4)) * 2).round().to(dtype)
    b = DocBuilder()
    vals, idx = b.call(f"aten.{op}.dim", b.input(x), 1, False)
    kv, ki = b.call(f"aten.{op}.dim", b.input(x), 2, True)
    b.check(vals, idx, kv, ki)


# -- views and scatters ---------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
@pytest.mark.parametrize("offset,d1,d2", [(0, 0, 1), (2, 0, 1), (-1, 1, 0), (1, 0, 2), (0, -1, 0)])
def test_diagonal(dtype, offset, d1, d2):
    x = _rand(14, -2, 2, (4, 6, 5)).to(dtype)
    b = DocBuilder()
    d = b.call("aten.diagonal.default", b.input(x), offset, d1, d2)
    b.check(b.call("aten.mul.Tensor", d, 2.0))


@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
@pytest.mark.parametrize("dim,start,end,step", [(1, 2, 7, 1), (0, None, 2, 1), (1, -4, None, 1), (1, 1, 9, 3),
                                                (0, 0, 5, 2), (1, 0, 12, 5)])
def test_slice_scatter(dtype, dim, start, end, step):
    x = _rand(15, -2, 2, (5, 12)).to(dtype)
    sl = x.narrow(0, 0, 5)[(slice(None),) * dim + (slice(start, end, step),)]
    src = _rand(16, 5, 9, tuple(sl.shape)).to(dtype)
    b = DocBuilder()
    b.check(b.call("aten.slice_scatter.default", b.input(x), b.input(src), dim, start, end, step))


@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
@pytest.mark.parametrize("dim,index", [(0, 2), (1, -1), (2, 0)])
def test_select_scatter(dtype, dim, index):
    x = _rand(17, -2, 2, (3, 4, 5)).to(dtype)
    shape = [s for j, s in enumerate(x.shape) if j != dim]
    b = DocBuilder()
    b.check(b.call("aten.select_scatter.default", b.input(x), b.input(_rand(18, 5, 9, shape).to(dtype)), dim, index))


@pytest.mark.parametrize("dtype", FLOATS + [torch.int64], ids=IDS + ["int64"])
@pytest.mark.parametrize("reduce", ["sum", "prod", "amax", "amin", "mean"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(dtype, reduce, include_self):
    if reduce == "mean" and not dtype.is_floating_point:
        pytest.skip("integer mean is unsupported (docs/ops.md)")
    g = torch.Generator().manual_seed(19)
    x = (_rand(20, 0.5, 2.0, (6, 5)) * (1 if dtype.is_floating_point else 3)).to(dtype)
    idx = torch.randint(0, 6, (4, 5), generator=g)   # some rows of x are never hit
    src = (_rand(21, 0.5, 2.0, (4, 5)) * (1 if dtype.is_floating_point else 3)).to(dtype)
    b = DocBuilder()
    b.check(b.call("aten.scatter_reduce.two", b.input(x), 0, b.input(idx), b.input(src), reduce,
                   include_self=include_self))


def test_empty_strided_is_a_fill_consumers_overwrite():
    b = DocBuilder()
    e = b.call("aten.empty_strided.default", [3, 4], [1, 3], dtype=torch.float32)
    b.check(b.call("aten.add.Tensor", b.call("aten.mul.Tensor", e, 0.0), 1.5))


# -- pooling and upsampling -----------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
@pytest.mark.parametrize("size,scale", [((4, 6), None), ((8, 9), None), ((5, 7), None), (None, (2.0, 3.0)),
                                        (None, (1.5, 0.5)), (None, (2.7, 1.3))])
def test_upsample_nearest2d(dtype, size, scale):
    x = _rand(22, -2, 2, (2, 3, 4, 6)).to(dtype)
    b = DocBuilder()
    b.check(b.call("aten.upsample_nearest2d.vec", b.input(x), list(size) if size else None,
                   list(scale) if scale else None))


@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
@pytest.mark.parametrize("kernel,stride,padding", [([2, 2, 2], [2, 2, 2], [0, 0, 0]), ([3, 2, 3], [1, 2, 2], [1, 0, 1])])
def test_avg_pool3d(dtype, kernel, stride, padding):
    """torch has no float16 avg_pool3d on the CPU: the float16 program is checked against
    eager float32 on the same (float16-rounded) values, at float16 tolerance."""
    x = _rand(23, -2, 2, (2, 3, 6, 6, 7)).to(dtype).float()
    b = DocBuilder()
    out = b.call("aten.avg_pool3d.default", b.input(x), kernel, stride, padding)
    if dtype == torch.float16:
        _as_float16(b)
    b.check(out, dtype=dtype)


def _as_float16(b: DocBuilder) -> None:
    """Re-declare a float32 document's tensors (and input values) as float16."""
    for inp in b.inputs:
        if inp["meta"]["dtype"] == "float32":
            inp["meta"]["dtype"] = "float16"
            b.values[inp["id"]] = b.values[inp["id"]].astype(np.float16)
    for node in b.nodes:
        for meta in node["outputs"]:
            if meta["dtype"] == "float32":
                meta["dtype"] = "float16"


@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
def test_adaptive_avg_pool3d(dtype):
    x = _rand(24, -2, 2, (2, 3, 6, 4, 8)).to(dtype)
    b = DocBuilder()
    b.check(b.call("aten._adaptive_avg_pool3d.default", b.input(x), [3, 2, 2]))


# -- distances ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32], ids=["fp32"])
@pytest.mark.parametrize("p", [2.0, 1.0, 0.0, 3.0, float("inf"), 0.5])
@pytest.mark.parametrize("s1,s2", [((5, 7), (6, 7)), ((2, 4, 3), (2, 30, 3)), ((3, 1, 5, 4), (2, 6, 4))])
def test_cdist(dtype, p, s1, s2):
    """torch's cdist has no float16 CPU kernel; float16 is checked below against float32."""
    x1, x2 = _rand(30, -2, 2, s1).to(dtype), _rand(31, -2, 2, s2).to(dtype)
    if p == 0.0:   # p = 0 counts differing coordinates: make some equal
        x2 = x2.clone()
        x2[..., 0] = x1.reshape(-1, x1.shape[-1])[0, 0]
    b = DocBuilder()
    b.check(b.call("aten._cdist_forward.default", b.input(x1), b.input(x2), p, None))


@pytest.mark.parametrize("p", [2.0, 1.0])
def test_cdist_float16_against_float32(p):
    x1, x2 = _rand(32, -2, 2, (6, 8)).half().float(), _rand(33, -2, 2, (9, 8)).half().float()
    b = DocBuilder()
    out = b.call("aten._cdist_forward.default", b.input(x1), b.input(x2), p, None)
    _as_float16(b)
    b.check(out, dtype=torch.float16)


@pytest.mark.parametrize("p", [2.0, 1.0, 0.0, 3.0, float("inf")])
@pytest.mark.parametrize("n", [2, 5, 9])
def test_pdist(p, n):
    x = _rand(34 + n, -2, 2, (n, 6))
    b = DocBuilder()
    b.check(b.call("aten._pdist_forward.default", b.input(x), p))


def test_pdist_float16_against_float32():
    x = _rand(40, -2, 2, (7, 5)).half().float()
    b = DocBuilder()
    out = b.call("aten._pdist_forward.default", b.input(x), 2.0)
    _as_float16(b)
    b.check(out, dtype=torch.float16)


# -- embedding_bag --------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
@pytest.mark.parametrize("mode", [0, 1, 2], ids=["sum", "mean", "max"])
@pytest.mark.parametrize("include_last,padding_idx", [(False, -1), (True, -1), (False, 2), (True, 4)])
def test_embedding_bag(dtype, mode, include_last, padding_idx):
    if dtype == torch.float16 and mode == 2:
        pytest.skip("torch's CPU embedding_bag max has no float16 kernel")
    weight = _rand(50, -2, 2, (10, 6)).to(dtype)
    idx = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 0, 2])
    offsets = torch.tensor([0, 4, 4, 7] + ([10] if include_last else []))   # bag 1 is empty
    b = DocBuilder()
    out = b.call("aten._embedding_bag.default", b.input(weight, kind="parameter"), b.input(idx), b.input(offsets),
                 False, mode, False, None, include_last, padding_idx)
    b.check(out[0])


@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
def test_embedding_bag_per_sample_weights(dtype):
    weight = _rand(51, -2, 2, (8, 5)).to(dtype)
    idx = torch.tensor([1, 2, 4, 5, 7, 3])
    psw = _rand(52, 0, 2, (6,)).to(dtype)
    b = DocBuilder()
    out = b.call("aten._embedding_bag.default", b.input(weight, kind="parameter"), b.input(idx),
                 b.input(torch.tensor([0, 2, 5])), False, 0, False, b.input(psw), False, -1)
    b.check(out[0])


# -- what Inductor's decompositions of other core ops leave -----------------------------------
class _Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


F = torch.nn.functional
DECOMPOSED = {
    # _unsafe_index.Tensor (index arithmetic Inductor builds for pads and interpolation)
    "reflection_pad1d": (lambda x: F.pad(x, (2, 1), mode="reflect"), (2, 4, 9)),
    "reflection_pad2d": (lambda x: F.pad(x, (2, 1, 1, 2), mode="reflect"), (2, 4, 6, 6)),
    "replication_pad3d": (lambda x: F.pad(x, (1, 1, 2, 0, 1, 1), mode="replicate"), (1, 2, 4, 4, 4)),
    "upsample_bilinear2d": (lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"), (2, 4, 6, 6)),
    "upsample_bilinear2d_align": (lambda x: F.interpolate(x, size=(5, 7), mode="bilinear", align_corners=True),
                                  (2, 4, 6, 6)),
    # prims.rev
    "flip": (lambda x: torch.flip(x, [1, 3]) * 2, (2, 4, 6, 6)),
    # prims._low_memory_max_pool_with_offsets with a 3-D kernel
    "max_pool3d": (lambda x: F.max_pool3d(x, 2), (1, 2, 4, 6, 4)),
    "max_pool3d_strided": (lambda x: F.max_pool3d(x, (3, 2, 2), stride=(2, 1, 2), padding=(1, 0, 1)), (1, 2, 5, 6, 4)),
    "unfold": (lambda x: x.unfold(-1, 3, 2) + 1, (2, 4, 9)),
    "glu": (lambda x: F.glu(x, 1), (2, 4, 6)),
    "addcmul": (lambda x: torch.addcmul(x, x, x + 1, value=0.5), (2, 4, 6)),
    "addcdiv": (lambda x: torch.addcdiv(x, x, x.abs() + 1, value=-2), (2, 4, 6)),
    "hypot": (lambda x: torch.hypot(x, x + 1), (2, 4, 6)),
    "exp2": (lambda x: torch.exp2(x), (2, 4, 6)),
    "copysign": (lambda x: torch.copysign(x, -x + 0.5), (2, 4, 6)),
}


@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
@pytest.mark.parametrize("case", sorted(DECOMPOSED))
def test_ops_inductor_decompositions_leave(case, dtype):
    from tests.lowering_helpers import assert_close, capture_with_values, eager_outputs

    fn, shape = DECOMPOSED[case]
    x = _rand(60, -2, 2, shape).to(dtype)
    model = _Fn(fn)
    try:
        want = eager_outputs(model, (x,))
    except (RuntimeError, NotImplementedError):
        if dtype != torch.float16:
            raise
        pytest.skip("no float16 CPU kernel in torch")
    doc, values = capture_with_values(model, (x,))
    got = interpret(lower_document(doc), values)
    for g, w in zip(got, want):
        assert_close(g, w, dtype, case)


def test_copysign_negative_zero():
    b = DocBuilder()
    x = torch.tensor([1.0, 2.0, 3.0, -4.0])
    b.check(b.call("aten.copysign.Tensor", b.input(x), b.input(torch.tensor([-0.0, 0.0, -1.0, 5.0]))))


@pytest.mark.parametrize("right", [False, True])
@pytest.mark.parametrize("out_int32", [False, True])
def test_bucketize(right, out_int32):
    x = _special(_rand(61, -3, 3), [-1.0, 0.0, 1.0, float("nan"), -5.0, 5.0])
    bounds = torch.tensor([-1.0, 0.0, 0.5, 1.0])
    b = DocBuilder()
    b.check(b.call("aten.bucketize.Tensor", b.input(x), b.input(bounds), out_int32=out_int32, right=right))


@pytest.mark.parametrize("planner", ["naive", "heuristic", "cpsat"])
def test_every_planner_runs_the_new_ops(planner):
    """A graph mixing the sweep's new bodies (negative-stride flip copy, multi-index
    gathers of a reflection pad and a bilinear upsample, log1p/fmod/atan2, argmax, a
    scatter_add, uneven adaptive pooling's matmuls): every planner's program validates and
    runs to the interpreter's numbers."""
    from simulator.api import compare
    from simulator.run import run_program
    from solver.planners import plan
    from target.hardware import load_target
    from tests.lowering_helpers import capture_with_values

    class Mix(torch.nn.Module):
        def forward(self, x):
            y = F.pad(torch.flip(x, [3]), (2, 1, 1, 2), mode="reflect")
            y = F.interpolate(y, scale_factor=2, mode="bilinear")
            z = torch.log1p(y.abs()) + torch.fmod(y * 3, 1.25) + torch.atan2(y, y + 2)
            idx = z.argmax(dim=-1, keepdim=True)
            return z, torch.zeros(2, 4, 18, 1).scatter_add(3, idx % 1, z[..., :1]), F.adaptive_avg_pool2d(z, (5, 7))

    x = _rand(70, -2, 2, (2, 4, 6, 6)).half().float()
    doc, values = capture_with_values(Mix(), (x,))
    pg = lower_document(doc)
    ref = interpret(pg, values)
    hw = load_target()
    prog = plan(pg, hw, planner=planner, fallback=False, time_limit_s=30)   # validated inside
    assert prog.stats.planner == planner
    assert compare(run_program(prog, values, hw), ref)[1] < 1e-5


@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
@pytest.mark.parametrize("mask_shape", [(3, 4, 6), (4, 1), (6,)])
def test_masked_scatter(dtype, mask_shape):
    """llava's image-feature merge: embeddings.masked_scatter(image_token_mask, features)."""
    x = _rand(80, -2, 2, (3, 4, 6)).to(dtype)
    mask = _rand(81, 0, 1, mask_shape) < 0.4
    full = mask.expand(3, 4, 6)
    source = _rand(82, 5, 9, (int(full.sum()) + 3,)).to(dtype)
    b = DocBuilder()
    b.check(b.call("aten.masked_scatter.default", b.input(x), b.input(mask), b.input(source)))


# -- index_put generalized, and small ones the second sweep found ------------------------------
@pytest.mark.parametrize("dtype", FLOATS + [torch.int64], ids=IDS + ["int64"])
@pytest.mark.parametrize("dim", [0, 1, 2])
@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_on_any_dim(dtype, dim, accumulate):
    x = (_rand(90, -2, 2, (5, 6, 4)) * 3).to(dtype)
    # duplicates only with accumulate (torch leaves the winner of duplicates unspecified)
    n = x.shape[dim]
    idx = torch.tensor([n - 1, 0, -1, 1, 0]) if accumulate else torch.tensor([n - 1, 0, -2])   # negatives wrap
    vshape = list(x.shape)
    vshape[dim] = idx.shape[0]
    vals = (_rand(91, 5, 9, tuple(vshape)) * 2).to(dtype)
    indices = [None] * dim + [idx]
    b = DocBuilder()
    b.check(b.call("aten.index_put.default", b.input(x), [b.input(idx) if t is not None else None for t in indices],
                   b.input(vals), accumulate))


@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
def test_index_add_and_index_fill_through_capture(dtype):
    from tests.lowering_helpers import assert_close, capture_with_values, eager_outputs

    idx = torch.tensor([0, 2, 2, 3])

    class M(torch.nn.Module):
        def forward(self, x):
            return x.index_add(0, idx, torch.ones(4, 6, dtype=x.dtype)), x.index_fill(1, torch.tensor([0, 4]), -1.0)
    x = _rand(92, -2, 2, (4, 6)).to(dtype)
    doc, values = capture_with_values(M(), (x,))
    got = interpret(lower_document(doc), values)
    for g, w in zip(got, eager_outputs(M(), (x,))):
        assert_close(g, w, dtype, "index_add / index_fill")


@pytest.mark.parametrize("dtype", FLOATS + [torch.int64], ids=IDS + ["int64"])
def test_max_min_of_everything_and_signbit(dtype):
    x = _special(_rand(93, -3, 3), [-0.0, 0.0]).to(dtype) if dtype.is_floating_point else \
        (_rand(93, -3, 3) * 5).to(dtype)
    b = DocBuilder()
    xi = b.input(x)
    b.check(b.call("aten.max.default", xi), b.call("aten.min.default", xi), b.call("aten.signbit.default", xi))


@pytest.mark.parametrize("right", [False, True])
@pytest.mark.parametrize("seq_shape", [(5,), (5, 7)])
def test_searchsorted(right, seq_shape):
    seq = torch.sort(_rand(94, -2, 2, seq_shape), dim=-1).values
    x = _special(_rand(95, -3, 3, (5, 4)), [float(seq.reshape(-1)[1]), float("nan")])
    b = DocBuilder()
    b.check(b.call("aten.searchsorted.Tensor", b.input(seq), b.input(x), right=right))


@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
@pytest.mark.parametrize("shape,out", [((2, 3, 7, 10), [3, 4]), ((3, 6, 9), [4, 9]), ((1, 2, 5, 7, 6), [2, 3, 4])])
def test_adaptive_avg_pool_uneven_windows(dtype, shape, out):
    x = _rand(96, -2, 2, shape).to(dtype)
    b = DocBuilder()
    target = "aten._adaptive_avg_pool3d.default" if len(out) == 3 else "aten._adaptive_avg_pool2d.default"
    if len(out) == 3 and dtype == torch.float16:
        x = x.float()
        o = b.call(target, b.input(x), out)
        _as_float16(b)
        b.check(o, dtype=dtype)
        return
    pg = b.check(b.call(target, b.input(x), out))
    assert any(op.kind == "matmul" for op in pg.ops)


@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
@pytest.mark.parametrize("kernel,stride,padding,ceil_mode,include_pad,override", [
    ([3, 3], [2, 2], [1, 1], False, False, None),
    ([3, 2], [2, 2], [1, 0], True, True, None),
    ([3, 3], [2, 3], [1, 1], True, False, None),
    ([2, 2], [2, 2], [0, 0], True, True, None),
    ([3, 3], [2, 2], [1, 1], True, False, 5),
])
def test_avg_pool2d_partial_windows(dtype, kernel, stride, padding, ceil_mode, include_pad, override):
    x = _rand(97, -2, 2, (2, 3, 7, 9)).to(dtype)
    b = DocBuilder()
    b.check(b.call("aten.avg_pool2d.default", b.input(x), kernel, stride, padding, ceil_mode, include_pad, override))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.uint8], ids=["int64", "int32", "int8",
                                                                                                "uint8"])
@pytest.mark.parametrize("target", ["aten.__lshift__.Tensor", "aten.__rshift__.Tensor", "aten.__lshift__.Scalar",
                                    "aten.__rshift__.Scalar", "aten.bitwise_left_shift.Tensor",
                                    "aten.bitwise_right_shift.Tensor"])
def test_bit_shifts(dtype, target):
    """int4 unpacking ((w >> 4) & 15) and packing; the stored dtype wraps as torch."""
    g = torch.Generator().manual_seed(5)
    lo = 0 if dtype == torch.uint8 else -100
    a = torch.randint(lo, 100, (4, 8), generator=g).to(dtype)
    amount = torch.randint(0, 9, (4, 8), generator=g).to(dtype)
    b = DocBuilder()
    other = 3 if target.endswith("Scalar") else b.input(amount)
    b.check(b.call(target, b.input(a), other))


@pytest.mark.parametrize("dtype", FLOATS + [torch.int64], ids=IDS + ["int64"])
@pytest.mark.parametrize("k,dim,keepdim", [(1, 1, False), (3, -1, True), (5, 0, False)])
def test_kthvalue(dtype, k, dim, keepdim):
    # distinct values per row: torch's index for ties is unspecified
    x = torch.rand(5, 12, generator=torch.Generator().manual_seed(k)).argsort(dim=dim).to(dtype) - 4
    b = DocBuilder()
    b.check(*b.call("aten.kthvalue.default", b.input(x), k, dim, keepdim))


@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
@pytest.mark.parametrize("n", [7, 8])
def test_median(dtype, n):
    x = torch.rand(4, n, generator=torch.Generator().manual_seed(n)).argsort(dim=-1).to(dtype) * 0.5
    x[2, 3] = float("nan")
    x[2, 5] = float("nan")
    b = DocBuilder()
    xi = b.input(x)
    vals, idx = b.call("aten.median.dim", xi, 1, False)
    b.check(vals, idx, b.call("aten.median.default", b.input(x[[0, 1, 3]].contiguous())))
