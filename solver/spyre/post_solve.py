"""The steps after the solve, behind one interface, and the runner that judges them.

A post-solve step (`Step`) improves a valid plan the solve made: it has a `name`, a budget
`share` (and a `reserve` it asks earlier steps to leave it), says whether it `applies(state)`
to the plan as it stands and, when it does, `run(state)` returns an `Outcome`: a candidate
plan with its simulated time, and what the step found out. The steps are declared as one
ordered list, `solver.spyre.steps.POST_SOLVE_STEPS`; `run_steps` runs them in that order.

The runner, not the step, decides and records:
- a step starts only when it applies and, with a deadline, the time left covers
  `min_trials` whole-plan trials (`state.trial_s`: the last one measured);
- its deadline (`state.deadline`) is the plan's deadline less the `reserve` of every later
  step that applies, and at most its `share` of the time left;
- its candidate is accepted only when it is valid (the validator's verdict on its program,
  `solver.oracle`) and simulates faster than the plan as it stands (`state.us`);
- each step's seconds, simulated time before and after, and whether it was accepted go to
  a `StepRecord` (`state.records`) and, with a progress sink, a `solver.events.StepFinished`; the step's `log` lines always, its `notes` only when
  accepted, go to the plan's notes; its `facts` (what later steps may use: a runner-up
  variant, the number of fused kernels) go to `state.facts`.
A step never edits the state: it reads it and returns an `Outcome`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional, Protocol

from target.primitives import PrimGraph
from target.superdsc import Program
from simulator.timing import time_program
from simulator.validate import validate_program
from solver.events import EventSink, StepFinished, emit
from solver.oracle import checked_program
from solver.plan import PlanDecisions
from solver.spyre.fusion.trial import issues_of, trial
from solver.spyre.strategies import Strategy


@dataclass
class Outcome:
    """What a step returns. `decisions` None: no candidate (only `log` and `facts`).
    `us`: the candidate's simulated time. `before_us`: the simulated time of the plan the step
    started from, when the step measured it (the runner then need not). `trial`: the
    candidate as a fusion trial (decisions, program with tile buffers, timing report), the
    next step's starting trial when accepted; `program`: its program when the step has it
    without a trial."""

    decisions: Optional[PlanDecisions] = None
    us: Optional[float] = None
    notes: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    facts: dict = field(default_factory=dict)
    before_us: Optional[float] = None
    trial: Optional[tuple] = None
    program: Optional[Program] = None


@dataclass
class Improved:
    """What a whole-program trial step leaves: the plan (`decisions`, its valid `program`),
    what was done (`notes`), and the simulated time before (`base_us`) and after (`us`)."""

    decisions: PlanDecisions
    program: Program
    notes: list[str]
    base_us: float
    us: float

    @property
    def gain_us(self) -> float:
        return self.base_us - self.us


@dataclass
class StepRecord:
    """What the runner recorded of one step."""

    name: str
    status: str                    # accepted, not faster, invalid, no candidate, not applicable, no time
    seconds: float = 0.0
    before_us: Optional[float] = None
    after_us: Optional[float] = None

    @property
    def gain_us(self) -> float:
        if self.status != "accepted" or self.before_us is None or self.after_us is None:
            return 0.0
        return self.before_us - self.after_us


@dataclass
class PostSolveState:
    """The plan the steps improve, as the runner keeps it. Steps read it; only the runner
    writes it. `us` is the plan's simulated time once anything measured it; `deadline` the
    running step's (None: deterministic, no wall clock); `plan_deadline` the whole plan's."""

    pg: PrimGraph
    hw: object
    decisions: PlanDecisions
    strategies: dict[str, list[Strategy]]
    plan_deadline: Optional[float]
    fuse: bool = True
    us: Optional[float] = None
    start_us: Optional[float] = None
    program: Optional[Program] = None
    deadline: Optional[float] = None
    trial_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    facts: dict = field(default_factory=dict)
    records: list[StepRecord] = field(default_factory=list)
    events: Optional[EventSink] = None
    # the solve's CP-SAT model (`solver.spyre.model.SpyreModel`) when the planner has one: a
    # step may price a candidate on its objective (`local_search`) before simulating it
    model: Optional[object] = None
    _trial: Optional[tuple] = None
    _checked: Optional[tuple] = None

    def checked(self) -> Optional[Program]:
        """The plan's program when it emits and validates (`solver.oracle`), emitted once per
        plan; the seconds it took become `trial_s`."""
        if self._checked is None or self._checked[0] is not self.decisions:
            t = time.perf_counter()
            prog, _ = checked_program(self.pg, self.hw, self.decisions)
            self.trial_s = time.perf_counter() - t
            self._checked = (self.decisions, prog)
        return self._checked[1]

    def current_trial(self) -> Optional[tuple]:
        """The plan as a fusion trial (tile buffers placed, timed) when it is valid, else
        None; the accepted step's own trial when it gave one. The seconds a fresh trial took
        become `trial_s`."""
        if self._trial is None or self._trial[0] is not self.decisions:
            t = time.perf_counter()
            tr = trial(self.pg, self.hw, self.decisions)
            ok = tr is not None and not issues_of(tr, self.hw)
            self.trial_s = time.perf_counter() - t
            self._trial = (self.decisions, tr if ok else None)
        return self._trial[1]

    def accepted(self, name: str) -> bool:
        """Whether the step `name` ran and its plan was accepted."""
        return any(r.name == name and r.status == "accepted" for r in self.records)

    def gain_ns(self) -> float:
        """Simulated gain of all accepted steps (ns): the plan as the steps found it against
        the plan they leave."""
        if self.start_us is None or self.us is None:
            return 0.0
        return max(0.0, (self.start_us - self.us) * 1000.0)


class Step(Protocol):
    """A post-solve step (module docstring). `share`: of the time left when it starts, what
    it may use (1.0: all). `reserve`: of the time left when an earlier step starts, what
    that step must leave for this one when this one applies. `min_trials`: whole-plan
    trials the time left must cover for it to start. `applies` must be cheap: the runner
    also asks it of later steps, for their reserve."""

    name: str
    share: float
    reserve: float
    min_trials: int

    def applies(self, state: PostSolveState) -> bool: ...

    def run(self, state: PostSolveState) -> Optional[Outcome]: ...


def _step_deadline(steps: list, i: int, state: PostSolveState, now: float) -> Optional[float]:
    end = state.plan_deadline
    if end is None:
        return None
    left = max(0.0, end - now)
    reserved = sum(s.reserve for s in steps[i + 1:] if s.reserve > 0 and s.applies(state))
    deadline = end - reserved * left if reserved else end
    share = steps[i].share
    return deadline if share >= 1.0 else min(deadline, now + share * left)


def _valid(outcome: Outcome, state: PostSolveState) -> bool:
    """The validator's verdict on the candidate: its trial's issues (known when placing tile
    buffers validated it), its program, or its decisions emitted."""
    if outcome.trial is not None:
        return not issues_of(outcome.trial, state.hw)
    if outcome.program is not None:
        return not validate_program(outcome.program, state.hw)
    return checked_program(state.pg, state.hw, outcome.decisions)[0] is not None


def _record(state: PostSolveState, record: StepRecord) -> None:
    state.records.append(record)
    if record.status not in ("not applicable", "no time"):
        emit(state.events, lambda: StepFinished("cpsat", record.name, record.status, record.seconds, record.gain_us))


def run_steps(steps, state: PostSolveState) -> PostSolveState:
    """Run `steps` in order on `state` (module docstring); returns the state."""
    steps = list(steps)
    for i, step in enumerate(steps):
        if not step.applies(state):
            _record(state, StepRecord(step.name, "not applicable"))
            continue
        now = time.perf_counter()
        if state.plan_deadline is not None and now + step.min_trials * state.trial_s >= state.plan_deadline:
            _record(state, StepRecord(step.name, "no time"))
            continue
        state.deadline = _step_deadline(steps, i, state, now)
        out = step.run(state)
        seconds = time.perf_counter() - now
        state.deadline = None
        if out is None:
            _record(state, StepRecord(step.name, "no candidate", seconds, state.us))
            continue
        state.facts.update(out.facts)
        state.notes.extend(out.log)
        if state.us is None and out.before_us is not None:
            state.us = out.before_us
        if state.start_us is None:
            state.start_us = state.us
        if out.decisions is None:
            _record(state, StepRecord(step.name, "no candidate", seconds, state.us))
            continue
        if state.us is None:
            # nothing has timed the plan yet: the runner does, to judge the candidate
            prog = state.checked()
            state.us = state.start_us = time_program(prog, state.hw).total_us if prog is not None else None
        before = state.us
        if before is not None and not out.us < before:
            _record(state, StepRecord(step.name, "not faster", seconds, before, out.us))
            continue
        if not _valid(out, state):
            _record(state, StepRecord(step.name, "invalid", seconds, before, out.us))
            continue
        state.decisions, state.us = out.decisions, out.us
        state.program = out.program if out.trial is None else out.trial[1]
        if out.trial is not None:
            state._trial = (out.decisions, out.trial)
        state.notes.extend(out.notes)
        _record(state, StepRecord(step.name, "accepted", seconds, before, out.us))
    return state


def records_note(records: list[StepRecord]) -> str:
    """One note line: each step that ran, its seconds and its simulated gain."""
    ran = [r for r in records if r.status not in ("not applicable",)]
    return "post-solve steps: " + ", ".join(
        f"{r.name} {r.status}" + (f" {r.seconds:.2f} s" if r.seconds else "") +
        (f" -{r.gain_us:.1f} us" if r.gain_us else "") for r in ran)
