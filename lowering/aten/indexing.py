"""Row gathers (embedding, index.Tensor, gather, index_select) -> `gather` PrimOps, and
tensor creation (full, scalar_tensor, zeros/ones, iota, arange) -> `fill` PrimOps."""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from lowering.aten.context import INT_DTYPES, Ctx, NodeArgs, View, register
from lowering.aten.pointwise import broadcast_shapes
from lowering.aten.views import norm_dim, slice_view
from target.interpreter import round_bfloat16
from target.primitives import Access, FillBody, GatherBody, IterDim


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


@register("aten.index.Tensor",
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
