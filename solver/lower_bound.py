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
"""
from __future__ import annotations

from dataclasses import dataclass, field

from lowering.op_rules import stick_elems
from lowering.primitives import DTYPE_BYTES, PrimGraph, PrimOp


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
    ops: list[OpBound] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("lower_bound_us", "per_op_us", "datasheet_us",
                                              "datasheet_per_op_us", "compute_us", "memory_us",
                                              "compulsory_bytes")}


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
    return LowerBound(lower_bound_us=lb / 1e3, per_op_us=per_op / 1e3, datasheet_us=ds / 1e3,
                      datasheet_per_op_us=ds_per_op / 1e3, compute_us=comp / 1e3, memory_us=mem / 1e3,
                      compulsory_bytes=sum(o.bytes for o in ops), ops=ops)
