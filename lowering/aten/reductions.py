"""Reductions -> `reduce` PrimOps (sum/max/min/prod folds, cumsum scans).

mean folds its 1/N scale into the reduced expression (sum of x/N, one op, no rounded
intermediate sum); var_mean is a mean op then a sum of squared deviations."""
from __future__ import annotations

import math
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
    x's shape with size 1 on `dims` (broadcast along the reduction) or x's shape."""
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
        if tuple(e.shape) == tuple(kept_shape):
            accesses.append(ctx.access(e, kept_iter, node.id))
        elif tuple(e.shape) == tuple(x.shape):
            accesses.append(ctx.access(e, x_iter, node.id))
        else:
            raise node.fail("shape_mismatch", f"reduction operand {list(e.shape)} vs {kept_shape}")
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


def emit_arg_index(ctx: Ctx, node: NodeArgs, x: View, d: int, best: View, keepdim: bool, out_id: str) -> View:
    """The first position along d holding `best` (x's max or min along d, kept dim):
    `reduce min` of `where(x == best, position, n)`, NaN equal to NaN (torch's arg-reductions
    return the first NaN, which a max or min over a row with NaN is)."""
    from lowering.aten.indexing import int_iota

    n = x.shape[d]
    iota = int_iota(ctx, node, n, "positions")
    pos = iota.with_(x.shape, tuple(iota.strides[0] if j == d else 0 for j in range(x.rank)))

    def first(e):
        same = expr_fn("logical_or", expr_fn("eq", e[0], e[1]),
                       expr_fn("logical_and", expr_fn("ne", e[0], e[0]), expr_fn("ne", e[1], e[1])))
        return expr_fn("where", same, e[2], Const(float(n)))
    return emit_reduce(ctx, node, x, [d], keepdim, "min", first, "int64", out_id, extra=[best, pos])


@register("aten.max.dim", "aten.min.dim",
          doc=("`reduce max` / `reduce min` values; indices: `reduce min` of the positions holding the value (the"
               " first, NaN included, as torch)"))
def _max_dim(ctx: Ctx, node: NodeArgs):
    x: View = node.arg(0, "self")
    fn = "max" if node.target == "aten.max.dim" else "min"
    d = norm_dim(node, node.arg(1, "dim"), x.rank)
    keepdim = node.arg(2, "keepdim", False)
    if x.rank == 0:
        raise node.fail("unsupported_op", f"{node.target} of a 0-d tensor")
    values = emit_reduce(ctx, node, x, [d], keepdim, fn, None, x.dtype, node.id)
    best = values if keepdim else values.with_(values.shape[:d] + (1,) + values.shape[d:],
                                               values.strides[:d] + (0,) + values.strides[d:])
    return [values, emit_arg_index(ctx, node, x, d, best, keepdim, f"{node.id}:1")]


@register("aten.argmax.default", "aten.argmin.default",
          doc=("`reduce max` / `reduce min`, then `reduce min` of the positions holding it (the first; NaN counts as"
               " the extreme, as torch); dim=None flattens"))
def _argmax(ctx: Ctx, node: NodeArgs):
    from lowering.aten.views import reshape

    x: View = node.arg(0, "self")
    fn = "max" if node.target == "aten.argmax.default" else "min"
    dim, keepdim = node.arg(1, "dim"), node.arg(2, "keepdim", False)
    if dim is None:
        flat = reshape(ctx, node, x, (numel(x.shape),), f"{node.id}.flat") if x.rank != 1 else x
        best = emit_reduce(ctx, node, flat, [0], True, fn, None, x.dtype, f"{node.id}.best")
        idx = emit_arg_index(ctx, node, flat, 0, best, True, node.id)
        shape = (1,) * x.rank if keepdim else ()
        return [idx.with_(shape, (0,) * len(shape), name=node.id)]
    if x.rank == 0:
        raise node.fail("unsupported_op", f"{node.target} of a 0-d tensor")
    d = norm_dim(node, dim, x.rank)
    best = emit_reduce(ctx, node, x, [d], True, fn, None, x.dtype, f"{node.id}.best")
    return [emit_arg_index(ctx, node, x, d, best, keepdim, node.id)]


def _distance(ctx: Ctx, node: NodeArgs, a: View, b: View, a_dims, b_dims, out_shape, p: float,
              out_id: str) -> View:
    """The p-norm distance over the last (feature) dim of a and b: `reduce` over [*out, M]
    of |a - b|^p (p = 0: count of nonzero differences, inf: max), then the 1/p root.
    `a_dims`/`b_dims` name, per non-feature dim of a and b, the output dim that walks it."""
    from lowering.aten.pointwise import emit_pointwise

    M = a.shape[-1]
    iters, it = ctx.iter_dims_for(tuple(out_shape) + (M,), kinds=["parallel"] * len(out_shape) + ["reduction"])
    acc = [ctx.access(a, [it[d] for d in a_dims] + [it[-1]], node.id),
           ctx.access(b, [it[d] for d in b_dims] + [it[-1]], node.id)]
    diff = expr_fn("abs", expr_fn("sub", In(0), In(1)))
    if p == 0:
        fn, term = "sum", expr_fn("ne", diff, Const(0.0))
    elif math.isinf(p):
        fn, term = "max", diff
    elif p == 1:
        fn, term = "sum", diff
    elif p == 2:
        fn, term = "sum", expr_fn("mul", diff, diff)
    else:
        fn, term = "sum", expr_fn("pow", diff, Const(float(p)))
    dtype = a.dtype
    folded = ctx.new_tensor(f"{out_id}.folded" if p not in (0, 1) and not math.isinf(p) else out_id, out_shape, dtype)
    ctx.emit(folded, iters, acc, Access(folded, tuple(it[:-1])), ReduceBody(fn, term), node.id)
    v = ctx.tensor_view(folded)
    if p in (0, 1) or math.isinf(p):
        return v
    root = (lambda e: expr_fn("sqrt", e[0])) if p == 2 else (lambda e: expr_fn("pow", e[0], Const(1.0 / p)))
    return emit_pointwise(ctx, node, [v], root, dtype, out_id=out_id)


@register("aten._cdist_forward.default",
          doc=("`reduce` over [batch…, P, R, M] of `|x1 - x2|^p` (p = 0: nonzero count, inf: max), then the 1/p root"
               " (`sqrt` for p = 2); computed directly, not through torch's matmul expansion"))
def _cdist(ctx: Ctx, node: NodeArgs):
    x1, x2 = node.arg(0, "x1"), node.arg(1, "x2")
    p = float(node.arg(2, "p"))
    if x1.rank < 2 or x2.rank < 2 or x1.shape[-1] != x2.shape[-1] or p < 0:
        raise node.fail("shape_mismatch", f"cdist of {list(x1.shape)} and {list(x2.shape)} (p={p})")
    out_shape = tuple(node.out_shapes[0])
    nb = len(out_shape) - 2

    def dims(v: View, row: int) -> list[int]:   # v's batch dims right-aligned to the output's, then its rows
        lead = v.rank - 2
        return [nb - lead + j for j in range(lead)] + [row]
    for v in (x1, x2):   # a size-1 batch dim broadcasts
        for j, d in enumerate(dims(v, 0)[:-1]):
            if v.shape[j] != out_shape[d] and v.shape[j] != 1:
                raise node.fail("shape_mismatch", f"cdist batch dims {list(x1.shape)} {list(x2.shape)}")
    return [_distance(ctx, node, _bcast(x1, out_shape, nb), _bcast(x2, out_shape, nb), dims(x1, nb), dims(x2, nb + 1),
                      out_shape, p, node.id)]


def _bcast(v: View, out_shape, nb: int) -> View:
    """v with its size-1 batch dims expanded to the output's (stride 0)."""
    lead = v.rank - 2
    shape, strides = list(v.shape), list(v.strides)
    for j in range(lead):
        if shape[j] == 1:
            shape[j], strides[j] = out_shape[nb - lead + j], 0
    return v.with_(tuple(shape), tuple(strides))


@register("aten._pdist_forward.default",
          doc=("pair (i, j), i < j, of each output position k in torch's row-major order from integer iota arithmetic"
               " (`reduce sum` of `start(r) <= k`), `gather` of both rows, then the p-norm `reduce` as cdist"))
def _pdist(ctx: Ctx, node: NodeArgs):
    from lowering.aten.indexing import emit_gather, int_iota
    from lowering.aten.pointwise import emit_pointwise

    x: View = node.arg(0, "self")
    p = float(node.arg(1, "p", 2.0))
    if x.rank != 2 or p < 0:
        raise node.fail("shape_mismatch", f"pdist of {list(x.shape)} (p={p})")
    N, M = x.shape
    K = N * (N - 1) // 2
    if K == 0:
        raise node.fail("unsupported_op", "pdist of fewer than two rows (an empty result)")
    k = int_iota(ctx, node, K, "pairs")
    r = int_iota(ctx, node, N, "rows")
    # row r's first pair: start(r) = r*N - r*(r+1)/2 (exact integer arithmetic)
    start_of = lambda e: expr_fn("sub", expr_fn("mul", e, Const(float(N))),  # noqa: E731
                                 expr_fn("floordiv", expr_fn("mul", e, expr_fn("add", e, Const(1.0))), Const(2.0)))
    iters, it = ctx.iter_dims_for((K, N), kinds=("parallel", "reduction"))
    acc = [ctx.access(k, [it[0]], node.id), ctx.access(r, [it[1]], node.id)]
    first_t = ctx.new_tensor(f"{node.id}.first", (K,), "int64")
    # i(k) = #{r >= 1 : start(r) <= k}
    ctx.emit(first_t, iters, acc, Access(first_t, (it[0],)), ReduceBody("sum", expr_fn(
        "logical_and", expr_fn("ge", In(1), Const(1.0)), expr_fn("le", start_of(In(1)), In(0)))), node.id)
    first = ctx.tensor_view(first_t)
    second = emit_pointwise(ctx, node, [k, first], lambda e: expr_fn("add", expr_fn(
        "sub", e[0], start_of(e[1])), expr_fn("add", e[1], Const(1.0))), "int64", out_id=f"{node.id}.second")
    rows_i = emit_gather(ctx, node, x, (K, M), [None, 1], [(0, first, 0)], f"{node.id}.rows_i")
    rows_j = emit_gather(ctx, node, x, (K, M), [None, 1], [(0, second, 0)], f"{node.id}.rows_j")
    return [_distance(ctx, node, rows_i, rows_j, [0], [0], (K,), p, node.id)]


@register("aten.glu.default",
          doc="the two halves along dim as strided views, one pointwise `a * sigmoid(b)`")
def _glu(ctx: Ctx, node: NodeArgs):
    from lowering.aten.pointwise import emit_pointwise
    from lowering.aten.views import slice_view

    x: View = node.arg(0, "self")
    d = norm_dim(node, node.arg(1, "dim", -1), x.rank)
    n = x.shape[d]
    if n % 2:
        raise node.fail("bad_argument", f"glu of an odd dim ({n})")
    a, b = slice_view(node, x, d, 0, n // 2, 1, f"{node.id}.a"), slice_view(node, x, d, n // 2, n, 1, f"{node.id}.b")
    return [emit_pointwise(ctx, node, [a, b], lambda e: expr_fn("mul", e[0], expr_fn("sigmoid", e[1])), x.dtype)]


@register("aten.bucketize.Tensor",
          doc=("`reduce sum` over the boundaries of `boundary < x` (right: `<=`); NaN past the last boundary, as"
               " torch"))
def _bucketize(ctx: Ctx, node: NodeArgs):
    x: View = node.arg(0, "self")
    bounds: View = node.arg(1, "boundaries")
    out_dtype = "int32" if node.arg(2, "out_int32", False) else "int64"
    right = bool(node.arg(3, "right", False))
    if bounds.rank != 1:
        raise node.fail("unsupported_op", "bucketize with other than 1-D boundaries")
    nb = bounds.shape[0]
    iters, it = ctx.iter_dims_for(tuple(x.shape) + (nb,), kinds=["parallel"] * x.rank + ["reduction"],
                                  keep=(x.rank,))
    acc = [ctx.access(x, it[:-1], node.id), ctx.access(bounds, [it[-1]], node.id)]
    below = expr_fn("le" if right else "lt", In(1), In(0))
    term = expr_fn("logical_or", below, expr_fn("ne", In(0), In(0)))
    tid = ctx.new_tensor(node.id, x.shape, out_dtype)
    ctx.emit(tid, iters, acc, Access(tid, tuple(it[:-1])), ReduceBody("sum", term), node.id)
    return [ctx.tensor_view(tid, node.id)]


@register("aten.max.default", "aten.min.default",
          doc="`reduce max` / `reduce min` over every dim (a 0-d result)")
def _max_all(ctx: Ctx, node: NodeArgs):
    x: View = node.arg(0, "self")
    fn = "max" if node.target == "aten.max.default" else "min"
    return [emit_reduce(ctx, node, x, list(range(x.rank)), False, fn, None, x.dtype, node.id)]


@register("aten.searchsorted.Tensor",
          doc=("`reduce sum` over the sorted sequence's last dim of `boundary < value` (right or side='right': `<=`);"
               " N-D sequences per leading row; NaN past the end, as torch"))
def _searchsorted(ctx: Ctx, node: NodeArgs):
    seq: View = node.arg(0, "sorted_sequence")
    x: View = node.arg(1, "self")
    out_dtype = "int32" if node.arg(2, "out_int32", False) else "int64"
    right = bool(node.arg(3, "right", False)) or node.kwargs.get("side") == "right"
    if node.kwargs.get("sorter") is not None:
        raise node.fail("unsupported_op", "searchsorted with a sorter")
    nb = seq.shape[-1] if seq.rank else 1
    if seq.rank > 1 and (x.rank != seq.rank or x.shape[:-1] != seq.shape[:-1]):
        raise node.fail("shape_mismatch", f"searchsorted of {list(x.shape)} in {list(seq.shape)}")
    iters, it = ctx.iter_dims_for(tuple(x.shape) + (nb,), kinds=["parallel"] * x.rank + ["reduction"],
                                  keep=(x.rank,))
    seq_it = [it[-1]] if seq.rank == 1 else list(it[:x.rank - 1]) + [it[-1]]
    acc = [ctx.access(x, it[:-1], node.id), ctx.access(seq, seq_it, node.id)]
    below = expr_fn("le" if right else "lt", In(1), In(0))
    term = expr_fn("logical_or", below, expr_fn("ne", In(0), In(0)))
    tid = ctx.new_tensor(node.id, x.shape, out_dtype)
    ctx.emit(tid, iters, acc, Access(tid, tuple(it[:-1])), ReduceBody("sum", term), node.id)
    return [ctx.tensor_view(tid, node.id)]
