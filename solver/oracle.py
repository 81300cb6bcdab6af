"""The planner's oracle: a plan's decisions emitted as a program, judged by the simulator's
validator and timed by its timing model. Every place that asks "is this plan valid, and how
fast is it?" asks here, so the answer is the same question everywhere.

- `program_and_issues(pg, hw, d)`: the emitted program (valid or not) and the validator's
  issues, or (None, [the emitter's error]) when it does not emit;
- `checked_program(pg, hw, d)`: (the program, []) when `d` emits and validates, else (None,
  the validator's issues, or the emitter's error as a one-string list);
- `valid_program(pg, hw, d)`: the program or None;
- `simulated_us(pg, hw, d)`: the valid program's simulated time in us, or None;
- `emitted_report(pg, hw, d)`: the timing report of `d` emitted but not validated, or None
  when it does not emit (a plan that is returned later is validated by `planners.plan()`).

The emitter raises ValueError for decisions it cannot lower (a split that does not divide, a
layout an op cannot read); that is an invalid plan here, never an exception.
"""
from __future__ import annotations

from typing import Optional

from target.primitives import PrimGraph
from target.superdsc import Program
from simulator.timing import time_program
from simulator.timing_report import TimingReport
from simulator.validate import validate_program
from solver.emit import emit_program
from solver.plan import PlanDecisions


def program_and_issues(pg: PrimGraph, hw, d: PlanDecisions) -> tuple[Optional[Program], list]:
    """`d`'s program and the validator's issues with it ([]: valid); (None, [the emitter's
    error]) when `d` does not emit."""
    try:
        program = emit_program(pg, hw, d)
    except ValueError as exc:
        return None, [str(exc)]
    return program, validate_program(program, hw)


def checked_program(pg: PrimGraph, hw, d: PlanDecisions) -> tuple[Optional[Program], list]:
    """(program, []) when `d` emits and validates; (None, issues) otherwise (module docstring)."""
    program, issues = program_and_issues(pg, hw, d)
    return (program if not issues else None), issues


def valid_program(pg: PrimGraph, hw, d: PlanDecisions) -> Optional[Program]:
    """`d`'s program when it emits and validates, else None."""
    return checked_program(pg, hw, d)[0]


def simulated_us(pg: PrimGraph, hw, d: PlanDecisions) -> Optional[float]:
    """The simulated time (us) of `d`'s program when it emits and validates, else None."""
    program = valid_program(pg, hw, d)
    return None if program is None else time_program(program, hw).total_us


def emitted_report(pg: PrimGraph, hw, d: PlanDecisions) -> Optional[TimingReport]:
    """The timing report of `d` emitted without validation; None when it does not emit."""
    try:
        return time_program(emit_program(pg, hw, d), hw)
    except ValueError:
        return None


def issue_text(issues: list, n: int = 3) -> str:
    """The first `n` issues as one line (`code: message`; the emitter's error as is)."""
    return "; ".join(f"{getattr(i, 'code', '')}: {getattr(i, 'message', i)}" for i in issues[:n])
