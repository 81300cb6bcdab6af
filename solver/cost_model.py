"""The planner's cost model: predicted time per op, cheap enough to price every strategy
and every residency combination of every op, in integer nanoseconds for CP-SAT.

It approximates the simulator's timing model (`simulator.timing`, the ground truth) term by
term and reuses its per-op helpers (tile classes, per-core boxes, expression op counts,
matmul layout rate class) so the two cannot drift apart on geometry; every rate comes from
the one hardware description (`simulator.hardware.Hardware`). What it leaves out:
temporal tiling, double buffering and fused coarse-tiled groups (the CP-SAT planner never
tiles: in the timing model tiling only adds loop overhead and spill derates, so an untiled
strategy is never worse), clone-in of LX-resident graph inputs (the planner never makes a
graph input resident), and classes of uneven padding-aware slices share one byte ratio.
`benchmarks/cost_model_fidelity.py` measures how close it is.

Per op: time = max(memory, compute) + ring combine, where
- memory: device-memory bytes of the operands that are not LX-resident over the shared bus
  (one-way rate + read/write turnaround when several cores interleave), at the access-pattern
  rate of the op class (restickify; row reduction curve / cross-row reduction; broadcast-
  operand pointwise, a broadcast operand loaded once), divided by the underfill efficiency
  of the per-core tile; plus, for a matmul operand its split does not index, the replicated
  per-core load at the per-core ceiling;
- compute: matmul MACs of the busiest core (K and N in whole sticks) at the PT rate of its
  layout class, derated for short per-core M; SFP ops: whole sticks x cycles per stick;
- ring: a split reduction dim sums partials across the cores of the split.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Mapping, Optional, Sequence

from lowering.primitives import MatmulBody, PointwiseBody, PrimOp, ReduceBody, op_from_json
from simulator.geometry import box_lx_bytes, default_core_slices, op_granules
from simulator.superdsc import CoreSlice, Layout, LxMemory, Program
from simulator.timing import (  # the timing model's own helpers: one home for each concept
    _box, _is_broadcast_op, _matmul_layout_rate, _n_expr_ops, _tile_classes,
)

GRAPH_INPUT_ROLES = ("user_input", "parameter", "buffer", "constant")


@dataclass(frozen=True)
class OpCost:
    memory_ns: float
    compute_ns: float
    ring_ns: float
    read_bytes: float
    write_bytes: float

    @property
    def total_ns(self) -> float:
        return max(self.memory_ns, self.compute_ns) + self.ring_ns


@dataclass(frozen=True)
class OpCostParts:
    """The pieces of an op's cost that do not depend on which operands are LX-resident."""

    kind: str                         # compute | restickify | relayout
    body: str                         # matmul | pointwise | reduce | copy | gather | fill
    n_cores: int
    compute_ns: float
    ring_ns: float
    in_read_bytes: tuple[float, ...]  # bus bytes input i reads when in device memory
    in_replicated: tuple[float, ...]  # per-core replicated-load bytes of input i (matmul), 0 if none
    in_full: tuple[bool, ...]         # input i indexes every iteration dim (broadcast test)
    write_bytes: float                # bus bytes of the output when in device memory
    reduce_gbps: Optional[float]      # access-pattern rate of a reduction, None otherwise
    underfill: float                  # stream efficiency of the per-core tile (1: none)
    lx_core_bytes: float              # per-core LX bytes moved when operands are resident
    alias: bool = False

    def cost(self, in_lx: Sequence[bool], out_lx: bool, hw) -> OpCost:
        if self.alias:
            return OpCost(0.0, 0.0, 0.0, 0.0, 0.0)
        r = sum(b for b, lx, rep in zip(self.in_read_bytes, in_lx, self.in_replicated)
                if not lx and not rep)
        w = 0.0 if out_lx else self.write_bytes
        n = self.n_cores
        if self.kind == "relayout" or (self.kind == "restickify" and r == 0 and w == 0):
            mem = self.lx_core_bytes * 2 / hw.lx_relayout_gbps_per_core
        elif self.kind == "restickify":
            mem = min(hw.dram_ns(r, w, cores=n), (r + w) / hw.restickify_gbps)
        elif self.reduce_gbps is not None and r > 0:
            mem = hw.dram_ns(r, w, self.reduce_gbps, cores=n)
        else:
            mem = hw.dram_ns(r, w, cores=n)
            if self.body == "pointwise" and w > 0:
                live = [f for f, lx in zip(self.in_full, in_lx) if not lx]
                if any(live) and not all(live):
                    mem = min(mem, (r + w) / hw.broadcast_op_gbps)
        if self.body != "matmul" and mem > 0 and self.kind == "compute":
            mem /= self.underfill
        rep = max([b for b, lx in zip(self.in_replicated, in_lx) if not lx and b], default=0.0)
        if rep:
            mem += hw.mm_replicated_read_fixed_us * 1e3 + rep / hw.mm_replicated_read_gbps_per_core
        comp = self.compute_ns
        if self.body in ("copy", "gather") and self.kind == "compute" and (any(in_lx) or out_lx):
            comp = self.lx_core_bytes / hw.lx_relayout_gbps_per_core
        return OpCost(mem, comp, self.ring_ns, r, w)


@dataclass(frozen=True)
class OpView:
    """What one op's cost depends on: its loop nest and kind, the operand tensors' shapes,
    dtypes, layouts and roles, its split and core slices, the free-alias flag."""

    prim: PrimOp
    kind: str
    shapes: Mapping[str, Sequence[int]]
    dtypes: Mapping[str, str]
    layouts: Mapping[str, Layout]
    core_split: Mapping[str, int]
    core_slices: Sequence[CoreSlice]
    alias: bool = False


def op_cost_parts(v: OpView, hw) -> OpCostParts:
    prim = v.prim
    body = prim.body
    n_in = len(prim.inputs)
    if v.alias:
        return OpCostParts(v.kind, body.kind, 1, 0.0, 0.0, (0.0,) * n_in, (0.0,) * n_in,
                           (True,) * n_in, 0.0, None, 1.0, 0.0, alias=True)
    gran = op_granules(prim, v.layouts, v.dtypes, hw.stick_bytes)
    split = {k: f for k, f in v.core_split.items() if f > 1}
    slices = list(v.core_slices) or (default_core_slices(prim, split) if split else [])
    classes = _tile_classes(prim, SimpleNamespace(core_split=split, core_slices=slices), gran)
    n_cores = sum(len(c.cores) for c in classes)
    name_of = {i: d.name for i, d in enumerate(prim.iter_dims)}
    is_matmul = isinstance(body, MatmulBody)
    red_split = 1
    for i, d in enumerate(prim.iter_dims):
        if d.kind == "reduction":
            red_split *= split.get(d.name, 1)

    def per_core_bytes(idx: int, t: str) -> list[float]:
        out = []
        shape = list(v.shapes[t])
        lay, dt = v.layouts[t], v.dtypes[t]
        for cl in classes:
            if idx >= 0 and body.kind == "copy":
                o = prim.output.tensor
                oshape = list(v.shapes[o])
                frac = 1.0
                for (a, b), s in zip(_box(prim, -1, cl.extents, oshape), oshape):
                    frac *= (b - a) / max(1, s)
                whole = box_lx_bytes(tuple((0, s) for s in shape), lay, dt)
                out.append(float(math.ceil(whole * frac)))
            elif idx == 0 and body.kind == "gather":
                o = prim.output.tensor
                out.append(float(box_lx_bytes(_box(prim, -1, cl.extents, list(v.shapes[o])),
                                              v.layouts[o], dt)))
            else:
                out.append(float(box_lx_bytes(_box(prim, idx, cl.extents, shape), lay, dt)))
        return out

    reads, repls, full = [], [], []
    biggest = (-1.0, None, None)
    lx_core = 0.0
    for i, acc in enumerate(prim.inputs):
        indexed = {name_of[d] for d in acc.dims if d is not None}
        repl = 1
        for nme, f in split.items():
            if nme not in indexed:
                repl *= f
        pc = per_core_bytes(i, acc.tensor)
        total = sum(b * len(cl.cores) for b, cl in zip(pc, classes))
        lx_core = max(lx_core, max(pc))
        if is_matmul and repl > 1:
            reads.append(0.0)
            repls.append(max(pc))
        else:
            reads.append(total / repl)
            repls.append(0.0)
        full.append(len({d for d in acc.dims if d is not None}) == len(prim.iter_dims))
        if not (body.kind in ("copy", "gather")) and max(pc) > biggest[0]:
            biggest = (max(pc), i, pc)
    out_t = prim.output.tensor
    pc_out = per_core_bytes(-1, out_t)
    write = sum(b * len(cl.cores) for b, cl in zip(pc_out, classes)) / red_split
    lx_core = max(lx_core, max(pc_out))
    if max(pc_out) > biggest[0]:
        biggest = (max(pc_out), -1, pc_out)

    reduce_gbps = None
    if isinstance(body, ReduceBody) and body.fn != "cumsum":
        red_dims = {i for i, d in enumerate(prim.iter_dims) if d.kind == "reduction"}
        src = prim.inputs[0]
        st = v.layouts[src.tensor].stick_dim
        stick_iter = src.dims[st] if st is not None and st < len(src.dims) else None
        if stick_iter in red_dims:
            rows = 1
            for d in prim.iter_dims:
                if d.kind == "parallel":
                    rows *= d.size
            reduce_gbps = hw.reduction_read_curve.gbps(rows)
        else:
            reduce_gbps = hw.cross_row_reduction_gbps

    underfill = 1.0
    if not is_matmul and v.kind == "compute" and biggest[1] is not None:
        idx, pc = biggest[1], biggest[2]
        t = out_t if idx < 0 else prim.inputs[idx].tensor
        worst = max(range(len(classes)), key=lambda ci: pc[ci])
        box = _box(prim, idx, classes[worst].extents, list(v.shapes[t]))
        st = v.layouts[t].stick_dim
        cols = (box[st][1] - box[st][0]) if st is not None else 1
        elems = 1
        for a, b in box:
            elems *= (b - a)
        underfill = hw.underfill_curve.efficiency(elems / max(1, cols), cols)

    comp = 0.0
    dtype_in = v.dtypes[prim.inputs[0].tensor] if prim.inputs else v.dtypes[out_t]
    if is_matmul:
        tensors = {a.tensor: SimpleNamespace(layout=v.layouts[a.tensor]) for a in prim.inputs}
        rate_kind, _ = _matmul_layout_rate(prim, tensors, hw)
        rate = hw.pt_mac_per_ns(dtype_in, rate_kind)
        stick = hw.elems_per_stick(dtype_in)
        for cl in classes:
            ext = [(-(-e // stick) * stick) if i in (body.k, body.n) else e
                   for i, e in enumerate(cl.extents)]
            comp = max(comp, math.prod(ext) / (rate * hw.pt_pass_efficiency(cl.extents[body.m])))
    elif body.kind in ("pointwise", "reduce") and v.kind == "compute":
        a, t = _n_expr_ops(body.expr)
        if isinstance(body, ReduceBody):
            a += 1
        cycles = max(1, a) + t * hw.sfp_transcendental_cycles
        stick_iter = None
        for acc in list(prim.inputs) + [prim.output]:
            st = v.layouts[acc.tensor].stick_dim
            if st is not None and st < len(acc.dims) and acc.dims[st] is not None:
                stick_iter = acc.dims[st]
                break
        per_stick = hw.elems_per_stick(dtype_in)
        for cl in classes:
            pts = 1
            for i, e in enumerate(cl.extents):
                pts *= (-(-e // per_stick) * per_stick) if i == stick_iter else e
            comp = max(comp, pts / per_stick * cycles / hw.sfp_sticks_per_ns_per_core)

    ring = 0.0
    if red_split > 1:
        ring = (red_split - 1) * (max(pc_out) / hw.ring_gbps_per_direction + hw.ring_hop_latency_ns)
    return OpCostParts(v.kind, body.kind, max(1, n_cores), comp, ring, tuple(reads), tuple(repls),
                       tuple(full), write, reduce_gbps, underfill, lx_core)


# -- whole programs ----------------------------------------------------------------------
def predict_program_ns(program: Program, hw) -> float:
    """Predicted time of a program: the sum of its ops' predicted times."""
    tmap = program.tensor_map()
    shapes = {t.id: t.shape for t in program.tensors}
    dtypes = {t.id: t.dtype for t in program.tensors}
    layouts = {t.id: t.layout for t in program.tensors}
    total = 0.0
    for o in program.ops:
        if o.prim is None:
            continue
        prim = op_from_json(o.prim)
        view = OpView(prim, o.kind, shapes, dtypes, layouts, o.core_split, o.core_slices, o.alias)
        in_lx = [isinstance(tmap[a.tensor].memory, LxMemory) for a in prim.inputs]
        out_lx = isinstance(tmap[prim.output.tensor].memory, LxMemory)
        total += op_cost_parts(view, hw).cost(in_lx, out_lx, hw).total_ns
    return total


def predict_program_us(program: Program, hw) -> float:
    return predict_program_ns(program, hw) / 1000.0


def to_units(ns: float) -> int:
    """Integer time units of the CP-SAT objective: nanoseconds."""
    return int(round(ns))
