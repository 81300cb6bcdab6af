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

Search: one worker, seed 0, a deterministic-time limit (`PLACEMENT_DETERMINISTIC_LIMIT`), so
the same buffers give the same placement on any machine and load. The greedy first-fit
placement is the hint; when the solve ends without a better solution the greedy placement
is kept, so the result is never worse than greedy's on this objective.
"""
from __future__ import annotations

from typing import Optional

from solver.baseline.scratchpad import LxBuffer, greedy_place

# CP-SAT deterministic time (its own work units, about seconds on an idle core) for one
# placement: the layer graphs' 30-40 buffers solve to optimality far inside it. A budget
# knob of this reimplementation (upstream's limit is `cpsat_time_limit_seconds`).
PLACEMENT_DETERMINISTIC_LIMIT = 2.0


def spill_cost(b: LxBuffer) -> int:
    """Bytes of device-memory traffic spilling `b` adds over keeping it in LX: the
    producer's write and one read per reader (`uses` is the producer and each reader)."""
    return len(b.uses) * b.size


def placement_value(buffers: list[LxBuffer]) -> int:
    """The objective: the spill cost of every placed buffer (traffic kept on chip)."""
    return sum(spill_cost(b) for b in buffers if b.address is not None)


def cpsat_place(buffers: list[LxBuffer], capacity: int, alignment: int,
                deterministic_limit: float = PLACEMENT_DETERMINISTIC_LIMIT) -> dict:
    """Assign `address` (or None) to every buffer; returns the solve's stats (status,
    objective, greedy's objective, whether the greedy placement was kept)."""
    from ortools.sat.python import cp_model

    greedy_place(buffers, capacity, alignment)
    greedy = {b.name: b.address for b in buffers}
    greedy_value = placement_value(buffers)
    fits = [b for b in buffers if b.size <= capacity]
    if not fits:
        return {"status": "trivial", "objective": 0, "greedy_objective": 0, "kept_greedy": True}
    slots = capacity // alignment

    model = cp_model.CpModel()
    resident, offset, xs, ys = {}, {}, [], []
    for k, b in enumerate(fits):
        height = -(-b.size // alignment)
        r = model.NewBoolVar(f"in_{k}")
        o = model.NewIntVar(0, slots - height, f"off_{k}")
        xs.append(model.NewOptionalFixedSizeIntervalVar(b.start, b.end - b.start, r, f"t_{k}"))
        ys.append(model.NewOptionalFixedSizeIntervalVar(o, height, r, f"a_{k}"))
        resident[b.name], offset[b.name] = r, o
        if greedy[b.name] is not None:
            model.AddHint(r, 1)
            model.AddHint(o, greedy[b.name] // alignment)
        else:
            model.AddHint(r, 0)
            model.AddHint(o, 0)
    model.AddNoOverlap2D(xs, ys)
    # in sticks, so the coefficients stay small
    model.Maximize(sum(len(b.uses) * -(-b.size // alignment) * resident[b.name] for b in fits))

    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    solver.parameters.max_deterministic_time = deterministic_limit
    status = solver.Solve(model)
    stats = {"status": solver.StatusName(status), "greedy_objective": greedy_value, "kept_greedy": True}
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        for b in buffers:
            b.address = (solver.Value(offset[b.name]) * alignment
                         if b.name in resident and solver.Value(resident[b.name]) else None)
        if placement_value(buffers) >= greedy_value:
            stats["kept_greedy"] = False
        else:
            _restore(buffers, greedy)
    stats["objective"] = placement_value(buffers)
    return stats


def _restore(buffers: list[LxBuffer], addresses: dict[str, Optional[int]]) -> None:
    for b in buffers:
        b.address = addresses[b.name]
