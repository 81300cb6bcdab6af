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


@pytest.mark.parametrize("op", ["log1p", "expm1"])
def test_log1p_expm1_keep_relative_precision_near_zero(op):
    """Both exist for |x| << 1, where log(1 + x) and exp(x) - 1 lose every digit: the
    lowering must not be such a decomposition."""
    x = torch.tensor([1e-7, -3e-8, 2.5e-6, 1e-10, -1e-5])
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
