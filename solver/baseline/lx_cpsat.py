"""LX placement with CP-SAT, torch-spyre's default since PR #3978 (`config.layout_solver =
"cpsat"`; with `CO_OPTIMIZING_LX_PLANNING` off, as by default, `CpSatLayoutSolver.plan_layout`
places buffers whose core division is already fixed).

The placement-only model of upstream's `scratchpad/ilp_solver_ortools.py`, on our
`LxBuffer`s (the same eligible buffers the greedy solver places, `solver.baseline.scratchpad`):
- per buffer a residency literal and a stick-aligned offset; an optional rectangle
  [start, end) x [offset, offset + size) per buffer, all in one `AddNoOverlap2D`, and
  offset + size <= capacity;
- objective: minimize the device-memory traffic spilling adds, `spill_cost(b) * (1 -
  resident_b)` with an intermediate's spill cost `(readers + 1) * size` (its write plus
  one re-read per reader; graph inputs and outputs never reach here: no boundary clones in
  our program model), i.e. maximize `placement_value`;
- what upstream adds that is not modelled: in-place reuse (a child taking its dying
  parent's slot: our validator treats the parent's last read and the child's write as
  overlapping) and the post-solve `_justify` squeeze (addresses only; the residency set
  is what the timing sees).

Search: the buffers fall apart into groups of overlapping lifetimes (between two groups
nothing is live, so their placements are independent). A group greedy first fit places
whole is optimal as it is; each other group is one CP-SAT model, or, past `WINDOW_BUFFERS`
buffers, one per window of that many in start order, each placed around the earlier windows'
buffers (upstream solves one model under a time limit; windows keep a deep stack tractable).
Every model: one worker, seed 0, a deterministic-time limit (`PLACEMENT_DETERMINISTIC_LIMIT`),
so the same buffers give the same placement on any machine and load; greedy's placement is the
hint. A group whose result scores below greedy's gets greedy's placement back, so the result
is never worse than greedy's on this objective.
"""
from __future__ import annotations

from typing import Optional

from ortools.sat.python import cp_model

from solver.baseline.scratchpad import LxBuffer, greedy_place

# CP-SAT deterministic time (its own work units, about seconds on an idle core) for one
# placement: the layer graphs' 30-40 buffers solve to optimality far inside it. A budget
# knob of this reimplementation (upstream's limit is `cpsat_time_limit_seconds`).
PLACEMENT_DETERMINISTIC_LIMIT = 2.0
# Buffers one CP-SAT model places at most: a longer lifetime group is placed window by window
# in start order, each window around the earlier ones' placements. A deep stack's residual
# chain keeps every buffer in one group (Llama 32 x prefill: 1,093 buffers; one model ran 30 s
# to a solution 0.3% above greedy's; windows of 64: 18 models, each optimal, 5 s, 15% above
# greedy; of 128: 16% above, 24 s; 2 shared cores, 2026-12-05).
WINDOW_BUFFERS = 64


def spill_cost(b: LxBuffer) -> int:
    """Bytes of device-memory traffic spilling `b` adds over keeping it in LX: the
    producer's write and one read per reader (`uses` is the producer and each reader), or
    the buffer's own `value` when its caller set one."""
    return len(b.uses) * b.size if b.value is None else b.value


def placement_value(buffers: list[LxBuffer]) -> int:
    """The objective: the spill cost of every placed buffer (traffic kept on chip)."""
    return sum(spill_cost(b) for b in buffers if b.address is not None)


def lifetime_groups(buffers: list[LxBuffer]) -> list[list[LxBuffer]]:
    """The buffers in groups of overlapping lifetimes, in time order: no buffer of one group
    is live while one of another is."""
    groups: list[list[LxBuffer]] = []
    end = None
    for b in sorted(buffers, key=lambda b: (b.start, b.end)):
        if end is None or b.start >= end:
            groups.append([])
            end = b.end
        groups[-1].append(b)
        end = max(end, b.end)
    return groups


def cpsat_place(buffers: list[LxBuffer], capacity: int, alignment: int,
                deterministic_limit: float = PLACEMENT_DETERMINISTIC_LIMIT) -> dict:
    """Assign `address` (or None) to every buffer; returns the placement's stats (status:
    the worst model's, objective, greedy's objective, whether greedy's placement was kept
    everywhere, groups solved, CP-SAT models solved)."""
    greedy_place(buffers, capacity, alignment)
    greedy_value = placement_value(buffers)
    stats = {"status": "OPTIMAL", "greedy_objective": greedy_value, "kept_greedy": True, "solved_groups": 0,
             "models": 0}
    for group in lifetime_groups(buffers):
        if all(b.address is not None for b in group):
            continue   # first fit placed every buffer: nothing to gain
        stats["solved_groups"] += 1
        greedy = {b.name: b.address for b in group}
        group_greedy_value = placement_value(group)
        placed: list[LxBuffer] = []
        for window in _windows(group):
            fixed = [b for b in placed if b.address is not None and b.end > window[0].start]
            status = _solve_window(window, fixed, greedy, capacity, alignment, deterministic_limit)
            stats["models"] += 1
            if status != "OPTIMAL":
                stats["status"] = status
            placed.extend(window)
        if placement_value(group) < group_greedy_value:
            _restore(group, greedy)
        elif any(b.address != greedy[b.name] for b in group):
            stats["kept_greedy"] = False
    stats["objective"] = placement_value(buffers)
    return stats


def _windows(group: list[LxBuffer]) -> list[list[LxBuffer]]:
    """A lifetime group in start order, cut into windows of `WINDOW_BUFFERS` buffers."""
    ordered = sorted(group, key=lambda b: (b.start, b.end))
    return [ordered[i:i + WINDOW_BUFFERS] for i in range(0, len(ordered), WINDOW_BUFFERS)]


def _solve_window(buffers: list[LxBuffer], fixed: list[LxBuffer], hint: dict, capacity: int, alignment: int,
                  deterministic_limit: float) -> str:
    """CP-SAT placement of `buffers` around the `fixed` ones (placed, not moved); `hint`:
    greedy's addresses. Leaves a buffer's address as it was when no solution is found.
    Returns the solver status."""
    fits = [b for b in buffers if b.size <= capacity]
    if not fits:
        return "OPTIMAL"
    slots = capacity // alignment

    def height(b: LxBuffer) -> int:
        return -(-b.size // alignment)

    model = cp_model.CpModel()
    resident, offset, xs, ys = {}, {}, [], []
    for k, b in enumerate(fits):
        r = model.NewBoolVar(f"in_{k}")
        o = model.NewIntVar(0, slots - height(b), f"off_{k}")
        xs.append(model.NewOptionalFixedSizeIntervalVar(b.start, b.end - b.start, r, f"t_{k}"))
        ys.append(model.NewOptionalFixedSizeIntervalVar(o, height(b), r, f"a_{k}"))
        resident[b.name], offset[b.name] = r, o
        model.AddHint(r, 1 if hint[b.name] is not None else 0)
        model.AddHint(o, (hint[b.name] or 0) // alignment)
    for k, b in enumerate(fixed):
        xs.append(model.NewFixedSizeIntervalVar(b.start, b.end - b.start, f"ft_{k}"))
        ys.append(model.NewFixedSizeIntervalVar(b.address // alignment, height(b), f"fa_{k}"))
    model.AddNoOverlap2D(xs, ys)
    # in sticks, so the coefficients stay small
    model.Maximize(sum(_weight(b, alignment) * resident[b.name] for b in fits))

    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    solver.parameters.max_deterministic_time = deterministic_limit
    status = solver.Solve(model)
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        for b in buffers:
            b.address = (solver.Value(offset[b.name]) * alignment
                         if b.name in resident and solver.Value(resident[b.name]) else None)
    else:
        for b in buffers:
            b.address = None   # no solution around the fixed buffers: this window stays out
    return solver.StatusName(status)


def _weight(b: LxBuffer, alignment: int) -> int:
    """`spill_cost(b)` in sticks (small coefficients for the model)."""
    return len(b.uses) * -(-b.size // alignment) if b.value is None else max(1, -(-b.value // alignment))


def _restore(buffers: list[LxBuffer], addresses: dict[str, Optional[int]]) -> None:
    for b in buffers:
        b.address = addresses[b.name]
