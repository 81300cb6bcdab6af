"""The baseline planner: a faithful reimplementation of torch-spyre's published passes.

Pipeline, in upstream's pass order (torch_spyre/_inductor/passes.py):
0. graph inputs in their transferred layouts: stick on the last dim, except nn.Linear
   weights, which torch-spyre's model loading transfers sticked on out_features
   (`linear_weight_sticks`);
1. stick layouts: candidate propagation + beam search, width 64, cost = elements
   restickified (`solver.baseline.propagate_layouts`);
2. restickify insertion where a consumer's rule needs another layout (done by the
   emitter, one per (tensor, layout));
3. core work division: the matmul split enumeration, then greedy largest-divisor
   distribution over output dims with at most one reduction dim (`solver.baseline.work_division`);
   restickify ops are divided like any other op;
4. device dim orders (`heuristic` only): torch-spyre's default device layout for every
   tensor, then the `nonstick_dim_order` pass on matmul operands, written by their producers
   (PRs #4391, #4302; `solver.baseline.nonstick_dim_order`);
5. LX planning: upstream's eligibility rules (a denylist, PR #4065) and placement, by CP-SAT
   (upstream's default since #3978, `solver.baseline.lx_cpsat`) or, in `heuristic-2026-06`,
   greedy first-fit without eviction (`solver.baseline.scratchpad`); a restickify of a tensor
   that may stay in LX keeps its producer's core ownership and may read it from LX (PR #4153),
   and one whose source and copy are both placed runs on chip as an LX relayout (#3439).

Two registered variants (docs/baseline.md): `heuristic`, torch-spyre as it is now (beam width
200 with the liveness merge, the dim-order pass, CP-SAT placement), and `heuristic-2026-06`,
the passes as of mid-2026 (beam width 64, sticksat's plain row-major layouts, greedy
placement). `plan_heuristic`'s own defaults are the 2026-06 variant, which the CP-SAT
planner's starting plan uses.
Views that are free on the device layout (a reshape of outer dims) are claimed as aliases,
as Inductor's ReinterpretView makes them free upstream.

Bundles are cut by the shared partition step (solver.bundles), as for every planner. On a
target whose LX contents do not survive a bundle boundary (`hw.lx_persists_across_bundles`
false; on Spyre they do, as upstream's planner assumes), residencies whose live range would
force a bundle past `hw.bundle_tensor_limit` are dropped, longest first
(`solver.bundles.fit_bundles`). docs/baseline.md lists where this follows upstream and where
it had to guess.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from target.op_rules import (
    ANY, check_split, copy_is_alias, restickify_prim, split_granules, stick_options,
)
from target.primitives import PrimGraph, PrimOp
from target.geometry import (
    box_contains, box_lx_bytes, core_ranges, default_core_slices, make_layout, operand_box, padded,
    reduction_split,
)
from target.superdsc import CoreSlice
from solver.baseline.lx_cpsat import cpsat_place
from solver.baseline.nonstick_dim_order import upstream_dim_orders
from solver.baseline.propagate_layouts import BEAM_WIDTH, UPSTREAM_BEAM_WIDTH, beam_search_layouts
from solver.baseline.scratchpad import LxBuffer, greedy_place, lx_eligible_op
from solver.baseline.work_division import divide_work
from solver.emit import fit_bundles
from solver.naive import span_reduced_split
from solver.plan import OpPlan, PlanDecisions, Residency, restick_id
from solver.planners import register

@dataclass
class WorkStep:
    """One op of the program in emitted order (compute op or inserted restickify)."""

    prim: PrimOp
    split: dict[str, int]
    granules: dict[int, int]
    restick_of: Optional[str] = None   # restick id, for restickify steps
    alias: bool = False
    slices: Optional[list] = None      # explicit core -> slice map (CoreSlice list)


def linear_weight_sticks(pg: PrimGraph) -> dict[str, int]:
    """Transferred layouts of nn.Linear weights: torch-spyre's default model loading
    (`torch_spyre/model_utils.py: load_model_to_spyre`, installed on `model.to("spyre")` by its
    monkey patch, issue #1339) transfers every 2-D Linear weight [out, in] sticked on dim 0
    (`dim_order=[1, 0]`), the stick `x @ Wᵀ` needs; every other input keeps the default
    (last dim). A Linear weight is recognized by its use: a 2-D parameter read by a matmul as
    its y operand with the stick rule on tensor dim 0 (W read transposed)."""
    out: dict[str, int] = {}
    for op in pg.ops:
        if op.body.kind == "grouped_matmul":
            # mixture-of-experts weights [E, out, in] are loaded the same way, per expert:
            # sticked on the out dim (1) the grouped matmul's weight rule needs
            w = pg.tensors[op.inputs[1].tensor]
            if w.role == "parameter" and len(w.shape) == 3 and stick_options(op)[0].inputs[1] == 1:
                out[w.id] = 1
            continue
        if op.body.kind != "matmul" or len(op.inputs) < 2:
            continue
        w = pg.tensors[op.inputs[1].tensor]
        if w.role == "parameter" and len(w.shape) == 2 and stick_options(op)[0].inputs[1] == 0:
            out[w.id] = 0
    return out


def _span_reduced(op: PrimOp, split: dict[str, int], gran, sticks, ch, shapes, dtypes, hw,
                  fixed_orders: Optional[dict] = None) -> dict[str, int]:
    """An op's split brought under the per-core span limit the way torch-spyre's
    span-reduction pass does (solver/naive.py: span_reduced_split): expert weights, a table
    addressed by data, or the scores of a long prefill's attention exceed the limit unless
    the cores divide the dims that span them. Unchanged when every span fits.
    `fixed_orders`: device dim orders the graph fixes (`PrimTensor.dim_order`)."""
    names = [a.tensor for a in op.inputs] + [op.output.tensor]
    all_sticks = list(sticks) + [ch.output]
    fixed_orders = fixed_orders or {}
    layouts = {n: make_layout(shapes[n], dtypes[n], s, hw.stick_bytes, fixed_orders.get(n))
               for n, s in zip(names, all_sticks)}
    return span_reduced_split(op, split, gran, layouts, {n: shapes[n] for n in names},
                              {n: dtypes[n] for n in names}, hw)


def plan_heuristic(pg: PrimGraph, hw, *, time_limit_s: Optional[float] = None, deterministic: bool = False,
                   hint=None, lx_planning: bool = True, beam_width: int = BEAM_WIDTH,
                   linear_weight_layout: bool = True, lx_planner_relayout: bool = True,
                   input_sticks: Optional[dict] = None, dim_order_pass: bool = False,
                   lx_solver: str = "greedy", liveness_merge: bool = False, planner_name: str = "heuristic",
                   **_ignored) -> PlanDecisions:
    """`lx_planner_relayout` is upstream's `SPYRE_LX_PLANNER_RELAYOUT` (default on): a
    restickify keeps its producer's ownership and may read and write LX (PR #4153; on
    chip as an LX relayout, #3439). Off: every restickify reads and writes device memory
    (upstream's restickify barrier). `dim_order_pass`: torch-spyre's default device layouts
    and its `nonstick_dim_order` pass (else the plain row-major layouts). `lx_solver`:
    "cpsat" (upstream's default since #3978) or "greedy" (its GreedyLayoutSolver).
    `liveness_merge`: the beam drops a state a cheaper one agrees with on every tensor still
    to be read (upstream's beam now)."""
    if lx_solver not in ("greedy", "cpsat"):
        raise ValueError(f"lx_solver {lx_solver!r}: 'greedy' or 'cpsat'")
    stick_bytes = hw.stick_bytes
    # `input_sticks`: graph inputs arriving in other layouts than their last dim (a window of
    # a larger graph reads its boundary tensors in their producers' layouts; not upstream)
    decisions = PlanDecisions(planner=planner_name, input_sticks=dict(input_sticks or {}))
    if linear_weight_layout:
        decisions.input_sticks.update(linear_weight_sticks(pg))
    layouts = beam_search_layouts(pg, stick_bytes, width=beam_width, input_sticks=decisions.input_sticks,
                                  liveness_merge=liveness_merge)
    stick_of = dict(layouts.stick_of)
    shapes = {t.id: tuple(t.shape) for t in pg.tensors.values()}
    dtypes = {t.id: t.dtype for t in pg.tensors.values()}

    outputs = set(pg.outputs)

    def keep_ownership(source: str, step: WorkStep, producer_step: dict[str, WorkStep]) -> WorkStep:
        prod = producer_step.get(source)
        if lx_planning and lx_planner_relayout and prod is not None and source not in outputs \
                and _may_stay_in_lx(prod):
            return _follow_ownership(prod, step) or step
        return step

    divided = divide_steps(pg, hw, layouts, stick_of, shapes, dtypes, keep_ownership)
    steps = divided.steps
    decisions.ops.update(divided.op_plans)
    for rid, step in divided.restick_steps.items():
        decisions.restick_ops[rid] = OpPlan(
            core_split=step.split,
            core_slices=None if step.slices is None else [(c.core, dict(c.slice)) for c in step.slices])

    notes = [f"{len(decisions.input_sticks)} Linear weights transferred sticked on out_features",
             f"beam search (width {beam_width}{', liveness merge' if liveness_merge else ''}): "
             f"{layouts.restick_elements} elements restickified, {layouts.max_states} states at most, "
             f"{len(decisions.restick_ops)} restickify ops"]
    if dim_order_pass:
        decisions.dim_orders, reordered, span_kept = upstream_dim_orders(pg, steps, stick_of, shapes, dtypes, hw)
        notes.append(f"dim orders: torch-spyre's default layouts, {len(reordered)} matmul operands "
                     f"reordered by the nonstick_dim_order pass, {len(span_kept)} tensors kept row-major "
                     f"for the per-core span limit")
    if lx_planning:
        buffers = _lx_buffers(pg, steps, stick_of, shapes, dtypes, hw, lx_planner_relayout)
        if lx_solver == "cpsat":
            solve = cpsat_place(buffers, hw.lx_capacity_bytes, stick_bytes)
            how = (f"placed by CP-SAT ({solve['solved_groups']} lifetime groups solved, {solve['status']}, "
                   f"objective {solve['objective']} vs greedy {solve['greedy_objective']}"
                   f"{', greedy kept' if solve['kept_greedy'] else ''})")
        else:
            greedy_place(buffers, hw.lx_capacity_bytes, stick_bytes)
            how = "placed first-fit"
        placed = [b for b in buffers if b.address is not None]
        for b in placed:
            decisions.resident[b.name] = Residency(lx_address=b.address, size_per_core=b.size)
        decisions, drop = fit_bundles(pg, hw, decisions)
        dropped = len(drop)
        relayouts = sum(1 for st in steps if st.restick_of is not None and st.restick_of in decisions.resident
                        and st.prim.inputs[0].tensor in decisions.resident)
        notes.append(f"LX: {len(buffers)} eligible buffers, {len(placed)} {how}, "
                     f"{dropped} dropped for bundle limits, {relayouts} restickifies on chip (LX relayout)")
    decisions.stats["notes"] = notes
    return decisions


@dataclass
class DividedSteps:
    """The program's ops in emitted order (compute ops and the restickifies the layout
    pass inserts), each with its division: what the layout and work-division passes give
    every later pass (LX planning here, the co-optimizer's menus)."""

    steps: list[WorkStep]
    step_dtypes: list[list[str]]              # per step: its inputs' dtypes, then the output's
    op_plans: dict[str, OpPlan]               # per graph op: stick choice, split, alias
    restick_steps: dict[str, WorkStep]           # per restick id


def divide_steps(pg: PrimGraph, hw, layouts, stick_of: dict, shapes: dict, dtypes: dict,
                 restick_hook: Optional[Callable[[str, WorkStep, dict], WorkStep]] = None) -> DividedSteps:
    """Walk the ops in order: insert a restickify (its greedy division) for each input the
    op's stick choice needs in another layout, read it from the copy, and divide the op
    (`divide_work`). `restick_hook(source, step, producer_step)` may replace a new
    restickify's step (the heuristic's LX relayout keeps its producer's ownership).
    `stick_of`, `shapes`, `dtypes` gain the restickified copies."""
    stick_bytes = hw.stick_bytes
    fixed_orders = {t.id: t.dim_order for t in pg.tensors.values() if t.dim_order is not None}
    out = DividedSteps([], [], {}, {})
    producer_step: dict[str, WorkStep] = {}
    for op in pg.ops:
        ch = layouts.choices[op.id]
        effective = []
        reads = []   # the op's accesses with restickified inputs read from their copies
        for spec, acc in zip(ch.inputs, op.inputs):
            t = acc.tensor
            if spec is None or spec == ANY or spec == stick_of[t]:
                effective.append(stick_of[t])
                reads.append(acc)
                continue
            rid = restick_id(t, spec)
            reads.append(type(acc)(rid, acc.dims))
            if rid not in stick_of:
                stick_of[rid], shapes[rid], dtypes[rid] = spec, shapes[t], dtypes[t]
                prim = restickify_prim(f"restick:{rid}", t, rid, shapes[t])
                gran = split_granules(prim, [stick_of[t]], spec, [dtypes[t]] * 2, stick_bytes)
                rsplit = divide_work(prim, gran, hw, [dtypes[t]] * 2)
                rlayouts = {t: make_layout(shapes[t], dtypes[t], stick_of[t], stick_bytes, fixed_orders.get(t)),
                            rid: make_layout(shapes[rid], dtypes[rid], spec, stick_bytes)}
                rsplit = span_reduced_split(prim, rsplit, gran, rlayouts, {t: shapes[t], rid: shapes[rid]},
                                            {t: dtypes[t], rid: dtypes[rid]}, hw)
                step = WorkStep(prim, rsplit, gran, restick_of=rid)
                if restick_hook is not None:
                    step = restick_hook(t, step, producer_step)
                out.restick_steps[rid] = step
                out.steps.append(step)
                out.step_dtypes.append([dtypes[t]] * 2)
                producer_step[rid] = step
            effective.append(spec)
        dts = [dtypes[a.tensor] for a in op.inputs] + [dtypes[op.output.tensor]]
        gran = split_granules(op, effective, ch.output, dts, stick_bytes)
        split = divide_work(op, gran, hw, dts)
        # upstream's span reduction is mandatory for every op (work division, Pass 1): a
        # split whose core reaches across more than the span limit of any operand (expert
        # weights, a table addressed by data, attention scores of a long prefill) is re-divided
        split = _span_reduced(op, split, gran, effective, ch, shapes, dtypes, hw, fixed_orders)
        alias = _free_alias(op, stick_of, shapes, dtypes, stick_bytes)
        if alias:
            split = {}  # nothing moves
        out.op_plans[op.id] = OpPlan(stick=ch, core_split=split, alias=alias)
        prim = op if tuple(reads) == op.inputs else PrimOp(op.id, op.iter_dims, tuple(reads), op.output,
                                                           op.body, op.source)
        out.steps.append(WorkStep(prim, split, gran, alias=alias))
        out.step_dtypes.append(dts)
        producer_step[op.output.tensor] = out.steps[-1]
    return out


def _free_alias(op: PrimOp, stick_of, shapes, dtypes, stick_bytes: int) -> bool:
    if op.body.kind != "copy" or len(op.inputs) != 1:
        return False
    src, dst = op.inputs[0].tensor, op.output.tensor
    in_order = make_layout(shapes[src], dtypes[src], stick_of[src], stick_bytes).dim_order
    out_order = make_layout(shapes[dst], dtypes[dst], stick_of[dst], stick_bytes).dim_order
    return copy_is_alias(op, shapes[src], in_order, shapes[dst], out_order, dtypes[src], dtypes[dst],
                         stick_bytes)


def _may_stay_in_lx(step: WorkStep) -> bool:
    """The producer-side gates of LX eligibility (the reader-side ones need every reader)."""
    return not step.alias and lx_eligible_op(step.prim) and not reduction_split(step.prim, step.split)


def _follow_ownership(producer: WorkStep, restick: WorkStep) -> Optional[WorkStep]:
    """The restickify `restick` sliced the way `producer` wrote its source, core by core
    (PR #4153: ownership is preserved through a restickify, so each core copies what it
    holds); None when the producer's split does not index the tensor (a split along a dim
    the tensor lacks) or cuts the copy's stick dim inside a stick (upstream then keeps
    the restickify's own division and the barrier)."""
    out_dims = producer.prim.output.dims
    names = {i: d.name for i, d in enumerate(producer.prim.iter_dims)}
    rename: dict[str, str] = {}
    split: dict[str, int] = {}
    for j, d in enumerate(out_dims):
        if d is not None and producer.split.get(names[d], 1) > 1:
            rename[names[d]] = restick.prim.iter_dims[j].name
            split[rename[names[d]]] = producer.split[names[d]]
    if not split or set(producer.split) - set(rename):
        return None
    if check_split(restick.prim, split, restick.granules, len(default_core_slices(producer.prim, producer.split))):
        return None  # the producer splits the copy's stick dim finer than whole sticks
    src = producer.slices if producer.slices is not None else default_core_slices(producer.prim, producer.split)
    slices = [CoreSlice(core=c.core, slice={rename[n]: v for n, v in c.slice.items()}) for c in src]
    return WorkStep(restick.prim, split, restick.granules, restick_of=restick.restick_of, slices=slices)


def per_core_boxes(step: WorkStep, operand: int, shape) -> dict:
    if step.slices is not None:
        slices = step.slices
    else:
        slices = default_core_slices(step.prim, step.split) if step.split else []
    return {c: operand_box(step.prim, operand, rng, shape)
            for c, rng in core_ranges(step.prim, step.split, slices, step.granules).items()}


def _lx_buffers(pg: PrimGraph, steps: list[WorkStep], stick_of, shapes, dtypes, hw,
                relayout: bool = True) -> list[LxBuffer]:
    """Candidate LX buffers in program order, upstream's eligibility rules applied
    (solver.baseline.scratchpad names them)."""
    outputs = set(pg.outputs)
    readers: dict[str, list[tuple[int, int]]] = {}
    for k, st in enumerate(steps):
        for i, acc in enumerate(st.prim.inputs):
            readers.setdefault(acc.tensor, []).append((k, i))
    buffers = []
    for k, st in enumerate(steps):
        if not _may_stay_in_lx(st):
            continue
        t = st.prim.output.tensor
        uses = readers.get(t, [])
        if t in outputs or not uses:
            continue
        if st.restick_of is not None and not relayout:
            continue  # restickify barrier: its copy goes through device memory
        if any(steps[r].alias for r, _ in uses):
            continue  # an alias view shares device-memory bytes
        if not relayout and any(steps[r].restick_of is not None for r, _ in uses):
            continue  # restickify barrier: a restickify reads device memory
        if any(steps[r].prim.body.kind == "gather" and i == 0 for r, i in uses):
            continue  # read through an index (upstream's indirect-access gate)
        written = per_core_boxes(st, -1, shapes[t])
        full = tuple((0, n) for n in shapes[t])
        ok = True
        for r, i in uses:
            read = per_core_boxes(steps[r], i, shapes[t])
            if not boxes_cover(read.values(), full):
                ok = False  # read only in part (upstream's partial-read gate)
                break
            if any(c not in written or not box_contains(written[c], b) for c, b in read.items()):
                ok = False  # a core would read what another core wrote: no cross-core LX copy
                break
        if not ok:
            continue
        layout = make_layout(shapes[t], dtypes[t], stick_of[t], hw.stick_bytes)
        size = max(box_lx_bytes(box, layout, dtypes[t]) for box in written.values())
        buffers.append(LxBuffer(t, padded(size, hw.stick_bytes), sorted({k} | {r for r, _ in uses})))
    return buffers


def boxes_cover(boxes, full) -> bool:
    """Whether the boxes' bounding box is the whole tensor (a box: (lo, hi) per dim)."""
    boxes = [b for b in boxes if all(hi > lo for lo, hi in b)]
    if not boxes:
        return False
    return all(min(b[j][0] for b in boxes) == full[j][0] and max(b[j][1] for b in boxes) == full[j][1]
               for j in range(len(full)))


def plan_heuristic_upstream(pg: PrimGraph, hw, **kwargs) -> PlanDecisions:
    """torch-spyre as it is now: beam width 200 with the liveness merge, its default device
    layouts and the `nonstick_dim_order` pass (#4391, #4302), CP-SAT LX placement (#3978)."""
    kwargs.setdefault("beam_width", UPSTREAM_BEAM_WIDTH)
    return plan_heuristic(pg, hw, dim_order_pass=True, lx_solver="cpsat", liveness_merge=True,
                          planner_name="heuristic", **kwargs)


def plan_heuristic_2026_06(pg: PrimGraph, hw, **kwargs) -> PlanDecisions:
    """The baseline as of its mid-2026 update: beam width 64, row-major layouts, greedy
    first-fit LX placement."""
    return plan_heuristic(pg, hw, planner_name="heuristic-2026-06", **kwargs)


register("heuristic", plan_heuristic_upstream)
register("heuristic-2026-06", plan_heuristic_2026_06)
