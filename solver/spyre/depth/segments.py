"""Segments of a graph for the depth step: a piece of the graph as a graph of its own, planned
by the single-graph CP-SAT planner, and plans of pieces put back together.

- `subgraph`: consecutive ops as a graph (boundary inputs become graph inputs);
- `solve_segment`: such a piece planned by `solver.spyre.single.plan_graph` (or kept on
  its heuristic plan when its time is too short for a solve);
- `keep_part`, `merge`: the decisions of the ops a piece decides, and one plan from the
  pieces (each piece starts a bundle);
- `out_stick`, `reader_index`: the layout an op writes, and who reads each tensor;
- `crossings`: how many tensors cross each position of an op order (where to cut it).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from target.op_rules import default_choice
from target.primitives import PrimGraph, PrimTensor
from solver.plan import OpPlan, PlanDecisions
from solver.spyre import budget
from solver.spyre.single import plan_graph
from solver.spyre.start import default_hint, valid_or_naive


def out_stick(op, plan: Optional[OpPlan]):
    ch = (plan.stick if plan is not None and plan.stick is not None else None) or default_choice(op)
    return ch.output


def subgraph(pg: PrimGraph, idx: range | list[int], name: str,
             consumers_after: Optional[set[str]] = None) -> PrimGraph:
    """The ops `idx` of `pg` as a graph of their own: tensors they read but do not produce
    become graph inputs (an intermediate one as a `user_input`, arriving in its default
    layout unless the plan's `input_sticks` says otherwise); tensors they produce that an op
    outside reads, or that are outputs of `pg`, become outputs. `consumers_after`: the
    tensors read outside `idx` (computed when None)."""
    ops = [pg.ops[i] for i in idx]
    produced = {op.output.tensor for op in ops}
    if consumers_after is None:
        inside = set(id(op) for op in ops)
        consumers_after = {a.tensor for op in pg.ops if id(op) not in inside for a in op.inputs}
    tensors: dict[str, PrimTensor] = {}
    inputs: list[str] = []
    for op in ops:
        for a in op.inputs:
            t = pg.tensors[a.tensor]
            if a.tensor not in produced and a.tensor not in tensors:
                inputs.append(a.tensor)
                if t.role == "intermediate":
                    t = replace(t, role="user_input")
            tensors.setdefault(a.tensor, t)
        tensors.setdefault(op.output.tensor, pg.tensors[op.output.tensor])
    graph_out = set(pg.outputs)
    outputs = [op.output.tensor for op in ops
               if op.output.tensor in graph_out or op.output.tensor in consumers_after]
    if not outputs:
        outputs = [ops[-1].output.tensor]
    return PrimGraph(name, tensors, ops, inputs, outputs, source_hash="", meta=dict(pg.meta))


def solve_segment(pg: PrimGraph, idx: list[int], hw, *, time_limit_s: float, deterministic: bool,
                  input_sticks: Optional[dict] = None, name: str = "segment",
                  limit_share: float = budget.SEGMENT_LIMIT_SHARE, seed: int = 1,
                  draws: Optional[int] = 1) -> tuple[PlanDecisions, str]:
    """The ops `idx` of `pg` planned as a graph of their own by the CP-SAT pipeline (or the
    heuristic when the time is below `budget.MIN_WINDOW_S`); `input_sticks` fixes the layouts of
    its boundary inputs (tensors produced before it). Keys are `pg`'s ids. In wall-clock
    mode the pipeline is given `limit_share` of `time_limit_s`; `seed`, `draws`: the pipeline's
    (`single.plan_graph`; one draw by default: a window's plan is one of many, None: the
    deterministic default). Returns the plan and a note on how it was made."""
    sub = subgraph(pg, idx, f"{pg.name}#{name}")
    fixed = {t: s for t, s in (input_sticks or {}).items() if t in sub.tensors and t in sub.inputs}
    # the heuristic plans around the boundary's layouts (an op reading ANY layout splits
    # under the layout it gets); with fixed layouts it may not validate: the naive plan
    # then (without, the planner's own start repairs or replaces it)
    hint, _ = default_hint(sub, hw, fixed)
    if fixed:
        hint, _, _ = valid_or_naive(sub, hw, hint, fixed)
    if time_limit_s < budget.MIN_WINDOW_S or len(idx) < 2:
        return replace(hint, planner="cpsat", op_order=[]), \
            f"{name}: {len(idx)} ops, heuristic plan ({time_limit_s:.2f} s left)"
    limit = time_limit_s if deterministic else limit_share * time_limit_s
    d = plan_graph(sub, hw, time_limit_s=limit, deterministic=deterministic, hint=hint, seed=seed,
                   draws=draws)
    st = d.stats
    model = next((n.split()[1] for n in st.get("notes", []) if n.startswith("strategies:")), "?")
    return d, (f"{name}: {len(idx)} ops, {st.get('solver_status')} in {st.get('solve_seconds', 0):.1f} s "
               f"of {time_limit_s:.1f}, predicted {st.get('predicted_us', float('nan')):.1f} us "
               f"(CP-SAT model: {model} strategies)")


def keep_part(pg: PrimGraph, d: PlanDecisions, kept: list[int], readers: dict[str, list[int]]) -> PlanDecisions:
    """The decisions of `d` for the ops `kept` (positions in pg.ops): their op plans, LX
    residencies only of tensors all of whose readers are kept too (and restickified copies
    of those), their bundle starts (the first kept op starts one), in the op order of `d`."""
    keep_ids = {pg.ops[i].id for i in kept}
    keep_set = set(kept)
    out = PlanDecisions(planner=d.planner)
    out.ops = {o: p for o, p in d.ops.items() if o in keep_ids}
    out.input_sticks = dict(d.input_sticks)
    produced_here = {pg.ops[i].output.tensor for i in kept}

    outputs = set(pg.outputs)

    def whole(t: str) -> bool:
        base = t.rpartition("@stick")[0] or t
        return base in produced_here and base not in outputs and all(r in keep_set for r in readers.get(base, ()))
    out.resident = {t: r for t, r in d.resident.items() if whole(t)}
    out.restick_ops = {k: p for k, p in d.restick_ops.items() if (k.rpartition("@stick")[0] or k) in produced_here}
    out.dim_orders = {k: o for k, o in d.dim_orders.items() if (k.rpartition("@stick")[0] or k) in produced_here}
    out.bundle_starts = [o for o in d.bundle_starts if o in keep_ids]
    order = [o for o in d.op_order if o in keep_ids]
    out.op_order = order if len(order) == len(kept) else [pg.ops[i].id for i in kept]
    if out.op_order and out.op_order[0] not in out.bundle_starts:
        out.bundle_starts.insert(0, out.op_order[0])
    return out


def reader_index(pg: PrimGraph) -> dict[str, list[int]]:
    readers: dict[str, list[int]] = {}
    for i, op in enumerate(pg.ops):
        for a in op.inputs:
            readers.setdefault(a.tensor, []).append(i)
    return readers


def merge(parts: list[tuple[PlanDecisions, list[str]]], planner: str = "cpsat") -> PlanDecisions:
    """One plan from per-segment plans, each with its segment's op ids in order; segments
    are listed in op order, each starts a bundle, the op order is theirs concatenated."""
    d = PlanDecisions(planner=planner)
    for part, seg_ops in parts:
        d.ops.update(part.ops)
        for t, s in part.input_sticks.items():
            d.input_sticks.setdefault(t, s)
        d.resident.update(part.resident)
        d.restick_ops.update(part.restick_ops)
        d.dim_orders.update(part.dim_orders)
        starts = list(part.bundle_starts)
        if seg_ops and seg_ops[0] not in starts:
            starts.insert(0, seg_ops[0])
        d.bundle_starts.extend(starts)
        order = part.op_order if len(part.op_order) == len(seg_ops) else seg_ops
        d.op_order.extend(order)
    return d


def crossings(pg: PrimGraph, idx: list[int]) -> list[int]:
    """Per position j of `idx`, the tensors produced at positions before j and read at or
    after j (one sweep over a difference array)."""
    diff = [0] * (len(idx) + 1)
    last: dict[str, int] = {}
    born: dict[str, int] = {}
    for j, i in enumerate(idx):
        op = pg.ops[i]
        for a in op.inputs:
            if a.tensor in born:
                last[a.tensor] = j
        born[op.output.tensor] = j
    for t, p in born.items():
        q = last.get(t)
        if q is not None and q > p:
            diff[p + 1] += 1
            diff[q + 1] -= 1
    out, acc = [], 0
    for j in range(len(idx)):
        acc += diff[j]
        out.append(acc)
    return out
