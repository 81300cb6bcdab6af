"""Convolution as im2col + matmul (torch-spyre's conv2d_via_bmm shape; grouped and
depthwise convolutions batch the matmul over the groups), max pooling as an im2col window
+ max reduction. Any number of spatial dims."""
from __future__ import annotations

import math
from typing import Sequence

from lowering.aten.context import Ctx, NodeArgs, View, expr_fn, numel, register
from lowering.aten.matmul import emit_matmul
from lowering.aten.pointwise import emit_pointwise
from lowering.aten.reductions import emit_reduce
from lowering.aten.views import pad_view, reshape
from target.primitives import Const, StridedMap


class Unavailable:
    """A node output the lowering does not compute; using it is an error."""

    def __init__(self, why: str):
        self.why = why


def _spatial(node: NodeArgs, v, n: int, name: str, default: int) -> list[int]:
    if v is None or (isinstance(v, list) and not v):
        return [default] * n
    if isinstance(v, int):
        return [v] * n
    v = list(v)
    if len(v) == 1:
        return v * n
    if len(v) != n:
        raise node.fail("bad_argument", f"{name} {v} for {n} spatial dims")
    return v


def window_view(ctx: Ctx, node: NodeArgs, xp: View, out_sizes: Sequence[int], kernel: Sequence[int],
                stride: Sequence[int], dilation: Sequence[int], channels_last: bool, out_id: str,
                pad_value: float = 0.0) -> View:
    """Materialize the im2col windows of xp [N, C, *S] as [N, *OS, C, *K] (channels_last)
    or [N, C, *OS, *K]: one copy whose strided map walks the windows."""
    ns = len(kernel)
    sp_strides = xp.strides[2:]
    os_strides = [sp_strides[i] * stride[i] for i in range(ns)]
    k_strides = [sp_strides[i] * dilation[i] for i in range(ns)]
    n, c = xp.shape[0], xp.shape[1]
    if channels_last:
        shape = [n, *out_sizes, c, *kernel]
        strides = [xp.strides[0], *os_strides, xp.strides[1], *k_strides]
    else:
        shape = [n, c, *out_sizes, *kernel]
        strides = [xp.strides[0], xp.strides[1], *os_strides, *k_strides]
    tid = ctx.new_tensor(out_id, shape, xp.dtype)
    ctx.emit_copy(tid, [(xp.base, StridedMap(tuple(shape), tuple(strides), xp.offset), (0,) * len(shape))],
                  pad_value, node.id)
    return ctx.tensor_view(tid, out_id)


def _out_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    span = size + 2 * p - d * (k - 1) - 1
    out = (span + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1  # the last window must start inside the input or the left padding
    return out


@register("aten.convolution.default",
          doc=("im2col `copy` (after a pad `copy`) + `matmul` against the regrouped weight, then a bias pointwise; "
               "groups > 1 (grouped, depthwise) make the group a batch dim of the matmul"))
def _convolution(ctx: Ctx, node: NodeArgs):
    """im2col + matmul; groups > 1 (grouped, depthwise) batch the matmul over the groups."""
    x, w, bias = node.arg(0, "input"), node.arg(1, "weight"), node.arg(2, "bias")
    ns = x.rank - 2
    if ns < 1 or w.rank != x.rank:
        raise node.fail("shape_mismatch", f"convolution of {list(x.shape)} with weight {list(w.shape)}")
    stride = _spatial(node, node.arg(3, "stride"), ns, "stride", 1)
    padding = _spatial(node, node.arg(4, "padding"), ns, "padding", 0)
    dilation = _spatial(node, node.arg(5, "dilation"), ns, "dilation", 1)
    if node.arg(6, "transposed", False):
        raise node.fail("unsupported_op", "transposed convolution")
    G = node.arg(8, "groups", 1)
    if not isinstance(G, int) or isinstance(G, bool) or G < 1:
        raise node.fail("bad_argument", f"convolution groups={G!r}")
    N, C = x.shape[:2]
    O, Cg = w.shape[:2]
    kernel = list(w.shape[2:])
    if C != Cg * G or O % G:
        raise node.fail("shape_mismatch", f"input channels {C}, groups {G} vs weight {list(w.shape)}")
    out_sizes = [_out_size(x.shape[2 + i], kernel[i], stride[i], padding[i], dilation[i], False) for i in range(ns)]
    nid = node.id
    xp = pad_view(ctx, node, x, [0, 0, *padding], [0, 0, *padding], 0.0, f"{nid}.padded")
    cols = window_view(ctx, node, xp, out_sizes, kernel, stride, dilation, True, f"{nid}.im2col")
    P, K = numel(out_sizes), Cg * numel(kernel)
    if G == 1:
        cols2 = reshape(ctx, node, cols, [N, P, K], f"{nid}.im2col_rows")
        # regroup the weight to [O, C*K] first (a layout-free copy), then read it transposed
        w2 = ctx.ensure_relabel(reshape(ctx, node, w, [O, K], f"{nid}.weight_rows"), nid)
        w2t = w2.with_(w2.shape[::-1], w2.strides[::-1])
        mm = emit_matmul(ctx, node, cols2, w2t, x.dtype, f"{nid}.mm")  # [N, P, O]
        bias_rows = bias
    else:
        # Grouped: the channels C = G*Cg split, the group becomes a batch dim of the matmul.
        # im2col rows [N, P, G, Cg*K] (a layout-free regroup of [N, *OUT, C, *K]) are read
        # as [N, G, P, Cg*K]; the weight [O, Cg, *K] regroups to [G, Og, Cg*K] and is read
        # transposed; the product is stored [N, P, G, Og], which is [N, P, O] row-major.
        Og = O // G
        rows = ctx.ensure_relabel(reshape(ctx, node, cols, [N, P, G, K], f"{nid}.im2col_rows"), nid)
        xg = rows.with_([N, G, P, K], [rows.strides[d] for d in (0, 2, 1, 3)])
        w2 = ctx.ensure_relabel(reshape(ctx, node, w, [G, Og, K], f"{nid}.weight_rows"), nid)
        w2t = w2.with_([G, K, Og], [w2.strides[d] for d in (0, 2, 1)])
        mm = emit_matmul(ctx, node, xg, w2t, x.dtype, f"{nid}.mm", out_order=(0, 2, 1, 3))  # [N, P, G, Og]
        bias_rows = None if bias is None else reshape(ctx, node, bias, [G, Og], f"{nid}.bias_rows")
    if bias_rows is not None:
        mm = emit_pointwise(ctx, node, [mm, bias_rows], lambda e: expr_fn("add", e[0], e[1]), x.dtype,
                            out_shape=mm.shape, out_id=f"{nid}.biased")
    out = reshape(ctx, node, mm, [N, *out_sizes, O], nid)
    order = [0, ns + 1, *range(1, ns + 1)]
    return [out.with_([out.shape[d] for d in order], [out.strides[d] for d in order], name=nid)]


def _batched(node: NodeArgs, x: View, kernel, what: str) -> tuple[View, bool]:
    """A pooling input with its batch dim: (x, whether it arrived without one)."""
    ns = len(kernel)
    if x.rank not in (ns + 1, ns + 2):
        raise node.fail("shape_mismatch", f"{what} of {list(x.shape)} with kernel {kernel}")
    if x.rank == ns + 1:
        return x.with_((1,) + x.shape, (0,) + x.strides), True
    return x, False


def _max_pool(ctx: Ctx, node: NodeArgs, x: View, kernel, stride, padding, dilation, ceil_mode) -> View:
    ns = len(kernel)
    x, unbatched = _batched(node, x, kernel, "max pool")
    stride = stride or kernel
    sizes = x.shape[2:]
    out_sizes = [_out_size(sizes[i], kernel[i], stride[i], padding[i], dilation[i], ceil_mode) for i in range(ns)]
    # -inf padding up to where the last window ends (ceil_mode windows may overhang)
    after = [max(0, (out_sizes[i] - 1) * stride[i] + dilation[i] * (kernel[i] - 1) + 1 - sizes[i] - padding[i])
             for i in range(ns)]
    xp = pad_view(ctx, node, x, [0, 0, *padding], [0, 0, *after], -math.inf, f"{node.id}.padded")
    win = window_view(ctx, node, xp, out_sizes, kernel, stride, dilation, False, f"{node.id}.windows")
    red = list(range(2 + ns, 2 + 2 * ns))
    out = emit_reduce(ctx, node, win, red, False, "max", None, x.dtype, node.id)
    if unbatched:
        out = out.with_(out.shape[1:], out.strides[1:])
    return out


@register("prims._low_memory_max_pool_with_offsets.default", "aten.max_pool2d_with_indices.default",
          "aten.max_pool2d.default",
          doc=("`-inf` pad `copy`, window `copy`, `reduce max` over the window; reading the offsets/indices output is "
               "unsupported_op"))
def _max_pool_node(ctx: Ctx, node: NodeArgs):
    x = node.arg(0, "self" if node.target.startswith("aten") else "input")
    ks = node.arg(1, "kernel_size")
    # the prims op serves max_pool2d and max_pool3d: its kernel's length says which
    ns = len(ks) if node.target.startswith("prims") and isinstance(ks, list) and len(ks) > 1 else 2
    kernel = _spatial(node, ks, ns, "kernel_size", 1)
    stride = _spatial(node, node.arg(2, "stride"), ns, "stride", 0) if node.arg(2, "stride") else kernel
    padding = _spatial(node, node.arg(3, "padding"), ns, "padding", 0)
    dilation = _spatial(node, node.arg(4, "dilation"), ns, "dilation", 1)
    out = _max_pool(ctx, node, x, kernel, stride, padding, dilation, bool(node.arg(5, "ceil_mode", False)))
    if node.target == "aten.max_pool2d.default":
        return [out]
    return [out, Unavailable("max pool offsets/indices are not computed; only the values output is supported")]


def _avg_pool(ctx: Ctx, node: NodeArgs, x: View, kernel, stride, padding, ceil_mode: bool,
              count_include_pad: bool, divisor_override) -> View:
    """Average pooling: zero-pad copy, window copy, one sum reduction of x / divisor."""
    ns = len(kernel)
    x, unbatched = _batched(node, x, kernel, "avg pool")
    sizes = x.shape[2:]
    out_sizes = [_out_size(sizes[i], kernel[i], stride[i], padding[i], 1, ceil_mode) for i in range(ns)]
    overhang = any((out_sizes[i] - 1) * stride[i] + kernel[i] > sizes[i] + 2 * padding[i] for i in range(ns))
    if overhang or (any(padding) and not count_include_pad and divisor_override is None):
        return _avg_pool_partial(ctx, node, x, unbatched, kernel, stride, padding, out_sizes, count_include_pad,
                                 divisor_override)
    divisor = divisor_override or numel(kernel)
    xp = pad_view(ctx, node, x, [0, 0, *padding], [0, 0, *padding], 0.0, f"{node.id}.padded")
    win = window_view(ctx, node, xp, out_sizes, kernel, stride, [1] * ns, False, f"{node.id}.windows")
    red = list(range(2 + ns, 2 + 2 * ns))
    out = emit_reduce(ctx, node, win, red, False, "sum", lambda e: expr_fn("mul", e[0], Const(1.0 / divisor)),
                      x.dtype, node.id)
    if unbatched:
        out = out.with_(out.shape[1:], out.strides[1:])
    return out


def _avg_pool_partial(ctx: Ctx, node: NodeArgs, x: View, unbatched: bool, kernel, stride, padding, out_sizes,
                      count_include_pad: bool, divisor_override) -> View:
    """Average pooling whose windows cover different numbers of elements (ceil_mode
    overhang, count_include_pad=False): zero-padded windows summed, then divided per output
    position by torch's divisor, the product over dims of the window's extent clipped to the
    padded input (count_include_pad) or to the input itself, built from iotas."""
    from lowering.aten.indexing import int_iota

    ns = len(kernel)
    sizes = x.shape[2:]
    after = [max(padding[i], (out_sizes[i] - 1) * stride[i] + kernel[i] - sizes[i] - padding[i]) for i in range(ns)]
    xp = pad_view(ctx, node, x, [0, 0, *padding], [0, 0, *after], 0.0, f"{node.id}.padded")
    win = window_view(ctx, node, xp, out_sizes, kernel, stride, [1] * ns, False, f"{node.id}.windows")
    red = list(range(2 + ns, 2 + 2 * ns))
    total = emit_reduce(ctx, node, win, red, False, "sum", None, x.dtype, f"{node.id}.sum")
    operands = [total]
    for i in range(ns):
        if divisor_override:
            break
        o = int_iota(ctx, node, out_sizes[i], f"out{i}")
        k, st, p, n = kernel[i], stride[i], padding[i], sizes[i]
        lo = lambda e, st=st, p=p: expr_fn("sub", expr_fn("mul", e, Const(float(st))), Const(float(p)))  # noqa: E731
        hi = lambda e, k=k, n=n, p=p, lo=lo: expr_fn("minimum", expr_fn("add", lo(e), Const(float(k))),  # noqa: E731
                                                     Const(float(n + p)))
        if count_include_pad:
            count = lambda e, lo=lo, hi=hi: expr_fn("sub", hi(e), lo(e))  # noqa: E731
        else:
            count = lambda e, lo=lo, hi=hi, n=n: expr_fn("sub", expr_fn("minimum", hi(e), Const(float(n))),  # noqa: E731
                                                         expr_fn("maximum", lo(e), Const(0.0)))
        extent = emit_pointwise(ctx, node, [o], lambda e, count=count: count(e[0]), "int64",
                                out_id=f"{node.id}.extent{i}")
        operands.append(extent.with_(tuple(out_sizes[j] if j == i else 1 for j in range(ns)),
                                     tuple(extent.strides[0] if j == i else 0 for j in range(ns))))

    def mean(e):
        div = Const(float(divisor_override)) if divisor_override else None
        for f in e[1:]:
            div = f if div is None else expr_fn("mul", div, f)
        return expr_fn("div", e[0], div)
    out = emit_pointwise(ctx, node, operands, mean, x.dtype, out_shape=total.shape, out_id=node.id)
    if unbatched:
        out = out.with_(out.shape[1:], out.strides[1:])
    return out


@register("aten.avg_pool2d.default", "aten.avg_pool3d.default",
          doc=("zero pad `copy`, window `copy`, `reduce sum` of `x / divisor`; partial windows (ceil_mode overhang,"
               " count_include_pad=False): `reduce sum`, then a pointwise divide by torch's per-window divisor"))
def _avg_pool2d(ctx: Ctx, node: NodeArgs):
    x = node.arg(0, "self")
    ns = 3 if node.target == "aten.avg_pool3d.default" else 2
    kernel = _spatial(node, node.arg(1, "kernel_size"), ns, "kernel_size", 1)
    stride = _spatial(node, node.arg(2, "stride"), ns, "stride", 0) if node.arg(2, "stride") else kernel
    padding = _spatial(node, node.arg(3, "padding"), ns, "padding", 0)
    return [_avg_pool(ctx, node, x, kernel, stride, padding, bool(node.arg(4, "ceil_mode", False)),
                      bool(node.arg(5, "count_include_pad", True)), node.arg(6, "divisor_override"))]


@register("aten._adaptive_avg_pool2d.default", "aten.adaptive_avg_pool2d.default", "aten._adaptive_avg_pool3d.default",
          doc=("average pool with kernel = stride = input/output when the output size divides the input; else one"
               " `matmul` per spatial dim with its pooling matrix (1/window on torch's adaptive windows, from iotas)"))
def _adaptive_avg_pool2d(ctx: Ctx, node: NodeArgs):
    x = node.arg(0, "self")
    ns = 3 if node.target == "aten._adaptive_avg_pool3d.default" else 2
    out_sizes = _spatial(node, node.arg(1, "output_size"), ns, "output_size", 1)
    sizes = x.shape[-ns:]
    if any(o <= 0 for o in out_sizes) or x.rank < ns:
        raise node.fail("bad_argument", f"adaptive average pooling {list(sizes)} -> {out_sizes}")
    if all(s % o == 0 for s, o in zip(sizes, out_sizes)):
        kernel = [s // o for s, o in zip(sizes, out_sizes)]
        return [_avg_pool(ctx, node, x, kernel, kernel, [0] * ns, False, True, None)]
    # windows of different sizes: per spatial dim one matmul with its pooling matrix
    for k in range(ns):
        x = _pool_dim(ctx, node, x, x.rank - ns + k, out_sizes[k], node.id if k == ns - 1 else f"{node.id}.dim{k}")
    return [x]


def _pool_dim(ctx: Ctx, node: NodeArgs, x: View, d: int, out: int, out_id: str) -> View:
    """Adaptive average along dim d as a matmul with the pooling matrix P [out, n]:
    P[o, i] = 1 / (end_o - start_o) for start_o = floor(o*n/out) <= i < end_o = ceil((o+1)*n/out)
    (torch's adaptive windows), built from iotas in exact integer arithmetic."""
    from lowering.aten.indexing import int_iota

    n = x.shape[d]
    if n == out:
        return x.with_(x.shape, x.strides, name=out_id)
    rows, cols = int_iota(ctx, node, out, f"{out_id}.out_pos"), int_iota(ctx, node, n, f"{out_id}.in_pos")
    start = lambda o: expr_fn("floordiv", expr_fn("mul", o, Const(float(n))), Const(float(out)))  # noqa: E731
    end = lambda o: expr_fn("floordiv", expr_fn("add", expr_fn("mul", expr_fn("add", o, Const(1.0)),  # noqa: E731
                                                               Const(float(n))), Const(float(out - 1))), Const(float(out)))
    weight = emit_pointwise(ctx, node, [rows.with_((out, 1), (1, 0)), cols.with_((1, n), (0, 1))], lambda e: expr_fn(
        "where", expr_fn("logical_and", expr_fn("ge", e[1], start(e[0])), expr_fn("lt", e[1], end(e[0]))),
        expr_fn("div", Const(1.0), expr_fn("sub", end(e[0]), start(e[0]))), Const(0.0)),
        x.dtype, out_shape=(out, n), out_id=f"{out_id}.weights")
    if d == x.rank - 1:   # [..., n] @ Pᵀ [n, out]
        pt = weight.with_((n, out), (weight.strides[1], weight.strides[0]))
        return emit_matmul(ctx, node, x, pt, x.dtype, out_id)
    before, after = numel(x.shape[:d]), numel(x.shape[d + 1:])
    x3 = reshape(ctx, node, x, (before, n, after), f"{out_id}.grouped")
    y = emit_matmul(ctx, node, weight.with_((1, out, n), (0,) + weight.strides), x3, x.dtype, f"{out_id}.pooled")
    return reshape(ctx, node, y, tuple(x.shape[:d]) + (out,) + tuple(x.shape[d + 1:]), out_id)
