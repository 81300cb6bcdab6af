"""Terms of the timing model that are about one kind of op or one mechanism, each with
its mechanism and its fitted constants in the hardware file (docs/simulator-timing.md):
- split-K partial sums combined per output tile (`partials_combined_per_output_tile`);
- the operand-order stall of a matmul or projection whose operands keep the batch inside
  the row dims (`matmul_layout_stall`);
- grouped (mixture-of-experts) matmuls under uniform routing (`grouped_*`);
- temporal tiling: per-tile re-reads of an operand the tiled dim does not index, and the
  share of an operand each tile moves (`tile_rereads`, `tile_share`, `reduction_tiles`).
`simulator.timing.OpTimer` combines them into an op's time."""
from __future__ import annotations

import math

from target.geometry import box_lx_bytes
from target.hardware import Hardware
from target.primitives import MatmulBody, PrimOp
from target.superdsc import OpDecl, TensorDecl


def matmul_batch_dims(prim: PrimOp) -> tuple[list[int], list[int]]:
    """A matmul's batch iteration dims: those both operands index (a bmm's), and those x
    indexes (a projection's batched x against a weight every batch shares)."""
    body = prim.body
    x, y = prim.inputs[0], prim.inputs[1]
    other = [i for i in range(len(prim.iter_dims)) if i not in (body.m, body.n, body.k)]
    return [i for i in other if i in x.dims and i in y.dims], [i for i in other if i in x.dims]


def matmul_layout_stall(prim: PrimOp, tensors: dict[str, TensorDecl], hw: Hardware,
                        extents: tuple[int, ...] | None = None) -> tuple[float, list[str]]:
    """Extra PT time per MAC per core from the operands' device orders, and which operands
    cause it.

    A batched matmul (a bmm: batch iteration dims indexed by both x and y; or a projection:
    a batched x against a weight every batch shares) feeds the array row by row. An operand
    that carries batch dims but does not keep them outermost in its `dim_order` (the
    compiler's default tile order puts the batch just inside the row dims) interleaves the
    batches' rows, so each row fetch of the feed (x, y) or drain (the output) strides across
    batches. Each such input stalls the feed, a batch-inside output stalls the drain, which
    overlaps the feed stalls (`Hardware.pt_layout_stall_ns_per_mac`); the stall grows with
    the batch extent up to `bmm_layout_saturation_batch` (`Hardware.batch_interleave`).

    What interleaves is the rows one core feeds: the batch extent is that of the core's
    slice (`extents`, per iteration dim; None: the whole op). A core whose slice holds one
    batch (the batch dims split over the cores down to one, e.g. one attention head per
    core) feeds the rows of that batch only, in order: no stall, whatever the order in
    device memory. Whether the op is a bmm or a projection is the op's, not the slice's."""
    assert isinstance(prim.body, MatmulBody)
    both, batch = matmul_batch_dims(prim)
    batch = [i for i in batch if prim.iter_dims[i].size > 1]
    shared_weight = not [i for i in both if prim.iter_dims[i].size > 1]
    if not batch:
        return 0.0, []
    extent = math.prod((prim.iter_dims[i].size if extents is None else extents[i]) for i in batch)
    if extent <= 1:
        return 0.0, []
    inside = []
    for name, acc in (("x", prim.inputs[0]), ("y", prim.inputs[1]), ("out", prim.output)):
        mine = [i for i in batch if i in acc.dims]
        if mine and not batch_outermost(acc, mine, tensors):
            inside.append(name)
    n_in = sum(1 for n in inside if n != "out")
    stall = hw.pt_layout_stall_ns_per_mac(n_in, "out" in inside, extent, shared_weight)
    return stall, inside


def best_matmul_rate_kind(prim: PrimOp, hw: Hardware, dtype: str) -> str:
    """The fastest PT rate any operand layouts give this matmul (lower bounds charge it):
    the sustained rate, every operand in feed order (no operand-order stall)."""
    return "sustained"


def batch_outermost(acc, batch: list[int], tensors: dict[str, TensorDecl]) -> bool:
    """Every batch dim of the operand comes before every other dim with extent in its
    device `dim_order` (size-1 dims hold no data and may sit anywhere)."""
    td = tensors[acc.tensor]
    batch_tdims = {j for j, d in enumerate(acc.dims) if d in batch}
    seen_other = False
    for j in td.layout.dim_order:
        if td.shape[j] <= 1:
            continue
        if j in batch_tdims:
            if seen_other:
                return False
        else:
            seen_other = True
    return True


# -- grouped matmul (mixture of experts) ------------------------------------------------------
# The rows of a grouped matmul are (token, slot) pairs sorted by expert; which expert each
# row takes is data. Static pricing assumes uniform routing: each of the M rows goes to
# one of the G experts with equal probability. Rates are the matmul ones (sustained PT
# rate, pass efficiency, whole-stick K and N); no new hardware number is involved.
def grouped_experts_hit(rows: float, groups: int) -> float:
    """Expected distinct experts among `rows` uniformly routed rows (G (1 - (1 - 1/G)^rows))."""
    if groups <= 1:
        return float(groups)
    return groups * (1.0 - (1.0 - 1.0 / groups) ** rows)


def grouped_rows(prim: PrimOp, extents: tuple[int, ...]) -> float:
    """Rows one core computes: its M slice times the share of experts it holds."""
    b = prim.body
    G = prim.iter_dims[b.g].size
    return extents[b.m] * extents[b.g] / max(1, G)


def grouped_core_experts(prim: PrimOp, extents: tuple[int, ...]) -> float:
    """Experts whose weights one core loads (an expectation: a fraction when the core's
    experts may get no row): those its rows reach. The core's rows are a contiguous block
    of the expert-sorted rows restricted to its experts, so they span at most their share
    of the experts hit plus one boundary. Per-core imbalance of real routing (a decode
    token's two experts on two cores, the others idle) is not modelled."""
    b = prim.body
    G, M = prim.iter_dims[b.g].size, prim.iter_dims[b.m].size
    g_core, m_core = extents[b.g], extents[b.m]
    hit = grouped_experts_hit(M, G)
    span = hit * m_core / max(1, M) + (1.0 if m_core < M else 0.0)
    return min(g_core * hit / max(1, G), span, float(g_core))


def grouped_operand_bytes(prim: PrimOp, operand: int, extents: tuple[int, ...], box_bytes: float) -> float:
    """Device bytes one core moves for x (operand 0: only the rows routed to its experts)
    or the expert weights (operand 1: only the experts its rows reach)."""
    b = prim.body
    G = prim.iter_dims[b.g].size
    if operand == 0:
        return box_bytes * extents[b.g] / max(1, G)
    return box_bytes * grouped_core_experts(prim, extents) / max(1, extents[b.g])


def grouped_weight_floor(prim: PrimOp, td: TensorDecl) -> float:
    """Bytes of the expert weights that cross the bus at least: the experts the op's rows
    reach (cores split over rows read different experts, not one shared box)."""
    b = prim.body
    G = prim.iter_dims[b.g].size
    whole = box_lx_bytes(tuple((0, s) for s in td.shape), td.layout, td.dtype)
    return whole * grouped_experts_hit(prim.iter_dims[b.m].size, G) / max(1, G)


def grouped_compute_ns(prim: PrimOp, classes: list, hw: Hardware, dtype: str) -> dict[int, float]:
    """PT time per tile class: the routed rows times the core's N and K slices (padded to
    whole sticks), at the sustained rate derated by the rows of one expert's pass."""
    b = prim.body
    rate = hw.pt_mac_per_ns(dtype, "sustained")
    stick = hw.elems_per_stick(dtype)
    out = {}
    for ci, cl in enumerate(classes):
        rows = grouped_rows(prim, cl.extents)
        n_pad = -(-cl.extents[b.n] // stick) * stick
        k_pad = -(-cl.extents[b.k] // stick) * stick
        experts = max(1.0, grouped_core_experts(prim, cl.extents))
        eff = hw.pt_pass_efficiency(max(1, int(math.ceil(rows / experts))))
        out[ci] = rows * n_pad * k_pad / (rate * eff)
    return out


def tile_rereads(prim: PrimOp, op: OpDecl, operand: int) -> int:
    """How many times a tile loop reads input `operand`'s box: the product of the temporal
    tiles of the dims it does not index (1 when every tiled dim indexes it)."""
    if not op.temporal_tiles:
        return 1
    indexed = {prim.iter_dims[d].name for d in prim.inputs[operand].dims if d is not None}
    n = 1
    for name, t in op.temporal_tiles.items():
        if int(t) > 1 and name not in indexed:
            n *= int(t)
    return n


def tile_share(prim: PrimOp, op: OpDecl, operand: int, tiles: int) -> float:
    """The share of an operand's per-core box one temporal tile holds: 1 / the tiles of the
    dims it indexes; 0 for an input re-streamed whole every tile (no tiled dim indexes it)."""
    if tiles <= 1:
        return 1.0
    if operand >= 0:
        again = tile_rereads(prim, op, operand)
        if again >= tiles:
            return 0.0
        return again / tiles
    out_dims = {prim.iter_dims[d].name for d in prim.output.dims if d is not None}
    own = 1
    for name, t in op.temporal_tiles.items():
        if name in out_dims:
            own *= max(1, int(t))
    return 1.0 / own


def reduction_tiles(prim: PrimOp, op: OpDecl) -> int:
    """Temporal tiles over the op's reduction dims (K tiles of a matmul)."""
    red = {d.name for d in prim.iter_dims if d.kind == "reduction"}
    n = 1
    for name, t in op.temporal_tiles.items():
        if name in red:
            n *= max(1, int(t))
    return n


# -- split-K partial sums ----------------------------------------------------------------------
def partials_combined_per_output_tile(prim: PrimOp, op: OpDecl) -> bool:
    """Whether the op's split-K partial sums are combined with its K collaborators' (the
    cores that share one output slice) output tile by output tile: true for every matmul
    whose reduction dim is split over cores, whatever order `coreIdToWkSlice_` puts the
    collaborators in.

    Nothing is held past the tile, so nothing spills, but a core waits for each tile's
    combine before it loads the next: loads and compute run in series. The profiled split
    sweep of 2026-06 (K collaborators adjacent: the "k-fast" emission, on by default in its
    build) runs up to 25 MB of partial sums per core without a spill (MLP-up prefill at K
    split 32: 4.2 ms) and its prefill K splits take about loads + PT time."""
    red = {d.name for d in prim.iter_dims if d.kind == "reduction"}
    return any(v > 1 and k in red for k, v in op.core_split.items())
