"""The second baseline (`torch-spyre-coopt`): torch-spyre's joint CP-SAT co-optimizer of core
division and LX placement, as published behind `CO_OPTIMIZING_LX_PLANNING` (off by default
upstream): `CoOptimizingAllocator` (`scratchpad/allocator.py`) driving `CpSatLayoutSolver`
(`scratchpad/ilp_solver_ortools.py`), PR #2684 and its follow-ups (the cost-model objective
of #3810, the corelet term of #4616). Read, not copied; docs/baseline.md lists where it
follows upstream and where it had to be adapted.

What upstream fixes before the allocator runs is fixed here by the `heuristic` planner's
passes as upstream runs them now: stick layouts (beam search, width 200, liveness merge),
restickify insertion, the Linear weights' transfer layout, the non-stick dim orders, op order. What it decides jointly is decided here in one CP-SAT model:

Variables (per op: `div`, per LX candidate buffer: `in_buffer`, `offset`):
- `x[k][d]`: op k runs candidate division d, exactly one. The candidates are upstream's
  `enumerate_work_division_candidates` for pointwise and reduction ops (matmuls and
  restickifies included, which inductor lowers as such): every split whose factors divide
  their dims (in whole sticks along a stick dim), on at most the cores, at most one
  reduction dim split, every operand's per-core span within the limit. Other ops keep the
  division the greedy pass committed (upstream `_fixed_division`).
- `in_buffer[t]`: t stays in LX from its producer to its last reader; `offset[t]` its address
  in sticks; its per-core size follows the producer's division (`AddElement` upstream, a
  sum over the one-hot literals here).
Constraints:
- residency gate (upstream `constrain_residency`, `cd_parent_matches`): a resident buffer's
  producer division and each reader's division must be a compatible pair: every core reads
  inside what it wrote (no cross-core LX copy in our program model) and the producer splits
  no reduction dim; the allocator's fixed bars (graph boundary, denylist, gather table,
  partial reads, alias readers) pin `in_buffer` to 0;
- placement: one `AddNoOverlap2D` over optional rectangles
  [first use, last use + 1) x [offset, offset + size), present iff resident, below capacity.
Objective: the cost model (`coopt_cost_model`): per op compute + mem - 0.46 min(compute, mem),
mem = (R + W) / BW + alpha min(R, W) with R, W the device-memory bytes of its non-resident
arguments, compute the matmul split cost without its traffic term; min terms linearized with
`AddMinEquality` as upstream's sympy -> CP-SAT printer does.

Search: a time limit (default 10 s), one worker and seed 0 in deterministic mode (upstream:
1 worker under torch's deterministic mode, seed 0), the greedy divisions as a hint. The
plan then goes through the heuristic's bundle fit (residencies whose live range would push
a bundle past the external-tensor limit are dropped, longest first) and the validator; a
residency it still rejects is dropped and the plan re-emitted. The returned plan always
validates (last resort: the heuristic's own plan, with a note).
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from ortools.sat.python import cp_model

from simulator.validate import validate_program
from target.op_rules import legal_core_splits
from target.primitives import PrimGraph, PrimOp
from target.geometry import (
    box_lx_bytes, core_ranges, default_core_slices, first_slice_spans, layout_nbytes, make_layout, operand_box,
    padded, reduction_split,
)
from solver.baseline.coopt_cost_model import OVERLAP_GAMMA, bytes_ns, kernel_ns, op_compute_us
from solver.baseline.nonstick_dim_order import upstream_dim_orders
from solver.baseline.passes import (
    boxes_cover, per_core_boxes, WorkStep, divide_steps, linear_weight_sticks, plan_heuristic_upstream,
)
from solver.baseline.propagate_layouts import UPSTREAM_BEAM_WIDTH, beam_search_layouts
from solver.baseline.scratchpad import lx_eligible_op
from solver.emit import emit_program, fit_bundles
from solver.plan import OpPlan, PlanDecisions, Residency
from solver.planners import register

PLANNER_NAME = "torch-spyre-coopt"
DEFAULT_TIME_LIMIT_S = 10.0       # upstream config.cpsat_time_limit_seconds is a cap as well
SEED = 0                           # upstream: solver.parameters.random_seed = 0
# op kinds with an enumerated division menu (upstream: Pointwise / Reduction ComputedBuffers)
ENUMERATED_KINDS = frozenset({"pointwise", "reduce", "matmul", "copy"})
# objective units: 1e-4 ns (time in ns x 100 for the 0.46 / 0.857 coefficients, x 100 again)
_U = 100
_GAMMA_U = round(OVERLAP_GAMMA * _U)
# objective units per idle core of an op (the parallelism tie-break)
IDLE_CORE_TIE = 1
# share of the limit kept for reading back, emitting and validating the plan
_FINISH_SHARE = 0.15


@dataclass
class _OpVars:
    step: WorkStep
    dtypes: list[str]
    divisions: list[dict[str, int]]
    lits: list = field(default_factory=list)       # one-hot literals (None for a fixed op)
    fixed: bool = False


@dataclass
class _Buffer:
    name: str
    producer: int            # step index
    readers: list[tuple[int, int]]   # (step index, operand index)
    start: int
    end: int                 # exclusive
    sizes: list[int]         # per producer division, sticks per core (0: division cannot hold it)
    in_buffer: object = None
    offset: object = None


def _candidate_divisions(st: WorkStep, dtypes: list[str], shapes, stick_of, hw) -> tuple[list[dict], bool]:
    """Upstream's division menu of one op: every legal split (span-checked) for the kinds it
    enumerates, else the committed (greedy) division alone. Returns (menu, fixed)."""
    prim = st.prim
    if st.alias or prim.body.kind not in ENUMERATED_KINDS:
        return [dict(st.split)], True
    names = [a.tensor for a in prim.inputs] + [prim.output.tensor]
    sticks = [stick_of[n] for n in names]
    layouts = {n: make_layout(shapes[n], dt, s, hw.stick_bytes) for n, dt, s in zip(names, dtypes, sticks)}
    shp = {n: shapes[n] for n in names}
    dts = dict(zip(names, dtypes))
    menu = []
    for split in legal_core_splits(prim, st.granules, hw.cores):
        if max(first_slice_spans(prim, split, st.granules, layouts, shp, dts).values()) <= hw.per_core_span_bytes:
            menu.append(split)
    if not menu:
        return [dict(st.split)], True
    if dict(st.split) not in menu:
        menu.append(dict(st.split))
    return menu, len(menu) == 1


def _boxes(prim: PrimOp, split: dict, granules, operand: int, shape, cores: int) -> np.ndarray:
    """(cores, ndim, 2) box per core of an operand under `split` (empty boxes for idle cores)."""
    out = np.zeros((cores, max(1, len(shape)), 2), dtype=np.int64)
    slices = default_core_slices(prim, split) if split else []
    for c, rng in core_ranges(prim, split, slices, granules).items():
        box = operand_box(prim, operand, rng, shape)
        if box:
            out[c] = np.array(box, dtype=np.int64)
        else:
            out[c] = [[0, 1]]
    return out


def compatible_pairs(prod_boxes: np.ndarray, read_boxes: np.ndarray) -> np.ndarray:
    """[i, j]: every core's read box under reader division j lies inside what that core
    wrote under producer division i (an empty read needs nothing). Shapes:
    (P, cores, ndim, 2) and (R, cores, ndim, 2)."""
    w_lo, w_hi = prod_boxes[:, None, :, :, 0], prod_boxes[:, None, :, :, 1]
    r_lo, r_hi = read_boxes[None, :, :, :, 0], read_boxes[None, :, :, :, 1]
    read_empty = np.any(read_boxes[..., 1] <= read_boxes[..., 0], axis=-1)[None, :, :]
    inside = np.all((w_lo <= r_lo) & (r_hi <= w_hi), axis=-1)
    return np.all(inside | read_empty, axis=-1)


def _build_steps(pg: PrimGraph, hw):
    """The ops in program order with the restickifies the layout pass inserts, each with
    its greedy division (upstream's committed division, the hint), as the heuristic has them:
    the co-optimizer runs after upstream's current layout passes (beam width 200 with the
    liveness merge)."""
    stick_bytes = hw.stick_bytes
    input_sticks = linear_weight_sticks(pg)
    layouts = beam_search_layouts(pg, stick_bytes, width=UPSTREAM_BEAM_WIDTH, input_sticks=input_sticks,
                                  liveness_merge=True)
    stick_of = dict(layouts.stick_of)
    shapes = {t.id: tuple(t.shape) for t in pg.tensors.values()}
    dtypes = {t.id: t.dtype for t in pg.tensors.values()}
    divided = divide_steps(pg, hw, layouts, stick_of, shapes, dtypes)
    steps, step_dtypes = divided.steps, divided.step_dtypes
    choices = {op.id: layouts.choices[op.id] for op in pg.ops}
    return steps, step_dtypes, choices, stick_of, shapes, dtypes, input_sticks


def _static_bars(pg: PrimGraph, steps: list[WorkStep], shapes) -> dict[str, str]:
    """Per intermediate, the allocator's division-independent reason it may not reside
    (upstream `residency_reason`); a buffer not listed is an LX candidate."""
    outputs = set(pg.outputs)
    readers: dict[str, list[tuple[int, int]]] = {}
    for k, st in enumerate(steps):
        for i, acc in enumerate(st.prim.inputs):
            readers.setdefault(acc.tensor, []).append((k, i))
    bars: dict[str, str] = {}
    for k, st in enumerate(steps):
        t = st.prim.output.tensor
        uses = readers.get(t, [])
        if st.alias:
            bars[t] = "alias of device memory"
        elif not lx_eligible_op(st.prim):
            bars[t] = "denied op (OP_OUTPUT_NOT_GOOD_FOR_LX_REUSE)"
        elif t in outputs:
            bars[t] = "graph output (no clone)"
        elif not uses:
            bars[t] = "no consumer reads it from LX"
        elif any(steps[r].alias for r, _ in uses):
            bars[t] = "read by an alias view"
        elif any(steps[r].prim.body.kind == "gather" and i == 0 for r, i in uses):
            bars[t] = "indirect read"
        else:
            full = tuple((0, n) for n in shapes[t])
            if any(not boxes_cover(per_core_boxes(steps[r], i, shapes[t]).values(), full) for r, i in uses):
                bars[t] = "partial read"
    return bars


def plan_coopt(pg: PrimGraph, hw, *, time_limit_s: Optional[float] = None, deterministic: bool = False,
               hint=None, **_ignored) -> PlanDecisions:
    t0 = time.perf_counter()
    limit = DEFAULT_TIME_LIMIT_S if time_limit_s is None else float(time_limit_s)
    steps, step_dtypes, choices, stick_of, shapes, dtypes, input_sticks = _build_steps(pg, hw)
    cores, stick_bytes = hw.cores, hw.stick_bytes
    model = cp_model.CpModel()

    # -- divisions ------------------------------------------------------------------------
    ops: list[_OpVars] = []
    hints: list[tuple[object, int]] = []     # (aux variable, its value in the hinted plan)
    n_candidates = 0
    for k, (st, dts) in enumerate(zip(steps, step_dtypes)):
        menu, fixed = _candidate_divisions(st, dts, shapes, stick_of, hw)
        ov = _OpVars(st, dts, menu, fixed=fixed)
        if fixed:
            ov.lits = [None]
        else:
            ov.lits = [model.new_bool_var(f"div_{k}_{d}") for d in range(len(menu))]
            model.add_exactly_one(ov.lits)
        n_candidates += len(menu)
        ops.append(ov)

    # -- LX candidate buffers ---------------------------------------------------------------
    bars = _static_bars(pg, steps, shapes)
    readers: dict[str, list[tuple[int, int]]] = {}
    for k, st in enumerate(steps):
        for i, acc in enumerate(st.prim.inputs):
            readers.setdefault(acc.tensor, []).append((k, i))
    capacity_units = hw.lx_capacity_bytes // stick_bytes
    buffers: dict[str, _Buffer] = {}
    for k, ov in enumerate(ops):
        st = ov.step
        t = st.prim.output.tensor
        if t in bars:
            continue
        layout = make_layout(shapes[t], dtypes[t], stick_of[t], stick_bytes)
        prod_boxes, sizes = [], []
        for split in ov.divisions:
            boxes = _boxes(st.prim, split, st.granules, -1, shapes[t], cores)
            prod_boxes.append(boxes)
            if reduction_split(st.prim, split):
                sizes.append(0)     # partial sums: no reader finds its slice on its core
                continue
            per_core = max(box_lx_bytes(tuple(map(tuple, b)), layout, dtypes[t])
                           for b in boxes if np.all(b[:, 1] > b[:, 0]))
            units = padded(per_core, stick_bytes) // stick_bytes
            sizes.append(units if units <= capacity_units else 0)
        if not any(sizes):
            continue
        uses = readers[t]
        buf = _Buffer(t, k, uses, k, max(r for r, _ in uses) + 1, sizes)
        buf.in_buffer = model.new_bool_var(f"in_buffer_{k}")
        # the producer's division must let it hold the buffer at all
        for d, s in enumerate(sizes):
            if s == 0:
                if ov.fixed:
                    model.add(buf.in_buffer == 0)
                else:
                    model.add_bool_or([buf.in_buffer.Not(), ov.lits[d].Not()])
        pb = np.stack(prod_boxes)
        # residency gate: every reader's division compatible with the producer's
        for r, i in uses:
            rv = ops[r]
            rb = np.stack([_boxes(rv.step.prim, split, rv.step.granules, i, shapes[t], cores)
                           for split in rv.divisions])
            compat = compatible_pairs(pb, rb)
            for d in range(len(ov.divisions)):
                if sizes[d] == 0:
                    continue
                ok = [j for j in range(len(rv.divisions)) if compat[d, j]]
                if rv.fixed:
                    if ok:
                        continue
                    clause = [buf.in_buffer.Not()]
                else:
                    if len(ok) == len(rv.divisions):
                        continue
                    clause = [buf.in_buffer.Not()] + [rv.lits[j] for j in ok]
                if not ov.fixed:
                    clause.append(ov.lits[d].Not())
                model.add_bool_or(clause)
        buffers[t] = buf

    # -- placement: optional rectangles, one 2D no-overlap ----------------------------------
    x_iv, y_iv = [], []
    for t, buf in buffers.items():
        ov = ops[buf.producer]
        if ov.fixed:
            size = buf.sizes[0]
        else:
            size = model.new_int_var(0, max(buf.sizes), f"eff_size_{t}")
            model.add(size == sum(s * lit for s, lit in zip(buf.sizes, ov.lits)))
            hints.append((size, buf.sizes[ov.divisions.index(dict(ov.step.split))]))
        buf.offset = model.new_int_var(0, capacity_units, f"off_{t}")
        top = model.new_int_var(0, capacity_units, f"top_{t}")
        hints += [(buf.offset, 0), (top, 0)]
        y_iv.append(model.new_optional_interval_var(buf.offset, size, top, buf.in_buffer, f"y_{t}"))
        x_iv.append(model.new_optional_fixed_size_interval_var(buf.start, buf.end - buf.start, buf.in_buffer,
                                                               f"x_{t}"))
    if x_iv:
        model.add_no_overlap_2d(x_iv, y_iv)

    # -- objective: the cost model, per op ----------------------------------------------------
    nbytes = {n: layout_nbytes(make_layout(shapes[n], dtypes[n], stick_of[n], stick_bytes), dtypes[n])
              for n in shapes}
    turnaround = hw.dram_turnaround_ns_per_byte * hw.dram_oneway_gbps   # alpha in ns per ns of traffic
    turn_u = round(turnaround * _U)
    terms = []
    constant = 0
    for k, ov in enumerate(ops):
        st = ov.step
        if st.alias:
            continue
        compute = [op_compute_us(hw, st.prim, split, ov.dtypes) * 1e3 for split in ov.divisions]
        compute_u = [round(c * _U) for c in compute]
        # R and W: (constant ns, [(ns, in_buffer)])
        args = list(dict.fromkeys(a.tensor for a in st.prim.inputs))
        r_const, r_var = 0, []
        for a in args:
            ns = round(bytes_ns(hw, nbytes[a]))
            if a in buffers:
                r_var.append((ns, buffers[a].in_buffer))
            else:
                r_const += ns
        out = st.prim.output.tensor
        w_const, w_var = 0, []
        ns = round(bytes_ns(hw, nbytes[out]))
        if out in buffers:
            w_var.append((ns, buffers[out].in_buffer))
        else:
            w_const = ns
        if not r_var and not w_var and len(set(compute_u)) == 1:
            constant += round(kernel_ns(compute_u[0], mem_ns_units(r_const, w_const, turnaround) ) * _U)
            continue
        R = r_const + sum(ns for ns, _ in r_var) - sum(ns * v for ns, v in r_var)
        W = w_const + sum(ns for ns, _ in w_var) - sum(ns * v for ns, v in w_var)
        r_hi, w_hi = r_const + sum(ns for ns, _ in r_var), w_const + sum(ns for ns, _ in w_var)
        if r_var or w_var:
            # every min operand behind an IntVar of its own (upstream `_lin_max_operand`: a
            # weighted sum of Booleans as a lin_max operand makes presolve enumerate its
            # subset sums; 58 s on the GPT-2 layer before this)
            R, W = _behind_var(model, R, r_const, r_hi, f"R_{k}"), _behind_var(model, W, w_const, w_hi, f"W_{k}")
            hints += [(R, r_hi), (W, w_hi)]
            mrw = model.new_int_var(0, min(r_hi, w_hi), f"min_rw_{k}")
            model.add_min_equality(mrw, [R, W])
            hints.append((mrw, min(r_hi, w_hi)))
        else:
            mrw = min(r_const, w_const)
        mem = _U * R + _U * W + turn_u * mrw                   # 0.01 ns
        mem_hi = _U * (r_hi + w_hi) + turn_u * min(r_hi, w_hi)
        if ov.fixed or len(set(compute_u)) == 1:
            comp = compute_u[0]
        else:
            comp = sum(c * lit for c, lit in zip(compute_u, ov.lits))
        if max(compute_u) == 0:
            terms.append(_U * mem)
            continue
        c0 = compute_u[0] if ov.fixed else compute_u[ov.divisions.index(dict(st.split))]
        cm = model.new_int_var(0, min(max(compute_u), mem_hi), f"min_cm_{k}")
        comp_v = _behind_var(model, comp, min(compute_u), max(compute_u), f"compute_{k}")
        mem_v = _behind_var(model, mem, 0, mem_hi, f"mem_{k}")
        model.add_min_equality(cm, [comp_v, mem_v])
        hints += [(cm, min(c0, mem_hi)), (mem_v, mem_hi)]
        if comp_v is not comp:
            hints.append((comp_v, c0))
        terms.append(_U * comp + _U * mem - _GAMMA_U * cm)      # 1e-4 ns
    # ties of the cost objective (a non-matmul op's price does not depend on its core count
    # once its residencies are fixed) go to upstream's own second ladder stage, parallelism:
    # one objective unit (1e-4 ns) per idle core, below any difference the cost model sees
    idle = [sum((cores - math.prod(split.values())) * lit for split, lit in zip(ov.divisions, ov.lits))
            for ov in ops if not ov.fixed]
    model.minimize(sum(terms) + constant + IDLE_CORE_TIE * sum(idle))

    # -- hint: the committed (greedy) divisions, nothing resident ----------------------------
    for ov in ops:
        if ov.fixed:
            continue
        d0 = ov.divisions.index(dict(ov.step.split))
        for d, lit in enumerate(ov.lits):
            model.add_hint(lit, d == d0)
    for buf in buffers.values():
        model.add_hint(buf.in_buffer, False)
    for var, value in hints:
        if not isinstance(var, (int, float)):
            model.add_hint(var, value)

    solver = cp_model.CpSolver()
    p = solver.parameters
    p.random_seed = SEED
    budget = max(0.5, limit * (1 - _FINISH_SHARE) - (time.perf_counter() - t0))
    if deterministic:
        p.num_workers = 1
        p.max_deterministic_time = budget
        p.max_time_in_seconds = 3 * limit
    else:
        p.num_workers = max(1, os.cpu_count() or 1)
        p.max_time_in_seconds = budget
    status = solver.solve(model)
    notes = [f"co-optimizer: {len(steps)} ops, {n_candidates} candidate divisions, "
             f"{len(buffers)} LX candidate buffers ({len(bars)} barred), "
             f"CP-SAT {solver.status_name(status)} in {solver.wall_time:.2f} s"]
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        d = plan_heuristic_upstream(pg, hw)
        d.planner = PLANNER_NAME
        d.stats["notes"] = notes + ["no CP-SAT solution: the greedy allocator's plan (upstream's fallback)"] \
            + list(d.stats.get("notes", []))
        return d

    # -- read back ----------------------------------------------------------------------------
    decisions = PlanDecisions(planner=PLANNER_NAME)
    decisions.input_sticks.update(input_sticks)
    # upstream's nonstick_dim_order pass runs before the allocator: its orders are fixed here
    decisions.dim_orders = upstream_dim_orders(pg, steps, stick_of, shapes, dtypes, hw)[0]
    for k, ov in enumerate(ops):
        if ov.fixed:
            split = ov.divisions[0]
        else:
            split = next(s for s, lit in zip(ov.divisions, ov.lits) if solver.boolean_value(lit))
        ov.step.split = dict(split)
        st = ov.step
        if st.restick_of is not None:
            decisions.restick_ops[st.restick_of] = OpPlan(core_split=dict(split))
        else:
            decisions.ops[st.prim.id] = OpPlan(stick=choices[st.prim.id], core_split=dict(split), alias=st.alias)
    for t, buf in buffers.items():
        if solver.boolean_value(buf.in_buffer):
            k = buf.producer
            ov = ops[k]
            d = 0 if ov.fixed else next(i for i, lit in enumerate(ov.lits) if solver.boolean_value(lit))
            decisions.resident[t] = Residency(lx_address=solver.value(buf.offset) * stick_bytes,
                                              size_per_core=buf.sizes[d] * stick_bytes)
    solved_resident = len(decisions.resident)
    dropped_bundles = _fit_bundles(pg, hw, decisions)
    dropped_invalid = _drop_until_valid(pg, hw, decisions)
    objective_us = (solver.objective_value) / (_U * _U) / 1e3
    bound_us = solver.best_objective_bound / (_U * _U) / 1e3
    notes.append(f"{solved_resident} buffers resident in the solve, {dropped_bundles} dropped for bundle "
                 f"limits, {dropped_invalid} dropped by the validator")
    decisions.stats.update(objective=objective_us, bound=bound_us, solver_status=solver.status_name(status),
                           gap=(objective_us - bound_us) / objective_us if objective_us else 0.0)
    if dropped_invalid is None:
        d = plan_heuristic_upstream(pg, hw)
        d.planner = PLANNER_NAME
        d.stats["notes"] = notes + ["the co-optimized plan did not validate: the greedy plan instead"] \
            + list(d.stats.get("notes", []))
        return d
    decisions.stats["notes"] = notes
    return decisions


def _fit_bundles(pg: PrimGraph, hw, decisions: PlanDecisions) -> int:
    """The shared bundle fit every planner that chooses residencies runs (solver.bundles:
    residencies whose live range keeps a bundle over the external-tensor limit leave LX,
    where the target's LX contents do not cross bundles); 0 where there is none."""
    fitted, dropped = fit_bundles(pg, hw, decisions)
    decisions.resident = fitted.resident
    return len(dropped)


def _behind_var(model, expr, lo: int, hi: int, name: str):
    """`expr` itself when it is a constant, else an IntVar in [lo, hi] equal to it."""
    if isinstance(expr, (int, float)):
        return expr
    var = model.new_int_var(int(lo), int(hi), name)
    model.add(var == expr)
    return var


def mem_ns_units(r_ns: int, w_ns: int, turnaround: float) -> float:
    """The memory term in 0.01 ns from R and W in ns (a constant op)."""
    return _U * (r_ns + w_ns) + round(turnaround * _U) * min(r_ns, w_ns)


def _drop_until_valid(pg: PrimGraph, hw, decisions: PlanDecisions, max_rounds: int = 20) -> Optional[int]:
    """Emit and validate; drop the residencies the validator names until it passes. Returns
    how many were dropped, or None when the plan still fails with nothing left to drop."""
    dropped = 0
    for _ in range(max_rounds):
        try:
            issues = validate_program(emit_program(pg, hw, decisions), hw)
        except Exception:   # noqa: BLE001 - an emitter refusal is handled like a validator one
            issues = None
        if issues == []:
            return dropped
        if not decisions.resident:
            return None
        named = set()
        for issue in issues or []:
            text = f"{getattr(issue, 'message', '')} {getattr(issue, 'where', '')}"
            named |= {t for t in decisions.resident if t in text}
        if not named:
            named = set(decisions.resident)       # nothing attributable: give up residency
        for t in named:
            del decisions.resident[t]
        dropped += len(named)
    return None


register(PLANNER_NAME, plan_coopt)
