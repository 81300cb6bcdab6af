"""Elementwise aten ops -> one `pointwise` PrimOp each (broadcast through Access maps,
Python scalars and constant fills folded into the expression as Const)."""
from __future__ import annotations

import math
from typing import Callable, Optional, Sequence, Union

from lowering.aten.context import Ctx, NodeArgs, Scalar, View, expr_fn, register
from lowering.aten.dtypes import float_result, is_float, result_type
from target.primitives import Access, Const, Expr, In, PointwiseBody

Operand = Union[View, Scalar]


def as_operand(node: NodeArgs, x) -> Operand:
    if isinstance(x, View):
        return x
    if isinstance(x, bool):
        return Scalar(float(x), "bool")
    if isinstance(x, int):
        return Scalar(float(x), "int")
    if isinstance(x, float):
        return Scalar(x, "float")
    raise node.fail("bad_argument", f"expected a tensor or number operand, got {x!r}")


def broadcast_shapes(node: NodeArgs, shapes: Sequence[Sequence[int]]) -> tuple[int, ...]:
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        for j, size in enumerate(s):
            d = rank - len(s) + j
            if size == out[d] or size == 1:
                continue
            if out[d] == 1:
                out[d] = size
            else:
                raise node.fail("shape_mismatch", f"shapes {list(shapes)} do not broadcast")
    return tuple(out)


def emit_pointwise(ctx: Ctx, node: NodeArgs, operands: Sequence[Operand],
                   build: Callable[[list[Expr]], Expr], out_dtype: str,
                   out_shape: Optional[Sequence[int]] = None, out_id: Optional[str] = None) -> View:
    """out = build(operand exprs) elementwise over the broadcast shape of the operands."""
    views = [o for o in operands if isinstance(o, View)]
    shape = tuple(out_shape) if out_shape is not None else broadcast_shapes(node, [v.shape for v in views])
    iters, index = ctx.iter_dims_for(shape)
    accesses: list[Access] = []
    exprs: list[Expr] = []
    for o in operands:
        c = ctx.const_value(o)
        if c is not None and (isinstance(o, Scalar) or len(o.shape) <= len(shape)):
            exprs.append(Const(c))
            continue
        first = len(shape) - o.rank
        iter_of = [index[first + j] if o.shape[j] > 1 else None for j in range(o.rank)]
        acc = ctx.access(o, iter_of, node.id)
        if acc in accesses:
            exprs.append(In(accesses.index(acc)))
        else:
            exprs.append(In(len(accesses)))
            accesses.append(acc)
    tid = ctx.new_tensor(out_id or node.id, shape, out_dtype)
    ctx.emit(tid, iters, accesses, Access(tid, tuple(index)), PointwiseBody(build(exprs)), node.id)
    return ctx.tensor_view(tid, out_id or node.id)


def _alpha(node: NodeArgs, e: Expr, alpha) -> Expr:
    if alpha is None or alpha == 1:
        return e
    return expr_fn("mul", e, Const(float(alpha)))


# -- table-driven simple ops ------------------------------------------------------------
# unary float functions: result is float (ints promote to float32)
_UNARY_FLOAT = {
    "exp": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt", "tanh": "tanh", "erf": "erf",
    "sigmoid": "sigmoid", "sin": "sin", "cos": "cos", "reciprocal": "reciprocal", "silu": "silu",
}
# the same, added with the core ATen sweep (own doc row)
_UNARY_FLOAT_MORE = ("erfc", "log1p", "expm1", "log2", "log10", "tan", "atan", "asin", "acos", "sinh", "cosh", "asinh",
                     "acosh", "atanh")
# roundings: identities on integer tensors (torch keeps the dtype and the values)
_ROUNDINGS = ("floor", "ceil", "trunc", "round")
# unary ops keeping the input dtype
_UNARY_SAME = {"neg": "neg", "abs": "abs", "relu": "relu"}
_COMPARE = {"eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge"}
_BINARY_SAME = {"mul": "mul", "maximum": "maximum", "minimum": "minimum", "remainder": "remainder",
                "bitwise_and": "bitwise_and", "bitwise_or": "bitwise_or"}


def _unary(fn: str, float_out: bool):
    def lower(ctx: Ctx, node: NodeArgs):
        x = as_operand(node, node.arg(0, "self"))
        dt = float_result(x.dtype) if float_out else x.dtype
        return [emit_pointwise(ctx, node, [x], lambda e: expr_fn(fn, e[0]), dt)]
    return lower


def _compare(fn: str):
    def lower(ctx: Ctx, node: NodeArgs):
        a, b = (as_operand(node, node.arg(i, n)) for i, n in ((0, "self"), (1, "other")))
        return [emit_pointwise(ctx, node, [a, b], lambda e: expr_fn(fn, e[0], e[1]), "bool")]
    return lower


def _binary(fn: str):
    def lower(ctx: Ctx, node: NodeArgs):
        a, b = (as_operand(node, node.arg(i, n)) for i, n in ((0, "self"), (1, "other")))
        return [emit_pointwise(ctx, node, [a, b], lambda e: expr_fn(fn, e[0], e[1]), result_type([a, b]))]
    return lower


for _name, _fn in _UNARY_FLOAT.items():
    register(f"aten.{_name}.default", doc="same-named fn (ints give float32)")(_unary(_fn, True))
for _name in _UNARY_FLOAT_MORE:
    register(f"aten.{_name}.default", doc="same-named fn, float32 compute (ints give float32)")(_unary(_name, True))
for _name, _fn in _UNARY_SAME.items():
    register(f"aten.{_name}.default", doc="same-named fn (dtype kept)")(_unary(_fn, False))
for _name, _fn in _COMPARE.items():
    register(f"aten.{_name}.Tensor", f"aten.{_name}.Scalar", doc="comparison, bool result")(_compare(_fn))
for _name, _fn in _BINARY_SAME.items():
    targets = [f"aten.{_name}.Tensor"] if _name not in ("maximum", "minimum") else [f"aten.{_name}.default"]
    if _name in ("mul", "remainder", "bitwise_and", "bitwise_or"):
        targets.append(f"aten.{_name}.Scalar")
    register(*targets, doc="same-named fn (torch's type promotion)")(_binary(_fn))


def _rounding(fn: str):
    def lower(ctx: Ctx, node: NodeArgs):
        x = as_operand(node, node.arg(0, "self"))
        if not is_float(x.dtype):   # an integer is its own floor: alias, no op
            return [x.with_(x.shape, x.strides, name=node.id)]
        return [emit_pointwise(ctx, node, [x], lambda e: expr_fn(fn, e[0]), x.dtype)]
    return lower


for _name in _ROUNDINGS:
    register(f"aten.{_name}.default",
             doc="same-named fn (round: half to even); integer tensors alias (no op)")(_rounding(_name))


@register("aten.sign.default",
          doc="`sign` (dtype kept; sign(NaN) = 0 as torch)")
def _sign(ctx: Ctx, node: NodeArgs):
    x = as_operand(node, node.arg(0, "self"))
    if x.dtype == "bool":
        return [x.with_(x.shape, x.strides, name=node.id)]
    return [emit_pointwise(ctx, node, [x], lambda e: expr_fn("sign", e[0]), x.dtype)]


@register("aten.fmod.Tensor", "aten.fmod.Scalar",
          doc="`fmod` (C fmod: the result takes the dividend's sign; torch's type promotion)")
def _fmod(ctx: Ctx, node: NodeArgs):
    a, b = as_operand(node, node.arg(0, "self")), as_operand(node, node.arg(1, "other"))
    return [emit_pointwise(ctx, node, [a, b], lambda e: expr_fn("fmod", e[0], e[1]), result_type([a, b]))]


@register("aten.bitwise_xor.Tensor", "aten.bitwise_xor.Scalar",
          doc="`bitwise_xor` on integer and bool tensors (`ne` on bools)")
def _bitwise_xor(ctx: Ctx, node: NodeArgs):
    a, b = as_operand(node, node.arg(0, "self")), as_operand(node, node.arg(1, "other"))
    rt = result_type([a, b])
    if is_float(rt):
        raise node.fail("bad_argument", f"bitwise_xor of {rt}")
    fn = "ne" if rt == "bool" else "bitwise_xor"
    return [emit_pointwise(ctx, node, [a, b], lambda e: expr_fn(fn, e[0], e[1]), rt)]


@register("aten.__lshift__.Tensor", "aten.__lshift__.Scalar", "aten.bitwise_left_shift.Tensor",
          "aten.bitwise_left_shift.Tensor_Scalar", "aten.bitwise_left_shift.Scalar_Tensor",
          "aten.__rshift__.Tensor", "aten.__rshift__.Scalar", "aten.bitwise_right_shift.Tensor",
          "aten.bitwise_right_shift.Tensor_Scalar", "aten.bitwise_right_shift.Scalar_Tensor",
          doc="`shift_left` / `shift_right` (arithmetic) on integer tensors, computed in int64 and stored to the dtype")
def _shift(ctx: Ctx, node: NodeArgs):
    fn = "shift_left" if "lshift" in node.target or "left" in node.target else "shift_right"
    a, b = as_operand(node, node.arg(0, "self")), as_operand(node, node.arg(1, "other"))
    rt = result_type([a, b])
    if is_float(rt) or rt == "bool":
        raise node.fail("bad_argument", f"bit shift of {rt}")
    return [emit_pointwise(ctx, node, [a, b], lambda e: expr_fn(fn, e[0], e[1]), rt)]


@register("aten.logical_xor.default",
          doc="`ne(a != 0, b != 0)`, bool result")
def _logical_xor(ctx: Ctx, node: NodeArgs):
    a, b = as_operand(node, node.arg(0, "self")), as_operand(node, node.arg(1, "other"))
    truth = lambda v: expr_fn("ne", v, Const(0.0))  # noqa: E731
    return [emit_pointwise(ctx, node, [a, b], lambda e: expr_fn("ne", truth(e[0]), truth(e[1])), "bool")]


@register("aten.atan2.default",
          doc="`atan2(self, other)` (ints give float32)")
def _atan2(ctx: Ctx, node: NodeArgs):
    a, b = as_operand(node, node.arg(0, "self")), as_operand(node, node.arg(1, "other"))
    return [emit_pointwise(ctx, node, [a, b], lambda e: expr_fn("atan2", e[0], e[1]),
                           float_result(result_type([a, b])))]


@register("aten.addcmul.default", "aten.addcdiv.default",
          doc="`add(self, mul(value, mul(t1, t2)))` / `…div(t1, t2)…` (torch's type promotion)")
def _addcmul(ctx: Ctx, node: NodeArgs):
    ops = [as_operand(node, node.arg(i, n)) for i, n in ((0, "self"), (1, "tensor1"), (2, "tensor2"))]
    value = node.kwargs.get("value", node.args[3] if len(node.args) > 3 else 1)
    fn = "mul" if node.target == "aten.addcmul.default" else "div"
    rt = result_type(ops)
    if fn == "div" and not is_float(rt):
        raise node.fail("bad_argument", "addcdiv of integer tensors")
    return [emit_pointwise(ctx, node, ops, lambda e: expr_fn("add", e[0], _alpha(node, expr_fn(fn, e[1], e[2]), value)),
                           rt)]


@register("aten.hypot.default",
          doc="`sqrt(a·a + b·b)`")
def _hypot(ctx: Ctx, node: NodeArgs):
    a, b = as_operand(node, node.arg(0, "self")), as_operand(node, node.arg(1, "other"))
    return [emit_pointwise(ctx, node, [a, b], lambda e: expr_fn("sqrt", expr_fn(
        "add", expr_fn("mul", e[0], e[0]), expr_fn("mul", e[1], e[1]))), result_type([a, b]))]


@register("aten.exp2.default",
          doc="`pow(2, x)` (ints give float32)")
def _exp2(ctx: Ctx, node: NodeArgs):
    x = as_operand(node, node.arg(0, "self"))
    return [emit_pointwise(ctx, node, [x], lambda e: expr_fn("pow", Const(2.0), e[0]), float_result(x.dtype))]


def _negative(e: Expr) -> Expr:
    """The sign bit: x < 0, or x a negative zero (1/x = -inf)."""
    return expr_fn("logical_or", expr_fn("lt", e, Const(0.0)),
                   expr_fn("logical_and", expr_fn("eq", e, Const(0.0)), expr_fn("lt", expr_fn("reciprocal", e),
                                                                                Const(0.0))))


@register("aten.signbit.default",
          doc="`x < 0 or (x == 0 and 1/x < 0)` (negative zero counts), bool result")
def _signbit(ctx: Ctx, node: NodeArgs):
    x = as_operand(node, node.arg(0, "self"))
    if not is_float(x.dtype):
        return [emit_pointwise(ctx, node, [x], lambda e: expr_fn("lt", e[0], Const(0.0)), "bool")]
    return [emit_pointwise(ctx, node, [x], lambda e: _negative(e[0]), "bool")]


@register("aten.copysign.Tensor", "aten.copysign.Scalar",
          doc="`where(signbit(other), -abs(self), abs(self))` (a negative zero counts as negative; ints give float32)")
def _copysign(ctx: Ctx, node: NodeArgs):
    a, b = as_operand(node, node.arg(0, "self")), as_operand(node, node.arg(1, "other"))
    return [emit_pointwise(ctx, node, [a, b], lambda e: expr_fn("where", _negative(e[1]), expr_fn(
        "neg", expr_fn("abs", e[0])), expr_fn("abs", e[0])), float_result(result_type([a, b])))]


@register("aten.logical_and.default", "aten.logical_or.default",
          doc="`logical_and` / `logical_or`, bool result")
def _logical(ctx: Ctx, node: NodeArgs):
    fn = "logical_and" if "logical_and" in node.target else "logical_or"
    a, b = as_operand(node, node.arg(0, "self")), as_operand(node, node.arg(1, "other"))
    return [emit_pointwise(ctx, node, [a, b], lambda e: expr_fn(fn, e[0], e[1]), "bool")]


@register("aten.logical_not.default", "aten.bitwise_not.default",
          doc="`logical_not`, bool result (bitwise_not on bool tensors only)")
def _logical_not(ctx: Ctx, node: NodeArgs):
    x = as_operand(node, node.arg(0, "self"))
    if node.target == "aten.bitwise_not.default" and x.dtype != "bool":
        raise node.fail("unsupported_op", "bitwise_not is supported on bool tensors only")
    return [emit_pointwise(ctx, node, [x], lambda e: expr_fn("logical_not", e[0]), "bool")]


@register("aten.add.Tensor", "aten.add.Scalar", "aten.sub.Tensor", "aten.sub.Scalar",
          doc="`add(a, mul(b, alpha))`, `sub(…)`")
def _add_sub(ctx: Ctx, node: NodeArgs):
    fn = "add" if node.target.startswith("aten.add") else "sub"
    a, b = as_operand(node, node.arg(0, "self")), as_operand(node, node.arg(1, "other"))
    alpha = node.arg(2, "alpha", 1)
    return [emit_pointwise(ctx, node, [a, b], lambda e: expr_fn(fn, e[0], _alpha(node, e[1], alpha)),
                           result_type([a, b]))]


@register("aten.rsub.Scalar", "aten.rsub.Tensor",
          doc="`sub(b, mul(a, alpha))`")
def _rsub(ctx: Ctx, node: NodeArgs):
    a, b = as_operand(node, node.arg(0, "self")), as_operand(node, node.arg(1, "other"))
    alpha = node.arg(2, "alpha", 1)
    return [emit_pointwise(ctx, node, [a, b], lambda e: expr_fn("sub", e[1], _alpha(node, e[0], alpha)),
                           result_type([a, b]))]


@register("aten.div.Tensor", "aten.div.Scalar", "aten.div.Tensor_mode", "aten.div.Scalar_mode",
          doc=("`div` (true division, ints give float32); rounding_mode floor: `floordiv`; trunc: `trunc(div)` (on ints"
               " `div` stored to the int dtype)"))
def _div(ctx: Ctx, node: NodeArgs):
    a, b = as_operand(node, node.arg(0, "self")), as_operand(node, node.arg(1, "other"))
    mode = node.arg(2, "rounding_mode") if node.target.endswith("_mode") else None
    rt = result_type([a, b])
    if mode is None:
        return [emit_pointwise(ctx, node, [a, b], lambda e: expr_fn("div", e[0], e[1]), float_result(rt))]
    if mode == "floor":
        return [emit_pointwise(ctx, node, [a, b], lambda e: expr_fn("floordiv", e[0], e[1]), rt)]
    if mode == "trunc" and not is_float(rt):
        # trunc division of ints: the result's cast back to an int dtype truncates
        return [emit_pointwise(ctx, node, [a, b], lambda e: expr_fn("div", e[0], e[1]), rt)]
    if mode == "trunc":
        return [emit_pointwise(ctx, node, [a, b], lambda e: expr_fn("trunc", expr_fn("div", e[0], e[1])), rt)]
    raise node.fail("unsupported_op", f"div rounding_mode={mode!r} on {rt}")


@register("aten.floor_divide.default", "aten.floor_divide.Scalar",
          doc="`floordiv`")
def _floor_divide(ctx: Ctx, node: NodeArgs):
    a, b = as_operand(node, node.arg(0, "self")), as_operand(node, node.arg(1, "other"))
    return [emit_pointwise(ctx, node, [a, b], lambda e: expr_fn("floordiv", e[0], e[1]), result_type([a, b]))]


@register("aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor", "aten.pow.Scalar",
          doc="`pow`")
def _pow(ctx: Ctx, node: NodeArgs):
    a, b = as_operand(node, node.arg(0, "self")), as_operand(node, node.arg(1, "exponent"))
    return [emit_pointwise(ctx, node, [a, b], lambda e: expr_fn("pow", e[0], e[1]), result_type([a, b]))]


@register("aten.gelu.default",
          doc="`gelu` / `gelu_tanh` (kept fused, Spyre has it)")
def _gelu(ctx: Ctx, node: NodeArgs):
    x = as_operand(node, node.arg(0, "self"))
    approx = node.arg(1, "approximate", "none")
    fn = {"none": "gelu", "tanh": "gelu_tanh"}.get(approx)
    if fn is None:
        raise node.fail("unsupported_op", f"gelu approximate={approx!r}")
    return [emit_pointwise(ctx, node, [x], lambda e: expr_fn(fn, e[0]), float_result(x.dtype))]


@register("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther", "aten.where.Scalar",
          doc="`where`")
def _where(ctx: Ctx, node: NodeArgs):
    c, a, b = (as_operand(node, node.arg(i, n)) for i, n in ((0, "condition"), (1, "self"), (2, "other")))
    return [emit_pointwise(ctx, node, [c, a, b], lambda e: expr_fn("where", e[0], e[1], e[2]),
                           result_type([a, b]))]


@register("aten.masked_fill.Scalar", "aten.masked_fill.Tensor",
          doc="`where(mask, value, x)`")
def _masked_fill(ctx: Ctx, node: NodeArgs):
    x, mask, value = (as_operand(node, node.arg(i, n)) for i, n in ((0, "self"), (1, "mask"), (2, "value")))
    return [emit_pointwise(ctx, node, [mask, value, x], lambda e: expr_fn("where", e[0], e[1], e[2]),
                           x.dtype, out_shape=x.shape)]


@register("aten.clamp.default", "aten.clamp_min.default", "aten.clamp_max.default", "aten.hardtanh.default",
          "aten.clamp.Tensor", "aten.clamp_min.Tensor", "aten.clamp_max.Tensor",
          doc="`minimum(maximum(x, min), max)`; tensor bounds broadcast with x like a binary op")
def _clamp(ctx: Ctx, node: NodeArgs):
    x = as_operand(node, node.arg(0, "self"))
    kind = node.target.split(".")[1]
    if kind == "clamp_min":
        lo, hi = node.arg(1, "min"), None
    elif kind == "clamp_max":
        lo, hi = None, node.arg(1, "max")
    elif kind == "hardtanh":
        lo, hi = node.arg(1, "min_val", -1.0), node.arg(2, "max_val", 1.0)
    else:
        lo, hi = node.arg(1, "min"), node.arg(2, "max")
    ops: list[Operand] = [x]
    if lo is not None:
        ops.append(as_operand(node, lo))
    if hi is not None:
        ops.append(as_operand(node, hi))
    if len(ops) == 1:
        raise node.fail("bad_argument", f"{node.target} without min or max")

    def build(e: list[Expr]) -> Expr:
        out, k = e[0], 1
        if lo is not None:
            out, k = expr_fn("maximum", out, e[k]), k + 1
        if hi is not None:
            out = expr_fn("minimum", out, e[k])
        return out
    # Tensor bounds broadcast with self like a binary op (scalar bounds keep self's shape).
    shape = None if node.target.endswith(".Tensor") else x.shape
    return [emit_pointwise(ctx, node, ops, build, result_type(ops), out_shape=shape)]


@register("aten.isinf.default", "aten.isnan.default")
def _isinf_isnan(ctx: Ctx, node: NodeArgs):
    """isinf = `eq(abs(x), inf)`, isnan = `ne(x, x)`; bool result, always false on ints."""
    x = as_operand(node, node.arg(0, "self"))
    if node.target == "aten.isnan.default" or not is_float(x.dtype):
        build = lambda e: expr_fn("ne", e[0], e[0])  # noqa: E731  (x != x: NaN only, never for ints)
    else:
        build = lambda e: expr_fn("eq", expr_fn("abs", e[0]), Const(math.inf))  # noqa: E731
    return [emit_pointwise(ctx, node, [x], build, "bool", out_shape=x.shape)]


# -- casts and identities ----------------------------------------------------------------
def _cast(ctx: Ctx, node: NodeArgs, x: View, dtype: Optional[str]) -> list:
    if dtype is None or dtype == x.dtype:
        # A functional graph never observes identity, so a same-dtype cast or clone is
        # the value itself; a consumer that needs it materialized gets a copy.
        return [x.with_(x.shape, x.strides, name=node.id)]
    return [emit_pointwise(ctx, node, [x], lambda e: e[0], dtype)]


@register("prims.convert_element_type.default",
          doc="identity expression into the new dtype (same dtype: alias, no op)")
def _convert_element_type(ctx: Ctx, node: NodeArgs):
    return _cast(ctx, node, node.arg(0, "a"), node.arg(1, "dtype"))


@register("aten._to_copy.default", "aten.to.dtype",
          doc="identity expression into the new dtype (same dtype: alias, no op)")
def _to_copy(ctx: Ctx, node: NodeArgs):
    dtype = node.arg(1, "dtype") if node.target == "aten.to.dtype" else node.kwargs.get("dtype")
    return _cast(ctx, node, node.arg(0, "self"), dtype)


@register("aten.clone.default", "aten.alias.default", "aten.detach.default", "aten.lift_fresh_copy.default",
          "aten.contiguous.default",
          doc="alias (no op; a consumer that needs it materialized gets a `copy`)")
def _identity(ctx: Ctx, node: NodeArgs):
    return _cast(ctx, node, node.arg(0, "self"), None)


@register("aten.copy.default",
          doc="identity expression into self's shape and dtype (functional copy)")
def _copy(ctx: Ctx, node: NodeArgs):
    # functional copy: the result has self's shape and dtype and src's values
    dst, src = node.arg(0, "self"), as_operand(node, node.arg(1, "src"))
    return [emit_pointwise(ctx, node, [src], lambda e: e[0], dst.dtype, out_shape=dst.shape)]
