"""Plan transfer: a plan for one size of a graph, carried to another size of the same graph.

A serving loop compiles the same graph for many sizes (each prompt bucket, each KV length of
a decode step): the ops, their iteration dims and their operand accesses are the same, only
the dims' sizes differ. `transfer_plan(decisions, source, target, cores, stick_bytes)` maps a
plan's decisions for `source` onto `target` when the two have that structure
(`structure_mismatch` says why not), and repairs what the new sizes no longer allow:

- stick choices are kept when the op still offers them (`stick_options`), else the op's
  default;
- a core split follows its dims: a factor grows with its dim's units (whole sticks on a
  stick dim; a dim split over all of its 13 sticks is split over all of its 14) and keeps
  its value when the dim shrank, rounded to the nearest factor that divides the new units
  within the cores; a
  split that is still illegal becomes the op's outermost split; restickify splits the same;
- temporal tiles are capped at the units a core has;
- an explicit core -> slice map is kept only where the op's sizes did not change;
- the LX-resident tensors stay resident: the plan is emitted once with the new sizes to
  read each buffer's per-core size and live span, and the buffers are placed again first
  fit (in order of first use, larger first); a buffer that no longer fits goes to device
  memory;
- the op order and bundle starts are kept (the op ids are the same).

The result is a plan for `target` that has not been validated: the caller emits and
validates it (`solver.emit.emit_program`, the simulator's validator) and uses it as a
planner's starting point (`solver.planners.plan(..., hint=...)`) or, if it is good enough,
as is. A pure function: no planner, no I/O.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Optional

from solver.plan import OpPlan, PlanDecisions, Residency
from target.op_rules import (
    ANY, check_split, default_choice, outermost_split, restickify_prim, split_granules, split_units,
    stick_options,
)
from target.primitives import PrimGraph, PrimOp


@dataclass
class TransferResult:
    decisions: Optional[PlanDecisions]        # None: the graphs differ in structure
    reason: str = ""                          # why not transferred
    repairs: list[str] = field(default_factory=list)   # what the new sizes changed

    @property
    def transferred(self) -> bool:
        return self.decisions is not None


def _op_signature(op: PrimOp) -> tuple:
    return (op.id, op.body.kind, tuple((d.name, d.kind) for d in op.iter_dims),
            tuple((a.tensor, a.dims) for a in op.inputs), (op.output.tensor, op.output.dims))


def structure_mismatch(source: PrimGraph, target: PrimGraph) -> Optional[str]:
    """None when `target` is `source` with other sizes: the same ops in the same order
    (ids, kinds, iteration dims by name and kind, operand accesses), the same tensors (ids,
    ranks, dtypes, roles), inputs and outputs; else what differs."""
    if [o.id for o in source.ops] != [o.id for o in target.ops]:
        return f"the op lists differ ({len(source.ops)} vs {len(target.ops)} ops)"
    for a, b in zip(source.ops, target.ops):
        if _op_signature(a) != _op_signature(b):
            return f"op {a.id} differs in kind, iteration dims or operands"
    if source.inputs != target.inputs or source.outputs != target.outputs:
        return "the graph inputs or outputs differ"
    if source.tensors.keys() != target.tensors.keys():
        return "the tensor sets differ"
    for tid, t in source.tensors.items():
        u = target.tensors[tid]
        if len(t.shape) != len(u.shape) or t.dtype != u.dtype or t.role != u.role:
            return f"tensor {tid} differs in rank, dtype or role"
    return None


def _scaled_split(old_op: PrimOp, op: PrimOp, split: dict[str, int], old_gran: dict[int, int],
                  gran: dict[int, int], cores: int) -> dict[str, int]:
    """The split of `op` that does what `split` did for `old_op`: a factor grows with its
    dim's units (a dim split over all of its 13 sticks is split over all of its 14) and
    keeps its value when the dim shrank, then becomes the nearest factor that divides the
    new units within the cores left (the larger on a tie)."""
    index = {d.name: i for i, d in enumerate(op.iter_dims)}
    out: dict[str, int] = {}
    budget = cores
    for name, f in sorted(split.items(), key=lambda kv: -kv[1]):
        if name not in index or f <= 1:
            continue
        i = index[name]
        old_units = split_units(old_op.iter_dims[i].size, old_gran.get(i, 1))
        units = split_units(op.iter_dims[i].size, gran.get(i, 1))
        # more units: more cores, as the plan gave the old ones; fewer: keep the cores
        want = f * max(1.0, units / max(old_units, 1))
        options = [g for g in range(1, min(units, budget) + 1) if units % g == 0]
        g = min(options, key=lambda g: (abs(math.log(g / want)), -g))
        if g > 1:
            out[name] = g
            budget //= g
    return out


def _repair_tiles(op: PrimOp, tiles: dict[str, int], split: dict[str, int], gran: dict[int, int]) -> dict[str, int]:
    index = {d.name: i for i, d in enumerate(op.iter_dims)}
    out: dict[str, int] = {}
    for name, t in tiles.items():
        if name not in index:
            continue
        i = index[name]
        per_core = math.ceil(split_units(op.iter_dims[i].size, gran.get(i, 1)) / split.get(name, 1))
        if min(t, per_core) > 1:
            out[name] = min(t, per_core)
    return out


def _restick_tensor(key: str) -> str:
    return key.rsplit("@stick", 1)[0] if "@stick" in key else key


def place_lx(target: PrimGraph, hw, decisions: PlanDecisions) -> tuple[PlanDecisions, list[str]]:
    """`decisions` with its LX-resident buffers placed first fit at the sizes `target` gives
    them (read off one emission with the old addresses); the ones that find no room move to
    device memory. Returns (decisions, what moved)."""
    from solver.emit import emit_program
    from target.superdsc import LxMemory, lx_live_spans

    if not decisions.resident:
        return decisions, []
    try:
        program = emit_program(target, hw, decisions)
    except ValueError as e:
        return replace(decisions, resident={}), [f"all LX residencies dropped: the plan does not emit ({e})"]
    spans = lx_live_spans(program)
    sizes = {t.id: t.memory.size_per_core for t in program.tensors if isinstance(t.memory, LxMemory)}
    order = sorted((k for k in decisions.resident if k in sizes and k in spans),
                   key=lambda k: (spans[k][0], -sizes[k], k))
    taken: list[tuple[int, int, int, int]] = []   # live from, live to, first byte, end byte
    placed: dict[str, Residency] = {}
    moved = [f"{k}: not an LX buffer of the emitted plan, moved to device memory"
             for k in decisions.resident if k not in sizes or k not in spans]
    for key in order:
        lo, hi = spans[key]
        size = sizes[key]
        address = 0
        for _, _, first, end in sorted((t for t in taken if t[0] <= hi and lo <= t[1]), key=lambda t: t[2]):
            if address + size <= first:
                break
            address = max(address, -(-end // hw.stick_bytes) * hw.stick_bytes)
        if address + size > hw.lx_capacity_bytes:
            moved.append(f"{key}: {size} bytes per core no longer fit in LX, moved to device memory")
            continue
        taken.append((lo, hi, address, address + size))
        old = decisions.resident[key]
        placed[key] = Residency(address, None, old.per_tile)
    return replace(decisions, resident=placed), moved


def transfer_plan(decisions: PlanDecisions, source: PrimGraph, target: PrimGraph, hw) -> TransferResult:
    """`decisions` (a plan of `source`) carried to `target` on the hardware `hw`; see the
    module docstring."""
    cores, stick_bytes = hw.cores, hw.stick_bytes
    why = structure_mismatch(source, target)
    if why is not None:
        return TransferResult(None, why)
    repairs: list[str] = []
    out = PlanDecisions(planner=f"transfer:{decisions.planner}", input_sticks=dict(decisions.input_sticks),
                        bundle_starts=list(decisions.bundle_starts), op_order=list(decisions.op_order))
    source_ops = {o.id: o for o in source.ops}
    stick_of = {t.id: decisions.input_sticks.get(t.id, len(t.shape) - 1 if t.shape else None)
                for t in target.tensors.values()}
    for op in target.ops:
        old = decisions.ops.get(op.id, OpPlan())
        choice = old.stick
        if choice is not None and choice not in stick_options(op):
            repairs.append(f"{op.id}: stick choice no longer offered, default used")
            choice = None
        ch = choice or default_choice(op)
        stick_of[op.output.tensor] = ch.output
        ins = [stick_of[a.tensor] if s == ANY else s for s, a in zip(ch.inputs, op.inputs)]
        dts = [target.tensors[a.tensor].dtype for a in op.inputs] + [target.tensors[op.output.tensor].dtype]
        gran = split_granules(op, ins, ch.output, dts, stick_bytes)
        old_op = source_ops[op.id]
        old_gran = split_granules(old_op, ins, ch.output, dts, stick_bytes)
        split = dict(old.core_split)
        if [d.size for d in op.iter_dims] != [d.size for d in old_op.iter_dims]:
            split = _scaled_split(old_op, op, split, old_gran, gran, cores)
        if check_split(op, split, gran, cores):
            split = outermost_split(op, gran, cores)
        if split != {k: v for k, v in old.core_split.items() if v > 1}:
            repairs.append(f"{op.id}: core split {old.core_split} -> {split}")
        tiles = _repair_tiles(op, old.temporal_tiles, split, gran)
        if tiles != {k: v for k, v in old.temporal_tiles.items() if v > 1}:
            repairs.append(f"{op.id}: temporal tiles {old.temporal_tiles} -> {tiles}")
        same_sizes = [d.size for d in op.iter_dims] == [d.size for d in source_ops[op.id].iter_dims]
        slices = old.core_slices if same_sizes and split == old.core_split else None
        out.ops[op.id] = OpPlan(stick=choice, core_split=split, temporal_tiles=tiles, core_slices=slices,
                                alias=old.alias)
    for key, plan in decisions.restick_ops.items():
        tensor = _restick_tensor(key)
        if tensor not in target.tensors:
            continue
        dim = int(key.rsplit("@stick", 1)[1]) if "@stick" in key else None
        dtype = target.tensors[tensor].dtype
        new = restickify_prim(key, tensor, key, target.tensors[tensor].shape)
        old_prim = restickify_prim(key, tensor, key, source.tensors[tensor].shape)
        gran = split_granules(new, [stick_of.get(tensor)], dim, [dtype] * 2, stick_bytes)
        old_gran = split_granules(old_prim, [stick_of.get(tensor)], dim, [dtype] * 2, stick_bytes)
        split = _scaled_split(old_prim, new, plan.core_split, old_gran, gran, cores)
        if check_split(new, split, gran, cores):
            split = outermost_split(new, gran, cores)
        out.restick_ops[key] = OpPlan(core_split=split, temporal_tiles=_repair_tiles(new, plan.temporal_tiles,
                                                                                      split, gran))
    out.resident = {k: Residency(r.lx_address, None, r.per_tile) for k, r in decisions.resident.items()
                    if _restick_tensor(k) in target.tensors}
    out, moved = place_lx(target, hw, out)
    repairs.extend(moved)
    out.stats = {"notes": [f"transferred from a plan of {source.name or 'another size'} "
                           f"({len(repairs)} repairs)"]}
    return TransferResult(out, repairs=repairs)
