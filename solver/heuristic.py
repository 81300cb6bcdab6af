"""The baseline planner: a faithful reimplementation of torch-spyre's published passes.

Pipeline, in upstream's pass order (torch_spyre/_inductor/passes.py):
0. graph inputs in their transferred layouts: stick on the last dim, except nn.Linear
   weights, which torch-spyre's model loading transfers sticked on out_features
   (`linear_weight_sticks`);
1. stick layouts: candidate propagation + beam search, width 64, cost = elements
   restickified (`solver.heuristic_layouts`);
2. restickify insertion where a consumer's rule needs another layout (done by the
   emitter, one per (tensor, layout));
3. core work division: the matmul split enumeration, then greedy largest-divisor
   distribution over output dims with at most one reduction dim (`solver.heuristic_work`);
   restickify ops are divided like any other op;
4. LX planning: upstream's eligibility rules and greedy first-fit placement without
   eviction (`solver.heuristic_lx`).
Views that are free on the device layout (a reshape of outer dims) are claimed as aliases,
as Inductor's ReinterpretView makes them free upstream.

Where our program model is stricter than upstream (LX contents never cross a bundle, and
a bundle references at most `hw.bundle_tensor_limit` device-memory tensors), residencies
whose live range would force a bundle past that limit are dropped, longest first, until
the program validates. docs/baseline.md lists where this follows upstream and where it
had to guess.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from lowering.op_rules import (
    ANY, copy_is_alias, restickify_prim, split_granules,
)
from lowering.primitives import PrimGraph, PrimOp
from simulator.geometry import (
    box_lx_bytes, core_ranges, default_core_slices, make_layout, operand_box, padded,
    reduction_split,
)
from solver.heuristic_layouts import BEAM_WIDTH, beam_search_layouts
from solver.heuristic_lx import LxBuffer, greedy_place, lx_eligible_op
from solver.heuristic_work import divide_work
from solver.plan import OpPlan, PlanDecisions, Residency, restick_id
from solver.planners import register

@dataclass
class _Step:
    """One op of the program in emitted order (compute op or inserted restickify)."""

    prim: PrimOp
    split: dict[str, int]
    granules: dict[int, int]
    restick_of: Optional[str] = None   # restick id, for restickify steps
    alias: bool = False


def linear_weight_sticks(pg: PrimGraph) -> dict[str, int]:
    """Transferred layouts of nn.Linear weights: torch-spyre's default model loading
    (`torch_spyre/model_utils.py: load_model_to_spyre`, installed on `model.to("spyre")` by its
    monkey patch, issue #1339) transfers every 2-D Linear weight [out, in] sticked on dim 0
    (`dim_order=[1, 0]`), the stick `x @ Wᵀ` needs; every other input keeps the default
    (last dim). A Linear weight is recognized by its use: a 2-D parameter read by a matmul as
    its y operand with the stick rule on tensor dim 0 (W read transposed)."""
    from lowering.op_rules import stick_options

    out: dict[str, int] = {}
    for op in pg.ops:
        if op.body.kind != "matmul" or len(op.inputs) < 2:
            continue
        w = pg.tensors[op.inputs[1].tensor]
        if w.role == "parameter" and len(w.shape) == 2 and stick_options(op)[0].inputs[1] == 0:
            out[w.id] = 0
    return out


def plan_heuristic(pg: PrimGraph, hw, *, time_limit_s: Optional[float] = None, deterministic: bool = False,
                   hint=None, lx_planning: bool = True, beam_width: int = BEAM_WIDTH,
                   linear_weight_layout: bool = True, **_ignored) -> PlanDecisions:
    stick_bytes = hw.stick_bytes
    decisions = PlanDecisions(planner="heuristic")
    if linear_weight_layout:
        decisions.input_sticks.update(linear_weight_sticks(pg))
    layouts = beam_search_layouts(pg, stick_bytes, width=beam_width, input_sticks=decisions.input_sticks)
    stick_of = dict(layouts.stick_of)
    shapes = {t.id: tuple(t.shape) for t in pg.tensors.values()}
    dtypes = {t.id: t.dtype for t in pg.tensors.values()}

    steps: list[_Step] = []
    for op in pg.ops:
        ch = layouts.choices[op.id]
        effective = []
        for spec, acc in zip(ch.inputs, op.inputs):
            t = acc.tensor
            if spec is None or spec == ANY or spec == stick_of[t]:
                effective.append(stick_of[t])
                continue
            rid = restick_id(t, spec)
            if rid not in stick_of:
                stick_of[rid], shapes[rid], dtypes[rid] = spec, shapes[t], dtypes[t]
                prim = restickify_prim(f"restick:{rid}", t, rid, shapes[t])
                gran = split_granules(prim, [stick_of[t]], spec, [dtypes[t]] * 2, stick_bytes)
                split = divide_work(prim, gran, hw, [dtypes[t]] * 2)
                decisions.restick_ops[rid] = OpPlan(core_split=split)
                steps.append(_Step(prim, split, gran, restick_of=rid))
            effective.append(spec)
        dts = [dtypes[a.tensor] for a in op.inputs] + [dtypes[op.output.tensor]]
        gran = split_granules(op, effective, ch.output, dts, stick_bytes)
        split = divide_work(op, gran, hw, dts)
        alias = _free_alias(op, stick_of, shapes, dtypes, stick_bytes)
        if alias:
            split = {}  # nothing moves
        decisions.ops[op.id] = OpPlan(stick=ch, core_split=split, alias=alias)
        steps.append(_Step(op, split, gran, alias=alias))

    notes = [f"{len(decisions.input_sticks)} Linear weights transferred sticked on out_features",
             f"beam search (width {beam_width}): {layouts.restick_elements} elements restickified, "
             f"{len(decisions.restick_ops)} restickify ops"]
    if lx_planning:
        buffers = _lx_buffers(pg, steps, stick_of, shapes, dtypes, hw)
        greedy_place(buffers, hw.lx_capacity_bytes, stick_bytes)
        placed = [b for b in buffers if b.address is not None]
        for b in placed:
            decisions.resident[b.name] = Residency(lx_address=b.address, size_per_core=b.size)
        dropped = _fit_bundles(pg, hw, steps, decisions)
        notes.append(f"LX: {len(buffers)} eligible buffers, {len(placed)} placed first-fit, "
                     f"{dropped} dropped for bundle limits")
    decisions.stats["notes"] = notes
    return decisions


def _free_alias(op: PrimOp, stick_of, shapes, dtypes, stick_bytes: int) -> bool:
    if op.body.kind != "copy" or len(op.inputs) != 1:
        return False
    src, dst = op.inputs[0].tensor, op.output.tensor
    in_order = make_layout(shapes[src], dtypes[src], stick_of[src], stick_bytes).dim_order
    out_order = make_layout(shapes[dst], dtypes[dst], stick_of[dst], stick_bytes).dim_order
    return copy_is_alias(op, shapes[src], in_order, shapes[dst], out_order, dtypes[src], dtypes[dst],
                         stick_bytes)


def _per_core_boxes(step: _Step, operand: int, shape) -> dict:
    slices = default_core_slices(step.prim, step.split) if step.split else []
    return {c: operand_box(step.prim, operand, rng, shape)
            for c, rng in core_ranges(step.prim, step.split, slices, step.granules).items()}


def _lx_buffers(pg: PrimGraph, steps: list[_Step], stick_of, shapes, dtypes, hw) -> list[LxBuffer]:
    """Candidate LX buffers in program order, upstream's eligibility rules applied."""
    outputs = set(pg.outputs)
    readers: dict[str, list[tuple[int, int]]] = {}
    for k, st in enumerate(steps):
        for i, acc in enumerate(st.prim.inputs):
            readers.setdefault(acc.tensor, []).append((k, i))
    buffers = []
    for k, st in enumerate(steps):
        if st.restick_of is not None or st.alias or not lx_eligible_op(st.prim):
            continue
        t = st.prim.output.tensor
        uses = readers.get(t, [])
        if t in outputs or not uses or reduction_split(st.prim, st.split):
            continue
        if any(steps[r].alias for r, _ in uses):
            continue  # an alias view shares device-memory bytes
        written = _per_core_boxes(st, -1, shapes[t])
        if any(_per_core_boxes(steps[r], i, shapes[t]) != written for r, i in uses):
            continue  # core division mismatch: stays in device memory
        layout = make_layout(shapes[t], dtypes[t], stick_of[t], hw.stick_bytes)
        size = max(box_lx_bytes(box, layout, dtypes[t]) for box in written.values())
        buffers.append(LxBuffer(t, padded(size, hw.stick_bytes), sorted({k} | {r for r, _ in uses})))
    return buffers


def _fit_bundles(pg: PrimGraph, hw, steps: list[_Step], decisions: PlanDecisions) -> int:
    """Drop residencies until bundling can respect the external-tensor limit; returns how
    many were dropped.

    Replays the emitter's bundling (solver.emit: greedy cuts before an op that would push
    the bundle past the limit, never inside an LX live range) over the steps; where a bundle
    overflows because no cut is allowed, the longest live range spanning that op leaves LX
    and the replay starts again."""
    alias_root: dict[str, str] = {}
    for st in steps:
        if st.alias:
            src = st.prim.inputs[0].tensor
            alias_root[st.prim.output.tensor] = alias_root.get(src, src)
    index_of_producer = {st.prim.output.tensor: k for k, st in enumerate(steps)}
    last_reader: dict[str, int] = {}
    for k, st in enumerate(steps):
        for acc in st.prim.inputs:
            last_reader[acc.tensor] = k
    dropped = 0
    while True:
        ranges = {t: (index_of_producer[t], last_reader.get(t, index_of_producer[t]))
                  for t in decisions.resident}
        cur: set[str] = set()
        victim = None
        for k, st in enumerate(steps):
            refs = {alias_root.get(t, t) for t in [a.tensor for a in st.prim.inputs] + [st.prim.output.tensor]
                    if t not in decisions.resident}
            if len(cur | refs) <= hw.bundle_tensor_limit or k == 0:
                cur |= refs
                continue
            spanning = [(hi - lo, t) for t, (lo, hi) in ranges.items() if lo < k <= hi]
            if not spanning:
                cur = refs  # the emitter cuts here
                continue
            victim = max(spanning)[1]
            break
        if victim is None:
            return dropped
        del decisions.resident[victim]
        dropped += 1


register("heuristic", plan_heuristic)
