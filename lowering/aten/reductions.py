"""Reductions -> `reduce` PrimOps (sum/max/min/prod folds, cumsum scans).

mean folds its 1/N scale into the reduced expression (sum of x/N, one op, no rounded
intermediate sum); var_mean is a mean op then a sum of squared deviations."""
from __future__ import annotations

from typing import Optional, Sequence

from lowering.aten.context import Ctx, NodeArgs, View, expr_fn, numel, register
from lowering.aten.dtypes import float_result, is_float
from lowering.aten.views import norm_dim
from target.primitives import Access, Const, Expr, In, IterDim, ReduceBody


def reduce_dims(node: NodeArgs, x: View, dims) -> list[int]:
    if dims is None or (isinstance(dims, list) and not dims):
        return list(range(x.rank))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({norm_dim(node, d, x.rank) for d in dims})


def emit_reduce(ctx: Ctx, node: NodeArgs, x: View, dims: Sequence[int], keepdim: bool, fn: str,
                build: Optional[callable], out_dtype: str, out_id: str,
                extra: Sequence[View] = ()) -> View:
    """out = fold fn over `dims` of build(In(0)=x, In(1..)=extra); each extra operand has
    x's shape with size 1 on `dims` (broadcast along the reduction)."""
    red = set(dims)
    iters: list[IterDim] = []
    x_iter: list[Optional[int]] = []
    for j, s in enumerate(x.shape):
        if s == 1:
            x_iter.append(None)
            continue
        x_iter.append(len(iters))
        iters.append(IterDim(f"{'r' if j in red else 'd'}{j}", s, "reduction" if j in red else "parallel"))
    out_shape = [1 if j in red else s for j, s in enumerate(x.shape)] if keepdim else \
        [s for j, s in enumerate(x.shape) if j not in red]
    out_iter = [None if j in red else x_iter[j] for j in range(x.rank)] if keepdim else \
        [x_iter[j] for j in range(x.rank) if j not in red]
    accesses = [ctx.access(x, x_iter, node.id)]
    kept_shape = [1 if j in red else s for j, s in enumerate(x.shape)]
    kept_iter = [None if j in red else x_iter[j] for j in range(x.rank)]
    for e in extra:
        if tuple(e.shape) != tuple(kept_shape):
            raise node.fail("shape_mismatch", f"reduction operand {list(e.shape)} vs {kept_shape}")
        accesses.append(ctx.access(e, kept_iter, node.id))
    tid = ctx.new_tensor(out_id, out_shape, out_dtype)
    expr = build([In(i) for i in range(len(accesses))]) if build else In(0)
    ctx.emit(tid, iters, accesses, Access(tid, tuple(out_iter)), ReduceBody(fn, expr), node.id)
    return ctx.tensor_view(tid, out_id)


def _count(x: View, dims: Sequence[int]) -> int:
    return numel([x.shape[d] for d in dims])


def emit_mean(ctx: Ctx, node: NodeArgs, x: View, dims, keepdim, out_dtype, out_id) -> View:
    n = _count(x, dims)
    scale = 1.0 / n if n else float("nan")
    return emit_reduce(ctx, node, x, dims, keepdim, "sum", lambda e: expr_fn("mul", e[0], Const(scale)),
                       out_dtype, out_id)


def _reduction_args(node: NodeArgs, whole: bool, single_dim: bool = False):
    """(dims, keepdim, dtype) of sum/prod/mean: the `.default` overloads reduce every dim
    and take (self, dtype); the dim overloads take (self, dim, keepdim, dtype)."""
    if whole:
        return None, False, node.arg(1, "dtype")
    dims = node.arg(1, "dim")
    return ([dims] if single_dim else dims), node.arg(2, "keepdim", False), node.arg(3, "dtype")


@register("aten.sum.dim_IntList", "aten.sum.default",
          doc="`reduce sum` over the reduction dims; ints and bools sum to int64")
def _sum(ctx: Ctx, node: NodeArgs):
    x: View = node.arg(0, "self")
    dims, keepdim, dtype = _reduction_args(node, node.target == "aten.sum.default")
    if dtype is None:
        dtype = x.dtype if is_float(x.dtype) else "int64"
    return [emit_reduce(ctx, node, x, reduce_dims(node, x, dims), keepdim, "sum", None, dtype, node.id)]


@register("aten.prod.dim_int", "aten.prod.default",
          doc="`reduce prod`")
def _prod(ctx: Ctx, node: NodeArgs):
    x: View = node.arg(0, "self")
    dims, keepdim, dtype = _reduction_args(node, node.target == "aten.prod.default", single_dim=True)
    if dtype is None:
        dtype = x.dtype if is_float(x.dtype) else "int64"
    return [emit_reduce(ctx, node, x, reduce_dims(node, x, dims), keepdim, "prod", None, dtype, node.id)]


@register("aten.mean.dim", "aten.mean.default",
          doc="one `reduce sum` of `x * (1/N)` (no rounded intermediate sum)")
def _mean(ctx: Ctx, node: NodeArgs):
    x: View = node.arg(0, "self")
    dims, keepdim, dtype = _reduction_args(node, node.target == "aten.mean.default")
    dtype = dtype or x.dtype
    if not is_float(dtype):
        raise node.fail("dtype_mismatch", f"mean of {dtype}")
    return [emit_mean(ctx, node, x, reduce_dims(node, x, dims), keepdim, dtype, node.id)]


@register("aten.amax.default", "aten.amin.default",
          doc="`reduce max` / `reduce min`")
def _amax(ctx: Ctx, node: NodeArgs):
    x: View = node.arg(0, "self")
    fn = "max" if "amax" in node.target else "min"
    dims = reduce_dims(node, x, node.arg(1, "dim", []))
    return [emit_reduce(ctx, node, x, dims, node.arg(2, "keepdim", False), fn, None, x.dtype, node.id)]


def _correction(node: NodeArgs) -> float:
    c = node.kwargs.get("correction")
    return 1.0 if c is None else float(c)


def emit_var(ctx: Ctx, node: NodeArgs, x: View, dims, keepdim: bool, correction: float, mean: View,
             out_dtype: str, out_id: str) -> View:
    """var = sum((x - mean)^2) / (N - correction), mean broadcast along the reduced dims."""
    denom = _count(x, dims) - correction
    scale = 1.0 / denom if denom > 0 else float("nan")
    mean_k = mean
    if not keepdim:
        # give mean the kept size-1 dims so one access rule serves both forms
        shape, strides, k = [], [], 0
        for j in range(x.rank):
            if j in dims:
                shape.append(1)
                strides.append(1)
            else:
                shape.append(mean.shape[k])
                strides.append(mean.strides[k])
                k += 1
        mean_k = mean.with_(shape, strides)

    def build(e: list[Expr]) -> Expr:
        dev = expr_fn("sub", e[0], e[1])
        return expr_fn("mul", expr_fn("mul", dev, dev), Const(scale))
    return emit_reduce(ctx, node, x, dims, keepdim, "sum", build, out_dtype, out_id, extra=[mean_k])


@register("aten.var_mean.correction", "aten.var.correction",
          doc="mean (as mean.dim), then `reduce sum` of `(x-mean)² * 1/(N-correction)`")
def _var_mean(ctx: Ctx, node: NodeArgs):
    x: View = node.arg(0, "self")
    dims = reduce_dims(node, x, node.arg(1, "dim"))
    keepdim = bool(node.kwargs.get("keepdim", False))
    dtype = float_result(x.dtype)
    is_pair = node.target == "aten.var_mean.correction"
    mean = emit_mean(ctx, node, x, dims, keepdim, dtype, f"{node.id}:1" if is_pair else f"{node.id}.mean")
    var = emit_var(ctx, node, x, dims, keepdim, _correction(node), mean, dtype, node.id)
    return [var, mean] if is_pair else [var]


@register("aten.cumsum.default",
          doc="`reduce cumsum`: a scan along its one reduction dim, which the output keeps")
def _cumsum(ctx: Ctx, node: NodeArgs):
    x: View = node.arg(0, "self")
    d = norm_dim(node, node.arg(1, "dim"), x.rank)
    dtype = node.arg(2, "dtype") or (x.dtype if is_float(x.dtype) else "int64")
    iters: list[IterDim] = []
    index: list[Optional[int]] = []
    for j, s in enumerate(x.shape):
        if s == 1:
            index.append(None)
            continue
        index.append(len(iters))
        iters.append(IterDim(f"{'r' if j == d else 'd'}{j}", s, "reduction" if j == d else "parallel"))
    acc = ctx.access(x, index, node.id)
    tid = ctx.new_tensor(node.id, x.shape, dtype)
    ctx.emit(tid, iters, [acc], Access(tid, tuple(index)), ReduceBody("cumsum", In(0)), node.id)
    return [ctx.tensor_view(tid, node.id)]


def emit_softmax(ctx: Ctx, node: NodeArgs, x: View, dim: int, out_dtype: str,
                 out_id: str) -> tuple[View, View, View]:
    """softmax as torch-spyre runs it: amax, sub, exp, sum, div (one op each).
    Returns (softmax, amax, sum) — amax and sum keep the reduced dim."""
    from lowering.aten.pointwise import emit_pointwise

    mx = emit_reduce(ctx, node, x, [dim], True, "max", None, x.dtype, f"{out_id}.amax")
    sub = emit_pointwise(ctx, node, [x, mx], lambda e: expr_fn("sub", e[0], e[1]), x.dtype, out_id=f"{out_id}.sub")
    ex = emit_pointwise(ctx, node, [sub], lambda e: expr_fn("exp", e[0]), x.dtype, out_id=f"{out_id}.exp")
    sm = emit_reduce(ctx, node, ex, [dim], True, "sum", None, x.dtype, f"{out_id}.sum")
    out = emit_pointwise(ctx, node, [ex, sm], lambda e: expr_fn("div", e[0], e[1]), out_dtype, out_id=out_id)
    return out, mx, sm


@register("aten._softmax.default", "aten.softmax.int",
          doc="amax, sub, exp, sum, div (5 ops, as torch-spyre runs softmax)")
def _softmax(ctx: Ctx, node: NodeArgs):
    x: View = node.arg(0, "self")
    d = norm_dim(node, node.arg(1, "dim"), x.rank)
    if node.target == "aten._softmax.default":
        dtype = "float32" if node.arg(2, "half_to_float", False) else x.dtype
    else:
        dtype = node.arg(2, "dtype") or x.dtype
    return [emit_softmax(ctx, node, x, d, dtype, node.id)[0]]


@register("aten.any.dim", "aten.any.dims", "aten.any.default", "aten.all.dim", "aten.all.dims", "aten.all.default")
def _any_all(ctx: Ctx, node: NodeArgs):
    """any = max of the truth values, all = min (bool result; uint8 input stays uint8)."""
    x: View = node.arg(0, "self")
    fn = "max" if node.target.startswith("aten.any") else "min"
    if node.target.endswith(".default"):
        dims, keepdim = None, False
    else:
        dims, keepdim = node.arg(1, "dim"), node.arg(2, "keepdim", False)
    out_dtype = "uint8" if x.dtype == "uint8" else "bool"
    return [emit_reduce(ctx, node, x, reduce_dims(node, x, dims), keepdim, fn,
                        lambda e: expr_fn("ne", e[0], Const(0.0)), out_dtype, node.id)]


@register("aten.max.dim", "aten.min.dim",
          doc="`reduce max` / `reduce min` values; reading the indices output is unsupported_op")
def _max_dim(ctx: Ctx, node: NodeArgs):
    """Values only; the indices output exists only as an error if something reads it."""
    from lowering.aten.conv import Unavailable

    x: View = node.arg(0, "self")
    fn = "max" if node.target == "aten.max.dim" else "min"
    d = norm_dim(node, node.arg(1, "dim"), x.rank)
    values = emit_reduce(ctx, node, x, [d], node.arg(2, "keepdim", False), fn, None, x.dtype, node.id)
    return [values, Unavailable(f"{node.target} indices are not computed (arg-reductions are unsupported)")]
