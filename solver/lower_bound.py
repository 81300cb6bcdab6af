"""A lower bound on the time of any plan of a graph, from the hardware file's best rates.

Per primitive op:
- compute: a matmul's MACs at the best PT rate any operand layouts give it
  (`simulator.timing_terms.best_matmul_rate_kind`: the sustained rate; operand orders only add
  stalls; every core busy, no padding, no short-M derating); a pointwise/reduce op's iteration points in
  whole sticks at one SFP stick per cycle per corelet (no transcendental surcharge) on every
  core; copies, gathers, fills and restickifies compute nothing;
- compulsory device-memory bytes: every graph input (user inputs and weights) read by the
  program crosses device memory once, charged to its first reader, and every graph output
  once, charged to its producer; intermediates could all stay in LX and cost nothing. An
  in-place store (`scatter`) reads none of its table and writes only its rows into it, so
  its output counts as those rows' bytes.
  Logical bytes (no stick padding), at the one-way bus rate with no read/write turnaround.

Two totals:
- `per_op_us` = sum over ops of max(compute, bytes / bandwidth) (a roofline per op): a bound
  for plans that run each op's loads and compute without overlapping other ops';
- `lower_bound_us` = max(sum of compute, sum of bytes / bandwidth): also a bound when the
  simulator fuses consecutive ops into one coarse-tiled kernel whose loads overlap another
  op's compute, so it holds for every plan the simulator can time. This is the headline.
Both are given at the simulated machine's best rates (sustained PT, fitted one-way
bandwidth) and at the datasheet's (PT peak, peak bandwidth): the physical limit.

`split_bound_us` (`split_bound`) is tighter and also holds for every plan the validator
accepts: it charges what every core split of a matmul costs in this machine model.
- Shared operands. A split leaves an operand unindexed and every core of that split
  needs its box (fan-out f): a shared box cannot be LX-resident (a producer writes each
  element on one core only), so it comes from device memory. Its bytes cross the bus once
  (a graph input's already in M; an intermediate's read is charged here) and, past the free
  fan-out, its delivery costs `hw.shared_read_delivery_ns` (P). Only for an operand this
  matmul alone reads: a tensor several ops read may be delivered once, in one fused kernel,
  at the narrowest fan-out any of its readers uses, so nothing is charged for it. When
  that operand is the result of a pointwise or reduce op (not a graph output) and the
  matmul reads all of it, its producer wrote it to device memory (no other term charges
  that write: M holds graph outputs only, and such a producer has no split term), and the
  timing model charges reading back what a kernel of the program wrote there the write
  drain (`hw.dram_raw_turnaround_ns_per_byte` per byte read): both go into P too (since
  2026-12-05; a copy producer may be a free alias and a matmul's write is its own W).
- Split reductions combine partials over the ring (`hw.ring_combine_ns`, R) into device
  memory (the validator's lx_reduction_split), so the output is written there, the kernel
  that reads its streamed weights and writes pays the read/write turnaround, and a reader
  that takes every element loads it back from there (W; no producer holds the combined
  result on chip, so even a fused reader loads it).
- A split on fewer cores leaves the array idle (C: MACs over the split's cores at the
  sustained rate).
Every byte above is moved in some op's memory time and counted once (M: graph inputs'
first copy and graph outputs; P and W: time beyond those). The simulator's total is at
least sum R + max(M + sum(P + W), C_other + sum C) (C_other the other ops' compute: a fused
kernel overlaps one member's loads with another's compute), and for every lam in [0, 1] at
least lam*M + (1-lam)*C_other + sum over matmuls of min over splits (R + lam*(P + W) +
(1-lam)*C): separable per op. The bound is the best lam on a
grid. Splits are enumerated over every stick choice with the least restrictive granules,
and bytes are logical (no stick padding), so nothing is over-charged.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from target.op_rules import ANY, legal_core_splits, split_granules, stick_elems, stick_options
from target.primitives import DTYPE_BYTES, PrimGraph, PrimOp, in_place_table
from target.geometry import core_ranges, default_core_slices, operand_box
from simulator.timing_terms import best_matmul_rate_kind, grouped_experts_hit

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
        if rate_kind == "sustained":
            rate_kind = best_matmul_rate_kind(op, hw, dtype)
        return _points(op) / (hw.pt_mac_per_ns(dtype, rate_kind) * hw.cores)
    if kind == "grouped_matmul":
        # each row takes one expert's product: M*N*K multiply-adds, not G times that
        return _points(op) / op.iter_dims[op.body.g].size / (hw.pt_mac_per_ns(dtype, "sustained") * hw.cores)
    if kind in ("pointwise", "reduce"):
        sticks = _points(op) / stick_elems(dtype, hw.stick_bytes)
        return sticks / (hw.sfp_sticks_per_ns_per_core * hw.cores)
    return 0.0


def _compulsory_bytes(pg: PrimGraph, op: PrimOp, acc) -> int:
    """Bytes of graph input `acc.tensor` the op must load. A grouped matmul's expert
    weights: only the experts its rows reach, as the timing model prices them (expected
    experts hit under uniform routing, simulator/timing.py "grouped matmul")."""
    n = _logical_bytes(pg, acc.tensor)
    if op.body.kind == "grouped_matmul" and acc is op.inputs[1]:
        G = op.iter_dims[op.body.g].size
        n = int(n * grouped_experts_hit(op.iter_dims[op.body.m].size, G) / max(1, G))
    return n


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
        # an in-place store reads none of its table and writes only its rows into it
        table = in_place_table(op)
        for acc in op.inputs:
            t = acc.tensor
            if t != table and t not in produced and t not in loaded:
                loaded.add(t)
                moved += _compulsory_bytes(pg, op, acc)
        if op.output.tensor in outputs:
            moved += (_logical_bytes(pg, op.output.tensor) if table is None
                      else min(_logical_bytes(pg, op.inputs[1].tensor), _logical_bytes(pg, op.output.tensor)))
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


@dataclass(frozen=True)
class _SplitTerm:
    """What one core split of a matmul costs beyond the compulsory bytes (module docstring), ns."""
    ring: float          # R
    extra_mem: float     # P: single-reader shared operands, plus W: the forced output write
    compute: float       # C


def _split_terms(op: PrimOp, pg: PrimGraph, hw, reads: dict[str, int], produced: set[str],
                 whole: "_WholeReads", forced_write=lambda t, op: False) -> list[_SplitTerm]:
    """Every core split any stick choice of matmul `op` allows. Logical bytes (no stick
    padding). `produced`: the tensors some op writes; `whole`: `_read_whole` per tensor."""
    dts = [pg.tensors[a.tensor].dtype for a in op.inputs] + [pg.tensors[op.output.tensor].dtype]
    rate = hw.pt_mac_per_ns(dts[0], best_matmul_rate_kind(op, hw, dts[0]))
    macs = _points(op)
    red = {d.name for d in op.iter_dims if d.kind == "reduction"}
    out_t = op.output.tensor
    splits: dict[tuple, tuple[dict, dict]] = {}
    for ch in stick_options(op):
        ins = [ANY if (s is None or s == ANY) else s for s in ch.inputs]
        gran = split_granules(op, ins, ch.output, dts, hw.stick_bytes)
        for sp in legal_core_splits(op, gran, hw.cores):
            splits.setdefault(tuple(sorted(sp.items())), (sp, gran))
    out = []
    for sp, gran in splits.values():
        per_core = core_ranges(op, sp, default_core_slices(op, sp), gran)
        per_core = {c: r for c, r in per_core.items() if all(b > a for a, b in r)}
        cores = len(per_core)
        first = next(iter(per_core.values()))

        def box_bytes(operand: int, ranges) -> int:
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
        ring = hw.ring_combine_ns(ways, box_bytes(-1, first))
        single_p = 0.0
        streamed_inputs = 0      # single-reader graph inputs this op reads over the shared bus
        for i, acc in enumerate(op.inputs):
            t = acc.tensor
            indexed = {op.iter_dims[d].name for d in acc.dims if d is not None}
            fanout = 1
            for n, f in sp.items():
                if n not in indexed:
                    fanout *= f
            graph_input = t not in produced
            if reads[t] > 1:
                continue
            if fanout > 1:
                # once over the bus (a graph input's bytes are in M), then delivered to f cores
                logical = _logical_bytes(pg, t)
                single_p += hw.shared_read_delivery_ns(logical, fanout)
                if not graph_input:
                    single_p += logical / hw.dram_oneway_gbps
                    if forced_write(t, op):
                        # and its pointwise/reduce producer wrote it there, which nothing
                        # else charges, and this read of an intermediate pays the write drain
                        single_p += logical / hw.dram_oneway_gbps + logical * hw.dram_raw_turnaround_ns_per_byte
            elif graph_input:
                streamed_inputs += _logical_bytes(pg, t)
        write = 0.0
        if ways > 1 or out_t in pg.outputs:
            # a split reduction's partials are combined into device memory (the validator's
            # lx_reduction_split), and a graph output reaches it anyway: this op's kernel
            # both reads its streamed weights and writes, and pays the turnaround
            w = _logical_bytes(pg, out_t)
            write = (0.0 if out_t in pg.outputs else w / hw.dram_oneway_gbps)
            if cores >= hw.dram_turnaround_min_cores:
                write += hw.dram_turnaround_ns_per_byte * min(streamed_inputs, w)
            if ways > 1 and whole(out_t):
                # and what is in device memory is read back from there, once at least
                write += w / hw.dram_oneway_gbps
        out.append(_SplitTerm(ring, single_p + write, macs / (cores * rate)))
    return out


def _read_whole(pg: PrimGraph, t: str, readers: Optional[list[PrimOp]] = None) -> bool:
    """Does some op that computes on `t` (not a copy or gather, which may take pieces) read
    every element of it? `readers`: the ops reading t (all ops when None)."""
    shape = pg.tensors[t].shape
    for op in (pg.ops if readers is None else readers):
        if op.body.kind in ("copy", "gather"):
            continue
        for a in op.inputs:
            if a.tensor == t and all(
                    s == 1 or (j < len(a.dims) and a.dims[j] is not None and op.iter_dims[a.dims[j]].size == s)
                    for j, s in enumerate(shape)):
                return True
    return False


class _WholeReads:
    """`_read_whole` per tensor over an index of its readers, cached: linear in the graph
    (a scan of every op per call made the bound quadratic: 2.9 s on a 32-layer Llama)."""

    def __init__(self, pg: PrimGraph):
        self.pg = pg
        self.readers: dict[str, list[PrimOp]] = {}
        for op in pg.ops:
            for t in {a.tensor for a in op.inputs}:
                self.readers.setdefault(t, []).append(op)
        self.cache: dict[str, bool] = {}

    def __call__(self, t: str) -> bool:
        if t not in self.cache:
            self.cache[t] = _read_whole(self.pg, t, self.readers.get(t, []))
        return self.cache[t]


def split_bound(pg: PrimGraph, hw, ops: list[OpBound], memory_ns: float) -> float:
    """The split-aware bound in ns (module docstring)."""
    return sum(split_bound_shares(pg, hw, ops, memory_ns).values())


def split_bound_shares(pg: PrimGraph, hw, ops: Optional[list[OpBound]] = None,
                       memory_ns: Optional[float] = None) -> dict[str, float]:
    """The split-aware bound (before `lower_bound`'s max with the plain bound) as per-op
    shares in ns at the bound's best lam: a matmul's least R + lam*(P + W) + (1-lam)*C over
    its splits, every other op (1-lam) * its compute, and each op lam * its compulsory bytes
    / bandwidth. They sum to `split_bound`; a program's op that runs longer than its share
    is where the plan loses to the bound (`benchmarks/bound_breakdown.py`)."""
    if ops is None:
        lb = lower_bound(pg, hw)
        ops, memory_ns = lb.ops, lb.memory_us * 1e3
    reads: dict[str, int] = {}
    for op in pg.ops:
        for a in op.inputs:
            reads[a.tensor] = reads.get(a.tensor, 0) + 1
    terms: dict[str, list[_SplitTerm]] = {}
    compute_other = 0.0
    produced = {o.output.tensor for o in pg.ops}
    whole = _WholeReads(pg)
    writer = {o.output.tensor: o for o in pg.ops}

    def forced_write(t: str, reader: PrimOp) -> bool:
        # a shared box of t is in device memory: a pointwise or reduce producer wrote it
        # there (a copy may be a free alias, a matmul's write is its own split term's), and
        # the reader reads every element of it (the write drain is charged per byte read)
        w = writer.get(t)
        return (w is not None and w.body.kind in ("pointwise", "reduce") and t not in outputs
                and _read_whole(pg, t, [reader]))
    # the terms depend only on the op's structure and its operands' shapes, dtypes, reader
    # counts and roles: the same matmul in every layer of a deep model is priced once
    cache: dict[tuple, list[_SplitTerm]] = {}
    outputs = set(pg.outputs)
    for op, ob in zip(pg.ops, ops):
        if op.body.kind == "matmul":
            out_t = pg.tensors[op.output.tensor]
            key = (op.iter_dims, op.body, op.output.dims, out_t.shape, out_t.dtype, out_t.id in outputs,
                   whole(out_t.id), tuple((a.dims, pg.tensors[a.tensor].shape, pg.tensors[a.tensor].dtype,
                                           reads[a.tensor], a.tensor in produced, forced_write(a.tensor, op))
                                          for a in op.inputs))
            if key not in cache:
                cache[key] = _split_terms(op, pg, hw, reads, produced, whole, forced_write)
            terms[op.id] = cache[key]
        else:
            compute_other += ob.compute_ns
    best: Optional[dict[str, float]] = None
    for lam in _LAMBDAS:
        shares = {}
        for op, ob in zip(pg.ops, ops):
            ts = terms.get(op.id)
            own = (min((t.ring + lam * t.extra_mem + (1 - lam) * t.compute for t in ts), default=0.0)
                   if ts is not None else (1 - lam) * ob.compute_ns)
            shares[op.id] = own + lam * ob.bytes / hw.dram_oneway_gbps
        if best is None or sum(shares.values()) > sum(best.values()):
            best = shares
    return best or {}
