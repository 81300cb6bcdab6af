"""Planner registry and the one entry point every caller uses.

A planner is a callable `(pg, hw, *, time_limit_s, deterministic, hint) -> PlanDecisions`
(or a ready `Program`). `plan()` emits the program, stamps solve time, and ALWAYS runs the
simulator's validator: a program it returns has passed; otherwise it raises `PlanInvalid`.
Register a planner with one line: `PLANNERS["name"] = callable` (or `register("name", fn)`).
"""
from __future__ import annotations

import time
from typing import Callable, Optional, Union

from lowering.primitives import PrimGraph
from simulator.superdsc import Program
from simulator.validate import ProgramIssue, validate_program
from solver.emit import emit_program
from solver.naive import plan_naive
from solver.plan import PlanDecisions

PlannerFn = Callable[..., Union[PlanDecisions, Program]]

PLANNERS: dict[str, PlannerFn] = {
    "naive": plan_naive,
}

# What a user gets without asking (CLI, service, torch backend): the joint CP-SAT planner.
DEFAULT_PLANNER = "cpsat"


class PlanInvalid(RuntimeError):
    """A planner produced a program the validator rejects."""

    def __init__(self, planner: str, issues: list[ProgramIssue]):
        self.planner = planner
        self.issues = issues
        head = "; ".join(f"{i.code}: {i.message}" for i in issues[:5])
        more = f" (+{len(issues) - 5} more)" if len(issues) > 5 else ""
        super().__init__(f"planner {planner!r} produced an invalid program: {head}{more}")


def register(name: str, fn: PlannerFn) -> None:
    PLANNERS[name] = fn


def ensure_registered(name: str) -> None:
    """Planners living in modules that register themselves on import (cpsat, heuristic)."""
    if name in PLANNERS:
        return
    import importlib
    for module in ("solver.cpsat_planner", "solver.heuristic"):
        try:
            importlib.import_module(module)
        except ImportError:
            continue
        if name in PLANNERS:
            return


def plan(pg: PrimGraph, hw=None, planner: str = DEFAULT_PLANNER, time_limit_s: Optional[float] = None,
         deterministic: bool = False, hint: Optional[Union[PlanDecisions, Program]] = None) -> Program:
    if hw is None:
        from simulator.hardware import load_target
        hw = load_target()
    ensure_registered(planner)
    if planner not in PLANNERS:
        raise KeyError(f"unknown planner {planner!r}; known: {sorted(PLANNERS)}")
    t0 = time.perf_counter()
    result = PLANNERS[planner](pg, hw, time_limit_s=time_limit_s, deterministic=deterministic, hint=hint)
    if isinstance(result, PlanDecisions):
        result.stats.setdefault("solve_seconds", time.perf_counter() - t0)
        program = emit_program(pg, hw, result)
    else:
        program = result
    issues = validate_program(program, hw)
    if issues:
        raise PlanInvalid(planner, issues)
    if program.stats.lower_bound_us is None:
        # every program says how far from the machine's limit it could at best be
        from solver.lower_bound import lower_bound

        program.stats.lower_bound_us = lower_bound(pg, hw).lower_bound_us
    return program
