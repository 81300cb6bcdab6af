"""The planner-independent decisions model: what a planner decides, nothing it derives.

Every planner (naive, heuristic, cpsat) fills a `PlanDecisions`; `solver.emit.emit_program`
turns it into a SuperDSC program (restickify insertion, memory allocation, core slices,
bundles, stats). Keys are primitive op ids and tensor ids of the PrimGraph.

- `ops[op_id]` (`OpPlan`): the op's stick choice (one of `target.op_rules.stick_options`),
  its core split (iteration-dim name -> factor), temporal tiles, optionally an explicit
  core -> work-slice map, and whether a copy is claimed a free alias.
- A tensor's layout is the one its producer writes (the op's stick choice output); a graph
  input's layout is `input_sticks[tensor]` (default: last dim). `dim_orders[tensor or
  restick id]` orders its dims on the device (`superdsc.Layout.dim_order`: every dim once,
  outermost first, the stick dim where its stick-group dim goes); default: the other dims in
  logical order, the stick group last (`target.layout.default_dim_order`), the plain
  row-major layout.
- Where a consumer's stick choice needs another layout, the emitter inserts ONE restickify
  per (tensor, stick dim), shared by all consumers; its id is `restick_id(tensor, dim)` and
  its core split can be set in `restick_ops` (default: the consumer's slicing when the copy
  is LX-resident, else the outermost dim evenly).
- `resident[tensor_or_restick_id]` (`Residency`): kept in LX from its producer to its last
  reader at `lx_address` (bytes, stick aligned, the same address on every core); with
  `per_tile` only as a tile buffer inside one fused kernel. Everything else lives in device
  memory.
- `op_order`: the order ops run in (default: the graph's); only consecutive ops can fuse.
- `bundle_starts`: prim-op ids that start a new bundle (optional; the emitter adds cuts where
  the external-tensor limit demands).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from target.layout import default_dim_order
from target.op_rules import StickChoice
from target.superdsc import Program


def program_dim_orders(program: Program) -> dict[str, list[int]]:
    """The device dim orders a program's tensors carry that are not the default: what
    `PlanDecisions.dim_orders` says to emit them again (for a planner reading decisions
    back from a stored program)."""
    out: dict[str, list[int]] = {}
    for t in program.tensors:
        order = t.layout.dim_order
        if order != default_dim_order(len(t.shape), t.layout.stick_dim):
            out[t.id] = list(order)
    return out


def restick_id(tensor: str, stick_dim: Optional[int]) -> str:
    """Id of the restickified copy of `tensor` sticked on `stick_dim`."""
    return f"{tensor}@stick{stick_dim}"


@dataclass
class OpPlan:
    stick: Optional[StickChoice] = None           # None: op_rules.default_choice(op)
    core_split: dict[str, int] = field(default_factory=dict)
    temporal_tiles: dict[str, int] = field(default_factory=dict)
    # Explicit coreIdToWkSlice_: list of (core, {dim name: slice index}); None: natural order.
    core_slices: Optional[list[tuple[int, dict[str, int]]]] = None
    alias: bool = False                           # copy ops: claim a free alias (emitter checks)


@dataclass
class Residency:
    lx_address: int                               # bytes, stick aligned, same on every core
    size_per_core: Optional[int] = None           # None: the largest per-core box, whole sticks
    # A tile buffer of one fused coarse-tiled kernel (superdsc.LxMemory.per_tile): holds
    # the current tile only; its default size is the largest per-tile box.
    per_tile: bool = False


@dataclass
class PlanDecisions:
    planner: str
    ops: dict[str, OpPlan] = field(default_factory=dict)
    input_sticks: dict[str, Optional[int]] = field(default_factory=dict)
    # Device dim order per tensor (or restick id), stick dim at its stick-group position;
    # a tensor not named here gets the plain row-major order.
    dim_orders: dict[str, list[int]] = field(default_factory=dict)
    restick_ops: dict[str, OpPlan] = field(default_factory=dict)   # keyed by restick_id
    resident: dict[str, Residency] = field(default_factory=dict)
    bundle_starts: list[str] = field(default_factory=list)
    # Execution order of the graph's ops (a topological order of all of them); empty: the
    # graph's own order. Restickify ops go right before their first consumer either way.
    op_order: list[str] = field(default_factory=list)
    # Plan stats the planner knows (predicted_us, solver_status, objective, bound, gap,
    # solve_seconds, lower_bound_us, notes); copied into PlanStats.
    stats: dict = field(default_factory=dict)

    def op(self, op_id: str) -> OpPlan:
        return self.ops.setdefault(op_id, OpPlan())
