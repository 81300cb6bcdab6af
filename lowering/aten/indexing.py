"""Row gathers (embedding, index.Tensor, gather, index_select) -> `gather` PrimOps, and
tensor creation (full, scalar_tensor, zeros/ones, iota, arange) -> `fill` PrimOps."""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from lowering.aten.context import INT_DTYPES, Ctx, NodeArgs, View, expr_fn, register
from lowering.aten.pointwise import broadcast_shapes
from lowering.aten.views import norm_dim, pad_view, slice_view
from target.interpreter import round_bfloat16
from target.primitives import Access, Const, Expr, FillBody, GatherBody, In, IterDim, PointwiseBody, ReduceBody


def emit_gather(ctx: Ctx, node: NodeArgs, table: View, out_shape: Sequence[int],
                table_out_dim: Sequence[Optional[int]], indices: Sequence[tuple[int, View, int]],
                out_id: str) -> View:
    """out[p] = table[...] where table dim t is walked by output dim table_out_dim[t]
    (None for gathered dims) and, for each (t, idx, first), table dim t is indexed by
    idx, whose dims align with the output dims starting at `first`."""
    for t, idx, _ in indices:
        if idx.dtype not in INT_DTYPES:
            raise node.fail("unsupported_op", f"index tensors of dtype {idx.dtype} (only integer indices)")
    # A gathered dim of size 1 can only be indexed by 0 (or -1): it needs no index operand.
    indices = [(t, idx, first) for t, idx, first in indices if table.shape[t] > 1]
    if not indices:
        # every gathered dim has size 1 (e.g. one decode token's row picked by each routed
        # slot): the output is the table broadcast over the index dims
        from lowering.aten.pointwise import emit_pointwise

        strides = [0] * len(out_shape)
        for t in range(table.rank):
            j = table_out_dim[t]
            if j is not None and table.shape[t] > 1:
                strides[j] = table.strides[t]
        bcast = table.with_(tuple(out_shape), tuple(strides))
        return emit_pointwise(ctx, node, [bcast], lambda e: e[0], table.dtype, out_shape=out_shape, out_id=out_id)
    if any(table.strides[t] == 0 for t, _, _ in indices):
        table = ctx.materialize(table, node.id)  # a broadcast dim cannot be gathered from its base
    mapping = ctx.relabel(table)
    if mapping is None:
        table = ctx.materialize(table, node.id)
        mapping = ctx.relabel(table)
    iters, index = ctx.iter_dims_for(out_shape)
    gathered = {t for t, _, _ in indices}
    t_iter = [None if t in gathered or table_out_dim[t] is None or table.shape[t] == 1 else index[table_out_dim[t]]
              for t in range(table.rank)]
    for t in range(table.rank):
        if t not in gathered and table_out_dim[t] is not None and table.shape[t] != out_shape[table_out_dim[t]]:
            raise node.fail("shape_mismatch", f"table dim {t} ({table.shape[t]}) vs output {list(out_shape)}")
    t_acc = ctx.access(table, t_iter, node.id)
    accesses = [t_acc]
    axes = []
    for t, idx, first in indices:
        axes.append(mapping[t])
        accesses.append(ctx.access(idx, [index[first + j] if idx.shape[j] > 1 else None
                                         for j in range(idx.rank)], node.id))
    tid = ctx.new_tensor(out_id, out_shape, table.dtype)
    ctx.emit(tid, iters, accesses, Access(tid, tuple(index)), GatherBody(axes[0], extra_axes=tuple(axes[1:])),
             node.id)
    return ctx.tensor_view(tid, out_id)


@register("aten.embedding.default",
          doc="`gather` along axis 0 of the table")
def _embedding(ctx: Ctx, node: NodeArgs):
    weight, idx = node.arg(0, "weight"), node.arg(1, "indices")
    if weight.rank != 2:
        raise node.fail("shape_mismatch", f"embedding weight of rank {weight.rank}")
    out_shape = tuple(idx.shape) + (weight.shape[1],)
    return [emit_gather(ctx, node, weight, out_shape, [None, idx.rank], [(0, idx, 0)], node.id)]


@register("aten.index.Tensor", "aten._unsafe_index.Tensor",
          doc=("`gather` with one index operand per indexed dim (torch's broadcasting and dim placement); boolean mask"
               " indexing is unsupported"))
def _index(ctx: Ctx, node: NodeArgs):
    x: View = node.arg(0, "self")
    idx_list = list(node.arg(1, "indices"))
    if len(idx_list) > x.rank:
        raise node.fail("bad_argument", f"{len(idx_list)} indices for rank {x.rank}")
    idx_list += [None] * (x.rank - len(idx_list))
    positions = [p for p, i in enumerate(idx_list) if i is not None]
    if not positions:
        return [x.with_(x.shape, x.strides, name=node.id)]
    for p in positions:
        if idx_list[p].dtype == "bool":
            raise node.fail("unsupported_op", "boolean mask indexing (data-dependent shape)")
    bshape = broadcast_shapes(node, [idx_list[p].shape for p in positions])
    adjacent = positions == list(range(positions[0], positions[-1] + 1))
    rest = [d for d in range(x.rank) if d not in positions]
    if adjacent:
        first = positions[0]
        before = [d for d in rest if d < first]
        after = [d for d in rest if d > first]
        out_shape = [x.shape[d] for d in before] + list(bshape) + [x.shape[d] for d in after]
        block = len(before)
        out_dim = {d: j for j, d in enumerate(before)}
        out_dim.update({d: block + len(bshape) + j for j, d in enumerate(after)})
    else:
        block = 0
        out_shape = list(bshape) + [x.shape[d] for d in rest]
        out_dim = {d: len(bshape) + j for j, d in enumerate(rest)}
    table_out = [out_dim.get(d) for d in range(x.rank)]
    indices = [(p, idx_list[p], block + len(bshape) - idx_list[p].rank) for p in positions]
    return [emit_gather(ctx, node, x, out_shape, table_out, indices, node.id)]


@register("aten.gather.default",
          doc="`gather` along `dim` (the table sliced to the index's extent in the other dims)")
def _gather(ctx: Ctx, node: NodeArgs):
    x: View = node.arg(0, "self")
    d = norm_dim(node, node.arg(1, "dim"), x.rank)
    idx: View = node.arg(2, "index")
    if idx.rank != x.rank:
        raise node.fail("shape_mismatch", f"gather index rank {idx.rank} vs input rank {x.rank}")
    for j in range(x.rank):
        if j != d and idx.shape[j] < x.shape[j]:
            x = slice_view(node, x, j, 0, idx.shape[j], 1, x.name)
        elif j != d and idx.shape[j] > x.shape[j]:
            raise node.fail("shape_mismatch", f"gather index {list(idx.shape)} larger than input {list(x.shape)}")
    table_out = [None if j == d else j for j in range(x.rank)]
    return [emit_gather(ctx, node, x, idx.shape, table_out, [(d, idx, 0)], node.id)]


@register("aten.index_select.default",
          doc="`gather` along `dim`")
def _index_select(ctx: Ctx, node: NodeArgs):
    x: View = node.arg(0, "self")
    d = norm_dim(node, node.arg(1, "dim"), x.rank)
    idx: View = node.arg(2, "index")
    if idx.rank > 1:
        raise node.fail("shape_mismatch", "index_select index must be 0-D or 1-D")
    if idx.rank == 0:
        idx = idx.with_((1,), (1,))
    out_shape = list(x.shape)
    out_shape[d] = idx.shape[0]
    table_out = [None if j == d else j for j in range(x.rank)]
    return [emit_gather(ctx, node, x, out_shape, table_out, [(d, idx, d)], node.id)]


# -- creation ---------------------------------------------------------------------------
def int_iota(ctx: Ctx, node: NodeArgs, n: int, name: str) -> View:
    """An int64 [0, n) tensor `node.name` (a `fill` with iota), for position comparisons."""
    tid = ctx.new_tensor(f"{node.id}.{name}", (n,), "int64")
    dims = [IterDim("d0", n)] if n > 1 else []
    ctx.emit(tid, dims, [], Access(tid, (0,) if n > 1 else (None,)),
             FillBody(0.0, iota_dim=0, start=0.0, step=1.0), node.id)
    return ctx.tensor_view(tid)


def emit_fill(ctx: Ctx, node: NodeArgs, shape: Sequence[int], dtype: str, value: float,
              iota: Optional[tuple[float, float]] = None) -> View:
    iters, index = ctx.iter_dims_for(shape)
    tid = ctx.new_tensor(node.id, shape, dtype)
    if iota is None:
        value = stored_value(float(value), dtype)
        body = FillBody(value)
        ctx.const_of[tid] = value
    else:
        body = FillBody(0.0, iota_dim=0, start=float(iota[0]), step=float(iota[1]))
    ctx.emit(tid, iters, [], Access(tid, tuple(index)), body, node.id)
    return ctx.tensor_view(tid, node.id)


def stored_value(value: float, dtype: str) -> float:
    """The value a tensor of `dtype` holds for `value` (what a folded Const must carry)."""
    if dtype == "bool":
        return float(value != 0)
    if dtype in INT_DTYPES:
        return float(math.trunc(value)) if math.isfinite(value) else value
    if dtype == "float16":
        return float(np.float16(value))
    if dtype == "bfloat16":
        return float(round_bfloat16(np.asarray([value], dtype=np.float32))[0])
    if dtype == "float32":
        return float(np.float32(value))
    return value


def _num(node: NodeArgs, v) -> float:
    if isinstance(v, (bool, int, float)):
        return float(v)
    raise node.fail("bad_argument", f"expected a number, got {v!r}")


@register("aten.full.default", "aten.zeros.default", "aten.ones.default", "aten.empty.memory_format",
          "aten.empty_strided.default",
          doc="constant `fill` (folded as `Const` into pointwise consumers)")
def _full(ctx: Ctx, node: NodeArgs):
    shape = list(node.arg(0, "size"))
    if node.target == "aten.full.default":
        value = _num(node, node.arg(1, "fill_value"))
    else:
        value = 1.0 if node.target == "aten.ones.default" else 0.0
    return [emit_fill(ctx, node, shape, node.kwargs.get("dtype") or node.out_dtypes[0], value)]


@register("aten.full_like.default", "aten.zeros_like.default", "aten.ones_like.default",
          doc="constant `fill` (folded as `Const` into pointwise consumers)")
def _full_like(ctx: Ctx, node: NodeArgs):
    x: View = node.arg(0, "self")
    if node.target == "aten.full_like.default":
        value = _num(node, node.arg(1, "fill_value"))
    else:
        value = 1.0 if node.target == "aten.ones_like.default" else 0.0
    return [emit_fill(ctx, node, x.shape, node.kwargs.get("dtype") or x.dtype, value)]


@register("aten.scalar_tensor.default",
          doc="constant `fill` (folded as `Const` into pointwise consumers)")
def _scalar_tensor(ctx: Ctx, node: NodeArgs):
    value = _num(node, node.arg(0, "s"))
    return [emit_fill(ctx, node, (), node.kwargs.get("dtype") or node.out_dtypes[0], value)]


@register("prims.iota.default",
          doc="`fill` with `iota_dim`: `start + step * i`")
def _iota(ctx: Ctx, node: NodeArgs):
    length = node.arg(0, "length")
    start, step = node.kwargs.get("start", 0), node.kwargs.get("step", 1)
    return [emit_fill(ctx, node, (length,), node.kwargs.get("dtype") or "int64", 0.0,
                      iota=(_num(node, start), _num(node, step)))]


@register("aten.arange.start_step", "aten.arange.default", "aten.arange.start",
          doc="`fill` with `iota_dim`: `start + step * i`")
def _arange(ctx: Ctx, node: NodeArgs):
    if node.target == "aten.arange.default":
        start, end, step = 0, node.arg(0, "end"), 1
    elif node.target == "aten.arange.start":
        start, end, step = node.arg(0, "start"), node.arg(1, "end"), 1
    else:
        start, end, step = node.arg(0, "start"), node.arg(1, "end"), node.arg(2, "step", 1)
    length = max(0, math.ceil((_num(node, end) - _num(node, start)) / _num(node, step)))
    return [emit_fill(ctx, node, (length,), node.kwargs.get("dtype") or node.out_dtypes[0], 0.0,
                      iota=(_num(node, start), _num(node, step)))]


# -- scatter -----------------------------------------------------------------------------
# torch.scatter writes src[p] (or a scalar) to self at p with p[dim] replaced by index[p],
# for every position p of index. A write is a data-dependent store, which no primitive
# body has; read the other way round it is a reduction: output position q along `dim`
# collects the index positions j whose (wrapped) index equals q. So each scatter is one
# `reduce` over [index's shape with dim -> self's extent Q, j over index's extent J]
# (O(Q*J) SFP steps per row: small for the count and block tables MoE alignment scatters
# into), then a pointwise merge with self. Positions of self outside index's extent in the
# other dims are untouched (the reduced result is padded there by a copy).
def _scatter_region(node: NodeArgs, x: View, d: int, idx: View, src: Optional[View]) -> tuple[int, ...]:
    if idx.dtype not in INT_DTYPES:
        raise node.fail("unsupported_op", f"scatter index of dtype {idx.dtype}")
    if idx.rank != x.rank or (src is not None and src.rank != x.rank):
        raise node.fail("shape_mismatch", f"scatter of rank {x.rank} with index rank {idx.rank}")
    for j in range(x.rank):
        if (j != d and idx.shape[j] > x.shape[j]) or (src is not None and idx.shape[j] > src.shape[j]):
            raise node.fail("shape_mismatch", f"scatter index {list(idx.shape)} larger than self "
                                              f"{list(x.shape)} or src {list(src.shape) if src else None}")
    return tuple(x.shape[d] if j == d else idx.shape[j] for j in range(x.rank))


def _scatter_reduce(ctx: Ctx, node: NodeArgs, x: View, d: int, idx: View, src: Optional[View], fn: str,
                    build, out_dtype: str, out_id: str) -> View:
    """out[q] (q over the scatter region: index's shape with dim d -> self's extent Q) =
    fold `fn` over j in [0, J) of build(hit, src_j, j), hit = index[q, d -> j] == q[d]. An index
    outside [0, Q) hits nothing (torch raises on it; there is no error path on the device)."""
    region = _scatter_region(node, x, d, idx, src)
    Q, J = x.shape[d], idx.shape[d]
    iters, it = ctx.iter_dims_for(region)
    jd: Optional[int] = None
    if J > 1:
        jd = len(iters)
        iters.append(IterDim("r", J, "reduction"))
    it_j = list(it)
    it_j[d] = jd
    accesses = [ctx.access(idx, it_j, node.id), ctx.access(int_iota(ctx, node, Q, "positions"), [it[d]], node.id)]
    if src is not None:
        accesses.append(ctx.access(_sliced(node, src, idx.shape), it_j, node.id))
    j_expr: Expr = Const(0.0)
    if jd is not None:
        accesses.append(ctx.access(int_iota(ctx, node, J, "slots"), [jd], node.id))
        j_expr = In(len(accesses) - 1)
    expr = build(expr_fn("eq", In(0), In(1)), In(2) if src is not None else None, j_expr)
    tid = ctx.new_tensor(out_id, region, out_dtype)
    # one index position along dim (J == 1): nothing to fold, a pointwise op
    body = ReduceBody(fn, expr) if jd is not None else PointwiseBody(expr)
    ctx.emit(tid, iters, accesses, Access(tid, tuple(it)), body, node.id)
    return ctx.tensor_view(tid, out_id)


def _to_self_shape(ctx: Ctx, node: NodeArgs, v: View, x: View, fill: float) -> View:
    """v (over the scatter region) padded with `fill` to self's shape: positions no index
    reaches."""
    if tuple(v.shape) == tuple(x.shape):
        return v
    return pad_view(ctx, node, v, [0] * x.rank, [x.shape[j] - v.shape[j] for j in range(x.rank)], fill,
                    f"{v.name}.padded")


def _sliced(node: NodeArgs, v: View, shape: Sequence[int]) -> View:
    for j, s in enumerate(shape):
        if v.shape[j] != s:
            v = slice_view(node, v, j, 0, s, 1, v.name)
    return v


def _scatter_args(node: NodeArgs):
    x: View = node.arg(0, "self")
    d = norm_dim(node, node.arg(1, "dim"), x.rank)
    idx: View = node.arg(2, "index")
    if x.rank == 0:
        raise node.fail("unsupported_op", "scatter into a 0-d tensor")
    return x, d, idx


@register("aten.scatter.value",
          doc=("`reduce max` over [self's extent along dim, index positions] of `index == position`, then pointwise `where(hit, value, self)`"))
def _scatter_value(ctx: Ctx, node: NodeArgs):
    from lowering.aten.pointwise import emit_pointwise

    x, d, idx = _scatter_args(node)
    value = node.arg(3, "value")
    if not isinstance(value, (bool, int, float)):
        raise node.fail("bad_argument", f"scatter value {value!r}")
    hit = _scatter_reduce(ctx, node, x, d, idx, None, "max", lambda h, s, j: h, "bool", f"{node.id}.hit")
    hit = _to_self_shape(ctx, node, hit, x, 0.0)
    v = stored_value(float(value), x.dtype)
    return [emit_pointwise(ctx, node, [hit, x], lambda e: expr_fn("where", e[0], Const(v), e[1]), x.dtype,
                           out_shape=x.shape)]


@register("aten.scatter.src",
          doc=("the last index position writing each output position (`reduce max` over [self's extent along dim,"
               " index positions]), `gather` of src there, pointwise `where` against self (duplicates: the last"
               " position wins; torch leaves it unspecified)"))
def _scatter_src(ctx: Ctx, node: NodeArgs):
    from lowering.aten.pointwise import emit_pointwise

    x, d, idx = _scatter_args(node)
    src: View = node.arg(3, "src")
    if not isinstance(src, View):
        raise node.fail("bad_argument", f"scatter src {src!r}")
    last = _scatter_reduce(ctx, node, x, d, idx, None, "max",
                           lambda h, s, j: expr_fn("where", h, j, Const(-1.0)), "int64", f"{node.id}.last")
    region = _scatter_region(node, x, d, idx, src)
    row = emit_pointwise(ctx, node, [last], lambda e: expr_fn("maximum", e[0], Const(0.0)), "int64",
                         out_id=f"{node.id}.row")
    picked = emit_gather(ctx, node, _sliced(node, src, idx.shape), region,
                         [None if j == d else j for j in range(x.rank)], [(d, row, 0)], f"{node.id}.src")
    last = _to_self_shape(ctx, node, last, x, -1.0)
    picked = _to_self_shape(ctx, node, picked, x, 0.0)
    return [emit_pointwise(ctx, node, [last, picked, x],
                           lambda e: expr_fn("where", expr_fn("ge", e[0], Const(0.0)), e[1], e[2]), x.dtype,
                           out_shape=x.shape)]


@register("aten.scatter_add.default",
          doc=("`reduce sum` over [self's extent along dim, index positions] of `where(index == position, src, 0)`, then pointwise `self + sum`"))
def _scatter_add(ctx: Ctx, node: NodeArgs):
    from lowering.aten.pointwise import emit_pointwise

    x, d, idx = _scatter_args(node)
    src: View = node.arg(3, "src")
    if not isinstance(src, View):
        raise node.fail("bad_argument", f"scatter_add src {src!r}")
    acc_dtype = "int64" if x.dtype in INT_DTYPES or x.dtype == "bool" else x.dtype
    added = _scatter_reduce(ctx, node, x, d, idx, src, "sum", lambda h, s, j: expr_fn("where", h, s, Const(0.0)),
                            acc_dtype, f"{node.id}.added")
    added = _to_self_shape(ctx, node, added, x, 0.0)
    return [emit_pointwise(ctx, node, [x, added], lambda e: expr_fn("add", e[0], e[1]), x.dtype,
                           out_shape=x.shape)]


_REDUCE_IDENTITY = {"sum": 0.0, "prod": 1.0}


@register("aten.scatter_reduce.two",
          doc=("`reduce` over [self's extent along dim, index positions] of `where(index == position, src, identity)`"
               " (sum, prod, amax, amin; mean = sum / count), merged with self (include_self) or replacing it where"
               " some index hits; mean of integers unsupported"))
def _scatter_reduce_two(ctx: Ctx, node: NodeArgs):
    from lowering.aten.pointwise import emit_pointwise

    x, d, idx = _scatter_args(node)
    src: View = node.arg(3, "src")
    how = node.arg(4, "reduce")
    include_self = bool(node.arg(5, "include_self", True))
    if not isinstance(src, View):
        raise node.fail("bad_argument", f"scatter_reduce src {src!r}")
    is_float = x.dtype not in INT_DTYPES and x.dtype != "bool"
    if how not in ("sum", "prod", "amax", "amin", "mean"):
        raise node.fail("bad_argument", f"scatter_reduce reduce={how!r}")
    if how == "mean" and not is_float:
        raise node.fail("unsupported_op", "scatter_reduce mean of integers (torch floors the division)")
    acc_dtype = x.dtype if is_float else "int64"
    if how in ("amax", "amin"):
        big = math.inf if is_float else float(2 ** 62)   # beyond any int the test sets use; exact in float64
        fn, identity = ("max", -big) if how == "amax" else ("min", big)
    else:
        fn, identity = ("sum" if how in ("sum", "mean") else "prod"), _REDUCE_IDENTITY.get(how, 0.0)
    folded = _scatter_reduce(ctx, node, x, d, idx, src, fn,
                             lambda h, s_, j: expr_fn("where", h, s_, Const(identity)), acc_dtype, f"{node.id}.folded")
    count = _scatter_reduce(ctx, node, x, d, idx, None, "sum", lambda h, s_, j: h, "int64", f"{node.id}.count")
    folded = _to_self_shape(ctx, node, folded, x, identity)
    count = _to_self_shape(ctx, node, count, x, 0.0)
    combine = {"sum": "add", "prod": "mul", "amax": "maximum", "amin": "minimum"}

    def merge(e):   # e: self, folded, count
        hit = expr_fn("gt", e[2], Const(0.0))
        if how == "mean":
            total = expr_fn("add", e[1], e[0]) if include_self else e[1]
            n = expr_fn("add", e[2], Const(1.0)) if include_self else e[2]
            return expr_fn("where", hit, expr_fn("div", total, n), e[0])
        if include_self:
            return expr_fn("where", hit, expr_fn(combine[how], e[0], e[1]), e[0])
        return expr_fn("where", hit, e[1], e[0])
    return [emit_pointwise(ctx, node, [x, folded, count], merge, x.dtype, out_shape=x.shape)]


@register("aten.upsample_nearest2d.vec",
          doc=("`gather` along H and W with source indices `min(floor(i * scale), in - 1)` computed in float32 as"
               " torch (scale = 1/scale_factor if given, else in/out)"))
def _upsample_nearest2d(ctx: Ctx, node: NodeArgs):
    from lowering.aten.pointwise import emit_pointwise

    x: View = node.arg(0, "input")
    factors = node.arg(2, "scale_factors")
    if x.rank != 4:
        raise node.fail("unsupported_op", f"upsample_nearest2d of rank {x.rank}")
    out_shape = tuple(node.out_shapes[0])
    indices = []
    for k, axis in enumerate((2, 3)):
        size_in, size_out = x.shape[axis], out_shape[axis]
        if factors:
            scale = np.float32(1.0 / float(factors[k]))
        else:
            scale = np.float32(size_in) / np.float32(size_out)
        i = int_iota(ctx, node, size_out, f"dst{axis}")
        # float32 product as torch's nearest_idx (accscalar of float and half is float)
        pos = emit_pointwise(ctx, node, [i], lambda e, sc=scale: expr_fn("mul", e[0], Const(float(sc))), "float32",
                             out_id=f"{node.id}.pos{axis}")
        src = emit_pointwise(ctx, node, [pos], lambda e, n=size_in: expr_fn("minimum", expr_fn("floor", e[0]),
                                                                            Const(float(n - 1))),
                             "int64", out_id=f"{node.id}.src{axis}")
        indices.append((axis, src, axis))
    return [emit_gather(ctx, node, x, out_shape, [0, 1, None, None], indices, node.id)]


@register("aten._embedding_bag.default",
          doc=("`gather` of the indexed rows, each position's bag from the offsets (`reduce sum` of `offsets[b] <= i`),"
               " then `reduce` over [bags, dim, positions] of the rows in the bag (sum, mean: / count, max; padding_idx"
               " skipped, per_sample_weights multiplied, empty bags 0); the offset2bag / bag_size / max_indices outputs"
               " (backward helpers) are not computed"))
def _embedding_bag(ctx: Ctx, node: NodeArgs):
    from lowering.aten.conv import Unavailable
    from lowering.aten.pointwise import emit_pointwise

    weight, idx, offsets = node.arg(0, "weight"), node.arg(1, "indices"), node.arg(2, "offsets")
    mode = int(node.arg(4, "mode", 0))
    psw = node.arg(6, "per_sample_weights")
    include_last = bool(node.arg(7, "include_last_offset", False))
    padding_idx = node.arg(8, "padding_idx", -1)
    if weight.rank != 2 or idx.rank != 1 or not isinstance(offsets, View) or offsets.rank != 1:
        raise node.fail("unsupported_op", "embedding_bag with other than 1-D indices and offsets")
    if mode not in (0, 1, 2):
        raise node.fail("bad_argument", f"embedding_bag mode {mode}")
    if psw is not None and mode != 0:
        raise node.fail("bad_argument", "per_sample_weights need mode sum")
    I, D = idx.shape[0], weight.shape[1]
    bags = offsets.shape[0] - (1 if include_last else 0)
    if I == 0 or bags <= 0:
        raise node.fail("unsupported_op", "embedding_bag with no indices or no bags")
    if padding_idx is not None and padding_idx < 0:
        padding_idx = None   # the aten op's "no padding" (F.embedding_bag has already wrapped a negative one)
    rows = emit_gather(ctx, node, weight, (I, D), [None, 1], [(0, idx, 0)], f"{node.id}.rows")
    # bag of position i: #{b >= 1 : offsets[b] <= i} (include_last_offset: positions at or past the
    # last offset belong to no bag)
    pos = int_iota(ctx, node, I, "positions")
    nb = offsets.shape[0]
    b_iota = int_iota(ctx, node, nb, "bag_ids")
    iters, it = ctx.iter_dims_for((I, nb), kinds=("parallel", "reduction"))
    acc = [ctx.access(offsets, [it[1]], node.id), ctx.access(pos, [it[0]], node.id),
           ctx.access(b_iota, [it[1]], node.id)]
    bag_t = ctx.new_tensor(f"{node.id}.bag", (I,), "int64")
    ctx.emit(bag_t, iters, acc, Access(bag_t, (it[0],)), ReduceBody("sum", expr_fn(
        "logical_and", expr_fn("ge", In(2), Const(1.0)), expr_fn("le", In(0), In(1)))), node.id)
    bag = ctx.tensor_view(bag_t)
    # in[b, i]: position i counts towards bag b
    counted = [bag, idx] + ([psw] if psw is not None else [])
    iters, it = ctx.iter_dims_for((bags, D, I), kinds=("parallel", "parallel", "reduction"))
    out_ids = int_iota(ctx, node, bags, "bags")
    acc = [ctx.access(rows, [it[2], it[1]], node.id), ctx.access(bag, [it[2]], node.id),
           ctx.access(idx, [it[2]], node.id), ctx.access(out_ids, [it[0]], node.id)]
    if psw is not None:
        acc.append(ctx.access(psw, [it[2]], node.id))
    member = expr_fn("eq", In(1), In(3))
    if padding_idx is not None:
        member = expr_fn("logical_and", member, expr_fn("ne", In(2), Const(float(padding_idx))))
    value = expr_fn("mul", In(0), In(4)) if psw is not None else In(0)
    fn, identity = ("max", -math.inf) if mode == 2 else ("sum", 0.0)
    folded_id = node.id if mode == 0 else f"{node.id}.folded"
    folded_t = ctx.new_tensor(folded_id, (bags, D), weight.dtype)
    ctx.emit(folded_t, iters, acc, Access(folded_t, (it[0], it[1])),
             ReduceBody(fn, expr_fn("where", member, value, Const(identity))), node.id)
    out = ctx.tensor_view(folded_t, folded_id)
    if mode != 0:
        iters, it = ctx.iter_dims_for((bags, I), kinds=("parallel", "reduction"))
        acc = [ctx.access(bag, [it[1]], node.id), ctx.access(idx, [it[1]], node.id),
               ctx.access(out_ids, [it[0]], node.id)]
        m = expr_fn("eq", In(0), In(2))
        if padding_idx is not None:
            m = expr_fn("logical_and", m, expr_fn("ne", In(1), Const(float(padding_idx))))
        count_t = ctx.new_tensor(f"{node.id}.count", (bags,), "int64")
        ctx.emit(count_t, iters, acc, Access(count_t, (it[0],)), ReduceBody("sum", m), node.id)
        count = ctx.tensor_view(count_t).with_((bags, 1), (1, 0))
        if mode == 1:
            finish = lambda e: expr_fn("where", expr_fn("gt", e[1], Const(0.0)), expr_fn("div", e[0], e[1]),  # noqa: E731
                                       Const(0.0))
        else:
            finish = lambda e: expr_fn("where", expr_fn("gt", e[1], Const(0.0)), e[0], Const(0.0))  # noqa: E731
        out = emit_pointwise(ctx, node, [out, count], finish, weight.dtype, out_shape=(bags, D))
    why = "embedding_bag's offset2bag / bag_size / max_indices outputs are not computed (backward helpers)"
    return [out, Unavailable(why), Unavailable(why), Unavailable(why)]


@register("aten.masked_scatter.default",
          doc=("source element for each masked position in row-major order: `reduce cumsum` of the flattened mask,"
               " `gather` of the flattened source there, pointwise `where(mask, gathered, self)`"))
def _masked_scatter(ctx: Ctx, node: NodeArgs):
    """torch.masked_scatter: the k-th True position of the mask (row-major, mask broadcast to
    self's shape) takes source.flat[k]. A source with fewer elements than the mask has
    True positions is an error in torch; here those positions take its last element."""
    from lowering.aten.pointwise import emit_pointwise
    from lowering.aten.views import reshape

    x: View = node.arg(0, "self")
    mask: View = node.arg(1, "mask")
    source: View = node.arg(2, "source")
    if mask.dtype != "bool":
        raise node.fail("bad_argument", f"masked_scatter mask of {mask.dtype}")
    n = 1
    for s in x.shape:
        n *= s
    m_full = mask.with_(x.shape, (0,) * (x.rank - mask.rank) + tuple(
        st if s == t else 0 for s, t, st in zip(mask.shape, x.shape[x.rank - mask.rank:], mask.strides)))
    m_flat = reshape(ctx, node, m_full, (n,), f"{node.id}.mask_flat")
    iters, it = ctx.iter_dims_for((n,), kinds=("reduction",), keep=(0,))
    before_t = ctx.new_tensor(f"{node.id}.rank", (n,), "int64")
    ctx.emit(before_t, iters, [ctx.access(m_flat, it, node.id)], Access(before_t, tuple(it)),
             ReduceBody("cumsum", In(0)), node.id)
    s_numel = 1
    for s in source.shape:
        s_numel *= s
    if s_numel == 0:
        raise node.fail("unsupported_op", "masked_scatter from an empty source")
    # position's source element: (number of True up to and including it) - 1, kept in range
    take = emit_pointwise(ctx, node, [ctx.tensor_view(before_t)], lambda e: expr_fn("minimum", expr_fn(
        "maximum", expr_fn("sub", e[0], Const(1.0)), Const(0.0)), Const(float(s_numel - 1))), "int64",
                          out_id=f"{node.id}.take")
    src_flat = reshape(ctx, node, source, (s_numel,), f"{node.id}.source_flat")
    picked = emit_gather(ctx, node, src_flat, (n,), [None], [(0, take, 0)], f"{node.id}.picked")
    picked = reshape(ctx, node, picked, x.shape, f"{node.id}.picked")
    return [emit_pointwise(ctx, node, [m_full, picked, x], lambda e: expr_fn("where", e[0], e[1], e[2]), x.dtype,
                           out_shape=x.shape)]
