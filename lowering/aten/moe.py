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
- moe_mm (Foundation Model Stack's `moe::moe_mm`): the rows carry their expert id already
  (the token-to-expert mapping); each token's row repeated per routed slot, then
  `grouped_matmul`. FMS's block alignment before it (scatter.value, scatter_add, cumsum,
  sort) lowers in lowering/aten/indexing.py and the others; it only schedules the GPU kernel.

The comparison-based ops cost O(n^2) SFP work on [n, n] iteration spaces (n = tokens *
top_k); at a 512-token prefill with top-2 that is about 1M element steps per op, small
beside the expert matmuls.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from lowering.aten.context import FLOAT_DTYPES, INT_DTYPES, Ctx, NodeArgs, View, expr_fn, register
from lowering.aten.indexing import emit_gather, int_iota
from lowering.aten.views import norm_dim
from target.primitives import (Access, Const, Expr, GroupedMatmulBody, In, IterDim, ReduceBody,
                                 StridedMap)

_INF = float("inf")


_iota = int_iota


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


# -- ranks (sort, kthvalue, median) -----------------------------------------------------------
def emit_rank(ctx: Ctx, node: NodeArgs, x: View, d: int, descending: bool, iota: View):
    """rank[i] along d = #{j: x[j] sorts before x[i]} + #{j < i: x[j] ties x[i]} (a stable
    order; NaN last, first when descending): one `reduce sum` over [x's dims, j]. Returns
    (rank view, the iteration dims, x's dim -> iteration dim, the index of j's dim)."""
    is_float = x.dtype in FLOAT_DTYPES
    n = x.shape[d]
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
    return ctx.tensor_view(rank_t), iters, it, jd


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
    rank, iters, it, jd = emit_rank(ctx, node, x, d, descending, iota)
    it_j = list(it)
    it_j[d] = jd

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
          doc=("one index tensor on one dim (the others None): the last position writing each row along that dim"
               " (`reduce max` over [rows, positions]), `gather` of those value rows, pointwise `where` against self;"
               " accumulate=True: `reduce sum` over the positions of `where(index == row, values, 0)`, added to self"))
def _index_put(ctx: Ctx, node: NodeArgs):
    from lowering.aten.pointwise import emit_pointwise

    x: View = node.arg(0, "self")
    indices = list(node.arg(1, "indices"))
    values = node.arg(2, "values")
    accumulate = bool(node.arg(3, "accumulate", False))
    given = [j for j, t in enumerate(indices) if t is not None]
    if x.rank == 0 or len(given) != 1 or len(indices) > x.rank:
        raise node.fail("unsupported_op", "index_put with other than one index tensor")
    d = given[0]
    idx: View = indices[d]
    if idx.dtype not in INT_DTYPES or idx.rank != 1:
        raise node.fail("unsupported_op", f"index_put with a {idx.rank}-D {idx.dtype} index")
    if not isinstance(values, View):
        raise node.fail("unsupported_op", "index_put of a scalar value")
    P, I = x.shape[d], idx.shape[0]
    # values broadcast to the indexed shape: x's shape with dim d replaced by the I positions
    vshape = tuple(x.shape[:d]) + (I,) + tuple(x.shape[d + 1:])
    lead = len(vshape) - values.rank
    if lead < 0 or any(s not in (1, t) for s, t in zip(values.shape, vshape[lead:])):
        raise node.fail("shape_mismatch", f"index_put values {list(values.shape)} for {list(vshape)}")
    vals = values.with_(vshape, (0,) * lead + tuple(st if s == t else 0 for s, t, st in
                                                  zip(values.shape, vshape[lead:], values.strides)))
    wrapped = lambda e: expr_fn("where", expr_fn("lt", e, Const(0.0)), expr_fn("add", e, Const(float(P))), e)  # noqa: E731
    iota_p = _iota(ctx, node, P, "rows")
    if accumulate:
        # added[.., p, ..] = sum_i [idx[i] == p] * values[.., i, ..]
        shape = tuple(x.shape) + (I,)
        iters, it = ctx.iter_dims_for(shape, kinds=["parallel"] * x.rank + ["reduction"], keep=(x.rank,))
        v_it = list(it[:x.rank])
        v_it[d] = it[-1]
        acc = [ctx.access(idx, [it[-1]], node.id), ctx.access(iota_p, [it[d]], node.id),
               ctx.access(vals, v_it, node.id)]
        expr = expr_fn("where", expr_fn("eq", wrapped(In(0)), In(1)), In(2), Const(0.0))
        acc_dtype = x.dtype if x.dtype in FLOAT_DTYPES else "int64"
        added_t = ctx.new_tensor(f"{node.id}.added", x.shape, acc_dtype)
        ctx.emit(added_t, iters, acc, Access(added_t, tuple(it[:x.rank])), ReduceBody("sum", expr), node.id)
        return [emit_pointwise(ctx, node, [x, ctx.tensor_view(added_t)], lambda e: expr_fn("add", e[0], e[1]),
                               x.dtype, out_shape=x.shape)]
    # last[p] = max{i : idx[i] (wrapped) == p}, -1 when no position writes row p
    iota_i = _iota(ctx, node, I, "pos")
    iters, (p_it, i_it) = ctx.iter_dims_for((P, I), kinds=("parallel", "reduction"))
    acc = [ctx.access(idx, [i_it], node.id), ctx.access(iota_i, [i_it], node.id),
           ctx.access(iota_p, [p_it], node.id)]
    expr = expr_fn("where", expr_fn("eq", wrapped(In(0)), In(2)), In(1), Const(-1.0))
    last_t = ctx.new_tensor(f"{node.id}.last", (P,), "int64")
    ctx.emit(last_t, iters, acc, Access(last_t, (p_it,)), ReduceBody("max", expr), node.id)
    last = ctx.tensor_view(last_t)
    last_b = last.with_(tuple(P if j == d else 1 for j in range(x.rank)),
                        tuple(last.strides[0] if j == d else 0 for j in range(x.rank)))
    if I > 1 and vals.strides[d] != 0:
        row = emit_pointwise(ctx, node, [last], lambda e: expr_fn("maximum", e[0], Const(0.0)), "int64",
                             out_id=f"{node.id}.row")
        src = emit_gather(ctx, node, vals, x.shape, [None if j == d else j for j in range(x.rank)],
                          [(d, row, d)], f"{node.id}.src")
    else:   # every position writes the same values: read them broadcast along d
        src = vals.with_(x.shape, tuple(0 if j == d else st for j, st in enumerate(vals.strides)))
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
    S = x.shape[0]
    G = w.shape[0]
    if offs.shape[0] != G:
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
    return emit_grouped_matmul_by_id(ctx, node, x, w, ctx.tensor_view(gid_t), out_dtype, node.id)


def emit_grouped_matmul_by_id(ctx: Ctx, node: NodeArgs, x: View, w: View, gid: View, out_dtype: str,
                              out_id: str) -> View:
    """out[m, n] = sum_k x[m, k] * w[gid[m], k, n] for x [S, K], w [G, K, N], gid [S] (rows
    whose id is outside [0, G) are 0): the `grouped_matmul` body, iteration dims m, n, k, g."""
    if x.rank != 2 or w.rank != 3 or gid.rank != 1:
        raise node.fail("unsupported_op", f"grouped mm of {list(x.shape)} x {list(w.shape)} ids "
                                          f"{list(gid.shape)} (only 2-D x 3-D with 1-D ids)")
    S, K = x.shape
    G, K2, N = w.shape
    if K != K2 or gid.shape[0] != S:
        raise node.fail("shape_mismatch", f"grouped mm of {list(x.shape)} x {list(w.shape)} ids {list(gid.shape)}")
    if gid.dtype not in INT_DTYPES:
        raise node.fail("unsupported_op", f"grouped mm expert ids of {gid.dtype}")
    m, n, k, g = 0, 1, 2, 3
    iters2 = [IterDim("m", S), IterDim("n", N), IterDim("k", K, "reduction"), IterDim("g", G, "reduction")]
    ax = ctx.access(x, [m, k], node.id)
    aw = ctx.access(w, [g, k, n], node.id)
    ag = ctx.access(gid, [m], node.id)
    tid = ctx.new_tensor(out_id, (S, N), out_dtype)
    ctx.emit(tid, iters2, [ax, aw, ag], Access(tid, (m, n)), GroupedMatmulBody(m, n, k, g), node.id)
    return ctx.tensor_view(tid, out_id)


@register("moe.moe_mm.default",
          doc=("FMS's expert matmul: row t·topk + a of the input repeated topk times (a `copy` when topk > 1) times"
               " `moe_matrix[token_expert_mapping[t, a]]ᵀ` as one `grouped_matmul` with the flattened mapping as"
               " the per-row expert id (ids outside [0, E) give 0 rows, as FMS's CPU kernel); the block-alignment"
               " arguments (a GPU kernel's schedule) are not read"))
def _moe_mm(ctx: Ctx, node: NodeArgs):
    """torch.ops.moe.moe_mm (fms/triton/pytorch_ops.py): input [T, D], moe_matrix [E, N, D],
    token_expert_mapping [M, A] with M*A == T*topk; output [M, A, N]. The CPU kernel's
    semantics: out[r] = a[r] @ moe_matrix[mapping.flat[r]]ᵀ, a = input's rows each repeated
    topk times. padded_token_ids_per_block, expert_block_mapping and total_padded_tokens
    only schedule the Triton kernel's blocks; the result does not depend on them."""
    from lowering.aten.views import reshape

    x: View = node.arg(0, "input")
    w: View = node.arg(1, "moe_matrix")
    mapping: View = node.arg(2, "token_expert_mapping")
    topk = int(node.arg(6, "topk"))
    if x.rank != 2 or w.rank != 3 or mapping.rank != 2:
        raise node.fail("unsupported_op", f"moe_mm of input {list(x.shape)}, matrix {list(w.shape)}, mapping "
                                          f"{list(mapping.shape)} (needs 2-D, 3-D, 2-D)")
    T, D = x.shape
    E, N, D2 = w.shape
    M, A = mapping.shape
    if D != D2 or topk < 1 or T * topk != M * A:
        raise node.fail("shape_mismatch", f"moe_mm of input {list(x.shape)} (topk {topk}), matrix {list(w.shape)},"
                                          f" mapping {list(mapping.shape)}")
    rows = x
    if topk > 1:  # each token's row once per routed slot: a stride-0 view, materialized by the regroup
        rows = reshape(ctx, node, x.with_((T, topk, D), (x.strides[0], 0, x.strides[1])), (T * topk, D),
                       f"{node.id}.rows")
    gid = reshape(ctx, node, mapping, (M * A,), f"{node.id}.expert")
    wt = w.with_((E, D, N), (w.strides[0], w.strides[2], w.strides[1]))   # moe_matrix[e]ᵀ, read through the Access
    out = emit_grouped_matmul_by_id(ctx, node, rows, wt, gid, node.out_dtypes[0], node.id)
    return [reshape(ctx, node, out, (M, A, N), node.id)]


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


# -- k-th smallest: kthvalue, median ----------------------------------------------------------
def _kth(ctx: Ctx, node: NodeArgs, x: View, d: int, k: int, keepdim: bool, nan_propagates: bool) -> list:
    """Value and index of the element of stable rank k (0-based) along d: one rank
    reduction, then `reduce max` of `where(rank == k, x, -inf)` and of `where(rank == k, i,
    -1)`. nan_propagates (median): a row holding NaN answers NaN at its first NaN."""
    from lowering.aten.reductions import emit_reduce

    n = x.shape[d]
    iota = _iota(ctx, node, n, "iota")
    rank, _, _, _ = emit_rank(ctx, node, x, d, False, iota)
    pos = iota.with_(x.shape, tuple(iota.strides[0] if j == d else 0 for j in range(x.rank)))
    low = -_INF if x.dtype in FLOAT_DTYPES else float(-2 ** 62)
    picked = lambda e: expr_fn("eq", e[1], Const(float(k)))  # noqa: E731
    vid, iid = (f"{node.id}.kth", f"{node.id}.kth_index") if nan_propagates else (node.id, f"{node.id}:1")
    value = emit_reduce(ctx, node, x, [d], keepdim, "max", lambda e: expr_fn("where", picked(e), e[0], Const(low)),
                        x.dtype, vid, extra=[rank])
    index = emit_reduce(ctx, node, x, [d], keepdim, "max", lambda e: expr_fn("where", picked(e), e[2], Const(-1.0)),
                        "int64", iid, extra=[rank, pos])
    if not nan_propagates or x.dtype not in FLOAT_DTYPES:
        return [value.with_(value.shape, value.strides, name=node.id), index.with_(index.shape, index.strides,
                                                                                   name=f"{node.id}:1")]
    from lowering.aten.pointwise import emit_pointwise

    first_nan = emit_reduce(ctx, node, x, [d], keepdim, "min", lambda e: expr_fn("where", _isnan(e[0]), e[1],
                                                                                 Const(float(n))),
                            "int64", f"{node.id}.first_nan", extra=[pos])
    has_nan = lambda e: expr_fn("lt", e[0], Const(float(n)))  # noqa: E731
    nan = float("nan")
    out_v = emit_pointwise(ctx, node, [first_nan, value], lambda e: expr_fn("where", has_nan(e), Const(nan), e[1]),
                           x.dtype, out_id=node.id)
    out_i = emit_pointwise(ctx, node, [first_nan, index], lambda e: expr_fn("where", has_nan(e), e[0], e[1]),
                           "int64", out_id=f"{node.id}:1")
    return [out_v, out_i]


@register("aten.kthvalue.default",
          doc=("the element of stable rank k-1 along dim (sort's rank `reduce sum` over [n, n], NaN last), its value"
               " and index by `reduce max` of `where(rank == k-1, …)`"))
def _kthvalue(ctx: Ctx, node: NodeArgs):
    x: View = node.arg(0, "self")
    k = int(node.arg(1, "k"))
    d = norm_dim(node, node.arg(2, "dim", -1), x.rank)
    if x.rank == 0 or not 1 <= k <= x.shape[d]:
        raise node.fail("bad_argument", f"kthvalue k={k} of {list(x.shape)}")
    return _kth(ctx, node, x, d, k - 1, bool(node.arg(3, "keepdim", False)), False)


@register("aten.median.dim", "aten.median.default",
          doc=("the lower median as kthvalue at rank (n-1)//2; a row holding NaN gives NaN and its first NaN's"
               " index (torch); median.default flattens"))
def _median(ctx: Ctx, node: NodeArgs):
    from lowering.aten.views import reshape

    x: View = node.arg(0, "self")
    if node.target == "aten.median.default":
        n = 1
        for s in x.shape:
            n *= s
        flat = reshape(ctx, node, x, (n,), f"{node.id}.flat") if x.rank != 1 else x
        if n == 0:
            raise node.fail("bad_argument", "median of an empty tensor")
        return _kth(ctx, node, flat, 0, (n - 1) // 2, False, True)[:1]
    d = norm_dim(node, node.arg(1, "dim"), x.rank)
    if x.rank == 0:
        raise node.fail("unsupported_op", "median.dim of a 0-d tensor")
    return _kth(ctx, node, x, d, (x.shape[d] - 1) // 2, bool(node.arg(2, "keepdim", False)), True)
