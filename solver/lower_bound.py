"""A lower bound on the time of any plan of a graph, from the hardware file's best rates.

Per primitive op:
- compute: a matmul's MACs at the best PT rate (`pt_mac_per_ns(dtype, "sustained")`, every
  core busy, no padding, no short-M derating); a pointwise/reduce op's iteration points in
  whole sticks at one SFP stick per cycle per corelet (no transcendental surcharge) on every
  core; copies, gathers, fills and restickifies compute nothing;
- compulsory device-memory bytes: every graph input (user inputs and weights) read by the
  program crosses device memory once, charged to its first reader, and every graph output
  once, charged to its producer; intermediates could all stay in LX and cost nothing.
  Logical bytes (no stick padding), at the one-way bus rate with no read/write turnaround.

Two totals:
- `per_op_us` = sum over ops of max(compute, bytes / bandwidth) (DESIGN.md's form): a bound
  for plans that run each op's loads and compute without overlapping other ops';
- `lower_bound_us` = max(sum of compute, sum of bytes / bandwidth): also a bound when the
  simulator fuses consecutive ops into one coarse-tiled kernel whose loads overlap another
  op's compute, so it holds for every plan the simulator can time. This is the headline.
Both are given at the simulated machine's best rates (sustained PT, fitted one-way
bandwidth) and at the datasheet's (PT peak, peak bandwidth): the physical limit.

`split_bound_us` (`split_bound`) is tighter and also holds for every plan the validator
accepts: it charges what every core split of a matmul costs in this machine model. A
split either leaves an operand unindexed, and every core of that split loads its box
(`hw.replicated_read_ns`, from device memory: a replicated box cannot be LX-resident, since a
producer writes each element on one core only), or splits the reduction dim, and the
partials are combined over the ring (`hw.ring_combine_ns`), or uses fewer cores, and the
array takes longer. With R (ring), P (replicated loads beyond the operand's compulsory
bytes) and C (MACs over the split's cores at the sustained rate) of the split each matmul
takes, the simulator's total is at least  sum R + max(M + sum P, C_other + sum C)  (M the
compulsory bytes' time, C_other the other ops' compute), and for every lam in [0, 1] at least
lam*M + (1-lam)*C_other + sum over matmuls of min over splits (R + lam*P + (1-lam)*C):
separable per op. The bound is the best lam on a grid. An operand tensor read more than
once is charged no P (a fused kernel reads it once), and splits are enumerated over every
stick choice with the least restrictive granules, so nothing is over-charged.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from lowering.op_rules import ANY, legal_core_splits, split_granules, stick_elems, stick_options
from lowering.primitives import DTYPE_BYTES, PrimGraph, PrimOp
from simulator.geometry import operand_box, slice_ranges

_LAMBDAS = tuple(i / 20 for i in range(21))


@dataclass
class OpBound:
    op_id: str
    compute_ns: float          # simulated machine's best rate
    bytes: int                 # compulsory device-memory bytes charged to this op
    compute_peak_ns: float     # datasheet rate


@dataclass
class LowerBound:
    lower_bound_us: float       # max(sum compute, sum bytes / bw), simulated rates
    per_op_us: float            # sum of per-op max(compute, bytes / bw), simulated rates
    datasheet_us: float         # lower_bound_us at the datasheet rates
    datasheet_per_op_us: float
    compute_us: float
    memory_us: float
    compulsory_bytes: int
    split_bound_us: float = 0.0  # >= lower_bound_us: also charges every matmul's core split
    ops: list[OpBound] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("lower_bound_us", "per_op_us", "datasheet_us",
                                              "datasheet_per_op_us", "compute_us", "memory_us",
                                              "compulsory_bytes", "split_bound_us")}


def _points(op: PrimOp) -> int:
    n = 1
    for d in op.iter_dims:
        n *= d.size
    return n


def _compute_ns(op: PrimOp, pg: PrimGraph, hw, rate_kind: str) -> float:
    kind = op.body.kind
    dtype = pg.tensors[op.inputs[0].tensor].dtype if op.inputs else pg.tensors[op.output.tensor].dtype
    if kind == "matmul":
        return _points(op) / (hw.pt_mac_per_ns(dtype, rate_kind) * hw.cores)
    if kind in ("pointwise", "reduce"):
        sticks = _points(op) / stick_elems(dtype, hw.stick_bytes)
        return sticks / (hw.sfp_sticks_per_ns_per_core * hw.cores)
    return 0.0


def _logical_bytes(pg: PrimGraph, tensor: str) -> int:
    t = pg.tensors[tensor]
    return t.numel * DTYPE_BYTES[t.dtype]


def lower_bound(pg: PrimGraph, hw) -> LowerBound:
    produced = {op.output.tensor for op in pg.ops}
    outputs = set(pg.outputs)
    loaded: set[str] = set()
    ops: list[OpBound] = []
    for op in pg.ops:
        moved = 0
        for acc in op.inputs:
            t = acc.tensor
            if t not in produced and t not in loaded:
                loaded.add(t)
                moved += _logical_bytes(pg, t)
        if op.output.tensor in outputs:
            moved += _logical_bytes(pg, op.output.tensor)
        ops.append(OpBound(op.id, _compute_ns(op, pg, hw, "sustained"), moved,
                           _compute_ns(op, pg, hw, "peak")))

    def totals(bw_gbps: float, peak: bool) -> tuple[float, float, float, float]:
        comp = sum(o.compute_peak_ns if peak else o.compute_ns for o in ops)
        mem = sum(o.bytes for o in ops) / bw_gbps
        per_op = sum(max(o.compute_peak_ns if peak else o.compute_ns, o.bytes / bw_gbps) for o in ops)
        return max(comp, mem), per_op, comp, mem

    lb, per_op, comp, mem = totals(hw.dram_oneway_gbps, peak=False)
    ds, ds_per_op, _, _ = totals(hw.dram_peak_gbps, peak=True)
    split_lb = split_bound(pg, hw, ops, mem)
    return LowerBound(lower_bound_us=lb / 1e3, per_op_us=per_op / 1e3, datasheet_us=ds / 1e3,
                      datasheet_per_op_us=ds_per_op / 1e3, compute_us=comp / 1e3, memory_us=mem / 1e3,
                      compulsory_bytes=sum(o.bytes for o in ops), split_bound_us=max(lb, split_lb) / 1e3,
                      ops=ops)


def _split_terms(op: PrimOp, pg: PrimGraph, hw, read_once: set[str]) -> list[tuple[float, float, float]]:
    """(R, P, C) in ns for every core split any stick choice of matmul `op` allows (module
    docstring). Logical bytes (no stick padding) and the largest work slice (slice 0)."""
    dts = [pg.tensors[a.tensor].dtype for a in op.inputs] + [pg.tensors[op.output.tensor].dtype]
    rate = hw.pt_mac_per_ns(dts[0], "sustained")
    macs = _points(op)
    red = {d.name for d in op.iter_dims if d.kind == "reduction"}
    splits: dict[tuple, tuple[dict, dict]] = {}
    for ch in stick_options(op):
        ins = [ANY if (s is None or s == ANY) else s for s in ch.inputs]
        gran = split_granules(op, ins, ch.output, dts, hw.stick_bytes)
        for sp in legal_core_splits(op, gran, hw.cores):
            splits.setdefault(tuple(sorted(sp.items())), (sp, gran))
    out = []
    for sp, gran in splits.values():
        cores = 1
        for f in sp.values():
            cores *= f
        ranges = slice_ranges(op, sp, {}, gran)
        def box_bytes(operand: int) -> int:
            acc = op.output if operand < 0 else op.inputs[operand]
            t = pg.tensors[acc.tensor]
            n = 1
            for a, b in operand_box(op, operand, ranges, t.shape):
                n *= b - a
            return n * DTYPE_BYTES[t.dtype]
        ways = 1
        for n, f in sp.items():
            if n in red:
                ways *= f
        ring = hw.ring_combine_ns(ways, box_bytes(-1))
        repl = 0.0
        for i, acc in enumerate(op.inputs):
            indexed = {op.iter_dims[d].name for d in acc.dims if d is not None}
            if acc.tensor in read_once and any(f > 1 and n not in indexed for n, f in sp.items()):
                t = acc.tensor
                # its compulsory bytes (charged in M when it is a graph input) move here instead
                compulsory = 0.0 if t in {o.output.tensor for o in pg.ops} else _logical_bytes(pg, t) / hw.dram_oneway_gbps
                repl = max(repl, hw.replicated_read_ns(box_bytes(i)) - compulsory)
        out.append((ring, max(0.0, repl), macs / (cores * rate)))
    return out


def split_bound(pg: PrimGraph, hw, ops: list[OpBound], memory_ns: float) -> float:
    """The split-aware bound in ns (module docstring)."""
    reads: dict[str, int] = {}
    for op in pg.ops:
        for a in op.inputs:
            reads[a.tensor] = reads.get(a.tensor, 0) + 1
    read_once = {t for t, n in reads.items() if n == 1}
    terms = {}
    compute_other = 0.0
    for op, ob in zip(pg.ops, ops):
        if op.body.kind == "matmul":
            terms[op.id] = _split_terms(op, pg, hw, read_once)
        else:
            compute_other += ob.compute_ns
    best = 0.0
    for lam in _LAMBDAS:
        total = lam * memory_ns + (1 - lam) * compute_other
        for ts in terms.values():
            total += min((r + lam * p + (1 - lam) * c for r, p, c in ts), default=0.0)
        best = max(best, total)
    return best
