"""Scaled dot-product attention in the materialized-scores form torch-spyre runs:
q·√s, k·√s, bmm q·kᵀ, (+ mask), amax, sub, exp, sum, div, bmm with v."""
from __future__ import annotations

import math
from typing import Optional

from lowering.aten.context import Ctx, NodeArgs, View, expr_fn, register
from lowering.aten.matmul import emit_matmul
from lowering.aten.pointwise import emit_pointwise
from lowering.aten.reductions import emit_softmax
from lowering.aten.views import reshape
from target.primitives import Access, Const, FillBody


def _iota(ctx: Ctx, node: NodeArgs, length: int, out_id: str) -> View:
    iters, index = ctx.iter_dims_for((length,))
    tid = ctx.new_tensor(out_id, (length,), "int64")
    ctx.emit(tid, iters, [], Access(tid, tuple(index)), FillBody(0.0, iota_dim=0), node.id)
    return ctx.tensor_view(tid, out_id)


def lower_sdpa(ctx: Ctx, node: NodeArgs, q: View, k: View, v: View, attn_mask, dropout_p: float,
               is_causal: bool, scale, name: Optional[str] = None) -> list:
    """[out, logsumexp] of attention; the tensors are named after `name` (default the
    node's id: a lowering that post-processes the result names its own output)."""
    if dropout_p:
        raise node.fail("unsupported_op", f"attention dropout_p={dropout_p} (inference only)")
    if q.rank < 2 or k.rank != q.rank or v.rank != q.rank:
        raise node.fail("shape_mismatch", f"attention q/k/v {list(q.shape)} {list(k.shape)} {list(v.shape)}")
    L, E = q.shape[-2:]
    S = k.shape[-2]
    s = float(scale) if scale is not None else 1.0 / math.sqrt(E)
    root = math.sqrt(s)
    dt = q.dtype
    nid = name or node.id
    out_shape = q.shape[:-1] + v.shape[-1:]
    qs = emit_pointwise(ctx, node, [q], lambda e: expr_fn("mul", e[0], Const(root)), dt, out_id=f"{nid}.q_scaled")
    ks = emit_pointwise(ctx, node, [k], lambda e: expr_fn("mul", e[0], Const(root)), dt, out_id=f"{nid}.k_scaled")
    group = 1
    if q.rank >= 3 and k.shape[-3] != q.shape[-3]:
        # grouped-query attention: query head h reads kv head h // group. Regroup the
        # scaled q's heads into (kv heads, group) (a copy of a row-major tensor, layout
        # free) and read k and v broadcast over the group: no kv copies.
        hq, hkv = q.shape[-3], k.shape[-3]
        if hkv == 0 or hq % hkv or v.shape[-3] != hkv:
            raise node.fail("shape_mismatch", f"attention heads: q {hq}, k {hkv}, v {v.shape[-3]}")
        group = hq // hkv
        qs = reshape(ctx, node, qs, q.shape[:-3] + (hkv, group, L, E), f"{nid}.q_grouped")
        ks = _unsqueeze(ks, ks.rank - 2)
        v = _unsqueeze(ctx.ensure_relabel(v, node.id), v.rank - 2)
        if attn_mask is not None:
            m = attn_mask
            while m.rank < 4:
                m = _unsqueeze(m, 0)
            if m.shape[-3] == hq and hq > 1:
                attn_mask = reshape(ctx, node, m, m.shape[:-3] + (hkv, group) + m.shape[-2:], m.name)
            else:
                attn_mask = _unsqueeze(m, m.rank - 2)
    kt = ks.with_(ks.shape[:-2] + ks.shape[-2:][::-1], ks.strides[:-2] + ks.strides[-2:][::-1])
    scores = emit_matmul(ctx, node, qs, kt, dt, f"{nid}.scores")
    if is_causal:
        if attn_mask is not None:
            raise node.fail("bad_argument", "attention with both attn_mask and is_causal")
        rows = _iota(ctx, node, L, f"{nid}.causal_rows")
        cols = _iota(ctx, node, S, f"{nid}.causal_cols")
        rows = rows.with_((L, 1), (1, 1))
        # torch's is_causal keeps the lower triangle aligned at the top-left: col <= row
        scores = emit_pointwise(ctx, node, [scores, rows, cols], lambda e: expr_fn(
            "where", expr_fn("le", e[2], e[1]), e[0], Const(-math.inf)), dt, out_id=f"{nid}.masked")
    elif attn_mask is not None:
        if attn_mask.dtype == "bool":
            scores = emit_pointwise(ctx, node, [scores, attn_mask], lambda e: expr_fn(
                "where", e[1], e[0], Const(-math.inf)), dt, out_shape=scores.shape, out_id=f"{nid}.masked")
        else:
            scores = emit_pointwise(ctx, node, [scores, attn_mask], lambda e: expr_fn("add", e[0], e[1]), dt,
                                    out_shape=scores.shape, out_id=f"{nid}.masked")
    last = scores.rank - 1
    probs, amax, ssum = emit_softmax(ctx, node, scores, last, dt, f"{nid}.probs")
    # grouped results are tensors of their own; the aten values are their regroups
    out = emit_matmul(ctx, node, probs, v, dt, nid if group == 1 else f"{nid}.grouped")
    # logsumexp of the scaled scores (flash attention's second output), float32
    lse = emit_pointwise(ctx, node, [amax, ssum], lambda e: expr_fn("add", e[0], expr_fn("log", e[1])),
                         "float32", out_id=f"{nid}:1" if group == 1 else f"{nid}.lse_grouped")
    lse = lse.with_(lse.shape[:-1], lse.strides[:-1])
    if group > 1:  # back to [..., Hq, L, Ev]: a regroup of the row-major result
        out = reshape(ctx, node, out, out_shape, nid)
        lse = reshape(ctx, node, lse, out_shape[:-1], f"{nid}:1")
    return [out, lse]


def _unsqueeze(x: View, d: int) -> View:
    return x.with_(x.shape[:d] + (1,) + x.shape[d:], x.strides[:d] + (0,) + x.strides[d:])


@register("aten._scaled_dot_product_flash_attention_for_cpu.default",
          doc=("materialized scores: scale, bmm, mask, softmax chain, bmm; the logsumexp output is `amax + log(sum)`, "
               "dropped unless used"))
def _sdpa_flash_cpu(ctx: Ctx, node: NodeArgs):
    q, k, v = node.arg(0, "query"), node.arg(1, "key"), node.arg(2, "value")
    return lower_sdpa(ctx, node, q, k, v, node.kwargs.get("attn_mask"), node.arg(3, "dropout_p", 0.0),
                      node.arg(4, "is_causal", False), node.kwargs.get("scale"))


@register("aten.scaled_dot_product_attention.default",
          doc="materialized scores: scale, bmm, mask, softmax chain, bmm (GQA: q regrouped, k/v read broadcast)")
def _sdpa(ctx: Ctx, node: NodeArgs):
    q, k, v = node.arg(0, "query"), node.arg(1, "key"), node.arg(2, "value")
    if q.rank >= 3 and q.shape[-3] != k.shape[-3] and not node.arg(7, "enable_gqa", False):
        raise node.fail("shape_mismatch", "scaled_dot_product_attention with unequal heads needs enable_gqa")
    return lower_sdpa(ctx, node, q, k, v, node.arg(3, "attn_mask"), node.arg(4, "dropout_p", 0.0),
                      node.arg(5, "is_causal", False), node.arg(6, "scale"))[:1]
