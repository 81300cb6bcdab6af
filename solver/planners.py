"""Planner registry and the one entry point every caller uses.

A planner is a callable `(pg, hw, *, time_limit_s, deterministic, hint) -> PlanDecisions`
(or a ready `Program`). `plan()` emits the program, stamps solve time, and ALWAYS runs the
simulator's validator: a program it returns has passed; one that fails (`PlanInvalid`)
counts as a planner failure.
Register a planner with one line: `PLANNERS["name"] = callable` (or `register("name", fn)`).

No planner failure reaches the caller as a crash: when the requested planner raises or
its program fails validation, `plan()` falls back along `FALLBACK_CHAIN` (cpsat ->
heuristic -> naive), logs a warning and records in the program's stats which planner was
asked for and why it failed (`fallback_from`, `fallback_reason`, a note). With
`fallback=False` (the backend's and service's strict mode) it raises `PlannerFailed`
instead, naming the op when the failure is about one.

Progress: `plan(..., events=sink)` calls `sink` with typed events (`solver.events`): the
planner's phases and CP-SAT incumbents (planners that take an `events` keyword), the
validation and lower-bound phases, fallbacks, and last `Finished` (or `Failed` before the
exception propagates). Without a sink, nothing changes.
"""
from __future__ import annotations

import gc
import importlib
import inspect
import logging
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Union

from lowering.errors import GraphError
from target.primitives import PrimGraph
from target.hardware import load_target
from target.superdsc import Program
from simulator.validate import ProgramIssue, validate_program
from solver.bundles import split_wide_copies
from solver.capacity import check_fits
from solver.emit import emit_program
from solver.events import EventSink, Failed, Fallback, Finished, Phase, emit
from solver.lower_bound import lower_bound
from solver.naive import plan_naive
from solver.plan import PlanDecisions

log = logging.getLogger("sticksat")

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


@dataclass(frozen=True)
class PlannerInfo:
    """What the rest of the project needs to know about a planner, declared once here:
    the service, the CLI, the batch jobs and the benchmarks read this table."""

    name: str
    module: str  # the module that registers it (`register(name, fn)`) when imported
    searches: bool  # an anytime search: takes a time limit and a deterministic mode
    fast: bool  # answers in well under a second on any graph the service's limits admit
    online: bool  # offered by the service and the torch backend (GET /version lists it)
    summary: str
    # takes a plan of another size of the same graph as its hint (solver.spyre.transfer.SizedPlan)
    transfers: bool = False


# Adding a planner: write its module (ending in `register(name, fn)`), add a row here and,
# when it should be a fallback, a place in FALLBACK_CHAIN.
KNOWN_PLANNERS: tuple[PlannerInfo, ...] = (
    PlannerInfo("naive", "solver.naive", searches=False, fast=True, online=True,
                summary="one core per op, every tensor in device memory"),
    PlannerInfo("heuristic", "solver.baseline.passes", searches=False, fast=True, online=True,
                summary="the torch-spyre baseline passes"),
    PlannerInfo("heuristic-2026-06", "solver.baseline.passes", searches=False, fast=True, online=True,
                summary="the torch-spyre baseline as of mid-2026 (greedy LX, beam 64, row-major layouts)"),
    PlannerInfo("torch-spyre-coopt", "solver.baseline.coopt_ilp_solver_ortools", searches=True, fast=False,
                online=False, summary="torch-spyre's co-optimization ILP (baseline)"),
    PlannerInfo("cpsat", "solver.spyre.cpsat_planner", searches=True, fast=False, online=True,
                summary="the joint CP-SAT planner (default)", transfers=True),
)
PLANNER_INFO: dict[str, PlannerInfo] = {info.name: info for info in KNOWN_PLANNERS}


def planner_names(*, online: Optional[bool] = None, searches: Optional[bool] = None,
                  fast: Optional[bool] = None) -> tuple[str, ...]:
    """Names of KNOWN_PLANNERS (in table order) with the given properties."""
    return tuple(i.name for i in KNOWN_PLANNERS
                 if (online is None or i.online == online) and (searches is None or i.searches == searches)
                 and (fast is None or i.fast == fast))


# Each planner's fallback when it fails: the next, simpler one. The naive planner is the
# end of the chain: one core per op, every tensor in device memory.
FALLBACK_CHAIN = ("cpsat", "heuristic", "naive")


class PlannerFailed(RuntimeError):
    """The planner could not make a valid program and no fallback was allowed (strict) or
    every planner of the chain failed. `op` names the primitive op when the failure is
    about one (e.g. no legal strategy)."""

    def __init__(self, planner: str, reason: str, op: Optional[str] = None):
        self.planner = planner
        self.reason = reason
        self.op = op
        where = f" at op {op!r}" if op else ""
        super().__init__(f"planner {planner!r} failed{where}: {reason}")


def register(name: str, fn: PlannerFn) -> None:
    PLANNERS[name] = fn


def ensure_registered(name: str) -> None:
    """Import the module of a planner that registers itself on import (`KNOWN_PLANNERS`)."""
    if name in PLANNERS:
        return
    info = PLANNER_INFO.get(name)
    modules = [info.module] if info is not None else [i.module for i in KNOWN_PLANNERS]
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            continue
        if name in PLANNERS:
            return


def plan(pg: PrimGraph, hw=None, planner: str = DEFAULT_PLANNER, time_limit_s: Optional[float] = None,
         deterministic: bool = False, hint: Optional[Union[PlanDecisions, Program]] = None,
         fallback: bool = True, events: Optional[EventSink] = None) -> Program:
    """The validated program of `planner` for `pg`; on failure the next planner of
    `FALLBACK_CHAIN` (unless `fallback` is False: then `PlannerFailed`). `events`: an
    optional progress sink (module docstring).

    Before any planner runs: a graph with a tensor the device cannot hold is refused
    (`solver.capacity.DoesNotFit`, a GraphError), and a copy wider than a bundle becomes a
    tree of copies that fit (`solver.bundles.split_wide_copies`)."""
    hw = hw or load_target()
    check_fits(pg, hw)
    pg = split_wide_copies(pg, hw)
    if events is None:
        with _few_full_collections():
            return _plan(pg, hw, planner, time_limit_s, deterministic, hint, fallback)
    try:
        with _few_full_collections():
            program = _plan(pg, hw, planner, time_limit_s, deterministic, hint, fallback, events)
    except Exception as exc:
        emit(events, lambda: Failed(planner, _reason(exc)))
        raise
    s = program.stats
    emit(events, lambda: Finished(s.planner, s.solver_status, s.predicted_us, s.lower_bound_us, s.gap,
                                  s.solve_seconds))
    return program


# Planning allocates millions of short-lived objects (emitted programs, validator and timing
# records) while the process holds many long-lived ones (the graph, caches, the model):
# CPython's default thresholds then run a full collection, which scans every object, about
# a dozen times in one layer's compile (about 1 s of 7, measured 2026-12-01). While any
# plan() runs, the oldest generation is collected FULL_COLLECTION_THRESHOLD times less
# often; the young generations as usual (cyclic garbage still goes). Restored after.
FULL_COLLECTION_THRESHOLD = 100
_GC_LOCK = threading.Lock()
_GC_DEPTH = [0, None]   # plans running, thresholds before the first


@contextmanager
def _few_full_collections() -> Iterator[None]:
    with _GC_LOCK:
        if _GC_DEPTH[0] == 0:
            _GC_DEPTH[1] = gc.get_threshold()
            g0, g1, g2 = _GC_DEPTH[1]
            gc.set_threshold(g0, g1, g2 * FULL_COLLECTION_THRESHOLD)
        _GC_DEPTH[0] += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            _GC_DEPTH[0] -= 1
            if _GC_DEPTH[0] == 0:
                gc.set_threshold(*_GC_DEPTH[1])


def _plan(pg: PrimGraph, hw, planner: str, time_limit_s: Optional[float], deterministic: bool,
          hint: Optional[Union[PlanDecisions, Program]], fallback: bool,
          events: Optional[EventSink] = None) -> Program:
    if hw is None:
        hw = load_target()
    ensure_registered(planner)
    if planner not in PLANNERS:
        raise KeyError(f"unknown planner {planner!r}; known: {sorted(PLANNERS)}")
    try:
        return _plan_with(pg, hw, planner, time_limit_s, deterministic, hint, events)
    except GraphError:
        raise  # the client's graph, not the planner: the caller reports it as such
    except Exception as exc:  # noqa: BLE001 - any planner bug becomes a fallback or a clear error
        reason = _reason(exc)
        op = getattr(exc, "op", None)
        nxt = _next_planner(planner)
        if not fallback or nxt is None:
            raise PlannerFailed(planner, reason, op) from exc
    log.warning("sticksat: planner %s failed on graph %s (%s); falling back to %s", planner, pg.name, reason, nxt)
    emit(events, lambda: Fallback(planner, nxt, reason))
    program = _plan(pg, hw, nxt, time_limit_s, deterministic, None, True, events)
    stats = program.stats
    # the outermost call runs last: the requested planner's failure is the one reported
    stats.fallback_from, stats.fallback_reason = planner, reason
    stats.notes = [f"planner {planner} failed ({reason}); plan made by {stats.planner}"] + list(stats.notes)
    return program


def _reason(exc: Exception) -> str:
    text = str(exc) if isinstance(exc, PlanInvalid) else f"{type(exc).__name__}: {exc}"
    return text[:500]


def _next_planner(planner: str) -> Optional[str]:
    if planner not in FALLBACK_CHAIN:
        return FALLBACK_CHAIN[-1] if planner != FALLBACK_CHAIN[-1] else None
    i = FALLBACK_CHAIN.index(planner)
    for name in FALLBACK_CHAIN[i + 1:]:
        ensure_registered(name)
        if name in PLANNERS:
            return name
    return None


def _takes_events(fn) -> bool:
    try:
        return "events" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _plan_with(pg: PrimGraph, hw, planner: str, time_limit_s: Optional[float], deterministic: bool,
               hint: Optional[Union[PlanDecisions, Program]], events: Optional[EventSink] = None) -> Program:
    t0 = time.perf_counter()
    fn = PLANNERS[planner]
    if events is not None and _takes_events(fn):
        result = fn(pg, hw, time_limit_s=time_limit_s, deterministic=deterministic, hint=hint, events=events)
    elif events is not None:
        with Phase(events, planner, "plan"):
            result = fn(pg, hw, time_limit_s=time_limit_s, deterministic=deterministic, hint=hint)
    else:
        result = fn(pg, hw, time_limit_s=time_limit_s, deterministic=deterministic, hint=hint)
    with Phase(events, planner, "validation"):
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
        with Phase(events, planner, "lower bound"):
            program.stats.lower_bound_us = lower_bound(pg, hw).lower_bound_us
    return program
