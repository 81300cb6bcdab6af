"""View ops (compose strided views, no PrimOp) and the copies that assemble new tensors
(cat, constant_pad_nd)."""
from __future__ import annotations

from typing import Optional, Sequence

from lowering.aten.context import Ctx, NodeArgs, View, expr_fn, numel, register
from target.primitives import Const, StridedMap


def norm_dim(node: NodeArgs, dim: int, rank: int) -> int:
    r = max(rank, 1)
    if not -r <= dim < r:
        raise node.fail("bad_argument", f"dim {dim} out of range for rank {rank}")
    return dim % r


def view_strides(old_shape: Sequence[int], old_strides: Sequence[int],
                 new_shape: Sequence[int]) -> Optional[tuple[int, ...]]:
    """Strides that present a strided view with a new shape without moving data, or None
    when the regrouping is impossible (the same rule as torch's view)."""
    if numel(old_shape) == 0:
        return tuple(1 for _ in new_shape)
    if len(old_shape) == 0:
        return tuple(1 for _ in new_shape)
    new_strides = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_base = old_strides[-1]
    tensor_numel = 1
    view_numel = 1
    for td in range(len(old_shape) - 1, -1, -1):
        tensor_numel *= old_shape[td]
        if td == 0 or (old_shape[td - 1] != 1 and old_strides[td - 1] != tensor_numel * chunk_base):
            while view_d >= 0 and (view_numel < tensor_numel or new_shape[view_d] == 1):
                new_strides[view_d] = view_numel * chunk_base
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if td > 0:
                chunk_base = old_strides[td - 1]
                tensor_numel = 1
                view_numel = 1
    if view_d != -1:
        return None
    return tuple(new_strides)


def reshape(ctx: Ctx, node: NodeArgs, x: View, shape: Sequence[int], name: str) -> View:
    shape = list(shape)
    if shape.count(-1) > 1:
        raise node.fail("bad_argument", f"reshape to {shape}: more than one -1")
    if -1 in shape:
        known = numel([s for s in shape if s != -1])
        shape[shape.index(-1)] = numel(x.shape) // known if known else 0
    if numel(shape) != numel(x.shape):
        raise node.fail("shape_mismatch", f"cannot reshape {list(x.shape)} to {shape}")
    strides = view_strides(x.shape, x.strides, shape)
    if strides is None:
        # not expressible over x's base: realize x first, then regroup its row-major order
        x = ctx.materialize(x, node.id)
        strides = view_strides(x.shape, x.strides, shape)
        assert strides is not None
    return x.with_(shape, strides, name=name)


@register("aten.view.default", "aten.reshape.default", "aten._unsafe_view.default",
          doc=("folded when only size-1 dims change; a regrouping reshape is a `copy` at the first consumer (one that "
               "is not stride-compatible materializes its input first)"))
def _view(ctx: Ctx, node: NodeArgs):
    return [reshape(ctx, node, node.arg(0, "self"), node.arg(1, "size"), node.id)]


@register("prims.view_of.default",
          doc="alias (no op)")
def _view_of(ctx: Ctx, node: NodeArgs):
    x: View = node.arg(0, "a")
    return [x.with_(x.shape, x.strides, name=node.id)]


@register("aten.permute.default",
          doc="folded into the consumer's Access (no op)")
def _permute(ctx: Ctx, node: NodeArgs):
    x: View = node.arg(0, "self")
    dims = [norm_dim(node, d, x.rank) for d in node.arg(1, "dims")]
    if sorted(dims) != list(range(x.rank)):
        raise node.fail("bad_argument", f"permute dims {dims} are not a permutation")
    return [x.with_([x.shape[d] for d in dims], [x.strides[d] for d in dims], name=node.id)]


@register("aten.transpose.int",
          doc="folded into the consumer's Access (no op)")
def _transpose(ctx: Ctx, node: NodeArgs):
    x: View = node.arg(0, "self")
    a, b = norm_dim(node, node.arg(1, "dim0"), x.rank), norm_dim(node, node.arg(2, "dim1"), x.rank)
    order = list(range(x.rank))
    order[a], order[b] = order[b], order[a]
    return [x.with_([x.shape[d] for d in order], [x.strides[d] for d in order], name=node.id)]


@register("aten.t.default",
          doc="folded into the consumer's Access (no op)")
def _t(ctx: Ctx, node: NodeArgs):
    x: View = node.arg(0, "self")
    if x.rank < 2:
        return [x.with_(x.shape, x.strides, name=node.id)]
    return [x.with_(x.shape[::-1], x.strides[::-1], name=node.id)]


@register("aten.unsqueeze.default",
          doc="folded into the consumer's Access (no op)")
def _unsqueeze(ctx: Ctx, node: NodeArgs):
    x: View = node.arg(0, "self")
    d = norm_dim(node, node.arg(1, "dim"), x.rank + 1)
    stride = x.strides[d] * x.shape[d] if d < x.rank else 1
    return [x.with_(x.shape[:d] + (1,) + x.shape[d:], x.strides[:d] + (stride,) + x.strides[d:], name=node.id)]


@register("aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default",
          doc="folded into the consumer's Access (no op)")
def _squeeze(ctx: Ctx, node: NodeArgs):
    x: View = node.arg(0, "self")
    if node.target == "aten.squeeze.default":
        dims = set(range(x.rank))
    elif node.target == "aten.squeeze.dim":
        dims = {norm_dim(node, node.arg(1, "dim"), x.rank)} if x.rank else set()
    else:
        dims = {norm_dim(node, d, x.rank) for d in node.arg(1, "dim")} if x.rank else set()
    keep = [j for j in range(x.rank) if not (j in dims and x.shape[j] == 1)]
    return [x.with_([x.shape[j] for j in keep], [x.strides[j] for j in keep], name=node.id)]


@register("aten.expand.default",
          doc="folded (broadcast of size-1 or new dims: `None` in the Access)")
def _expand(ctx: Ctx, node: NodeArgs):
    x: View = node.arg(0, "self")
    sizes = list(node.arg(1, "size"))
    lead = len(sizes) - x.rank
    if lead < 0:
        raise node.fail("bad_argument", f"expand to {sizes}: fewer dims than {list(x.shape)}")
    shape, strides = [], []
    for j, s in enumerate(sizes):
        if j < lead:
            if s < 0:
                raise node.fail("bad_argument", f"expand size {s} for a new dim")
            shape.append(s)
            strides.append(0)
            continue
        old = x.shape[j - lead]
        if s == -1 or s == old:
            shape.append(old)
            strides.append(x.strides[j - lead])
        elif old == 1:
            shape.append(s)
            strides.append(0)
        else:
            raise node.fail("shape_mismatch", f"cannot expand {list(x.shape)} to {sizes}")
    return [x.with_(shape, strides, name=node.id)]


def slice_view(node: NodeArgs, x: View, dim: int, start: Optional[int], end: Optional[int], step: int,
               name: str) -> View:
    d = norm_dim(node, dim, x.rank)
    size = x.shape[d]
    if step <= 0:
        raise node.fail("bad_argument", f"slice step {step} must be positive")
    start = 0 if start is None else start
    end = size if end is None else end
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    length = (end - start + step - 1) // step
    shape = list(x.shape)
    strides = list(x.strides)
    shape[d] = length
    offset = x.offset + start * x.strides[d]
    strides[d] = x.strides[d] * step
    return x.with_(shape, strides, offset=offset, name=name)


@register("aten.slice.Tensor",
          doc="strided view, a `copy` at the first consumer")
def _slice(ctx: Ctx, node: NodeArgs):
    x: View = node.arg(0, "self")
    return [slice_view(node, x, node.arg(1, "dim", 0), node.arg(2, "start"), node.arg(3, "end"),
                       node.arg(4, "step", 1), node.id)]


@register("aten.narrow.default",
          doc="strided view, a `copy` at the first consumer")
def _narrow(ctx: Ctx, node: NodeArgs):
    x: View = node.arg(0, "self")
    start, length = node.arg(2, "start"), node.arg(3, "length")
    return [slice_view(node, x, node.arg(1, "dim"), start, start + length, 1, node.id)]


@register("aten.select.int",
          doc="strided view, a `copy` at the first consumer")
def _select(ctx: Ctx, node: NodeArgs):
    x: View = node.arg(0, "self")
    d = norm_dim(node, node.arg(1, "dim"), x.rank)
    idx = node.arg(2, "index")
    idx = idx + x.shape[d] if idx < 0 else idx
    if not 0 <= idx < x.shape[d]:
        raise node.fail("bad_argument", f"select index {idx} out of range for size {x.shape[d]}")
    return [x.with_(x.shape[:d] + x.shape[d + 1:], x.strides[:d] + x.strides[d + 1:],
                    offset=x.offset + idx * x.strides[d], name=node.id)]


def _split_sizes(node: NodeArgs, total: int, sizes) -> list[int]:
    if isinstance(sizes, int):
        if sizes <= 0:
            raise node.fail("bad_argument", f"split size {sizes}")
        out = [sizes] * (total // sizes)
        if total % sizes or not out:
            out.append(total % sizes)
        return out
    if sum(sizes) != total:
        raise node.fail("shape_mismatch", f"split sizes {sizes} do not sum to {total}")
    return list(sizes)


@register("aten.split.Tensor", "aten.split_with_sizes.default",
          doc="strided views, a `copy` at each piece's first consumer")
def _split(ctx: Ctx, node: NodeArgs):
    x: View = node.arg(0, "self")
    d = norm_dim(node, node.arg(2, "dim", 0), x.rank)
    sizes = _split_sizes(node, x.shape[d], node.arg(1, "split_size" if node.target.endswith("Tensor")
                                                    else "split_sizes"))
    out, start = [], 0
    for k, s in enumerate(sizes):
        out.append(slice_view(node, x, d, start, start + s, 1, f"{node.id}:{k}"))
        start += s
    return out


@register("aten.unbind.int",
          doc="strided views, a `copy` at each piece's first consumer")
def _unbind(ctx: Ctx, node: NodeArgs):
    x: View = node.arg(0, "self")
    d = norm_dim(node, node.arg(1, "dim", 0), x.rank)
    return [x.with_(x.shape[:d] + x.shape[d + 1:], x.strides[:d] + x.strides[d + 1:],
                    offset=x.offset + k * x.strides[d], name=f"{node.id}:{k}") for k in range(x.shape[d])]


# -- copies that build new tensors -------------------------------------------------------
@register("aten.cat.default",
          doc="one `copy` with one piece per input (read through the input's own view)")
def _cat(ctx: Ctx, node: NodeArgs):
    parts: list[View] = [t for t in node.arg(0, "tensors")]
    # torch's legacy rule: 1-D empty tensors are skipped whatever the other ranks
    parts = [p for p in parts if not (p.rank == 1 and p.shape[0] == 0)]
    if not parts:
        raise node.fail("bad_argument", "cat of no non-empty tensors")
    rank = parts[0].rank
    d = norm_dim(node, node.arg(1, "dim", 0), rank)
    out_dtype = node.out_dtypes[0]
    shape = list(parts[0].shape)
    shape[d] = 0
    pieces = []
    for p in parts:
        if p.rank != rank or any(p.shape[j] != shape[j] for j in range(rank) if j != d):
            raise node.fail("shape_mismatch", f"cat of {[list(q.shape) for q in parts]} along dim {d}")
        if p.dtype != out_dtype:
            raise node.fail("unsupported_op", f"cat of mixed dtypes ({p.dtype} into {out_dtype})")
        if p.shape[d]:
            offs = tuple(shape[d] if j == d else 0 for j in range(rank))
            pieces.append((p.base, StridedMap(p.shape, p.strides, p.offset), offs))
        shape[d] += p.shape[d]
    tid = ctx.new_tensor(node.id, shape, out_dtype)
    ctx.emit_copy(tid, pieces, 0.0, node.id)
    return [ctx.tensor_view(tid, node.id)]


@register("aten.constant_pad_nd.default",
          doc="one `copy` with `pad_value` (negative pads crop)")
def _constant_pad(ctx: Ctx, node: NodeArgs):
    x: View = node.arg(0, "self")
    pad = list(node.arg(1, "pad"))
    value = float(node.arg(2, "value", 0.0))
    if len(pad) % 2 or len(pad) // 2 > x.rank:
        raise node.fail("bad_argument", f"pad {pad} for rank {x.rank}")
    before = [0] * x.rank
    after = [0] * x.rank
    for i in range(len(pad) // 2):
        d = x.rank - 1 - i
        before[d], after[d] = pad[2 * i], pad[2 * i + 1]
    return [pad_view(ctx, node, x, before, after, value, node.id)]


def pad_view(ctx: Ctx, node: NodeArgs, x: View, before: Sequence[int], after: Sequence[int], value: float,
             out_id: str) -> View:
    """Constant padding as a copy; negative amounts crop (a slice, folded into the map)."""
    for d in range(x.rank):
        lo, hi = min(before[d], 0), min(after[d], 0)
        if lo or hi:
            x = slice_view(node, x, d, -lo, x.shape[d] + hi, 1, x.name)
    before = [max(b, 0) for b in before]
    after = [max(a, 0) for a in after]
    if not any(before) and not any(after):
        return x.with_(x.shape, x.strides, name=out_id)
    shape = [x.shape[d] + before[d] + after[d] for d in range(x.rank)]
    tid = ctx.new_tensor(out_id, shape, x.dtype)
    ctx.emit_copy(tid, [(x.base, StridedMap(x.shape, x.strides, x.offset), tuple(before))], value, node.id)
    return ctx.tensor_view(tid, out_id)


@register("aten.repeat.default",
          doc="stride-0 tile dims, a `copy` of the expanded view, then a layout-free regroup")
def _repeat(ctx: Ctx, node: NodeArgs):
    """Tile by expanding a size-1 dim before each dim, then regrouping (copies at need)."""
    x: View = node.arg(0, "self")
    reps = list(node.arg(1, "repeats"))
    if len(reps) < x.rank or any(r < 0 for r in reps):
        raise node.fail("bad_argument", f"repeat {reps} of rank-{x.rank} tensor")
    lead = len(reps) - x.rank
    shape = (1,) * lead + x.shape
    strides = (0,) * lead + x.strides
    tiled_shape, tiled_strides = [], []
    for r, s, st in zip(reps, shape, strides):
        tiled_shape += [r, s]
        tiled_strides += [0, st]
    tiled = x.with_(tiled_shape, tiled_strides, name=node.id)
    return [reshape(ctx, node, tiled, [r * s for r, s in zip(reps, shape)], node.id)]


@register("aten.diagonal.default",
          doc="strided view (the two dims' strides summed into a trailing dim), a `copy` at the first consumer")
def _diagonal(ctx: Ctx, node: NodeArgs):
    x: View = node.arg(0, "self")
    offset = int(node.arg(1, "offset", 0))
    d1, d2 = norm_dim(node, node.arg(2, "dim1", 0), x.rank), norm_dim(node, node.arg(3, "dim2", 1), x.rank)
    if d1 == d2:
        raise node.fail("bad_argument", "diagonal dims must differ")
    n1, n2 = x.shape[d1], x.shape[d2]
    length = max(0, min(n1, n2 - offset) if offset >= 0 else min(n1 + offset, n2))
    start = x.offset + (offset * x.strides[d2] if offset >= 0 else -offset * x.strides[d1]) if length else x.offset
    keep = [j for j in range(x.rank) if j not in (d1, d2)]
    return [x.with_(tuple(x.shape[j] for j in keep) + (length,),
                    tuple(x.strides[j] for j in keep) + (x.strides[d1] + x.strides[d2],), offset=start, name=node.id)]


def _scatter_pieces(ctx: Ctx, node: NodeArgs, x: View, d: int, start: int, end: int, src: View) -> View:
    """x with [start, end) along d replaced by src: one `copy` of three pieces (x before,
    src, x after), which never overlap."""
    if src.dtype != x.dtype:
        raise node.fail("unsupported_op", f"scatter of {src.dtype} into {x.dtype}")
    pieces = []
    for lo, hi, v in ((0, start, x), (start, end, src), (end, x.shape[d], x)):
        if hi <= lo:
            continue
        part = v if v is src else slice_view(node, x, d, lo, hi, 1, x.name)
        offs = tuple(lo if j == d else 0 for j in range(x.rank))
        pieces.append((part.base, StridedMap(part.shape, part.strides, part.offset), offs))
    tid = ctx.new_tensor(node.id, x.shape, x.dtype)
    ctx.emit_copy(tid, pieces, 0.0, node.id)
    return ctx.tensor_view(tid, node.id)


@register("aten.slice_scatter.default",
          doc=("step 1: one `copy` of three pieces (self before the slice, src, self after); a step > 1: src"
               " `gather`ed to self's extent and a pointwise `where` on the slice's positions"))
def _slice_scatter(ctx: Ctx, node: NodeArgs):
    from lowering.aten.indexing import emit_gather, int_iota
    from lowering.aten.pointwise import emit_pointwise

    x: View = node.arg(0, "self")
    src: View = node.arg(1, "src")
    d = norm_dim(node, node.arg(2, "dim", 0), x.rank)
    step = int(node.arg(5, "step", 1))
    sl = slice_view(node, x, d, node.arg(3, "start"), node.arg(4, "end"), step, x.name)
    if tuple(sl.shape) != tuple(src.shape):
        raise node.fail("shape_mismatch", f"slice_scatter of {list(src.shape)} into a slice {list(sl.shape)}")
    start = node.arg(3, "start")
    start = 0 if start is None else (start + x.shape[d] if start < 0 else start)
    start = min(max(start, 0), x.shape[d])
    n = src.shape[d]
    if step == 1 or n <= 1:
        return [_scatter_pieces(ctx, node, x, d, start, start + n, src)]
    # position p along d is the slice's element (p - start) / step when that is a whole number
    q = x.shape[d]
    pos = int_iota(ctx, node, q, "positions")
    rel = emit_pointwise(ctx, node, [pos], lambda e: expr_fn("minimum", expr_fn("maximum", expr_fn(
        "floordiv", expr_fn("sub", e[0], Const(float(start))), Const(float(step))), Const(0.0)), Const(float(n - 1))),
                         "int64", out_id=f"{node.id}.src_pos")
    hit = emit_pointwise(ctx, node, [pos], lambda e: expr_fn("logical_and", expr_fn("logical_and", expr_fn(
        "ge", e[0], Const(float(start))), expr_fn("lt", e[0], Const(float(start + step * (n - 1) + 1)))), expr_fn(
        "eq", expr_fn("remainder", expr_fn("sub", e[0], Const(float(start))), Const(float(step))), Const(0.0))),
                         "bool", out_id=f"{node.id}.in_slice")
    spread = emit_gather(ctx, node, src, x.shape, [None if j == d else j for j in range(x.rank)], [(d, rel, d)],
                         f"{node.id}.spread")
    hit_b = hit.with_(tuple(q if j == d else 1 for j in range(x.rank)),
                      tuple(hit.strides[0] if j == d else 0 for j in range(x.rank)))
    return [emit_pointwise(ctx, node, [hit_b, spread, x], lambda e: expr_fn("where", e[0], e[1], e[2]), x.dtype,
                           out_shape=x.shape)]


@register("aten.select_scatter.default",
          doc="one `copy` of three pieces (self before the index, src as a size-1 slice, self after)")
def _select_scatter(ctx: Ctx, node: NodeArgs):
    x: View = node.arg(0, "self")
    src: View = node.arg(1, "src")
    d = norm_dim(node, node.arg(2, "dim"), x.rank)
    i = int(node.arg(3, "index"))
    i = i + x.shape[d] if i < 0 else i
    if not 0 <= i < x.shape[d]:
        raise node.fail("bad_argument", f"select_scatter index {i} out of range for size {x.shape[d]}")
    want = x.shape[:d] + x.shape[d + 1:]
    if tuple(src.shape) != tuple(want):
        raise node.fail("shape_mismatch", f"select_scatter of {list(src.shape)} into {list(x.shape)} at dim {d}")
    src1 = src.with_(src.shape[:d] + (1,) + src.shape[d:], src.strides[:d] + (0,) + src.strides[d:])
    return [_scatter_pieces(ctx, node, x, d, i, i + 1, src1)]


@register("prims.rev.default", "aten.flip.default",
          doc="strided view with negative strides (offset at the last element), a `copy` at the first consumer")
def _rev(ctx: Ctx, node: NodeArgs):
    x: View = node.arg(0, "a" if node.target.startswith("prims") else "self")
    dims = {norm_dim(node, d, x.rank) for d in node.arg(1, "dims")}
    strides, offset = list(x.strides), x.offset
    for d in dims:
        if x.shape[d] > 1:
            offset += (x.shape[d] - 1) * strides[d]
            strides[d] = -strides[d]
    return [x.with_(x.shape, tuple(strides), offset=offset, name=node.id)]


@register("aten.unfold.default",
          doc="strided view (windows of `size` every `step` along the dim, a trailing window dim), a `copy` at the first"
              " consumer")
def _unfold(ctx: Ctx, node: NodeArgs):
    x: View = node.arg(0, "self")
    d = norm_dim(node, node.arg(1, "dimension"), x.rank)
    size, step = int(node.arg(2, "size")), int(node.arg(3, "step"))
    n = x.shape[d] if x.rank else 1
    if size < 0 or size > n or step <= 0:
        raise node.fail("bad_argument", f"unfold size {size} step {step} of a dim of {n}")
    if x.rank == 0:
        return [x.with_((size,), (0,), name=node.id)]
    shape, strides = list(x.shape), list(x.strides)
    shape[d] = (n - size) // step + 1
    strides[d] = x.strides[d] * step
    return [x.with_(tuple(shape) + (size,), tuple(strides) + (x.strides[d],), name=node.id)]
