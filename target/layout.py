"""Device layouts: the one home of a tensor's layout geometry.

The emitter, the validator, the functional run, the timing model and the planners all read a
tensor's bytes through these functions, so every one of them sees the same device memory.

A layout (`superdsc.Layout`, torch-spyre's SpyreTensorLayout) lists device dims outermost
first in `dim_map`: every logical dim once, the stick dim twice — its stick-group dim (which
stick) anywhere, its stick-element dim (which element of the stick, `stick_elems` of them)
last. `device_size` gives each device dim's extent (the stick-group dim counts whole sticks,
so the stick dim is padded); bytes are row-major over it.

- The *dim order* (`Layout.dim_order`, what a planner chooses) is `dim_map` without its last
  entry: the logical dims in device order, each once, the stick dim standing where its
  stick-group dim is. The plain row-major layout (v1's only one) has the stick dim last;
  torch-spyre's default ("generic stick", `spyre_default_dim_order`) for a [B, M, K] tensor
  sticked on K is dim order [1, 2, 0]: device dims [M, K/64, B, 64].
- What the timing model and the planners read of an operand's layout: `outer_dims_order`
  (the non-stick dims in device order), `stick_group_position`, `batch_outermost`,
  `is_row_major`, and per box `box_span_bytes`, `box_sticks`, `box_runs` (contiguity).
- A logical index i lands at element offset  sum over non-stick dims d of i_d * stride(d)
  + (i_s // stick_elems) * stride(stick group) + i_s % stick_elems.  When the stick-group
  dim's stride is one stick (nothing with extent between it and the stick elements) the
  stick dim is one stride like any other (`logical_strides`); otherwise it is not, and
  `box_offsets` gives the offsets element by element.
- A box held on its own (a core's slice in LX) is stored the same way over the box's own
  extents, its stick extent padded to whole sticks (`device_extents`).
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from target.op_rules import ANY, stick_elems
from target.primitives import DTYPE_BYTES
from target.superdsc import Layout

Range = tuple[int, int]
Box = tuple[Range, ...]


# -- building and reading a layout ---------------------------------------------------------------
def default_dim_order(rank: int, stick_dim: Optional[int]) -> list[int]:
    """The plain row-major order: the other dims in logical order, the stick dim last."""
    if rank == 0 or stick_dim is None:
        return list(range(rank))
    return [d for d in range(rank) if d != stick_dim] + [stick_dim]


def spyre_default_dim_order(rank: int, stick_dim: Optional[int]) -> list[int]:
    """torch-spyre's default device layout ("generic stick"), as a dim order: from the host
    order d0 .. d(r-1) (the other dims in logical order, the stick dim last) its device dims
    are d1 .. d(r-2), the stick group, d0, the stick elements — the first dim goes right
    inside the stick group ([B, M, K] on K: [M, K/64, B, 64])."""
    host = default_dim_order(rank, stick_dim)
    if rank < 2:
        return host
    return host[1:-1] + [host[-1], host[0]]


def make_layout(shape: Sequence[int], dtype: str, stick_dim: Optional[int], stick_bytes: int,
                dim_order: Optional[Sequence[int]] = None) -> Layout:
    """The layout of a tensor sticked on `stick_dim` (None / ANY: the last dim). `dim_order`
    lists the logical dims in device order, each once, the stick dim where its stick-group
    dim goes (`Layout.dim_order`); default: the plain row-major order (`default_dim_order`)."""
    rank = len(shape)
    se = stick_elems(dtype, stick_bytes)
    if rank == 0:
        if dim_order:
            raise ValueError(f"dim order {list(dim_order)} for a rank-0 tensor")
        return Layout(dim_map=[], device_size=[], stick_elems=se)
    if stick_dim is None or stick_dim == ANY:
        stick_dim = rank - 1
    order = default_dim_order(rank, stick_dim) if dim_order is None else [int(d) for d in dim_order]
    if sorted(order) != list(range(rank)):
        raise ValueError(f"dim order {order} is not a permutation of the dims of a rank-{rank} tensor")
    size = [int(shape[d]) for d in order]
    size[order.index(stick_dim)] = -(-int(shape[stick_dim]) // se)
    return Layout(dim_map=order + [stick_dim], device_size=size + [se], stick_elems=se)


def stick_group_position(layout: Layout) -> Optional[int]:
    """Index in `dim_map` of the stick-group dim (0 outermost .. rank-1 right before the stick
    elements, the plain row-major place); None for rank 0."""
    dm = layout.dim_map
    return dm.index(dm[-1]) if dm else None


def outer_dims_order(layout: Layout) -> list[int]:
    """The non-stick logical dims in device order, outermost first."""
    dm = layout.dim_map
    return [d for d in dm[:-1] if d != dm[-1]] if dm else []


def is_row_major(layout: Layout) -> bool:
    """Plain row-major over the logical shape (the stick dim the last dim, its stick-group dim
    right before its elements): the bytes a reshape can alias."""
    return layout.dim_order == list(range(len(layout.dim_order)))


def batch_outermost(layout: Layout, dims: Sequence[int]) -> bool:
    """Every logical dim of `dims` comes before every other device dim that holds data
    (extent > 1; the stick-group dim counts with its stick count): each index of those dims
    owns one contiguous block of the tensor."""
    want = set(dims)
    seen_other = False
    for d, n in zip(layout.dim_map[:-1], layout.device_size[:-1]):
        if n <= 1:
            continue
        if d in want:
            if seen_other:
                return False
        else:
            seen_other = True
    return True


def padded(n: int, granule: int) -> int:
    return -(-n // granule) * granule if granule > 1 else n


def layout_nbytes(layout: Layout, dtype: str) -> int:
    """Bytes the tensor occupies in device memory (padding included)."""
    n = 1
    for s in layout.device_size:
        n *= s
    if not layout.device_size:
        n = layout.stick_elems  # a rank-0 tensor occupies one stick
    return n * DTYPE_BYTES[dtype]


def layout_problems(layout: Layout, shape: Sequence[int], dtype: str, stick_bytes: int) -> list[tuple[str, str]]:
    """(code, message) for a layout inconsistent with its tensor: `layout_invalid` when
    `dim_map` is not every dim once plus the stick dim's stick-group dim, or a non-stick
    extent is wrong; `stick_alignment` when the stick elements are not `stick_elems` (of this
    dtype) or the stick count is not the stick dim's size in whole sticks."""
    rank = len(shape)
    se = stick_elems(dtype, stick_bytes)
    dm, ds = layout.dim_map, layout.device_size
    out: list[tuple[str, str]] = []
    if layout.stick_elems != se:
        out.append(("stick_alignment", f"stick_elems {layout.stick_elems} != {se} for {dtype}"))
    if rank == 0:
        if dm or ds:
            out.append(("layout_invalid", f"a rank-0 tensor has empty dim_map and device_size, got {dm} / {ds}"))
        return out
    bad = [d for d in dm if not (0 <= d < rank)]
    if bad:
        out.append(("layout_invalid", f"dim_map {dm} names {bad[0]}, not a dim of a rank-{rank} tensor"))
        return out
    if len(dm) != rank + 1:
        out.append(("layout_invalid", f"dim_map {dm} has {len(dm)} device dims, a rank-{rank} tensor has "
                                      f"{rank + 1} (each dim once, the stick dim twice: stick group and "
                                      f"stick elements last)"))
        return out
    stick = dm[-1]
    if dm.count(stick) != 2:
        out.append(("layout_invalid", f"dim_map {dm}: stick dim {stick} (the last entry) must appear exactly "
                                      f"once more, as its stick-group dim"))
        return out
    if sorted(dm[:-1]) != list(range(rank)):
        missing = sorted(set(range(rank)) - set(dm))
        out.append(("layout_invalid", f"dim_map {dm} is not a permutation of the dims plus the stick dim "
                                      f"(missing {missing})"))
        return out
    if len(ds) != len(dm):
        out.append(("layout_invalid", f"device_size {ds} has {len(ds)} entries, dim_map {dm} {len(dm)}"))
        return out
    group = dm.index(stick)
    for i, d in enumerate(dm):
        if i == len(dm) - 1:
            if ds[i] != se:
                out.append(("stick_alignment", f"stick elements (last device dim) {ds[i]}, a stick holds {se}"))
        elif i == group:
            want = -(-shape[d] // se)
            if ds[i] != want:
                out.append(("stick_alignment", f"stick dim {d} of size {shape[d]} takes {want} whole sticks, "
                                               f"device_size says {ds[i]}"))
        elif ds[i] != shape[d]:
            out.append(("layout_invalid", f"device_size of dim {d} is {ds[i]}, expected {shape[d]}"))
    return out


# -- where an index lands -------------------------------------------------------------------------
def device_extents(layout: Layout, extents: Optional[Sequence[int]] = None) -> tuple[int, ...]:
    """Per device dim, its extent for data of logical `extents` (per logical dim; a box held
    on its own) laid out in this layout: the stick-group dim counts whole sticks. None: the
    whole tensor (`device_size`)."""
    if extents is None:
        return tuple(layout.device_size)
    dm = layout.dim_map
    if not dm:
        return ()
    se = layout.stick_elems
    group = dm.index(dm[-1])
    out = [extents[d] for d in dm]
    out[group] = -(-extents[dm[-1]] // se)
    out[-1] = se
    return tuple(out)


def device_strides(layout: Layout, extents: Optional[Sequence[int]] = None) -> tuple[int, ...]:
    """Element strides per device dim, row-major over `device_extents(layout, extents)`."""
    ext = device_extents(layout, extents)
    strides = [0] * len(ext)
    acc = 1
    for i in reversed(range(len(ext))):
        strides[i] = acc
        acc *= ext[i]
    return tuple(strides)


def logical_strides(layout: Layout, extents: Optional[Sequence[int]] = None) -> Optional[tuple[int, ...]]:
    """Element strides per LOGICAL dim, when every logical dim is one stride: the stick dim is,
    when its stick-group dim steps one stick (only extent-1 dims between it and the stick
    elements, as in the row-major layout) or it has one stick. None otherwise (read through
    `box_offsets`)."""
    dm = layout.dim_map
    if not dm:
        return ()
    ext = device_extents(layout, extents)
    dev = device_strides(layout, extents)
    se = layout.stick_elems
    group = dm.index(dm[-1])
    if dev[group] != se and ext[group] > 1:
        return None
    strides = [0] * (len(dm) - 1)
    for i, d in enumerate(dm[:-1]):
        strides[d] = dev[i] if i != group else 1
    return tuple(strides)


def dim_offsets(layout: Layout, dim: int, lo: int, hi: int, extents: Optional[Sequence[int]] = None,
                strides: Optional[Sequence[int]] = None) -> np.ndarray:
    """Element offsets that indices lo..hi-1 of logical dim `dim` contribute (the offset of a
    logical index is the sum over its dims)."""
    dm = layout.dim_map
    dev = device_strides(layout, extents) if strides is None else strides
    idx = np.arange(lo, hi, dtype=np.int64)
    if dim != dm[-1]:
        return idx * dev[dm.index(dim)]
    se = layout.stick_elems
    return (idx // se) * dev[dm.index(dim)] + idx % se


def element_offset(layout: Layout, index: Sequence[int], extents: Optional[Sequence[int]] = None) -> int:
    """Element offset of one logical index."""
    dm = layout.dim_map
    if not dm:
        return 0
    dev = device_strides(layout, extents)
    se = layout.stick_elems
    stick = dm[-1]
    off = 0
    for i, d in enumerate(dm[:-1]):
        if d == stick:
            off += (index[d] // se) * dev[i] + index[d] % se
        else:
            off += index[d] * dev[i]
    return off


def box_offsets(layout: Layout, box: Box, extents: Optional[Sequence[int]] = None) -> np.ndarray:
    """Element offsets of every index of `box` (shape: the box's lengths), in data of logical
    `extents` laid out in this layout (None: the whole tensor)."""
    if not layout.dim_map:
        return np.zeros((), dtype=np.int64)
    dev = device_strides(layout, extents)
    rank = len(box)
    out = np.zeros((), dtype=np.int64)
    for d, (a, b) in enumerate(box):
        shape = [1] * rank
        shape[d] = max(0, b - a)
        out = out + dim_offsets(layout, d, a, b, strides=dev).reshape(shape)
    return out


# -- what a box covers ---------------------------------------------------------------------------
def box_storage_extents(box: Box, layout: Layout) -> tuple[int, ...]:
    """Per logical dim, the stored extent of a box held on its own (LX): its length, the stick
    dim padded to whole sticks."""
    ext = [b - a for a, b in box]
    if layout.dim_map:
        s = layout.dim_map[-1]
        ext[s] = padded(ext[s], layout.stick_elems)
    return tuple(ext)


def box_lx_bytes(box: Box, layout: Layout, dtype: str) -> int:
    """Bytes a core needs to hold `box` of a tensor in LX (whole sticks; any dim order)."""
    n = 1
    for e in box_storage_extents(box, layout):
        n *= e
    if not box:
        n = layout.stick_elems
    return n * DTYPE_BYTES[dtype]


def box_sticks(box: Box, layout: Layout) -> int:
    """Sticks moved to read/write `box` (the stick-dim extent rounded up to whole sticks)."""
    n = 1
    for e in box_storage_extents(box, layout):
        n *= e
    return (n // layout.stick_elems) if box else 1


def box_span_bytes(box: Box, layout: Layout, dtype: str) -> int:
    """Byte span [first, last] a core touches reading `box` of a tensor in device memory
    (whole sticks: from the start of the first stick to the end of the last). Every dim's
    offset grows with its index, so the first byte is the box's low corner, the last its high
    corner."""
    if not box or not layout.dim_map:
        return layout.stick_elems * DTYPE_BYTES[dtype]
    if any(b <= a for a, b in box):
        return 0
    dm = layout.dim_map
    dev = device_strides(layout)
    se = layout.stick_elems
    stick = dm[-1]
    first = last = 0
    for i, d in enumerate(dm[:-1]):
        a, b = box[d]
        if d == stick:
            first += (a // se) * dev[i] + a % se
            last += ((b - 1) // se) * dev[i] + (b - 1) % se
        else:
            first += a * dev[i]
            last += (b - 1) * dev[i]
    if se > 1:
        last = (last // se + 1) * se - 1
        first = (first // se) * se
    return (last - first + 1) * DTYPE_BYTES[dtype]


def box_runs(box: Box, layout: Layout) -> tuple[int, int]:
    """Contiguity of `box` in device memory, moved in whole sticks: (runs, sticks per run) —
    the box is `runs` contiguous runs of equal length. A run grows outward from the stick
    elements over every device dim the box covers whole, then takes the box's extent of the
    first dim it does not."""
    if not box or not layout.dim_map:
        return 1, 1
    if any(b <= a for a, b in box):
        return 0, 0
    dm, ds = layout.dim_map, layout.device_size
    se = layout.stick_elems
    stick = dm[-1]
    group = dm.index(stick)
    ext = []
    for i, d in enumerate(dm[:-1]):
        a, b = box[d]
        ext.append((-(-b // se) - a // se) if i == group else b - a)
    run, i = 1, len(ext) - 1
    while i >= 0 and ext[i] == ds[i]:
        run *= ext[i]
        i -= 1
    if i >= 0:
        run *= ext[i]
    runs = 1
    for e in ext[:max(i, 0)]:
        runs *= e
    return runs, run


# -- orders a planner may offer ------------------------------------------------------------------
def batch_outer_order(shape: Sequence[int], stick_dim: int, batch_dims: Sequence[int]) -> list[int]:
    """The dim order with the tensor dims `batch_dims` (of extent > 1) outermost, in logical
    order, then the other dims as the plain row-major order has them (the stick dim last):
    the order a batched matmul reads or writes without striding across batches."""
    rank = len(shape)
    batch = [d for d in sorted(set(batch_dims)) if shape[d] > 1 and d != stick_dim]
    return batch + [d for d in default_dim_order(rank, stick_dim) if d not in batch]


def preferred_orders(op, access, shape: Sequence[int], stick_dim: Optional[int]) -> list[list[int]]:
    """Dim orders an op may prefer for one of its operands (`access`, of a tensor of `shape`
    sticked on `stick_dim`), other than the plain row-major default: for a matmul, the
    operand's batch dims (iteration dims other than m, n and k that it indexes) outermost,
    and torch-spyre's default (`spyre_default_dim_order`, the batch just inside the stick
    rows). Proposals only: a planner prices each on the timing model."""
    rank = len(shape)
    if rank < 2 or stick_dim is None or stick_dim == ANY:
        return []
    body = op.body
    if body.kind != "matmul":
        return []
    mnk = {body.m, body.n, body.k}
    batch = [j for j, d in enumerate(access.dims) if d is not None and d not in mnk]
    default = default_dim_order(rank, stick_dim)
    out = []
    for order in (batch_outer_order(shape, stick_dim, batch), spyre_default_dim_order(rank, stick_dim)):
        if order != default and order not in out:
            out.append(order)
    return out
