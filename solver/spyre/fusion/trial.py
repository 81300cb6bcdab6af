"""One trial of the fusion search and the validity check every step uses: a plan emitted,
given the tile buffers the validator accepts, and timed (`trial`); the validator's issues
with a trial's program (`issues_of`). A plan's program when it emits and validates is the oracle's
(`solver.oracle.valid_program`)."""
from __future__ import annotations

from typing import Optional

from target.primitives import PrimGraph
from target.superdsc import Program
from simulator.timing import time_program
from simulator.timing_report import TimingReport
from simulator.validate import validate_program
from solver.emit import emit_program
from solver.plan import PlanDecisions
from solver.spyre.tile_buffers import add_tile_buffers


class Trial(tuple):
    """(decisions, program, timing report) of one trial, and the validator's issues with
    the program when the trial has them already (`issues`, else None): placing tile
    buffers validates the program it returns, so `issues_of` need not validate it again
    when a step asks before keeping the trial. A trial's program is never edited afterwards."""

    issues: Optional[list] = None

    def __new__(cls, d: PlanDecisions, prog: Program, report: TimingReport, issues: Optional[list] = None):
        self = super().__new__(cls, (d, prog, report))
        self.issues = issues
        return self


def trial(pg: PrimGraph, hw, d: PlanDecisions) -> Optional[Trial]:
    """Emit `d`, add the tile buffers the validator accepts, time it. The program may be
    invalid (a trial only ranks choices; the final combination is validated)."""
    try:
        prog = emit_program(pg, hw, d)
    except ValueError:
        return None
    buf = add_tile_buffers(pg, hw, d, prog)
    if buf is None:
        return Trial(d, prog, time_program(prog, hw))
    return Trial(buf.decisions, buf.program, time_program(buf.program, hw), buf.issues)


def issues_of(tr: tuple, hw) -> list:
    """The validator's issues with a trial's program ([]: valid)."""
    known = getattr(tr, "issues", None)
    return known if known is not None else validate_program(tr[1], hw)
