"""Progress events of a plan: an optional sink `plan(..., events=sink)` calls with typed
events as the solve goes (docs/report.md "Live progress").

A sink is any callable taking one event. Planners that know about events (cpsat) emit
their phases and, during the CP-SAT solve, every improving incumbent and bound; `plan()`
emits its own phases (validation, lower bound), fallbacks, and always ends with one
`Finished` (or `Failed`). A sink that raises is logged and then ignored: progress never
changes or breaks a plan. Without a sink nothing is emitted and nothing is computed for it.

`log_sink(logger)` turns the events into structured log lines (the service's JSON logger).
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional, Union

log = logging.getLogger("sticksat")

# the phases a plan goes through, in order (a planner may skip some; "plan" wraps a planner
# that emits no phases of its own; "repeats": the CP-SAT planner's depth step, solver.spyre.depth)
PHASES = ("transfer", "repeats", "hint", "strategies", "local search", "solve", "fusion", "plan", "validation", "lower bound")


@dataclass(frozen=True)
class PhaseStarted:
    planner: str
    phase: str
    detail: str = ""
    t: float = field(default_factory=time.perf_counter)
    kind: str = "phase_started"


@dataclass(frozen=True)
class PhaseFinished:
    planner: str
    phase: str
    seconds: float
    detail: str = ""
    t: float = field(default_factory=time.perf_counter)
    kind: str = "phase_finished"


@dataclass(frozen=True)
class Incumbent:
    """A better solution (objective) or a better proven bound during the CP-SAT solve, in
    microseconds of the cost model; `gap` is (objective - bound) / objective."""
    planner: str
    round: int
    wall_s: float
    objective_us: Optional[float]
    bound_us: Optional[float]
    gap: Optional[float]
    solutions: int = 0
    t: float = field(default_factory=time.perf_counter)
    kind: str = "incumbent"


@dataclass(frozen=True)
class StepFinished:
    """A post-solve step of the CP-SAT planner ran (inside the "fusion" phase; recorded by the
    runner, solver.spyre.post_solve): its status (accepted, not faster, invalid, no
    candidate), its seconds, and the simulated gain it was accepted with (us, 0 otherwise)."""

    planner: str
    step: str
    status: str
    seconds: float
    gain_us: float
    t: float = field(default_factory=time.perf_counter)
    kind: str = "step_finished"


@dataclass(frozen=True)
class Fallback:
    planner: str
    next_planner: str
    reason: str
    t: float = field(default_factory=time.perf_counter)
    kind: str = "fallback"


@dataclass(frozen=True)
class Finished:
    """The last event of a successful plan."""
    planner: str
    status: Optional[str]
    predicted_us: Optional[float]
    lower_bound_us: Optional[float]
    gap: Optional[float]
    solve_seconds: Optional[float]
    t: float = field(default_factory=time.perf_counter)
    kind: str = "finished"


@dataclass(frozen=True)
class Failed:
    """The last event of a plan that raised (strict mode, or every planner failed)."""
    planner: str
    reason: str
    t: float = field(default_factory=time.perf_counter)
    kind: str = "failed"


Event = Union[PhaseStarted, PhaseFinished, Incumbent, StepFinished, Fallback, Finished, Failed]
EventSink = Callable[[Event], None]


def emit(sink: Optional[EventSink], event_factory: Callable[[], Event]) -> None:
    """Call `sink` with the event `event_factory` builds (only when there is a sink); a
    sink's exception is logged and swallowed."""
    if sink is None:
        return
    try:
        sink(event_factory())
    except Exception:  # noqa: BLE001 - progress must never break a plan
        log.debug("sticksat: progress sink failed", exc_info=True)


class Phase:
    """`with Phase(sink, planner, "solve"):` emits PhaseStarted and PhaseFinished."""

    def __init__(self, sink: Optional[EventSink], planner: str, phase: str, detail: str = ""):
        self.sink, self.planner, self.phase, self.detail = sink, planner, phase, detail

    def __enter__(self) -> "Phase":
        self.t0 = time.perf_counter()
        emit(self.sink, lambda: PhaseStarted(self.planner, self.phase, self.detail))
        return self

    def __exit__(self, *exc) -> None:
        emit(self.sink, lambda: PhaseFinished(self.planner, self.phase, time.perf_counter() - self.t0))


def event_fields(event: Event) -> dict:
    """The event as a flat JSON-able dict (`kind` first)."""
    d = asdict(event)
    d.pop("t", None)
    return {"kind": d.pop("kind"), **d}


def log_sink(logger: Optional[logging.Logger] = None, level: int = logging.INFO, **context) -> EventSink:
    """A sink writing each event as one structured log line (`extra={"fields": ...}`, the
    form service/logging.py's JSON formatter merges); `context` (e.g. graph_hash) is added
    to every line."""
    logger = logger or log

    def sink(event: Event) -> None:
        fields = {**context, **event_fields(event)}
        logger.log(level, "plan_progress", extra={"fields": fields})

    return sink
