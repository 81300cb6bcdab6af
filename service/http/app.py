"""The sticksat HTTP service (FastAPI): the app factory and its routes.

Routes: POST /compile, POST /simulate, GET /programs/{key}, GET /graphs/{graph_hash},
GET /healthz, GET /readyz, GET /metrics, GET /version; the HTML pages (GET /, GET
/programs/{key}/report) live in service/http/pages.py. Every error is an RFC 9457
problem document (service/problems.py). Solves run in the process pool created in the
lifespan (service/pool.py), never on the event loop; the store (service/store.py) makes
a repeated compile a lookup.

The package: `config` (ServiceConfig), `middleware` (auth, Content-Type, body limits,
metrics), `handlers` (what the routes do), `openapi` (the published schema), `pages`
(HTML). Request bodies and their preparation are in service/prepare.py, outside this
package, because pool workers run them.
"""
from __future__ import annotations

import asyncio
import json
import platform
import time
from contextlib import asynccontextmanager
from typing import Any, Optional

from fastapi import FastAPI, Path, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from lowering.errors import GraphError
from lowering.version import COMPILER_VERSION
from service import pipeline
from service.http import handlers, pages
from service.http.config import ServiceConfig, config_from_env, limits_of
from service.http.middleware import ServiceMiddleware
from service.http.openapi import service_openapi
from service.http.storage import FULL_RETRY_AFTER_S, StorageWatch, store_failure
from service.logging import log_event
from service.metrics import ServiceMetrics
from service.pool import SolverPool
from service.prepare import CompileResponse, prepare_compile, prepare_simulate
from service.problems import STORE_PROBLEMS, ProblemError, from_problem_error, openapi_responses, problem_response
from service.store import ProgramStore, describe_location

def create_app(config: ServiceConfig) -> FastAPI:
    metrics = ServiceMetrics()
    state = handlers.ServiceState(config, metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.store = ProgramStore(config.store_path)
        state.storage = StorageWatch(str(config.store_path), config.min_free_bytes)
        state.pool = SolverPool(config.workers, config.queue_limit, on_inflight_change=metrics.inflight.set,
                                on_event=log_event, memory_bytes=config.worker_memory_bytes)
        metrics.pool_workers.set(config.workers)

        async def warm():
            try:
                # The store's quick integrity check (what /readyz reports), off the loop.
                await asyncio.to_thread(state.store.health)
                await state.pool.start(pipeline.warm_worker)
                log_event("pool_ready", workers=config.workers, queue_limit=config.queue_limit,
                          store=describe_location(config.store_path))
            except Exception as exc:  # noqa: BLE001 - reported by /readyz
                state.warm_error = f"{type(exc).__name__}: {exc}"
                log_event("pool_failed", error=state.warm_error)

        # Readiness is reported while the workers start: /readyz answers 503 until then.
        state.warm_task = asyncio.create_task(warm())
        try:
            yield
        finally:
            state.warm_task.cancel()
            state.pool.shutdown()
            state.store.close()

    app = FastAPI(
        title="sticksat",
        version=COMPILER_VERSION,
        description="Layout and tiling optimizer service for the IBM Spyre accelerator: "
                    "graph document → validated SuperDSC program. Errors are application/problem+json.",
        lifespan=lifespan,
    )
    app.state.service = state

    # -- error handlers ------------------------------------------------------------
    @app.exception_handler(ProblemError)
    async def _problem(request: Request, exc: ProblemError):
        return from_problem_error(exc, instance=request.url.path)

    @app.exception_handler(GraphError)
    async def _graph(request: Request, exc: GraphError):
        return from_problem_error(handlers.graph_error_problem(exc), instance=request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        return handlers.request_validation_problem(exc, request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return problem_response(exc.status_code, code, str(exc.detail), instance=request.url.path,
                                headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        problem = _store_failure(exc, request.url.path)
        if problem is not None:
            return from_problem_error(problem, instance=request.url.path)
        log_event("internal_error", path=request.url.path, error=f"{type(exc).__name__}: {exc}")
        return problem_response(500, "internal_error", f"{type(exc).__name__}: {exc}", instance=request.url.path)

    def _store_failure(exc: BaseException, path: str) -> Optional[ProblemError]:
        problem = store_failure(exc)
        if problem is None:
            return None
        if problem.code == "store_full" and state.storage is not None:
            state.storage.write_failed()
        metrics.rejected.labels(problem.code).inc()
        log_event(problem.code, path=path, error=f"{type(exc).__name__}: {exc}")
        return problem

    @asynccontextmanager
    async def disk_full_as_507(path: str):
        """A store that is full (507) or damaged (503) is answered as such, raised as a
        ProblemError like any 4xx/5xx of ours (the catch-all handler would log a crash)."""
        try:
            yield
        except ProblemError:
            raise
        except Exception as exc:
            problem = _store_failure(exc, path)
            if problem is not None:
                raise problem from None
            raise

    # -- health --------------------------------------------------------------------
    @app.get("/healthz", summary="liveness")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", summary="readiness: 503 until the solver pool is up", responses=openapi_responses(503))
    async def readyz() -> dict[str, Any]:
        if state.pool is None or not state.pool.ready:
            detail = state.warm_error or "solver pool is starting"
            raise ProblemError(503, "not_ready", detail, headers={"Retry-After": "1"})
        full = state.storage.problem() if state.storage is not None else None
        if full is not None:
            raise ProblemError(503, "store_full", full, headers={"Retry-After": str(FULL_RETRY_AFTER_S)})
        health = await asyncio.to_thread(state.store.health)  # the quick check ran at startup
        if not health.ok:
            damaged = any(p.startswith(("integrity", "damaged")) for p in health.problems)
            code = "store_damaged" if damaged else "store_full"
            raise ProblemError(503, code, "the program store: " + "; ".join(health.problems),
                               headers={"Retry-After": str(STORE_PROBLEMS[code][2])})
        return {"status": "ready", "workers": state.pool.workers, "queue_limit": state.pool.queue_limit}

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response,
             responses={200: {"content": {"text/plain": {}}}})
    async def metrics_route() -> Response:
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    @app.get("/version", summary="compiler, dependency and hardware versions")
    async def version() -> dict[str, Any]:
        import numpy
        import ortools
        import pydantic

        targets = {name: pipeline.load_hardware(name).digest for name in pipeline.available_targets()}
        return {"sticksat": COMPILER_VERSION, "numpy": numpy.__version__, "ortools": ortools.__version__,
                "pydantic": pydantic.__version__, "python": platform.python_version(),
                "planners": pipeline.available_planners(), "default_planner": pipeline.default_planner(),
                "targets": targets}

    # -- compile -------------------------------------------------------------------
    # The body is parsed here with CompileRequest.model_validate_json (one pass in
    # pydantic-core) rather than by FastAPI (json.loads, then validation of the Python
    # objects): a cache hit is mostly parsing. The OpenAPI body schema is declared below.
    @app.post("/compile", summary="graph document → validated SuperDSC program + stats",
              response_model=CompileResponse, responses=openapi_responses(401, 408, 413, 415, 422, 500, 503, 504, 507),
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": {"$ref": "#/components/schemas/CompileRequest"}}}}})
    async def compile_route(request: Request) -> Response:
        received_at = time.time()
        raw = await request.body()
        prepared = await handlers.prepare_off_loop(state, raw, prepare_compile, raw, limits_of(config))
        if isinstance(prepared, dict):
            return handlers.problem_of(state, prepared, request.url.path)
        async with disk_full_as_507(request.url.path):
            return await handlers.compile_document(state, request, prepared, received_at)

    # -- simulate ------------------------------------------------------------------
    # Parsed here like /compile (FastAPI's own parsing answers an undocumented 400 for a
    # body json.loads cannot take, e.g. one nested too deeply).
    @app.post("/simulate", summary="program → validation result, simulated timing, optional trace",
              responses=openapi_responses(401, 408, 413, 415, 422, 500, 503, 504),
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": {"$ref": "#/components/schemas/SimulateRequest"}}}}})
    async def simulate_route(request: Request) -> Response:
        raw = await request.body()
        job = await handlers.prepare_off_loop(state, raw, prepare_simulate, raw, limits_of(config))
        if isinstance(job, dict):
            return handlers.problem_of(state, job, request.url.path)
        return Response(json.dumps(handlers.json_safe(await handlers.simulate(state, request, job)), allow_nan=False),
                        media_type="application/json")

    # -- store ---------------------------------------------------------------------
    @app.get("/programs/{key}", summary="a stored program with its stats", responses=openapi_responses(401, 404, 422))
    async def get_program(key: str = Path(pattern=r"^[0-9a-f]{64}$")) -> dict[str, Any]:
        record = state.store.get_program(key)
        if record is None:
            raise ProblemError(404, "not_found", f"no program with key {key}")
        out = record.summary(COMPILER_VERSION)
        out["stats"] = record.stats
        out["has_solution"] = record.solution is not None
        out["program"] = json.loads(record.program)
        return out

    @app.get("/graphs/{graph_hash}", summary="a stored graph document and its programs",
             responses=openapi_responses(401, 404, 422))
    async def get_graph(graph_hash: str = Path(pattern=r"^[0-9a-f]{64}$")) -> dict[str, Any]:
        record = state.store.get_graph(graph_hash)
        if record is None:
            raise ProblemError(404, "not_found", f"no graph with hash {graph_hash}")
        return {"graph_hash": record.graph_hash, "name": record.name, "created_at": record.created_at,
                "document": json.loads(record.document),
                "programs": [p.summary(COMPILER_VERSION) for p in state.store.programs_for_graph(graph_hash)]}

    app.include_router(pages.router)
    app.openapi = lambda: service_openapi(app)  # type: ignore[method-assign]
    app.add_middleware(ServiceMiddleware, max_body_bytes=config.max_body_bytes, metrics=metrics, bodies=state.bodies,
                       token=config.token, body_read_timeout_s=config.body_read_timeout_s)
    return app


def app_from_env() -> FastAPI:
    """For `uvicorn service.app:app_from_env --factory`."""
    return create_app(config_from_env())
