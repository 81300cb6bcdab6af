"""Document → validated SuperDSC program + stats: the one place the service calls
lowering, the solver and the simulator.

Two halves:
- cheap checks the service runs on the request path before it spends a worker
  (`check_graph_limits`, `check_document`, `resolve_options`): a bad graph is a 422
  without a trip through the pool;
- the jobs a pool worker runs (`compile_job`, `simulate_job`). They take and return
  plain picklable dataclasses holding JSON text, never live model objects, so the
  process boundary stays cheap and explicit.

`compile_in_process` runs the same job in the calling process (the embedded default
of the torch backend when no service URL is set).
"""
from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Optional, Union

from lowering.errors import GraphError
from lowering.graph_format import GraphDocument, SymSize
from solver.planners import PLANNER_INFO
from solver.spyre.transfer import SizedPlan, structure_key

if TYPE_CHECKING:  # the store is the service's: the embedded path never imports it
    from service.store import ProgramRecord

DEFAULT_TIME_LIMIT_S = 10.0
# A compile's wall-time bound: its time limit plus what lowering, the early fallback plan,
# emitting, validating and timing take (half the limit, at least WALL_GRACE_MIN_S).
WALL_GRACE_MIN_S = 10.0
MAX_TIME_LIMIT_S = 3600.0


# -- size limits ---------------------------------------------------------------------

@dataclass(frozen=True)
class GraphLimits:
    """What one /compile may ask for. The format's own bounds (20k nodes, rank 8) stop
    hostile documents; these are the service's operating limits, configurable per
    deployment."""

    max_nodes: int = 5_000
    max_rank: int = 8
    max_dim: int = 2**31 - 1
    # Sum of elements over every graph input and node output: bounds what the planner
    # and simulator allocate for one request.
    max_total_elements: int = 2**34


def _numel(shape: list) -> Optional[int]:
    n = 1
    for s in shape:
        if isinstance(s, SymSize):
            return None  # symbolic: validation names it precisely
        n *= s
    return n


def check_graph_limits(doc: GraphDocument, limits: GraphLimits) -> None:
    """Raise GraphError("graph_too_large", ..., node) when the graph exceeds a limit."""
    if len(doc.nodes) > limits.max_nodes:
        raise GraphError("graph_too_large",
                         f"graph has {len(doc.nodes)} nodes; this service accepts at most {limits.max_nodes}")
    total = 0
    metas = [(inp.id, inp.meta) for inp in doc.inputs]
    metas += [(node.id, meta) for node in doc.nodes for meta in node.outputs]
    for owner, meta in metas:
        if len(meta.shape) > limits.max_rank:
            raise GraphError("graph_too_large",
                             f"tensor of rank {len(meta.shape)}; at most {limits.max_rank} dims are accepted", owner)
        for size in meta.shape:
            if isinstance(size, int) and size > limits.max_dim:
                raise GraphError("graph_too_large",
                                 f"dim of size {size} exceeds the limit {limits.max_dim}", owner)
        n = _numel(meta.shape)
        if n is not None:
            total += n
            if total > limits.max_total_elements:
                raise GraphError("graph_too_large",
                                 f"graph tensors total more than {limits.max_total_elements} elements "
                                 f"(limit reached at this tensor)", owner)


def check_document(doc: GraphDocument) -> None:
    """Structural and semantic validation (H1's validator): GraphError on failure."""
    from lowering.validate import validate_document

    validate_document(doc)


def document_from_export(raw: dict) -> GraphDocument:
    """A torch.export serialized program (JSON) → graph document. GraphError on failure."""
    from lowering import export_serde

    return export_serde.document_from_export(raw)


# -- options -------------------------------------------------------------------------

@lru_cache(maxsize=1)
def _registered_planners() -> tuple[str, ...]:
    from solver import planners

    # The online planners of the registry (solver.planners.KNOWN_PLANNERS) that register
    # in this process (their modules import).
    for name in planners.planner_names(online=True):
        planners.ensure_registered(name)
    return tuple(sorted(name for name in planners.planner_names(online=True) if name in planners.PLANNERS))


def available_planners() -> list[str]:
    """Registered planners (looked up once per process: registration happens at import)."""
    return list(_registered_planners())


def default_planner() -> str:
    """solver.planners.DEFAULT_PLANNER, else the first of its fallback chain available."""
    from solver.planners import DEFAULT_PLANNER, FALLBACK_CHAIN

    names = set(available_planners())
    for name in (DEFAULT_PLANNER,) + FALLBACK_CHAIN:
        if name in names:
            return name
    raise RuntimeError("no planner is registered")


@lru_cache(maxsize=1)
def _shipped_targets() -> tuple[str, ...]:
    from target.hardware import list_targets

    return tuple(sorted(list_targets()))


def available_targets() -> list[str]:
    """The hardware targets shipped with the package (read once per process)."""
    return list(_shipped_targets())


@lru_cache(maxsize=16)
def load_hardware(target: str):
    """Targets are looked up by name among the shipped ones only: a client never
    names a file path."""
    from target.hardware import load_target

    if target not in available_targets():
        raise GraphError("unknown_target", f"unknown target {target!r}; known: {available_targets()}")
    return load_target(target)


@dataclass(frozen=True)
class CompileOptions:
    """The options that determine the program. `options_hash` keys the store; the
    target enters the key through its hardware digest, the deadline not at all (it
    bounds one request's wait, not what the answer is)."""

    planner: str
    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    deterministic: bool = False
    target: str = "spyre"
    # Strict: a planner failure is an error naming the op, not a fallback plan.
    strict: bool = False

    def solve_dict(self) -> dict[str, Any]:
        out = {"planner": self.planner, "time_limit_s": float(self.time_limit_s),
               "deterministic": bool(self.deterministic)}
        if self.strict:  # keyed apart (a non-strict row may hold a fallback plan); old keys unchanged
            out["strict"] = True
        return out

    def options_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.solve_dict(), sort_keys=True).encode()).hexdigest()


def resolve_options(planner: Optional[str] = None, time_limit_s: Optional[float] = None,
                    deterministic: bool = False, target: Optional[str] = None,
                    strict: bool = False) -> CompileOptions:
    """Fill defaults and check names; GraphError("invalid_option") for a bad one."""
    name = planner or default_planner()
    if name not in available_planners():
        raise GraphError("invalid_option", f"unknown planner {name!r}; available: {available_planners()}")
    limit = DEFAULT_TIME_LIMIT_S if time_limit_s is None else float(time_limit_s)
    if not (0 < limit <= MAX_TIME_LIMIT_S):
        raise GraphError("invalid_option", f"time_limit_s must be in (0, {MAX_TIME_LIMIT_S}]")
    target_name = target or "spyre"
    load_hardware(target_name)
    return CompileOptions(planner=name, time_limit_s=limit, deterministic=bool(deterministic), target=target_name,
                          strict=bool(strict))


class CompileFailed(RuntimeError):
    """The planner produced no program the validator accepts (`op`: the primitive op the
    failure is about, when known)."""

    def __init__(self, message: str, op: Optional[str] = None):
        super().__init__(message)
        self.op = op


# -- the compile job -----------------------------------------------------------------

@dataclass(frozen=True)
class StoreSlot:
    """Where a compile's program goes in the store: the store and the row it fills (`row`:
    its key fields; `record()` adds the program). The worker writes its early fallback plan
    here itself."""

    store_path: str
    row: ProgramRecord

    def record(self, program: str, stats: dict[str, Any], solution: Optional[str], complete: bool):
        now = time.time()
        return replace(self.row, program=program, stats=stats, solution=solution, complete=complete,
                       created_at=now, updated_at=now)


@dataclass(frozen=True)
class CompileJob:
    document: str  # graph document JSON (already validated on the request path)
    options: CompileOptions
    # Wall-clock time (time.time()) by which the caller needs an answer; None = no deadline.
    deadline_at: Optional[float] = None
    # The program of an earlier solve of the same key cut short by its deadline: the
    # warm start (a complete hint) for this one.
    hint: Optional[str] = None
    # Set by the service: an anytime planner's early fallback plan is stored here.
    slot: Optional[StoreSlot] = None
    # Seconds the job may run in all (from when the worker starts it); the planner gets
    # what remains of it. The pool kills a job that overruns it (`wall_limit_s`).
    wall_limit_s: Optional[float] = None


@dataclass
class CompileOutcome:
    status: str  # "ok" | "graph_error" | "planner_failed" | "deadline_exceeded"
    program: Optional[str] = None  # SuperDSC program JSON
    stats: dict[str, Any] = field(default_factory=dict)
    solution: Optional[str] = None
    # The solve ran with the requested time limit (not cut short by the deadline).
    complete: bool = True
    effective_time_limit_s: Optional[float] = None
    error: Optional[dict[str, Any]] = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def wall_limit_s(time_limit_s: float, grace_min_s: float = WALL_GRACE_MIN_S,
                 deterministic: bool = False) -> float:
    """The wall time a compile with this time limit may take in a worker before it is
    stopped (the service then answers the best plan stored so far). A deterministic plan
    is the best of several draws, each a solve of about the limit on the deterministic
    clock (solver.spyre.single.draw_count), so its work is that many limits: a bound of
    one limit would stop it at a point that depends on the machine's load."""
    work_s = time_limit_s
    if deterministic:
        from solver.spyre.single import draw_count

        work_s *= draw_count(time_limit_s)
    return work_s + max(grace_min_s, 0.5 * work_s)


def fallback_planner(requested: str) -> Optional[str]:
    """The planner whose plan is stored first while `requested` solves: the first fast
    one of the fallback chain (solver.planners: fast planners answer in well under a
    second; the others are anytime solvers whose model building alone may outlast a
    tight deadline). None when `requested` is fast itself."""
    from solver.planners import FALLBACK_CHAIN, PLANNER_INFO

    info = PLANNER_INFO.get(requested)
    if info is not None and info.fast:
        return None
    names = available_planners()
    return next((name for name in FALLBACK_CHAIN if PLANNER_INFO[name].fast and name in names), None)


# Seconds kept back from a deadline for emitting, validating and returning the program.
def _deadline_reserve(remaining: float) -> float:
    return min(1.0, 0.2 * remaining)


def _solution_of(program) -> Optional[str]:
    """The planner's own warm-start form of a program, when the solver exposes one
    (`solver.planners.solution_of`). Without it the stored program is the solution:
    `solver.planners.plan` accepts a Program as its hint."""
    try:
        from solver.planners import solution_of  # type: ignore[attr-defined]
    except ImportError:
        return None
    solution = solution_of(program)
    if solution is None:
        return None
    return solution if isinstance(solution, str) else json.dumps(solution)


def _hint_from(hint: Optional[str]):
    if hint is None:
        return None
    from target.superdsc import Program

    return Program.from_json(hint)


# The plans this process made, by graph structure (`solver.spyre.transfer.structure_key`):
# a new size of a graph compiled before starts from the last plan of that graph, which a
# planner that transfers (`PlannerInfo.transfers`) carries to the new size instead of
# solving. Wall-clock requests only: a deterministic plan must not depend on what the
# process compiled before. The oldest entries go past SIZED_PLANS_KEPT.
SIZED_PLANS_KEPT = 64
_sized_plans: "OrderedDict[tuple, SizedPlan]" = OrderedDict()
_sized_plans_lock = threading.Lock()


def _sized_plan_key(pg, options: "CompileOptions") -> Optional[tuple]:
    info = PLANNER_INFO.get(options.planner)
    if info is None or not info.transfers or options.deterministic:
        return None
    return (structure_key(pg), options.target, options.planner)


def _earlier_size(key: Optional[tuple], pg) -> Optional[SizedPlan]:
    if key is None:
        return None
    with _sized_plans_lock:
        source = _sized_plans.get(key)
    if source is None or all(source.pg.tensors[t].shape == pg.tensors[t].shape for t in pg.tensors):
        return None  # none, or this very size (the store answers repeats)
    return source


def _stored_size(slot: Optional["StoreSlot"], key: Optional[tuple], pg) -> Optional[SizedPlan]:
    """The plan of another size of this graph from the store (`graph_structures`, filled by
    `_record_structure`), so a restarted service or another worker transfers too: the
    newest complete program of a graph with the same structure key, planned with the
    same options, compiler version and hardware. A store problem costs only the
    transfer (None)."""
    if slot is None or key is None:
        return None
    from lowering import lower_document
    from service.store_integrity import StoreError
    from target.superdsc import Program

    row = slot.row
    try:
        store = _worker_store(slot.store_path)
        for graph_hash in store.graphs_with_structure(key[0]):
            if graph_hash == row.graph_hash:
                continue
            for record in reversed(store.programs_for_graph(graph_hash)):
                if not record.complete or (record.options_hash, record.compiler_version, record.hardware_digest) != (
                        row.options_hash, row.compiler_version, row.hardware_digest):
                    continue
                graph = store.get_graph(graph_hash)
                if graph is None:
                    break
                source = lower_document(GraphDocument.from_json(graph.document))
                program = Program.from_json(record.program)
                if structure_key(source) != key[0] or program.stats.planner != key[2]:
                    break
                return SizedPlan(source, program)
    except (StoreError, GraphError):
        return None
    return None


def _record_structure(slot: Optional["StoreSlot"], key: Optional[tuple]) -> None:
    if slot is None or key is None:
        return
    from service.store_integrity import StoreError

    try:
        _worker_store(slot.store_path).put_structure(key[0], slot.row.graph_hash)
    except StoreError:
        pass   # a lost index row costs a later transfer, never a compile


def _remember(key: Optional[tuple], pg, program) -> None:
    if key is None or program.stats.planner != key[2]:
        return
    with _sized_plans_lock:
        _sized_plans[key] = SizedPlan(pg, program)
        _sized_plans.move_to_end(key)
        while len(_sized_plans) > SIZED_PLANS_KEPT:
            _sized_plans.popitem(last=False)


def _program_stats(program, doc: GraphDocument, hw) -> dict[str, Any]:
    """Fill the program's graph identity; its stats plus the simulator's time for it
    (the ground truth every performance number here is measured with)."""
    from simulator.timing import time_program

    if not program.graph_hash:
        program.graph_hash = doc.graph_hash()
    if not program.graph_name:
        program.graph_name = doc.name
    stats = json.loads(program.stats.model_dump_json())
    try:
        stats["simulated_us"] = time_program(program, hw).total_us
    except Exception as exc:  # noqa: BLE001 - a timing-model bug must not lose a valid program
        stats["timing_error"] = f"{type(exc).__name__}: {exc}"
    return stats


_worker_stores: dict[str, Any] = {}


def _worker_store(path: str):
    from service.store import ProgramStore

    store = _worker_stores.get(path)
    if store is None:
        store = _worker_stores[path] = ProgramStore(path)
    return store


def _store_fallback(slot: StoreSlot, program, stats: dict[str, Any]) -> None:
    store = _worker_store(slot.store_path)
    store.put_program(slot.record(program.to_json(), stats, _solution_of(program), complete=False))


def compile_job(job: CompileJob) -> CompileOutcome:
    """Lower, plan (the planner validates on the simulator) and serialize. Runs in a
    pool worker; never raises for a client's mistake, it returns it.

    For an anytime planner (cpsat) with a store slot, a fast planner's plan is made and
    stored first (`complete: false`): if the deadline passes while the solver still
    builds or searches, the service answers with that validated plan instead of a 504;
    it also serves as the solver's hint. The final plan replaces it in the store.
    A job that starts after its deadline plans with the smallest budget and reports
    `complete: false`; it never returns without a program for a valid graph."""
    from lowering import lower_document
    from solver.planners import PlannerFailed, plan

    started = time.time()
    options = job.options
    effective_limit = options.time_limit_s

    try:
        doc = GraphDocument.from_json(job.document)
        hw = load_hardware(options.target)
        pg = lower_document(doc)
        hint = _hint_from(job.hint)
        sized_key = _sized_plan_key(pg, options)
        hint = hint or _earlier_size(sized_key, pg) or _stored_size(job.slot, sized_key, pg)
        fallback = fallback_planner(options.planner) if job.slot is not None else None
        if fallback is not None:
            early = plan(pg, hw, planner=fallback, deterministic=options.deterministic, fallback=not options.strict)
            early.stats.notes = list(early.stats.notes) + [
                f"fallback plan by {fallback}, stored while {options.planner} solves"]
            _store_fallback(job.slot, early, _program_stats(early, doc, hw))
            hint = hint or early
        # Past the deadline (queued behind other jobs, or lowering took long), the job
        # still runs with the least budget instead of returning nothing: the service told
        # the client its program would be stored, and a job it no longer wants is dropped
        # by the pool before it starts (SolverPool.leave), never here.
        ends = [t for t in (job.deadline_at, started + job.wall_limit_s if job.wall_limit_s else None)
                if t is not None]
        if ends:
            remaining = min(ends) - time.time()
            effective_limit = max(0.01, min(options.time_limit_s, remaining - _deadline_reserve(remaining)))
        program = plan(pg, hw, planner=options.planner, time_limit_s=effective_limit,
                       deterministic=options.deterministic, hint=hint, fallback=not options.strict)
    except GraphError as exc:
        return CompileOutcome(status="graph_error", error=exc.to_dict(), seconds=time.time() - started)
    except PlannerFailed as exc:
        return CompileOutcome(status="planner_failed", seconds=time.time() - started,
                              error={"code": "planner_failed", "message": str(exc), "node": exc.op})
    _remember(sized_key, pg, program)
    _record_structure(job.slot, sized_key)
    stats = _program_stats(program, doc, hw)
    status = (stats.get("solver_status") or "").upper()
    complete = effective_limit >= options.time_limit_s or status == "OPTIMAL"
    return CompileOutcome(status="ok", program=program.to_json(), stats=stats, solution=_solution_of(program),
                          complete=complete, effective_time_limit_s=effective_limit,
                          seconds=time.time() - started)


def compile_in_process(document: Union[GraphDocument, dict, str], planner: Optional[str] = None,
                       time_limit_s: Optional[float] = None, deterministic: bool = False,
                       target: Optional[str] = None, limits: Optional[GraphLimits] = None,
                       strict: bool = False) -> dict[str, Any]:
    """The embedded path: validate and compile in this process; returns the program as
    a dict. Raises GraphError for a bad graph, CompileFailed when the planner produced
    no valid program (a compiler bug, never the client's)."""
    if isinstance(document, GraphDocument):
        doc = document
    else:
        from lowering.validate import parse_document

        doc = parse_document(document)
    check_graph_limits(doc, limits or GraphLimits())
    check_document(doc)
    options = resolve_options(planner, time_limit_s, deterministic, target, strict)
    outcome = compile_job(CompileJob(document=doc.to_json(), options=options))
    if outcome.status == "graph_error":
        err = outcome.error or {}
        raise GraphError(err.get("code", "invalid_graph"), err.get("message", ""), err.get("node"))
    if outcome.status != "ok" or outcome.program is None:
        err = outcome.error or {}
        raise CompileFailed(err.get("message", outcome.status), err.get("node"))
    return json.loads(outcome.program)


# -- the simulate job ----------------------------------------------------------------

@dataclass(frozen=True)
class SimulateJob:
    program: str  # SuperDSC program JSON
    graph: Optional[str] = None  # graph document JSON (needed for numerics)
    target: str = "spyre"
    numerics: bool = False
    trace: bool = False


def simulate_job(job: SimulateJob) -> dict[str, Any]:
    """Validate and time a program (optionally check numerics against the graph and
    export a trace). Returns the simulator's JSON result, plus `trace` when asked for."""
    import os
    import tempfile

    from lowering import lower_document
    from simulator.api import GraphMismatch, simulate

    started = time.time()
    hw = load_hardware(job.target)
    trace_path = None
    try:
        if job.trace:
            fd, trace_path = tempfile.mkstemp(prefix="sticksat-trace-", suffix=".json")
            os.close(fd)
        try:
            graph = lower_document(GraphDocument.from_json(job.graph)) if job.graph else None
            result = simulate(job.program, hw=hw, graph=graph, numerics=job.numerics, trace=trace_path)
        except (GraphError, GraphMismatch) as exc:  # the reference graph does not lower, or is another's
            return {"valid": False, "errors": [exc.to_dict()], "graph_error": True}
        out = result.to_json()
        if trace_path is not None and result.valid and os.path.getsize(trace_path) > 0:
            with open(trace_path) as f:
                out["trace"] = json.load(f)
    finally:
        if trace_path is not None:
            os.unlink(trace_path)
    out["seconds"] = time.time() - started
    return out


def warm_worker(target: str = "spyre") -> float:
    """Import the heavy modules and load the hardware once, so the first real job in a
    fresh worker does not pay for it. Returns the seconds it took."""
    started = time.time()
    import lowering  # noqa: F401
    import simulator.api  # noqa: F401
    import simulator.timing  # noqa: F401

    available_planners()  # imports the planners that register themselves (cpsat, heuristic)
    load_hardware(target)
    return time.time() - started
