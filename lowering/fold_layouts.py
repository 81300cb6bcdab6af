"""Fold a layout-only copy into the op that produces its input.

A `copy` whose map reads its input T as a permutation of T's dims followed by a reshape
(`reshape(permute(T, perm))`, e.g. attention's output `[b, h, s, d]` -> transpose(1, 2)
-> `[b, s, h*d]`) moves data on the device: only a reshape of row-major order between
natural-order layouts is a free alias (`op_rules.copy_is_alias`). When T's producer P
writes it through a per-dim Access (matmul, grouped_matmul, pointwise, reduce), P can as
well write T with its dims permuted: T is re-declared with shape `T.shape[perm]`, P's
output Access dims are permuted the same way, and the copy becomes a plain reshape of the
new T (`copy_is_reshape`), which a planner may make a free alias. When the new T has the
copy's output shape the copy is dropped and its readers read T.

Conditions (anything else is left alone):
- the copy has one piece, no offset, and writes its whole output;
- T is an intermediate, not a graph output, and the copy is its only reader;
- P is a matmul, grouped_matmul, pointwise or reduce op (not a copy, gather or fill);
- the map is exactly `reshape(permute(T, perm))` for a perm that is not the identity on
  T's dims of size > 1, and that keeps T's innermost dim of size > 1 innermost. The
  innermost dim is where P's output stick sits by default (a matmul's n, always): moving
  it would put the stick on an inner-but-not-last dim, a non-natural layout no copy
  can alias, so the fold would only move the data movement elsewhere.
Size-1 dims of T keep their positions. Tensor ids are kept (the dropped copy's output id
disappears; its readers name T).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional, Sequence

from lowering.aten.context import row_major_strides
from lowering.aten.views import view_strides
from target.primitives import Access, CopyBody, PrimGraph, PrimOp, PrimTensor, StridedMap

# Producers that write their output through a per-dim Access (one iteration dim or None
# per tensor dim), so permuting the output tensor's dims is a relabeling of the Access.
FOLDABLE_PRODUCERS = frozenset({"matmul", "grouped_matmul", "pointwise", "reduce"})


def permutation_of(shape: Sequence[int], smap: StridedMap) -> Optional[tuple[int, ...]]:
    """The perm with `smap` == reshape(permute(x, perm)) for a row-major x of `shape`
    (size-1 dims of x keep their positions), or None when the map is not of that form
    (an offset, a slice, a broadcast, a window, repeated elements)."""
    shape = tuple(int(s) for s in shape)
    n = 1
    for s in shape:
        n *= s
    m = 1
    for s in smap.shape:
        m *= s
    if smap.offset != 0 or n == 0 or n != m:
        return None
    rs = row_major_strides(shape)
    big = [b for b in range(len(shape)) if shape[b] > 1]
    order: list[int] = []
    for size, stride in zip(smap.shape, smap.strides):
        if size == 1:
            continue
        if stride <= 0:
            return None
        # the dim of x holding this map dim's innermost step, then the outer dims its
        # extent runs into (a map dim may merge several consecutive dims of x)
        pos = next((k for k, b in enumerate(big) if rs[b] <= stride < rs[b] * shape[b]), None)
        if pos is None or stride % rs[big[pos]]:
            return None
        covered = [big[pos]]
        extent = stride * size
        while extent > rs[covered[0]] * shape[covered[0]]:
            pos -= 1
            if pos < 0:
                return None
            covered.insert(0, big[pos])
        for b in covered:
            if b not in order:
                order.append(b)
    if sorted(order) != big:
        return None
    perm = list(range(len(shape)))
    for slot, b in zip(big, order):
        perm[slot] = b
    # exact check: the map must be the view torch would make of the permuted tensor
    want = view_strides([shape[p] for p in perm], [rs[p] for p in perm], smap.shape)
    if want is None or any(sz > 1 and w != s for sz, w, s in zip(smap.shape, want, smap.strides)):
        return None
    return tuple(perm)


def _copy_access(base_id: str, base_shape: Sequence[int], smap: StridedMap,
                 out_dims: Sequence[Optional[int]]) -> Access:
    """A copy's input Access for reading `base` through `smap` (the rule Ctx.emit_copy
    uses: base dim b is walked by the output dim whose stride is b's row-major stride)."""
    bstr = row_major_strides(base_shape)
    dims: list[Optional[int]] = []
    for b in range(len(base_shape)):
        hit = None
        if base_shape[b] > 1:
            for j, (sz, st) in enumerate(zip(smap.shape, smap.strides)):
                if st == bstr[b] and 1 < sz <= base_shape[b] and out_dims[j] is not None:
                    hit = out_dims[j]
                    break
        dims.append(hit)
    return Access(base_id, tuple(dims))


def _fold_perm(copy: PrimOp, producer: Optional[PrimOp], tensors: dict[str, PrimTensor],
               outputs: set, reads: dict[str, int]) -> Optional[tuple[int, ...]]:
    """The perm to fold `copy` into `producer` with, or None when it must stay as it is."""
    body = copy.body
    if not isinstance(body, CopyBody) or len(copy.inputs) != 1 or len(body.maps) != 1:
        return None
    src = copy.inputs[0].tensor
    t, out = tensors[src], tensors[copy.output.tensor]
    smap = body.maps[0]
    if any(body.out_offsets[0]) or tuple(smap.shape) != tuple(out.shape) or t.dtype != out.dtype:
        return None
    if t.role != "intermediate" or src in outputs or reads.get(src, 0) != 1 or t.dim_order is not None:
        return None   # (a layout the graph fixes is not re-shaped)
    if producer is None or producer.body.kind not in FOLDABLE_PRODUCERS:
        return None
    perm = permutation_of(t.shape, smap)
    if perm is None:
        return None
    big = [b for b in range(len(t.shape)) if t.shape[b] > 1]
    if not big or [perm[b] for b in big] == big or perm[big[-1]] != big[-1]:
        return None  # nothing moves, or the innermost dim (the stick's) would move
    return perm


def fold_layouts(pg: PrimGraph) -> PrimGraph:
    """`pg` with every foldable layout copy folded into its producer (module docstring);
    ops in the same order, `pg` itself untouched."""
    ops: list[Optional[PrimOp]] = list(pg.ops)
    tensors = dict(pg.tensors)
    outputs = set(pg.outputs)
    reads: dict[str, int] = {}
    for op in ops:
        for a in op.inputs:
            reads[a.tensor] = reads.get(a.tensor, 0) + 1
    producer_at = {op.output.tensor: i for i, op in enumerate(ops)}
    rename: dict[str, str] = {}  # output of a dropped copy -> the tensor its readers read
    for i, op in enumerate(ops):
        if rename and any(a.tensor in rename for a in op.inputs):
            op = replace(op, inputs=tuple(Access(rename.get(a.tensor, a.tensor), a.dims) for a in op.inputs))
            ops[i] = op
        if op.body.kind != "copy":
            continue
        src = op.inputs[0].tensor if op.inputs else None
        p_at = producer_at.get(src)
        producer = ops[p_at] if p_at is not None else None
        perm = _fold_perm(op, producer, tensors, outputs, reads)
        if perm is None:
            continue
        t = tensors[src]
        new_t = replace(t, shape=tuple(t.shape[p] for p in perm))
        tensors[src] = new_t
        ops[p_at] = replace(producer, output=Access(src, tuple(producer.output.dims[p] for p in perm)))
        dst = op.output.tensor
        if new_t.shape == tensors[dst].shape and dst not in outputs:
            # the permuted T is the copy's output: drop the copy, its readers read T
            ops[i] = None
            rename[dst] = src
            reads[src] = reads.pop(dst, 0)
            del tensors[dst]
            continue
        shape = tensors[dst].shape
        smap = StridedMap(tuple(shape), row_major_strides(shape), 0)
        ops[i] = replace(op, inputs=(_copy_access(src, new_t.shape, smap, op.output.dims),),
                         body=replace(op.body, maps=(smap,)))
    return PrimGraph(pg.name, tensors, [op for op in ops if op is not None], list(pg.inputs),
                     list(pg.outputs), pg.source_hash, pg.meta)
