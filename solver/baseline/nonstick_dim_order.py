"""Device dim orders the torch-spyre way: every tensor in torch-spyre's default device
layout ("generic stick"), then upstream's `nonstick_dim_order` pass (PR #4391) reorders
the non-stick dims of matmul operands, and the producer writes the reordered layout
directly (`require_layout` semantics, PR #4302: a requested output geometry is the
producer's own, no conversion op after it).

Reimplements, on our dim orders (`superdsc.Layout.dim_order`: the logical dims in device
order, the stick dim where its stick-group dim is; the stick elements are always last):

- **default layouts.** A tensor torch-spyre lays out itself gets `spyre_default_dim_order`
  (`target.layout`): for host order d0 .. d(r-1) (stick dim last) the device dims are
  d1 .. d(r-2), the stick group, d0, the stick elements. Graph inputs arrive that way
  (transferred with the default SpyreTensorLayout), so do op outputs and restickified
  copies (a fresh layout for the new stick dim: guessed, see docs/baseline.md).
- **free views stay row-major.** Our program model aliases a reshape only between two
  plain row-major layouts (`op_rules.copy_is_alias`); upstream's ReinterpretView makes
  the view inherit its source's device layout instead. So the source and the view of
  every copy the baseline claims as a free alias keep the row-major order and the pass
  leaves them alone (a guess that keeps upstream's free views free).
- **expert weights** of a grouped (mixture-of-experts) matmul are loaded per expert, as
  torch-spyre's model loading transfers each expert's 2-D weight: the expert dim is
  outermost, each expert's slab in the default layout.
- **span limit.** A tensor whose order would leave some core's access spanning more than
  `hw.per_core_span_bytes` keeps the row-major order (upstream's span-reduction pass would
  re-divide the op instead; the baseline keeps its division). Counted in the plan's notes.
- **phase 1, indirect-access constraint.** A gather's table has its gathered dims at the
  outermost device positions (upstream: a hardware requirement, pinned before phase 2).
  Upstream relayouts a graph-input table with a copy; we give the input that order
  directly (the copy's cost is not charged).
- **phase 2, matmul reorder** (`matmul_reorder`): walking the matmuls in reverse program
  order, each operand they read that is not a graph input (and not seen before): when the
  stick group is not already right before the stick elements, the largest non-stick dim
  before the stick group (extent > 1, not pinned) swaps into the position right after the
  stick group, if it is larger than what sits there. For a [B, M, K] operand sticked on K,
  generic [M, K/64, B, 64] becomes [B, K/64, M, 64] when M > B: the batch moves outermost
  and each stick of K holds its M rows together.
"""
from __future__ import annotations

from typing import Iterable, Optional, Sequence

from target.geometry import first_slice_spans
from target.layout import default_dim_order, layout_nbytes, make_layout, spyre_default_dim_order
from target.op_rules import ANY, stick_elems
from target.primitives import PrimGraph


def matmul_reorder(order: Sequence[int], shape: Sequence[int], stick_dim: Optional[int], dtype: str,
                   stick_bytes: int, pinned: Iterable[int] = ()) -> Optional[list[int]]:
    """Upstream's matmul perf reorder of one operand's dim order; None when it does not
    apply. `pinned`: device positions phase 1 fixed (nothing moves into or out of them)."""
    order = list(order)
    rank = len(order)
    if rank < 2 or stick_dim is None:
        return None   # upstream: at most two device dims (rank <= 1) is left alone
    pinned = set(pinned)
    se = stick_elems(dtype, stick_bytes)

    def device_extent(pos: int) -> int:
        d = order[pos]
        return -(-int(shape[d]) // se) if d == stick_dim else int(shape[d])

    outer_stick = order.index(stick_dim)
    slot = outer_stick + 1
    if slot >= rank or slot in pinned:
        return None   # the stick group already sits right before the stick elements
    candidates = [p for p in range(outer_stick) if int(shape[order[p]]) > 1 and p not in pinned]
    if not candidates:
        return None
    largest = max(candidates, key=device_extent)   # the first of equal extents, as upstream's max
    if device_extent(largest) <= device_extent(slot):
        return None
    order[slot], order[largest] = order[largest], order[slot]
    return order


def indirect_access_order(order: Sequence[int], gathered: Sequence[int], stick_dim: Optional[int]
                          ) -> tuple[list[int], set[int]]:
    """Phase 1: the table's gathered dims (not its stick dim) moved to the outermost device
    positions, the others kept in their order; and the positions now pinned."""
    lead = [d for d in gathered if d != stick_dim]
    out = lead + [d for d in order if d not in lead]
    return out, set(range(len(lead)))


def per_expert_order(order: Sequence[int], expert_dim: int) -> list[int]:
    """An expert weight's order: the expert dim outermost, the rest in `order`'s order."""
    return [expert_dim] + [d for d in order if d != expert_dim]


def upstream_dim_orders(pg: PrimGraph, steps, stick_of: dict, shapes: dict, dtypes: dict,
                        hw) -> tuple[dict[str, list[int]], dict[str, list[int]], set[str]]:
    """(dim orders to emit: every tensor whose order is not the plain row-major one; the
    orders the matmul reorder changed: tensor -> new order; the tensors kept row-major for
    the span limit). `steps` are the program's ops in emitted order (`passes.WorkStep`:
    compute ops with their restickified reads, and the restickify ops), `stick_of` every
    tensor's stick dim (restick copies included)."""
    stick_bytes = hw.stick_bytes
    graph_inputs = {t.id for t in pg.tensors.values()} - {op.output.tensor for op in pg.ops}
    # free views: both sides keep the plain row-major bytes an alias needs
    row_major: set[str] = set()
    for st in steps:
        if st.alias:
            row_major.add(st.prim.inputs[0].tensor)
            row_major.add(st.prim.output.tensor)
    # the stick dim of every tensor (ANY / None: the last dim, as make_layout reads them)
    sticks = {t: (len(shapes[t]) - 1 if len(shapes[t]) else None) if s is None or s == ANY else s
              for t, s in stick_of.items()}
    orders: dict[str, list[int]] = {}
    for t, s in sticks.items():
        rank = len(shapes[t])
        orders[t] = default_dim_order(rank, s) if t in row_major else spyre_default_dim_order(rank, s)

    for st in steps:   # expert weights, loaded per expert
        if st.prim.body.kind == "grouped_matmul":
            w = st.prim.inputs[1]
            if w.tensor in graph_inputs and w.tensor not in row_major and st.prim.body.g in w.dims:
                orders[w.tensor] = per_expert_order(orders[w.tensor], w.dims.index(st.prim.body.g))

    pinned: dict[str, set[int]] = {}
    for st in steps:   # phase 1: gather tables
        if st.prim.body.kind != "gather":
            continue
        table = st.prim.inputs[0].tensor
        if table in row_major:
            continue
        orders[table], pinned[table] = indirect_access_order(orders[table], st.prim.body.table_axes,
                                                             sticks[table])

    reordered: dict[str, list[int]] = {}
    seen: set[str] = set()
    for st in reversed(steps):   # phase 2: matmul operands, last matmul first
        if st.prim.body.kind != "matmul":
            continue
        for acc in st.prim.inputs:
            t = acc.tensor
            if t in seen or t in graph_inputs or t in row_major:
                continue
            seen.add(t)
            new = matmul_reorder(orders[t], shapes[t], sticks[t], dtypes[t], stick_bytes,
                                 pinned.get(t, ()))
            if new is not None:
                orders[t] = reordered[t] = new
    row_major_for_span = _over_span_limit(steps, orders, sticks, shapes, dtypes, hw)
    for t in row_major_for_span:
        orders[t] = default_dim_order(len(shapes[t]), sticks[t])
        reordered.pop(t, None)
    emitted = {t: o for t, o in orders.items() if o != default_dim_order(len(shapes[t]), sticks[t])}
    return emitted, reordered, row_major_for_span


def _over_span_limit(steps, orders: dict, sticks: dict, shapes: dict, dtypes: dict, hw) -> set[str]:
    """Tensors (in a non-row-major order) some op's core slice would reach past the
    per-core span limit in."""
    layouts = {t: make_layout(shapes[t], dtypes[t], sticks[t], hw.stick_bytes, orders[t]) for t in orders}
    # a tensor no larger than the limit cannot be spanned past it: only the large ones matter
    large = {t for t, lay in layouts.items() if layout_nbytes(lay, dtypes[t]) > hw.per_core_span_bytes}
    over: set[str] = set()
    for st in steps:
        if st.alias or not st.split or not large.intersection(a.tensor for a in st.prim.inputs + (st.prim.output,)):
            continue
        spans = first_slice_spans(st.prim, st.split, st.granules, layouts, shapes, dtypes)
        accs = list(st.prim.inputs) + [st.prim.output]
        for idx, span in spans.items():
            t = accs[idx].tensor
            if span > hw.per_core_span_bytes and orders[t] != default_dim_order(len(shapes[t]), sticks[t]):
                over.add(t)
    return over
