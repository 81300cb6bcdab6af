"""The request handlers behind the routes: a compile (store lookup, the solve in the
pool, deadline and fallback answers), a simulation, preparing a large body in a worker,
and waiting for a pool job while watching the client."""
from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from typing import Any, Optional

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from starlette.responses import Response

from lowering.errors import GraphError
from lowering.version import COMPILER_VERSION
from service import pipeline
from service.http.config import ServiceConfig
from service.http.middleware import BodyBytes
from service.http.storage import FULL_RETRY_AFTER_S, store_failure
from service.logging import log_event
from service.metrics import ServiceMetrics
from service.pool import JobDropped, JobTimedOut, PoolFull, PoolNotReady, SolverPool, WorkerCrashed, wait
from service.prepare import PreparedCompile, body_validation_findings
from service.problems import ProblemError, problem_response
from service.store import ProgramRecord, ProgramStore, program_key

class ServiceState:
    def __init__(self, config: ServiceConfig, metrics: ServiceMetrics):
        self.config = config
        self.metrics = metrics
        self.store: Optional[ProgramStore] = None
        self.pool: Optional[SolverPool] = None
        self.warm_task: Optional[asyncio.Task] = None
        self.warm_error: Optional[str] = None
        self.storage = None  # service.http.storage.StorageWatch, set in the lifespan
        self.bodies = BodyBytes()  # request body bytes in flight (counted by the middleware)


def graph_error_problem(exc: GraphError, errors: Optional[list[GraphError]] = None) -> ProblemError:
    more = [e.to_dict() for e in errors] if errors and len(errors) > 1 else None
    return ProblemError(422, exc.code, exc.message, node=exc.node, errors=more)


def problem_of(state: ServiceState, prepared: dict[str, Any], instance: str) -> Response:
    p = prepared["problem"]
    if p.get("rejected"):
        state.metrics.rejected.labels(p["rejected"]).inc()
    return problem_response(p["status"], p["code"], p["detail"], node=p.get("node"), errors=p.get("errors"),
                            instance=instance)


def json_safe(value: Any) -> Any:
    """Non-finite floats (an error of inf when outputs differ in shape) as the strings
    'inf', '-inf', 'nan', as in graph documents: JSON has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value



def request_validation_problem(exc: RequestValidationError, instance: str) -> Response:
    errors = [dict(e, loc=tuple(e.get("loc", ()))[1:] if tuple(e.get("loc", ()))[:1] == ("body",)
                   else tuple(e.get("loc", ()))) for e in exc.errors()]
    return _body_validation_problem(errors, getattr(exc, "body", None), instance)


def _body_validation_problem(errors: list[dict], body: Any, instance: str) -> Response:
    found = body_validation_findings(errors, body)
    return problem_response(422, "schema", found["detail"], node=found["node"], errors=found["errors"],
                            instance=instance)



def _wall_limit_s(options: pipeline.CompileOptions, config: ServiceConfig) -> Optional[float]:
    """The wall-time bound of a compile with a searching planner (cpsat): its time limit
    (a deterministic compile's: one per draw) plus the grace (pipeline.wall_limit_s). A planner that does not search (naive,
    heuristic) ignores the time limit, and its run time grows with the graph alone (the
    service's graph limits bound it): its job is bounded by the request's deadline."""
    from solver.planners import PLANNER_INFO

    info = PLANNER_INFO.get(options.planner)
    if info is None or not info.searches:
        return None
    return pipeline.wall_limit_s(options.time_limit_s, config.wall_grace_min_s, options.deterministic)


def _expected_s(options: pipeline.CompileOptions) -> Optional[float]:
    """A compile's expected run time for Retry-After: its time limit when the planner
    searches for it, else unknown (the pool's recent mean)."""
    from solver.planners import PLANNER_INFO

    info = PLANNER_INFO.get(options.planner)
    return options.time_limit_s if info is not None and info.searches else None


async def prepare_off_loop(state: ServiceState, raw: bytes, fn, *args):
    """Small bodies are prepared on the loop (a cache hit is mostly this); large ones in
    a pool worker, so /healthz and every other request keep answering while a 20 MB
    document is parsed (pydantic holds the GIL: a thread would not help). So is any body
    while the bodies in flight together pass the loop's budget: many medium bodies
    parsed back to back stall the loop as one large one does. The parse takes a pool
    slot like any job: a full pool is a 503."""
    config = state.config
    if len(raw) >= config.offload_parse_bytes:
        reason = "size"
    elif state.bodies.inflight > config.loop_parse_budget_bytes:
        reason = "budget"
    else:
        reason = None
    if reason is None or state.pool is None or not state.pool.ready:
        return fn(*args)
    state.metrics.bodies_offloaded.labels(reason).inc()
    key = f"prepare:{fn.__name__}:" + hashlib.sha256(raw).hexdigest()
    try:
        future, _ = state.pool.submit(key, fn, *args, True)
    except PoolFull as exc:
        state.metrics.rejected.labels("pool_full").inc()
        raise ProblemError(503, "pool_full", str(exc), headers={"Retry-After": str(exc.retry_after_s)}) from None
    try:
        return await wait(future, state.config.default_deadline_s)
    except asyncio.TimeoutError:
        state.pool.leave(key, "deadline")
        raise ProblemError(504, "deadline_exceeded", "the request body was not parsed in time") from None
    except WorkerCrashed as exc:
        state.metrics.worker_crashes.inc()
        raise ProblemError(500, "worker_crashed", str(exc)) from None
    except Exception as exc:
        problem = store_failure(exc)  # the worker's store read or write (damaged, full)
        if problem is not None:
            raise problem from None
        raise


# -- waiting for a job ---------------------------------------------------------------

async def _client_gone(receive) -> None:
    """Returns when the client disconnects (the body has been read: the next message the
    server delivers is the disconnect)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def _await_job(state: ServiceState, request: Request, key: str, future: asyncio.Future,
                     timeout_s: float) -> tuple[str, Any]:
    """Wait for the job, the timeout or the client leaving, whichever comes first:
    ("done", None) with `future` done; ("timeout", fate) or ("gone", fate) where fate is
    what the pool did with the job once this waiter left (SolverPool.leave)."""
    waiter = asyncio.ensure_future(wait(future, None))
    gone = asyncio.ensure_future(_client_gone(request.receive))
    try:
        done, _ = await asyncio.wait({waiter, gone}, timeout=max(0.0, timeout_s),
                                     return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (waiter, gone):
            if not task.done():
                task.cancel()
    if future.done():
        return "done", None
    reason = "client_gone" if gone in done else "deadline"
    fate = state.pool.leave(key, reason)
    if fate == "dropped":
        state.metrics.jobs_dropped.labels(reason).inc()
    if future.done() and fate != "dropped":  # finished between the wait and leave()
        return "done", None
    return ("gone" if reason == "client_gone" else "timeout"), fate


# -- compile handler -----------------------------------------------------------------

def _response_text(record: ProgramRecord, *, cached: bool, coalesced: bool, hardware_name: str) -> str:
    # Assembled from the stored program text: a cache hit does not parse or re-serialize
    # the program.
    head = {
        "key": record.key, "graph_hash": record.graph_hash, "compiler_version": record.compiler_version,
        "cached": cached, "coalesced": coalesced, "complete": record.complete, "options": record.options,
        "hardware": {"name": hardware_name, "digest": record.hardware_digest}, "stats": record.stats,
    }
    return json.dumps(head)[:-1] + ',"program":' + record.program + "}"


async def compile_document(state: ServiceState, request: Request, prepared: PreparedCompile, received_at: float) -> Response:
    config, metrics, store = state.config, state.metrics, state.store
    options = prepared.options
    hw = pipeline.load_hardware(options.target)
    graph_hash = prepared.graph_hash
    key = program_key(graph_hash, COMPILER_VERSION, options.options_hash(), hw.digest)
    log_fields = {"graph_hash": graph_hash, "key": key, "planner": options.planner, "target": options.target}

    def answer(record: ProgramRecord, cached: bool, coalesced: bool, hit: bool = False, **log_extra) -> Response:
        if hit:  # a complete stored program: a store hit (a stored fallback plan is not one)
            metrics.cache_hits.inc()
        metrics.document_compiled(prepared.n_nodes, cached=cached)
        log_event("compile", cached=cached, coalesced=coalesced, status=record.stats.get("solver_status"),
                  gap=record.stats.get("gap"), seconds=round(time.time() - received_at, 6), **log_extra,
                  **log_fields)
        return Response(_response_text(record, cached=cached, coalesced=coalesced, hardware_name=hw.name),
                        media_type="application/json")

    stored = store.get_program(key)
    if stored is not None and stored.complete:
        return answer(stored, cached=True, coalesced=False, hit=True)

    # A miss: validate fully (a stored program proves an identical graph passed before).
    document_json = prepared.document_json
    if document_json is None:
        from lowering.validate import find_problems

        problems = find_problems(prepared.doc)
        if problems:
            metrics.rejected.labels(problems[0].code).inc()
            raise graph_error_problem(problems[0], problems)
        document_json = prepared.doc.to_json()
    if state.storage is not None:
        full = state.storage.problem()
        if full is not None:  # a solve whose program cannot be stored: refused before it is spent
            metrics.rejected.labels("store_full").inc()
            raise ProblemError(507, "store_full", f"{full}; stored programs are still served",
                               headers={"Retry-After": str(FULL_RETRY_AFTER_S)})
    await asyncio.to_thread(store.put_graph, graph_hash, document_json, prepared.name)
    if state.storage is not None:
        state.storage.write_succeeded()

    deadline_s = prepared.deadline_s if prepared.deadline_s is not None else max(
        config.default_deadline_s, options.time_limit_s + 60.0)
    deadline_at = received_at + deadline_s
    slot = pipeline.StoreSlot(str(config.store_path), ProgramRecord.empty(
        key=key, graph_hash=graph_hash, compiler_version=COMPILER_VERSION, options_hash=options.options_hash(),
        options=options.solve_dict(), hardware=hw.name, hardware_digest=hw.digest))
    job = pipeline.CompileJob(document=document_json, options=options, deadline_at=deadline_at,
                              hint=stored.program if stored is not None else None, slot=slot,
                              wall_limit_s=_wall_limit_s(options, config))

    async def persist(outcome: pipeline.CompileOutcome) -> None:
        metrics.solve_seconds.labels(options.planner).observe(outcome.seconds)
        status = outcome.stats.get("solver_status") or outcome.status
        metrics.solver_status.labels(options.planner, str(status)).inc()
        if outcome.stats.get("fallback_from"):
            metrics.planner_fallbacks.labels(outcome.stats["fallback_from"], str(outcome.stats.get("planner"))).inc()
        log_event("solve", status=status, outcome=outcome.status, gap=outcome.stats.get("gap"),
                  predicted_us=outcome.stats.get("predicted_us"), simulated_us=outcome.stats.get("simulated_us"),
                  seconds=round(outcome.seconds, 6),
                  complete=outcome.complete, error=outcome.error, **log_fields)
        if outcome.status != "ok" or outcome.program is None:
            return
        record = slot.record(outcome.program, outcome.stats, outcome.solution, outcome.complete)
        await asyncio.to_thread(store.put_program, record)

    # An identical solve may have finished (and stored its program) while this request was
    # awaiting above; it is no longer in flight, so look again before starting another.
    # No await between this look and submit(): a job stores before it leaves the pool.
    again = store.get_program(key)
    if again is not None and again.complete:
        return answer(again, cached=True, coalesced=False, hit=True)
    metrics.cache_misses.inc()
    try:
        future, joined = state.pool.submit(key, pipeline.compile_job, job, on_done=persist,
                                           hard_timeout_s=(job.wall_limit_s or deadline_s) + config.wall_kill_grace_s,
                                           expected_s=_expected_s(options))
    except PoolFull as exc:
        metrics.rejected.labels("pool_full").inc()
        raise ProblemError(503, "pool_full", str(exc), headers={"Retry-After": str(exc.retry_after_s)}) from None
    except PoolNotReady as exc:
        metrics.rejected.labels("not_ready").inc()
        raise ProblemError(503, "not_ready", str(exc), headers={"Retry-After": "1"}) from None
    if joined:
        metrics.coalesced.inc()

    how, fate = await _await_job(state, request, key, future, deadline_at - time.time())

    def fallback_answer(reason: str) -> Optional[Response]:
        # The fallback plan the worker stored, or an earlier solve cut short by its
        # deadline, is still a validated plan: the best feasible one the service has.
        fallback = store.get_program(key)
        if fallback is None:
            return None
        cached = fallback.created_at < received_at  # else: this request's own fallback plan
        return answer(fallback, cached=cached, coalesced=joined, fallback=reason,
                      planner_used=fallback.stats.get("planner"))

    if how == "done":
        try:
            outcome: pipeline.CompileOutcome = future.result()
        except JobTimedOut as exc:
            metrics.wall_time_exceeded.inc()
            fell_back = fallback_answer("wall_time")
            if fell_back is not None:
                return fell_back
            log_event("compile", status="wall_time_exceeded", seconds=round(time.time() - received_at, 6),
                      **log_fields)
            raise ProblemError(504, "wall_time_exceeded",
                               f"the compile ran past its wall-time bound of {job.wall_limit_s or deadline_s:g} s "
                               f"(time_limit_s {options.time_limit_s:g} plus the time lowering, emitting and "
                               f"validating may take; the deadline for a planner that does not search) "
                               f"and was stopped; no plan was stored under key {key}: {exc}") from None
        except WorkerCrashed as exc:
            metrics.worker_crashes.inc()
            fell_back = fallback_answer("worker_crashed")
            if fell_back is not None:
                return fell_back
            log_event("compile", status="worker_crashed", seconds=round(time.time() - received_at, 6), **log_fields)
            raise ProblemError(500, "worker_crashed", f"{exc}; no fallback plan was stored for key {key}") from None
        except JobDropped as exc:  # every waiter left while it was queued (not this one: unreachable)
            raise ProblemError(504, "deadline_exceeded", f"{exc}; nothing is stored under key {key}") from None
    else:
        outcome = pipeline.CompileOutcome(status="deadline_exceeded", complete=False)

    if outcome.status == "ok":
        record = store.get_program(key)
        if record is None:  # the store kept a better row than this outcome: impossible for a miss
            raise ProblemError(500, "store_error", f"solved program {key} is not in the store")
        return answer(record, cached=False, coalesced=joined)
    if outcome.status == "graph_error":
        err = outcome.error or {}
        metrics.rejected.labels(err.get("code", "graph_error")).inc()
        raise ProblemError(422, err.get("code", "invalid_graph"), err.get("message", ""), node=err.get("node"))
    if outcome.status == "deadline_exceeded":
        if how == "gone":
            log_event("client_gone", fate=fate, seconds=round(time.time() - received_at, 6), **log_fields)
            metrics.client_gone.labels(str(fate)).inc()
            what = ("the job was still queued and nobody else waits for it: it was dropped and nothing will be "
                    f"stored under key {key}") if fate == "dropped" else (
                f"the job {'runs' if fate == 'running' else 'stays queued for other requests'}; when it finishes "
                f"its program is stored under key {key}")
            raise ProblemError(504, "client_gone", f"the client disconnected; {what}")
        metrics.deadline_exceeded.inc()
        fell_back = fallback_answer("deadline")
        if fell_back is not None:
            return fell_back
        log_event("compile", status="deadline_exceeded", fate=fate, seconds=round(time.time() - received_at, 6),
                  **log_fields)
        if fate == "dropped":
            raise ProblemError(504, "deadline_exceeded",
                               f"no validated plan within the deadline of {deadline_s:g} s: the job was still queued "
                               f"behind other jobs and has been dropped, so nothing will be stored under key {key}; "
                               f"retry later or with a longer deadline_s")
        if fate == "queued":
            raise ProblemError(504, "deadline_exceeded",
                               f"no validated plan within the deadline of {deadline_s:g} s: the job is still queued "
                               f"for other requests waiting for the same key; if they stay, its program will be "
                               f"stored under key {key}")
        raise ProblemError(504, "deadline_exceeded",
                           f"no validated plan within the deadline of {deadline_s:g} s; the solve continues "
                           f"and its program will be stored under key {key} (GET /programs/{key})")
    err = outcome.error or {}
    raise ProblemError(500, outcome.status, f"the planner produced no valid program: {err.get('message', outcome.status)}",
                       node=err.get("node"))


async def simulate(state: ServiceState, request: Request, job: pipeline.SimulateJob) -> dict[str, Any]:
    key = "simulate:" + hashlib.sha256(json.dumps(
        [job.program, job.graph, job.target, job.numerics, job.trace]).encode()).hexdigest()
    result = await run_pool_job(state, request, key, pipeline.simulate_job, job)
    if result.get("graph_error"):
        err = result["errors"][0]
        raise ProblemError(422, err.get("code", "invalid_graph"), err.get("message", ""), node=err.get("node"))
    return result


def submit(state: ServiceState, key: str, fn, *args, **kwargs) -> tuple[asyncio.Future, bool]:
    """`state.pool.submit`, with a full or starting pool as a 503 with Retry-After."""
    try:
        return state.pool.submit(key, fn, *args, **kwargs)
    except PoolFull as exc:
        state.metrics.rejected.labels("pool_full").inc()
        raise ProblemError(503, "pool_full", str(exc), headers={"Retry-After": str(exc.retry_after_s)}) from None
    except PoolNotReady as exc:
        state.metrics.rejected.labels("not_ready").inc()
        raise ProblemError(503, "not_ready", str(exc), headers={"Retry-After": "1"}) from None


async def run_pool_job(state: ServiceState, request: Request, key: str, fn, *args) -> Any:
    """Run `fn(*args)` in the pool under its queue limit (joining an identical job in
    flight) and return its result: 503 when the pool is full, 504 past the service's
    deadline or when the client left, 500 worker_crashed when the worker died running it."""
    future, _ = submit(state, key, fn, *args,
                       hard_timeout_s=state.config.default_deadline_s + state.config.wall_kill_grace_s)
    how, fate = await _await_job(state, request, key, future, state.config.default_deadline_s)
    if how != "done":
        if how == "gone":
            state.metrics.client_gone.labels(str(fate)).inc()
        raise ProblemError(504, "client_gone" if how == "gone" else "deadline_exceeded",
                           f"the job did not finish within {state.config.default_deadline_s:g} s"
                           if how == "timeout" else "the client disconnected")
    try:
        return future.result()
    except (ProblemError, JobDropped):
        raise
    except JobTimedOut as exc:
        raise ProblemError(504, "wall_time_exceeded", str(exc)) from None
    except WorkerCrashed as exc:
        state.metrics.worker_crashes.inc()
        raise ProblemError(500, "worker_crashed", str(exc)) from None
