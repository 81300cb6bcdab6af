"""One trial of the fusion search and the validity check every step uses: a plan emitted,
given the tile buffers the validator accepts, and timed (`trial`); a plan's program when
it emits and validates (`valid_program`)."""
from __future__ import annotations

from typing import Optional

from lowering.primitives import PrimGraph
from simulator.superdsc import Program
from simulator.timing import TimingReport, time_program
from simulator.validate import validate_program
from solver.emit import emit_program
from solver.plan import PlanDecisions
from solver.spyre.tile_buffers import add_tile_buffers


def trial(pg: PrimGraph, hw, d: PlanDecisions) -> Optional[tuple[PlanDecisions, Program, TimingReport]]:
    """Emit `d`, add the tile buffers the validator accepts, time it. The program may be
    invalid (a trial only ranks choices; the final combination is validated)."""
    try:
        prog = emit_program(pg, hw, d)
    except ValueError:
        return None
    buf = add_tile_buffers(pg, hw, d, prog)
    if buf is not None:
        d, prog = buf.decisions, buf.program
    return d, prog, time_program(prog, hw)


def valid_program(pg: PrimGraph, hw, d: PlanDecisions) -> Optional[Program]:
    try:
        prog = emit_program(pg, hw, d)
    except ValueError:
        return None
    return None if validate_program(prog, hw) else prog
