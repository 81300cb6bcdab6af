"""Progress events of the CP-SAT planner (`solver.events`): phases and each improving
incumbent and bound of a CP-SAT round. Emitted only when the caller passes a sink; they
never change the plan."""
from __future__ import annotations

import time
from typing import Optional

from ortools.sat.python import cp_model

from solver.core import gap_of
from solver.events import EventSink, Incumbent, PhaseFinished, PhaseStarted, emit

# start times of the phases running now, per sink
_PHASE_T0: dict[tuple[int, str], float] = {}


def phase(events: Optional[EventSink], name: str, start: bool, detail: str = "") -> None:
    """A phase of the planner started (`start`) or finished (with its seconds)."""
    if events is None:
        return
    key = (id(events), name)
    if start:
        _PHASE_T0[key] = time.perf_counter()
        emit(events, lambda: PhaseStarted("cpsat", name, detail))
    else:
        t0 = _PHASE_T0.pop(key, time.perf_counter())
        emit(events, lambda: PhaseFinished("cpsat", name, time.perf_counter() - t0, detail))


class ProgressCallback(cp_model.CpSolverSolutionCallback):
    """Emits an `Incumbent` for each improving solution and each better proven bound of one
    CP-SAT round (objective and bound in us of the cost model)."""

    def __init__(self, events: EventSink, round_: int, t0: float):
        super().__init__()
        self.events, self.round, self.t0 = events, round_, t0
        self.objective: Optional[float] = None
        self.bound: Optional[float] = None
        self.solutions = 0

    def _emit(self) -> None:
        obj, bound = self.objective, self.bound
        emit(self.events, lambda: Incumbent(
            "cpsat", self.round, time.perf_counter() - self.t0,
            None if obj is None else obj / 1000.0, None if bound is None else bound / 1000.0,
            gap_of(obj, bound), self.solutions))

    def on_solution_callback(self) -> None:
        self.solutions += 1
        self.objective = self.ObjectiveValue()
        bound = self.BestObjectiveBound()
        if self.bound is None or bound > self.bound:
            self.bound = bound
        self._emit()

    def on_bound(self, bound: float) -> None:
        if self.bound is None or bound > self.bound:
            self.bound = bound
            self._emit()


def phase_note(seconds: dict[str, float]) -> str:
    """The plan's note of where its time went."""
    return "time: " + ", ".join(f"{k} {v:.2f} s" for k, v in seconds.items())
