"""Foundation Model Stack's paged attention (`fms/utils/spyre/paged.py`, the ops vLLM's
Spyre plugin and aiu-fms-testing-utils drive) lowered to primitive ops.

The KV cache is `[num_blocks, block_size, kv_heads, head_size]`; a sequence's positions
live in the blocks its block-table row names, position j in block `block_table[j //
block_size]` at offset `j % block_size`; a token's slot is `block * block_size + offset`.

- `spyre.paged_attn_store(key, value, key_cache, value_cache, slot_mapping)` returns new
  caches (the op is functional: FMS declares it non-mutating and clones): token (b, s)
  writes its key/value row to slot `slot_mapping[b, s]`, block `slot // block_size`,
  offset `slot % block_size` (Python's floor semantics, as FMS computes them); when two
  tokens name one slot the later one in (b, s) order wins, as FMS's loop. Lowered as one
  `scatter` per cache (target/primitives.py): in place on the device (the new cache is
  the old cache's bytes, the program's output aliases its input), so a step moves the
  rows it writes, not the cache. The caller still gets a new cache, as FMS's clone gives:
  the host's input tensor is not written (backend/region.py copies inputs in and outputs
  out).
- `spyre.paged_attn_compute(query, key_cache, value_cache, scale, current_tkv_mask,
  left_padded_prompt_mask, block_table)`: per sequence i the keys at positions
  j in [left_padded_prompt_mask[i], current_tkv_mask[i]) through the block table, queries
  aligned to the end (query row r sits at position current_tkv_mask[i] - Lq + r), causal
  within that; rows with no key (the pads of a first prefill shorter than the query) are 0.
  Lowered as: the block id per position (`gather` of the block table at j // block_size,
  then positions outside the sequence's range set to block 0 so no out-of-range id is
  read), one multi-axis `gather` of the cache per K and V (block axis and offset axis
  indexed together, so no flattened copy of the cache), the boolean mask
  `start <= j <= tkv - Lq + r` (pointwise over iotas), the materialized-scores attention of
  lowering/aten/attention.py (GQA: kv read broadcast over each group), and a pointwise that
  zeroes the empty rows and writes `[batch, Lq, heads, head_size]`.
- `spyre.paged_attn_compute_with_sinks(..., sinks, sliding_window)`: the same with
  gpt-oss's attention sinks (the result scaled by `sigmoid(logsumexp - sinks[h])`, what a
  softmax with one extra sink logit per head gives) and, for sliding_window > 0, keys older
  than the window masked (`j > tkv - Lq + r - sliding_window`).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from lowering.aten.attention import lower_sdpa
from lowering.aten.context import INT_DTYPES, Ctx, NodeArgs, View, expr_fn, register
from lowering.aten.indexing import emit_gather, int_iota
from lowering.aten.pointwise import emit_pointwise
from target.primitives import Access, Const, ScatterBody


def _check_cache(node: NodeArgs, key_cache: View, value_cache: View) -> tuple[int, int, int, int]:
    if key_cache.rank != 4 or value_cache.rank != 4 or key_cache.shape[:3] != value_cache.shape[:3]:
        raise node.fail("shape_mismatch", f"paged KV caches {list(key_cache.shape)} and {list(value_cache.shape)} "
                                          "(need [blocks, block_size, kv_heads, head_size] each)")
    return key_cache.shape


# The paged KV cache's device layout, [blocks, block_size, kv_heads, head_size] in the
# order kv_heads, blocks, offsets, head_size: the cache lives on the device across steps,
# so its layout is the graph's to fix, not a planner's. Every read and write of it is
# addressed by data (block ids, slots) along blocks and offsets, so a core reaches any
# block; what a core split can bound is the kv heads. With them outermost a core working
# on h of KH heads reaches h/KH of the cache (a deployment's 537 MB cache: 67 MB a head,
# inside the 256 MB per-core span), where the row-major order lets every core span it all.
CACHE_DIM_ORDER = (2, 0, 1, 3)


def _pin_cache_layout(ctx: Ctx, cache: View) -> None:
    """Fix the device layout of the cache tensor `cache` views (`PrimTensor.dim_order`)."""
    t = ctx.tensors[cache.base]
    if t.dim_order is None and len(t.shape) == 4 and ctx.is_identity(cache):
        ctx.tensors[t.id] = dataclasses.replace(t, dim_order=CACHE_DIM_ORDER)


def _int(node: NodeArgs, v: View, what: str) -> View:
    if not isinstance(v, View) or v.dtype not in INT_DTYPES:
        raise node.fail("unsupported_op", f"{node.target}: {what} must be an integer tensor")
    return v


def _per_seq(v: View, rank: int) -> View:
    """A per-sequence [B] tensor as [B, 1, ...] (rank dims), broadcast over the rest."""
    return v.with_((v.shape[0],) + (1,) * (rank - 1), (v.strides[0],) + (0,) * (rank - 1))


# -- store ---------------------------------------------------------------------------------
@register("spyre.paged_attn_store.default",
          doc=("in place: the slot's block and offset (`floordiv` / `remainder` of the slot by the block size),"
               " one `scatter` per cache of the new key / value rows into the cache's own bytes (cost: the rows"
               " written; the later of two tokens naming one slot wins, as FMS's loop)"))
def _paged_store(ctx: Ctx, node: NodeArgs):
    key, value = node.arg(0, "key"), node.arg(1, "value")
    key_cache, value_cache = node.arg(2, "key_cache"), node.arg(3, "value_cache")
    slots = _int(node, node.arg(4, "slot_mapping"), "slot_mapping")
    NB, BS, KH, D = _check_cache(node, key_cache, value_cache)
    if slots.rank != 2 or key.rank != 4 or value.rank != 4 or key.shape[:2] != slots.shape \
            or value.shape[:2] != slots.shape or key.shape[2:] != key_cache.shape[2:] \
            or value.shape[2:] != value_cache.shape[2:]:
        raise node.fail("shape_mismatch", f"paged_attn_store of key {list(key.shape)}, value {list(value.shape)}, "
                                          f"slots {list(slots.shape)} into caches {list(key_cache.shape)}")
    B, S = slots.shape
    nid = node.id
    # slot -> (block, offset) with Python's floor semantics, as FMS's loop computes them
    # (a negative slot wraps to the last blocks, as its indexing does)
    block = emit_pointwise(ctx, node, [slots], lambda e: expr_fn("floordiv", e[0], Const(float(BS))), "int64",
                           out_id=f"{nid}.block")
    offset = emit_pointwise(ctx, node, [slots], lambda e: expr_fn("remainder", e[0], Const(float(BS))), "int64",
                            out_id=f"{nid}.offset")
    outs = []
    for k, (new, cache) in enumerate(((key, key_cache), (value, value_cache))):
        iters, it = ctx.iter_dims_for((B, S) + tuple(cache.shape[2:]), prefix="d")
        table = ctx.materialize(cache, nid)   # the cache tensor itself (a copy only for a strided view)
        _pin_cache_layout(ctx, table)
        t_acc = ctx.access(table, [None, None, it[2], it[3]], nid)
        acc = [t_acc, ctx.access(new, it, nid), ctx.access(block, [it[0], it[1]], nid),
               ctx.access(offset, [it[0], it[1]], nid)]
        name = f"{nid}:{k}" if k else nid
        out = ctx.new_tensor(name, cache.shape, cache.dtype)
        ctx.emit(out, iters, acc, Access(out, t_acc.dims), ScatterBody(0, extra_axes=(1,)), nid)
        outs.append(ctx.tensor_view(out, name))
    return outs


# -- compute -------------------------------------------------------------------------------
def _lower_paged_compute(ctx: Ctx, node: NodeArgs, sinks: Optional[View], sliding_window: int) -> list:
    q: View = node.arg(0, "query")
    key_cache, value_cache = node.arg(1, "key_cache"), node.arg(2, "value_cache")
    scale = node.arg(3, "scale")
    tkv = _int(node, node.arg(4, "current_tkv_mask"), "current_tkv_mask")
    start = _int(node, node.arg(5, "left_padded_prompt_mask"), "left_padded_prompt_mask")
    table = _int(node, node.arg(6, "block_table"), "block_table")
    NB, BS, KH, D = _check_cache(node, key_cache, value_cache)
    if q.rank != 4 or table.rank != 2 or q.shape[0] != table.shape[0] or q.shape[3] != D \
            or value_cache.shape[3] != D or tkv.shape != (q.shape[0],) or start.shape != (q.shape[0],):
        raise node.fail("shape_mismatch", f"{node.target} of query {list(q.shape)}, caches {list(key_cache.shape)}"
                                          f" / {list(value_cache.shape)}, block table {list(table.shape)}, masks "
                                          f"{list(tkv.shape)} / {list(start.shape)}")
    B, Lq, H, _ = q.shape
    T = table.shape[1]
    for cache in (key_cache, value_cache):
        _pin_cache_layout(ctx, cache)
    J = T * BS     # positions the block table can address
    if H % KH:
        raise node.fail("shape_mismatch", f"{H} query heads over {KH} kv heads")
    nid = node.id
    start_b, tkv_b = _per_seq(start, 2), _per_seq(tkv, 2)
    pos = int_iota(ctx, node, J, "positions")

    # the block holding each position of each sequence (block 0 outside the sequence's keys)
    tblk = emit_pointwise(ctx, node, [pos], lambda e: expr_fn("floordiv", e[0], Const(float(BS))), "int64",
                          out_id=f"{nid}.table_col")
    offset = emit_pointwise(ctx, node, [pos], lambda e: expr_fn("remainder", e[0], Const(float(BS))), "int64",
                            out_id=f"{nid}.offset")
    blocks = emit_gather(ctx, node, table, (B, J), [0, None], [(1, tblk, 1)], f"{nid}.block_of")
    pos_row = pos.with_((1, J), (0, 1))
    in_seq = lambda e: expr_fn("logical_and", expr_fn("ge", e[1], e[2]), expr_fn("lt", e[1], e[3]))  # noqa: E731
    blocks = emit_pointwise(ctx, node, [blocks, pos_row, start_b, tkv_b],
                            lambda e: expr_fn("where", in_seq(e), e[0], Const(0.0)), "int64", out_id=f"{nid}.block")
    # K, V [B, J, KH, D]: cache[block[b, j], offset[j]]
    kv = [emit_gather(ctx, node, cache, (B, J, KH, D), [None, None, 2, 3], [(0, blocks, 0), (1, offset, 1)],
                      f"{nid}.{name}") for cache, name in ((key_cache, "keys"), (value_cache, "values"))]

    # mask[b, r, j]: start <= j <= tkv - Lq + r (and j > tkv - Lq + r - window)
    rows = int_iota(ctx, node, Lq, "query_rows")
    last_key = lambda e: expr_fn("add", expr_fn("sub", e[2], Const(float(Lq))), e[1])  # noqa: E731  tkv - Lq + r

    def visible(e):
        ok = expr_fn("logical_and", expr_fn("ge", e[0], e[3]), expr_fn("le", e[0], last_key(e)))
        if sliding_window > 0:
            ok = expr_fn("logical_and", ok, expr_fn("gt", e[0], expr_fn("sub", last_key(e), Const(float(sliding_window)))))
        return ok
    start_3, tkv_3 = _per_seq(start, 3), _per_seq(tkv, 3)
    mask = emit_pointwise(ctx, node, [pos.with_((1, 1, J), (0, 0, 1)), rows.with_((1, Lq, 1), (0, 1, 0)), tkv_3,
                                      start_3], visible, "bool", out_shape=(B, Lq, J), out_id=f"{nid}.mask")
    # a query row sees at least one key iff its last visible position is >= start
    has_keys = emit_pointwise(ctx, node, [rows.with_((1, Lq), (0, 1)), tkv_b, start_b],
                              lambda e: expr_fn("ge", expr_fn("add", expr_fn("sub", e[1], Const(float(Lq))), e[0]),
                                                e[2]),
                              "bool", out_shape=(B, Lq), out_id=f"{nid}.has_keys")

    def heads_first(v: View) -> View:   # [B, L, heads, D] -> [B, heads, L, D] (a relabel)
        return v.with_((v.shape[0], v.shape[2], v.shape[1], v.shape[3]),
                       (v.strides[0], v.strides[2], v.strides[1], v.strides[3]))
    mask4 = mask.with_((B, 1, Lq, J), (mask.strides[0], 0, mask.strides[1], mask.strides[2]))
    attn, lse = lower_sdpa(ctx, node, heads_first(q), heads_first(kv[0]), heads_first(kv[1]), mask4, 0.0, False,
                           float(scale), name=f"{nid}.attn")
    out_v = heads_first(attn)                              # [B, Lq, H, D]
    keep = has_keys.with_((B, Lq, 1, 1), has_keys.strides + (0, 0))
    if sinks is None:
        return [emit_pointwise(ctx, node, [keep, out_v], lambda e: expr_fn("where", e[0], e[1], Const(0.0)), q.dtype,
                               out_shape=q.shape, out_id=nid)]
    if sinks.shape != (H,):
        raise node.fail("shape_mismatch", f"sinks {list(sinks.shape)} for {H} heads")
    lse_v = lse.with_((B, Lq, H, 1), (lse.strides[0], lse.strides[2], lse.strides[1], 0))   # lse is [B, H, Lq]
    sinks_v = sinks.with_((1, 1, H, 1), (0, 0, sinks.strides[0], 0))

    def scaled(e):
        gate = expr_fn("sigmoid", expr_fn("sub", e[2], e[3]))
        return expr_fn("where", e[0], expr_fn("mul", e[1], gate), Const(0.0))
    return [emit_pointwise(ctx, node, [keep, out_v, lse_v, sinks_v], scaled, q.dtype, out_shape=q.shape, out_id=nid)]


@register("spyre.paged_attn_compute.default",
          doc=("block id per position (`gather` of the block table), K and V by one two-axis `gather` of the cache"
               " (block, offset), bool mask `start <= j <= tkv - Lq + r`, materialized-scores attention (GQA: kv"
               " read broadcast), rows with no key zeroed"))
def _paged_compute(ctx: Ctx, node: NodeArgs):
    return _lower_paged_compute(ctx, node, None, 0)


@register("spyre.paged_attn_compute_with_sinks.default",
          doc=("as paged_attn_compute, the result scaled by `sigmoid(logsumexp - sinks[h])`; sliding_window > 0"
               " also masks keys at or before `tkv - Lq + r - sliding_window`"))
def _paged_compute_sinks(ctx: Ctx, node: NodeArgs):
    sinks = node.arg(7, "sinks")
    window = node.arg(8, "sliding_window")
    if not isinstance(sinks, View):
        raise node.fail("bad_argument", "paged attention sinks must be a tensor")
    return _lower_paged_compute(ctx, node, sinks, int(window or 0))

