"""Mixture-of-experts routing and expert matmuls on device.

transformers' MoE layers (Mixtral, Qwen2-MoE, ...; `experts_implementation="grouped_mm"`,
the default) route with top-k over the router's softmax, sort the (token, slot) pairs by
expert, count them per expert (`histc`, `cumsum` -> group offsets), run the experts as
grouped matmuls over the sorted rows, and scatter the rows back (`index_put` of the inverse
permutation). Everything here lowers to the existing primitive bodies except the expert
matmul itself, which is the one new body (`grouped_matmul`):

- top-k: k rounds of (`reduce max` of the not-yet-taken values, `reduce min` of the
  positions holding that value), then a `gather` of the values and a `copy` (cat) of the
  positions. Ties go to the lowest index (see `_topk`).
- sort: a rank per element (`reduce sum` over an [n, n] comparison: elements before it,
  equal elements at lower positions counted too — a stable sort), the permutation from the
  ranks (`reduce sum` over [n, n] of the position whose rank is p), values by `gather`.
- histc: `reduce sum` over [bins, elements] of "element falls in bin b" with torch's
  linear bin formula.
- index_put (one index tensor on dim 0, no accumulation): the last position writing each
  row (`reduce max` over [rows, positions]), a `gather` of those value rows, a pointwise
  `where` against the original.
- grouped_mm (transformers' `grouped_mm_fallback` custom op, `aten._grouped_mm`): per-row
  expert id from the offsets (`reduce sum` of offs[g] <= row), then `grouped_matmul`.

The comparison-based ops cost O(n^2) SFP work on [n, n] iteration spaces (n = tokens *
top_k); at a 512-token prefill with top-2 that is about 1M element steps per op, small
beside the expert matmuls.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from lowering.aten.context import FLOAT_DTYPES, INT_DTYPES, Ctx, NodeArgs, View, expr_fn, register
from lowering.aten.indexing import emit_gather
from lowering.aten.views import norm_dim
from target.primitives import (Access, Const, Expr, FillBody, GroupedMatmulBody, In, IterDim, ReduceBody,
                                 StridedMap)

_INF = float("inf")


def _iota(ctx: Ctx, node: NodeArgs, n: int, name: str) -> View:
    """An int64 [0, n) tensor (a `fill` with iota)."""
    tid = ctx.new_tensor(f"{node.id}.{name}", (n,), "int64")
    dims = [IterDim("d0", n)] if n > 1 else []
    ctx.emit(tid, dims, [], Access(tid, (0,) if n > 1 else (None,)),
             FillBody(0.0, iota_dim=0, start=0.0, step=1.0), node.id)
    return ctx.tensor_view(tid)


def _isnan(e: Expr) -> Expr:
    return expr_fn("ne", e, e)


def _same(a: Expr, b: Expr) -> Expr:
    """a == b, NaN equal to NaN (torch orders NaN as one value)."""
    return expr_fn("logical_or", expr_fn("eq", a, b), expr_fn("logical_and", _isnan(a), _isnan(b)))


def _any(terms: Sequence[Expr]) -> Optional[Expr]:
    out = None
    for t in terms:
        out = t if out is None else expr_fn("logical_or", out, t)
    return out


def _row_op(ctx: Ctx, node: NodeArgs, x: View, d: int, full: Sequence[View], rows: Sequence[View],
            col: Sequence[View], build, fn: str, out_dtype: str, out_id: str) -> View:
    """out (x's shape with size 1 at d) = fold `fn` over dim d of build(exprs): `full`
    operands have x's shape, `rows` x's shape with 1 at d, `col` are 1-D along d. Exprs
    come in that order."""
    iters, it = ctx.iter_dims_for(x.shape, kinds=["reduction" if j == d else "parallel" for j in range(x.rank)])
    kept = [None if j == d else it[j] for j in range(x.rank)]
    accesses = [ctx.access(v, it, node.id) for v in full]
    accesses += [ctx.access(v, kept, node.id) for v in rows]
    accesses += [ctx.access(v, [it[d]], node.id) for v in col]
    out_shape = [1 if j == d else s for j, s in enumerate(x.shape)]
    tid = ctx.new_tensor(out_id, out_shape, out_dtype)
    expr = build([In(i) for i in range(len(accesses))])
    ctx.emit(tid, iters, accesses, Access(tid, tuple(kept)), ReduceBody(fn, expr), node.id)
    return ctx.tensor_view(tid, out_id)


def _cat(ctx: Ctx, node: NodeArgs, parts: Sequence[View], d: int, out_id: str) -> View:
    shape = list(parts[0].shape)
    shape[d] = 0
    pieces = []
    for p in parts:
        offs = tuple(shape[d] if j == d else 0 for j in range(len(shape)))
        pieces.append((p.base, StridedMap(p.shape, p.strides, p.offset), offs))
        shape[d] += p.shape[d]
    tid = ctx.new_tensor(out_id, shape, parts[0].dtype)
    ctx.emit_copy(tid, pieces, 0.0, node.id)
    return ctx.tensor_view(tid, out_id)


# -- top-k ---------------------------------------------------------------------------------
@register("aten.topk.default",
          doc=("k rounds of `reduce max` over the values not yet taken and `reduce min` of the positions"
               " holding it (ties: lowest index first; NaN largest), then `gather` of the values and a `copy`"
               " of the positions; largest=False and integer inputs unsupported"))
def _topk(ctx: Ctx, node: NodeArgs):
    """Round r takes the largest value among positions not taken in rounds < r (NaN counts
    as largest, as in torch) and, of the positions holding it, the lowest. So equal values
    come out lowest index first. torch's CPU kernel leaves the order of ties to libstdc++'s
    nth_element / partial_sort (e.g. an all-equal row of 8, k=2 gives [6, 5]); values always
    agree, tied indices may differ (docs/ops.md)."""
    x: View = node.arg(0, "self")
    k = int(node.arg(1, "k"))
    d = norm_dim(node, node.arg(2, "dim", -1), x.rank)
    largest = node.arg(3, "largest", True)
    if not largest:
        raise node.fail("unsupported_op", "topk with largest=False")
    if x.dtype not in FLOAT_DTYPES:
        raise node.fail("unsupported_op", f"topk of {x.dtype}")
    n = x.shape[d] if x.rank else 1
    if x.rank == 0 or not 0 < k <= n:
        raise node.fail("bad_argument", f"topk k={k} over a dim of {n}")
    iota = _iota(ctx, node, n, "iota")
    picked: list[View] = []
    for r in range(k):
        prev = list(picked)

        def taken(e: list[Expr], first_prev: int, pos: Expr) -> Optional[Expr]:
            return _any([expr_fn("eq", pos, e[first_prev + j]) for j in range(len(prev))])

        # value of round r: the max over the positions not taken yet
        if prev:
            def build_v(e, prev=prev):
                t = taken(e, 1, e[1 + len(prev)])
                return expr_fn("where", t, Const(-_INF), e[0])
            v = _row_op(ctx, node, x, d, [x], prev, [iota], build_v, "max", x.dtype, f"{node.id}.v{r}")
        else:
            v = _row_op(ctx, node, x, d, [x], [], [], lambda e: e[0], "max", x.dtype, f"{node.id}.v{r}")

        # its position: the lowest free position holding that value
        def build_i(e, prev=prev):
            pos = e[2 + len(prev)]
            hit = _same(e[0], e[1])
            t = taken(e, 2, pos)
            if t is not None:
                hit = expr_fn("logical_and", hit, expr_fn("logical_not", t))
            return expr_fn("where", hit, pos, Const(float(n)))
        picked.append(_row_op(ctx, node, x, d, [x], [v] + prev, [iota], build_i, "min", "int64",
                              f"{node.id}.i{r}"))
    idx = picked[0] if k == 1 else _cat(ctx, node, picked, d, f"{node.id}:1")
    out_shape = list(x.shape)
    out_shape[d] = k
    values = emit_gather(ctx, node, x, out_shape, [None if j == d else j for j in range(x.rank)],
                         [(d, idx, 0)], node.id)
    return [values, idx.with_(idx.shape, idx.strides, name=f"{node.id}:1")]


# -- sort ----------------------------------------------------------------------------------
@register("aten.sort.default", "aten.sort.stable",
          doc=("stable sort: a rank per element (`reduce sum` over [n, n] comparisons, equal elements by"
               " position; NaN last, first when descending), the permutation from the ranks (`reduce sum`"
               " over [n, n]), values by `gather`"))
def _sort(ctx: Ctx, node: NodeArgs):
    x: View = node.arg(0, "self")
    if node.target == "aten.sort.stable":
        d = node.kwargs.get("dim", -1)
        descending = node.kwargs.get("descending", False)
    else:
        d = node.arg(1, "dim", -1)
        descending = node.arg(2, "descending", False)
    if x.rank == 0:
        raise node.fail("unsupported_op", "sort of a 0-d tensor")
    d = norm_dim(node, d, x.rank)
    n = x.shape[d]
    if n == 1:
        zero = _iota(ctx, node, 1, "iota")
        return [x, zero.with_(x.shape, tuple(0 for _ in x.shape), name=f"{node.id}:1")]
    iota = _iota(ctx, node, n, "iota")
    is_float = x.dtype in FLOAT_DTYPES

    # rank[i] = #{j: x[j] sorts before x[i]} + #{j < i: x[j] ties x[i]}
    iters: list[IterDim] = []
    it: list[Optional[int]] = []
    for j, s in enumerate(x.shape):
        if s == 1:
            it.append(None)
            continue
        it.append(len(iters))
        iters.append(IterDim(f"d{j}", s))
    jd = len(iters)
    iters.append(IterDim("r", n, "reduction"))
    it_j = list(it)
    it_j[d] = jd
    acc = [ctx.access(x, it, node.id), ctx.access(x, it_j, node.id),
           ctx.access(iota, [it[d]], node.id), ctx.access(iota, [jd], node.id)]

    def before(a: Expr, b: Expr) -> Expr:   # a sorts strictly before b
        if descending:
            lt = expr_fn("gt", a, b)
            if is_float:
                lt = expr_fn("logical_or", lt, expr_fn("logical_and", _isnan(a), expr_fn("logical_not", _isnan(b))))
        else:
            lt = expr_fn("lt", a, b)
            if is_float:
                lt = expr_fn("logical_or", lt, expr_fn("logical_and", _isnan(b), expr_fn("logical_not", _isnan(a))))
        return lt

    xi, xj, pi, pj = In(0), In(1), In(2), In(3)
    same = _same(xj, xi) if is_float else expr_fn("eq", xj, xi)
    expr = expr_fn("logical_or", before(xj, xi), expr_fn("logical_and", same, expr_fn("lt", pj, pi)))
    rank_t = ctx.new_tensor(f"{node.id}.rank", x.shape, "int64")
    ctx.emit(rank_t, iters, acc, Access(rank_t, tuple(it)), ReduceBody("sum", expr), node.id)
    rank = ctx.tensor_view(rank_t)

    # perm[p] = the i whose rank is p
    acc2 = [ctx.access(rank, it_j, node.id), ctx.access(iota, [jd], node.id), ctx.access(iota, [it[d]], node.id)]
    perm_t = ctx.new_tensor(f"{node.id}:1", x.shape, "int64")
    ctx.emit(perm_t, iters, acc2, Access(perm_t, tuple(it)),
             ReduceBody("sum", expr_fn("where", expr_fn("eq", In(0), In(2)), In(1), Const(0.0))), node.id)
    perm = ctx.tensor_view(perm_t, f"{node.id}:1")
    values = emit_gather(ctx, node, x, x.shape, [None if j == d else j for j in range(x.rank)],
                         [(d, perm, 0)], node.id)
    return [values, perm]


# -- histc ---------------------------------------------------------------------------------
@register("aten.histc.default",
          doc=("`reduce sum` over [bins, elements] of `min <= x <= max and min(floor((x - min) * bins /"
               " (max - min)), bins - 1) == b` (torch's linear bin formula, float32); min == max unsupported"))
def _histc(ctx: Ctx, node: NodeArgs):
    x: View = node.arg(0, "self")
    bins = int(node.arg(1, "bins", 100))
    lo, hi = float(node.arg(2, "min", 0)), float(node.arg(3, "max", 0))
    if x.dtype not in FLOAT_DTYPES:
        raise node.fail("unsupported_op", f"histc of {x.dtype}")
    if not lo < hi:
        raise node.fail("unsupported_op", "histc with min >= max (range taken from the data)")
    if bins < 1:
        raise node.fail("bad_argument", f"histc with {bins} bins")
    f32 = np.float32
    lo32, hi32 = f32(lo), f32(hi)
    width = float(f32(hi32 - lo32))
    iota = _iota(ctx, node, bins, "bins")
    iters: list[IterDim] = []
    b_it: Optional[int] = None
    if bins > 1:
        b_it = 0
        iters.append(IterDim("b", bins))
    x_it: list[Optional[int]] = []
    for j, s in enumerate(x.shape):
        if s == 1:
            x_it.append(None)
            continue
        x_it.append(len(iters))
        iters.append(IterDim(f"r{j}", s, "reduction"))
    acc = [ctx.access(x, x_it, node.id), ctx.access(iota, [b_it], node.id)]
    xe = In(0)
    valid = expr_fn("logical_and", expr_fn("ge", xe, Const(float(lo32))), expr_fn("le", xe, Const(float(hi32))))
    pos = expr_fn("div", expr_fn("mul", expr_fn("sub", xe, Const(float(lo32))), Const(float(bins))), Const(width))
    pos = expr_fn("minimum", expr_fn("floordiv", pos, Const(1.0)), Const(float(bins - 1)))
    hit = expr_fn("logical_and", valid, expr_fn("eq", pos, In(1)))
    tid = ctx.new_tensor(node.id, (bins,), x.dtype)
    ctx.emit(tid, iters, acc, Access(tid, (b_it,)), ReduceBody("sum", hit), node.id)
    return [ctx.tensor_view(tid, node.id)]


# -- index_put -----------------------------------------------------------------------------
@register("aten.index_put.default",
          doc=("one index tensor on dim 0, no accumulation: the last position writing each row (`reduce max`"
               " over [rows, positions]), `gather` of those value rows, pointwise `where` against self"))
def _index_put(ctx: Ctx, node: NodeArgs):
    from lowering.aten.pointwise import emit_pointwise

    x: View = node.arg(0, "self")
    indices = list(node.arg(1, "indices"))
    values: View = node.arg(2, "values")
    if node.arg(3, "accumulate", False):
        raise node.fail("unsupported_op", "index_put with accumulate=True")
    if x.rank == 0 or len(indices) != 1 or indices[0] is None:
        raise node.fail("unsupported_op", "index_put with other than one index tensor on dim 0")
    idx: View = indices[0]
    if idx.dtype not in INT_DTYPES or idx.rank != 1:
        raise node.fail("unsupported_op", f"index_put with a {idx.rank}-D {idx.dtype} index")
    if not isinstance(values, View):
        raise node.fail("unsupported_op", "index_put of a scalar value")
    P, I = x.shape[0], idx.shape[0]
    rest = tuple(x.shape[1:])
    # last[p] = max{i : idx[i] (wrapped) == p}, -1 when no position writes row p
    iota_p, iota_i = _iota(ctx, node, P, "rows"), _iota(ctx, node, I, "pos")
    iters, (p_it, i_it) = ctx.iter_dims_for((P, I), kinds=("parallel", "reduction"))
    acc = [ctx.access(idx, [i_it], node.id), ctx.access(iota_i, [i_it], node.id),
           ctx.access(iota_p, [p_it], node.id)]
    wrapped = expr_fn("where", expr_fn("lt", In(0), Const(0.0)), expr_fn("add", In(0), Const(float(P))), In(0))
    expr = expr_fn("where", expr_fn("eq", wrapped, In(2)), In(1), Const(-1.0))
    last_t = ctx.new_tensor(f"{node.id}.last", (P,), "int64")
    ctx.emit(last_t, iters, acc, Access(last_t, (p_it,)), ReduceBody("max", expr), node.id)
    last = ctx.tensor_view(last_t)
    last_b = last.with_((P,) + (1,) * len(rest), (1,) + (0,) * len(rest))
    vshape = tuple(values.shape)
    if len(vshape) == 1 + len(rest) and vshape[0] == I and I > 1:
        row = emit_pointwise(ctx, node, [last], lambda e: expr_fn("maximum", e[0], Const(0.0)), "int64",
                             out_id=f"{node.id}.row")
        src = emit_gather(ctx, node, values, (P,) + vshape[1:], [None] + list(range(1, len(vshape))),
                          [(0, row, 0)], f"{node.id}.src")
    else:
        src = values
    out = emit_pointwise(ctx, node, [last_b, src, x],
                         lambda e: expr_fn("where", expr_fn("ge", e[0], Const(0.0)), e[1], e[2]),
                         x.dtype, out_shape=x.shape)
    return [out]


# -- grouped matmul ------------------------------------------------------------------------
def emit_grouped_matmul(ctx: Ctx, node: NodeArgs, x: View, w: View, offs: View, out_dtype: str) -> View:
    """x [S, K] rows sorted by group, w [G, K, N], offs [G] cumulative row counts: row m uses
    w[g] for offs[g-1] <= m < offs[g]; rows at or past offs[-1] are 0."""
    if x.rank != 2 or w.rank != 3 or offs.rank != 1:
        raise node.fail("unsupported_op", f"grouped mm of {list(x.shape)} x {list(w.shape)} offsets "
                                          f"{list(offs.shape)} (only 2-D x 3-D with 1-D offsets)")
    S, K = x.shape
    G, K2, N = w.shape
    if K != K2 or offs.shape[0] != G:
        raise node.fail("shape_mismatch", f"grouped mm of {list(x.shape)} x {list(w.shape)} offsets "
                                          f"{list(offs.shape)}")
    if offs.dtype not in INT_DTYPES:
        raise node.fail("unsupported_op", f"grouped mm offsets of {offs.dtype}")
    # gid[m] = #{g : offs[g] <= m}
    iota = _iota(ctx, node, S, "rows")
    iters, (m_it, g_it) = ctx.iter_dims_for((S, G), kinds=("parallel", "reduction"))
    acc = [ctx.access(offs, [g_it], node.id), ctx.access(iota, [m_it], node.id)]
    gid_t = ctx.new_tensor(f"{node.id}.group", (S,), "int64")
    ctx.emit(gid_t, iters, acc, Access(gid_t, (m_it,)), ReduceBody("sum", expr_fn("le", In(0), In(1))), node.id)
    gid = ctx.tensor_view(gid_t)
    # out[m, n] = sum_k x[m, k] * w[gid[m], k, n]; iteration dims m, n, k, g
    m, n, k, g = 0, 1, 2, 3
    iters2 = [IterDim("m", S), IterDim("n", N), IterDim("k", K, "reduction"), IterDim("g", G, "reduction")]
    ax = ctx.access(x, [m, k], node.id)
    aw = ctx.access(w, [g, k, n], node.id)
    ag = ctx.access(gid, [m], node.id)
    tid = ctx.new_tensor(node.id, (S, N), out_dtype)
    ctx.emit(tid, iters2, [ax, aw, ag], Access(tid, (m, n)), GroupedMatmulBody(m, n, k, g), node.id)
    return ctx.tensor_view(tid, node.id)


@register("transformers.grouped_mm_fallback.default", "aten._grouped_mm.default",
          doc=("per-row expert id from the offsets (`reduce sum` of `offs[g] <= row`), then `grouped_matmul`"
               " (iteration dims m, n, k, g; rows past the last offset are 0); 2-D x 3-D with offsets only"))
def _grouped_mm(ctx: Ctx, node: NodeArgs):
    custom = node.target.startswith("transformers.")
    x, w = node.arg(0, "input" if custom else "self"), node.arg(1, "weight" if custom else "mat2")
    offs = node.arg(2, "offs")
    if node.target == "aten._grouped_mm.default" and node.arg(3, "bias") is not None:
        raise node.fail("unsupported_op", "_grouped_mm with a bias")
    if not isinstance(offs, View):
        raise node.fail("unsupported_op", "grouped mm without offsets")
    return [emit_grouped_matmul(ctx, node, x, w, offs, node.out_dtypes[0])]
