"""Where a plan's search starts: the starting plan (the hint) and its fallbacks, written once
for the single-graph planner and the depth step.

- `default_hint`: the heuristic plan (torch-spyre's baseline passes), around fixed boundary
  layouts when given;
- `decisions_from_program`: a stored program's decisions (re-optimization's warm start);
- `valid_or_naive`, `naive_start`: a plan with its program when it validates, else the
  naive plan;
- `starting_plan`: the CP-SAT search's start in its op order (the hint without the LX
  residencies that do not validate there, the default start competing with a stored
  program, the naive plan when nothing else validates);
- `own_order_plan`: the plan the result must beat in its own op order.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Optional, Union

from target.op_rules import matching_choice
from target.primitives import PrimGraph
from target.superdsc import LxMemory, Program
from solver.baseline.passes import plan_heuristic
from solver.baseline.propagate_layouts import UPSTREAM_BEAM_WIDTH
from solver.naive import plan_naive
from solver.oracle import checked_program
from solver.plan import OpPlan, PlanDecisions, Residency, program_dim_orders
from solver.spyre import budget
from solver.spyre.cost_model import predict_program_ns
from solver.spyre.transfer import SizedPlan

Hint = Union[PlanDecisions, Program, SizedPlan, None]


def default_hint(pg: PrimGraph, hw, input_sticks: Optional[dict] = None) -> tuple[PlanDecisions, str]:
    """The default starting plan and its name: the heuristic's, planned around the layouts
    `input_sticks` fixes for boundary inputs (an op reading ANY layout splits under the
    layout it gets). Its stick layouts come from upstream's current layout search (beam
    width 200 with the liveness merge: a restickify shared by many readers is found once);
    its LX placement is the quick first fit and its dim orders row-major, since the solve
    decides residency and dim orders itself."""
    return plan_heuristic(pg, hw, input_sticks=input_sticks, beam_width=UPSTREAM_BEAM_WIDTH,
                          liveness_merge=True), "heuristic"


def naive_start(pg: PrimGraph, hw, input_sticks: Optional[dict] = None) -> tuple[PlanDecisions, Optional[Program]]:
    """The naive plan (one core per op, everything in device memory) and its program (None
    only when even it does not validate): the start when the hint is invalid."""
    naive = plan_naive(pg, hw, input_sticks=input_sticks)
    return naive, checked_program(pg, hw, naive)[0]


def valid_or_naive(pg: PrimGraph, hw, d: PlanDecisions, input_sticks: Optional[dict] = None
                   ) -> tuple[PlanDecisions, Optional[Program], list]:
    """(d, its program, []) when `d` validates; else (the naive plan with `input_sticks`, its
    program or None, the issues that rejected `d`): an invalid plan is no starting point."""
    prog, issues = checked_program(pg, hw, d)
    if prog is not None:
        return d, prog, []
    return (*naive_start(pg, hw, input_sticks), issues)


def decisions_from_program(pg: PrimGraph, program: Program) -> PlanDecisions:
    """Read a program's decisions back as the solve sees a plan (stick choices, splits,
    explicit core slices, aliases, whole-tensor LX residencies, the device dim orders of
    its tensors): a stored plan used as a
    warm start. Temporal tiles and tile buffers are left out: they are the fusion search's,
    which runs again after the solve (a tile buffer read as a whole residency holds one
    tile of a tensor no untiled op fits in)."""
    tmap = program.tensor_map()
    ops = {o.id: o for o in program.ops}
    d = PlanDecisions(planner=program.stats.planner, dim_orders={
        t: o for t, o in program_dim_orders(program).items() if t in pg.tensors})
    produced = {op.output.tensor for op in pg.ops}
    for t in pg.tensors:
        if t not in produced and t in tmap:
            d.input_sticks[t] = tmap[t].layout.stick_dim
    for op in pg.ops:
        o = ops.get(op.id)
        if o is None:
            continue
        in_sticks = []
        for a, src in zip(op.inputs, o.prim["inputs"] if o.prim else []):
            in_sticks.append(tmap[src["tensor"]].layout.stick_dim if src["tensor"] in tmap else None)
        ch = matching_choice(op, in_sticks, tmap[op.output.tensor].layout.stick_dim)
        slices = [(c.core, dict(c.slice)) for c in o.core_slices] if o.core_slices else None
        d.ops[op.id] = OpPlan(stick=ch, core_split={k: v for k, v in o.core_split.items() if v > 1},
                              core_slices=slices, alias=o.alias)
    for t in tmap.values():
        if isinstance(t.memory, LxMemory) and not t.memory.per_tile and t.id in pg.tensors:
            d.resident[t.id] = Residency(t.memory.lx_address, t.memory.size_per_core)
    return d


def hint_repaired(pg: PrimGraph, hw, d: PlanDecisions, issues: list) -> tuple[PlanDecisions, Optional[Program]]:
    """A hint that does not validate in this planner's op order, with the LX residencies the
    validator names dropped (`budget.HINT_REPAIR_ROUNDS` rounds), then with none: a stored
    plan's sticks and splits are a better start than the naive plan even where its
    residencies do not hold in this order or without its fused kernels. (decisions, program
    or None)."""
    for _ in range(budget.HINT_REPAIR_ROUNDS):
        named = {getattr(i, "tensor", None) for i in issues} & set(d.resident)
        if not named:
            break
        d = replace(d, resident={t: r for t, r in d.resident.items() if t not in named})
        prog, issues = checked_program(pg, hw, d)
        if prog is not None:
            return d, prog
    d = replace(d, resident={})
    return d, checked_program(pg, hw, d)[0]


def hint_decisions(pg: PrimGraph, hw, hint: Hint) -> tuple[PlanDecisions, str]:
    """The hint as decisions and a name for the notes (the default hint when None)."""
    if isinstance(hint, PlanDecisions):
        return hint, hint.planner
    if isinstance(hint, Program):
        return decisions_from_program(pg, hint), f"stored {hint.stats.planner} program"
    return default_hint(pg, hw)


def starting_plan(pg: PrimGraph, hw, hint: Hint) -> tuple[PlanDecisions, Optional[Program], str, float]:
    """The search's start in this planner's op order: (decisions, their program, a name for
    the notes, seconds the first emit + validation took). The hint (`hint_decisions`)
    without the residencies that do not validate in this order (`hint_repaired`); for a
    stored program, the default start when that is predicted faster or the stored
    decisions do not validate; the naive plan when nothing else does."""
    hint_d, hint_name = hint_decisions(pg, hw, hint)
    hint_d = replace(hint_d, op_order=[])  # the hint runs in this planner's order
    t_emit = time.perf_counter()
    hint_prog, hint_issues = checked_program(pg, hw, hint_d)
    emit_s = time.perf_counter() - t_emit
    if hint_prog is None and hint_d.resident:
        hint_d, hint_prog = hint_repaired(pg, hw, hint_d, hint_issues)
        if hint_prog is not None:
            hint_name += " (without the LX residencies that do not validate in this op order)"
    if isinstance(hint, Program):
        # a stored plan's decisions without its fused kernels are priced untiled like any
        # start, and the default start competes: a fused program's splits are chosen for
        # its tiles (llama prefill, deterministic: from the stored plan's decisions 3990.8
        # us, from the default start 3843.0)
        default_d, default_name = hint_decisions(pg, hw, None)
        default_prog, _ = checked_program(pg, hw, default_d)
        if default_prog is not None and hint_prog is None:
            return default_d, default_prog, f"{default_name} (the {hint_name} did not validate)", emit_s
        if default_prog is not None and predict_program_ns(default_prog, hw) < predict_program_ns(hint_prog, hw):
            return default_d, default_prog, f"{default_name} (predicted faster than the {hint_name})", emit_s
    if hint_prog is None:
        # an invalid hint is not a starting point: fall back to the naive plan
        hint_d, hint_prog = naive_start(pg, hw)
        hint_name = f"naive (the {hint_name} hint was invalid)"
    return hint_d, hint_prog, hint_name, emit_s


def own_order_plan(pg: PrimGraph, hw, hint: Hint) -> tuple[Optional[PlanDecisions], Optional[str], Optional[float]]:
    """The plan the result must beat as its own planner ordered it: (decisions, name,
    predicted us) of the hint (the default hint when None), or (None, None, None) for a
    stored program (its decisions already start the search). Predicted us is None when it
    does not validate."""
    if isinstance(hint, Program):
        return None, None, None
    own, name = default_hint(pg, hw) if hint is None else (hint, hint.planner)
    prog, _ = checked_program(pg, hw, own)
    return own, name, (predict_program_ns(prog, hw) / 1000.0 if prog is not None else None)
