"""The sticksat HTTP service (FastAPI).

Routes: POST /compile, POST /simulate, GET /programs/{key}, GET /graphs/{graph_hash},
GET /healthz, GET /readyz, GET /metrics, GET /version; the HTML pages (GET /, GET
/programs/{key}/report) live in service/pages.py. Every error is an RFC 9457
problem document (service/problems.py). Solves run in the process pool created in the
lifespan (service/pool.py), never on the event loop; the store (service/store.py) makes
a repeated compile a lookup.
"""
from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import math
import os
import platform
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Optional

from fastapi import FastAPI, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from lowering.errors import GraphError
from lowering.graph_format import GraphDocument
from service import pages, pipeline
from service.logging import log_event
from service.metrics import ServiceMetrics
from service.pool import JobDropped, PoolFull, PoolNotReady, SolverPool, WorkerCrashed, wait
from service.problems import (
    Problem,
    ProblemError,
    from_problem_error,
    openapi_responses,
    problem_response,
)
from service.store import ProgramRecord, ProgramStore, describe_location, program_key
from lowering.version import COMPILER_VERSION
from target.superdsc import Program

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class ServiceConfig:
    store_path: str
    workers: int = 1
    # Distinct jobs allowed to wait for a worker; one more is a 503.
    queue_limit: int = 8
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    limits: pipeline.GraphLimits = field(default_factory=pipeline.GraphLimits)
    # Without a client deadline a compile waits at most this long (or its time limit
    # plus a minute, whichever is longer).
    default_deadline_s: float = 300.0
    # Bearer token every request but /healthz and /readyz must carry (None: no auth).
    token: Optional[str] = field(default=None, repr=False)
    # A request body must arrive whole within this many seconds of the request (408 and
    # the connection closed otherwise): stalled uploads do not hold connections open.
    body_read_timeout_s: float = 30.0
    # The operator's cap on a request's `time_limit_s` (a request above it is a 422
    # invalid_option naming the cap; not clamped: the time limit is part of the store key).
    max_time_limit_s: float = pipeline.MAX_TIME_LIMIT_S
    # /simulate with numerics: the elements the reference interpreter and the functional
    # run would materialize (graph tensors + program tensors), checked before any
    # allocation (422 numerics_too_large beyond).
    max_numerics_elements: int = 2**26
    # Bodies at least this large are parsed and validated in a pool worker, not on the
    # event loop (pydantic holds the GIL for the whole parse: seconds for a 20 MB body).
    offload_parse_bytes: int = 1024 * 1024


# -- request and response models -----------------------------------------------------

class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class CompileOptionsIn(_Strict):
    planner: Optional[str] = Field(None, max_length=32, pattern=r"^[a-z0-9_]+$",
                                   description="planner name (GET /version lists them); default: the best available")
    time_limit_s: Optional[float] = Field(None, gt=0, le=pipeline.MAX_TIME_LIMIT_S,
                                          description="solver budget in seconds (part of the store key)")
    deterministic: bool = Field(False, description="fixed seed and deterministic time limit")
    strict: bool = Field(False, description="a planner failure is an error (500 planner_failed naming the op) "
                                            "instead of a plan from the next planner (cpsat -> heuristic -> naive)")
    target: Optional[str] = Field(None, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$",
                                  description="hardware target name; default spyre")
    deadline_s: Optional[float] = Field(None, gt=0, le=86_400,
                                        description="answer within this many seconds: the best feasible "
                                                    "validated plan by then, else 504")


class CompileRequest(_Strict):
    graph: Optional[GraphDocument] = Field(None, description="a sticksat graph document (format v1)")
    export: Optional[dict[str, Any]] = Field(
        None, description="a torch.export serialized program (JSON), decomposed with Inductor's table")
    options: CompileOptionsIn = Field(default_factory=CompileOptionsIn)

    @model_validator(mode="after")
    def _one_source(self) -> "CompileRequest":
        if (self.graph is None) == (self.export is None):
            raise ValueError("give exactly one of 'graph' or 'export'")
        return self


class HardwareRef(BaseModel):
    name: str
    digest: str


class CompileResponse(BaseModel):
    key: str = Field(description="store key: GET /programs/{key}")
    graph_hash: str
    compiler_version: str
    cached: bool = Field(description="answered from the store without solving")
    coalesced: bool = Field(description="joined an identical solve already in flight")
    complete: bool = Field(description="solved with the full time limit (false: cut short by a deadline)")
    options: dict[str, Any]
    hardware: HardwareRef
    stats: dict[str, Any]
    program: dict[str, Any]


class SimulateRequest(_Strict):
    program: Program
    graph: Optional[GraphDocument] = Field(None, description="needed for numerics (the reference)")
    target: Optional[str] = Field(None, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    numerics: bool = False
    trace: bool = Field(False, description="include the Chrome/Perfetto trace")


# -- middleware ----------------------------------------------------------------------

class _ServiceMiddleware:
    """Body size limit (413 before the app sees the body) and per-route request metrics.

    The body is read here, up to the limit, and replayed to the app: a chunked upload
    without Content-Length is bounded as well as a declared one."""

    def __init__(self, app, max_body_bytes: int, metrics: ServiceMetrics, token: Optional[str] = None,
                 body_read_timeout_s: float = 30.0):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_read_timeout_s = body_read_timeout_s
        self.metrics = metrics
        self.token = token.encode() if token else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status_holder = {"status": 500}

        async def send_wrapper(message):
            if message["type"] == "http.response.start":
                status_holder["status"] = message["status"]
                if message["status"] == 500 and not any(k.lower() == b"connection" for k, _ in
                                                        message.get("headers", [])):
                    message = {**message, "headers": list(message.get("headers", [])) + [(b"connection", b"close")]}
            await send(message)

        try:
            if self.token is not None and scope.get("path") not in OPEN_PATHS and not self._authorized(scope):
                self.metrics.rejected.labels("unauthorized").inc()
                await problem_response(401, "unauthorized", "this service needs 'Authorization: Bearer <token>' "
                                       "(the token of STICKSAT_TOKEN or --token-file)", instance=scope.get("path"),
                                       headers={"WWW-Authenticate": 'Bearer realm="sticksat"'})(
                    scope, receive, send_wrapper)
                return
            if scope["method"] in ("POST", "PUT", "PATCH"):
                refused = _content_type_problem(scope)
                if refused is not None:
                    self.metrics.rejected.labels("unsupported_media_type").inc()
                    await refused(scope, receive, send_wrapper)
                    return
                body_or_response = await self._read_body(scope, receive)
                if isinstance(body_or_response, Response):
                    await body_or_response(scope, receive, send_wrapper)
                    return
                receive = _replay(body_or_response, receive)
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            label = getattr(route, "path", None) or "unmatched"
            self.metrics.requests.labels(label, scope["method"], str(status_holder["status"])).inc()
            self.metrics.request_seconds.labels(label).observe(time.perf_counter() - started)

    def _authorized(self, scope) -> bool:
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                scheme, _, presented = value.partition(b" ")
                # constant time in the token's contents (hmac.compare_digest)
                return scheme.lower() == b"bearer" and hmac.compare_digest(presented.strip(), self.token)
        return False

    async def _read_body(self, scope, receive):
        declared = None
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    return problem_response(400, "bad_content_length", "Content-Length is not an integer")
        if declared is not None and declared > self.max_body_bytes:
            return self._too_large(declared)
        chunks: list[bytes] = []
        size = 0
        # One deadline for the whole body (a client trickling a byte at a time is as stalled
        # as one sending nothing).
        deadline = time.monotonic() + self.body_read_timeout_s
        while True:
            try:
                message = await asyncio.wait_for(receive(), timeout=max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                self.metrics.rejected.labels("body_timeout").inc()
                return problem_response(408, "body_timeout",
                                        f"the request body did not arrive within {self.body_read_timeout_s:g} s "
                                        f"({size} of {declared if declared is not None else 'an unknown number of'} "
                                        f"bytes received); the connection is closed",
                                        instance=scope.get("path"), headers={"Connection": "close"})
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return self._too_large(size)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    def _too_large(self, size: int) -> Response:
        self.metrics.rejected.labels("body_too_large").inc()
        return problem_response(413, "body_too_large",
                                f"request body of {size} bytes exceeds the limit of {self.max_body_bytes} bytes",
                                headers={"Connection": "close"})


# Probes answer without the token (they reveal nothing but liveness and worker counts).
OPEN_PATHS = frozenset({"/healthz", "/readyz"})


def _content_type_problem(scope) -> Optional[Response]:
    """415 unless the body is declared JSON (application/json or application/*+json).
    A web page can make a browser POST text/plain, form or multipart bodies to any
    origin without a CORS preflight; refusing them keeps a page a developer visits from
    starting compiles on their localhost service."""
    value = ""
    for name, raw in scope.get("headers", []):
        if name == b"content-type":
            value = raw.decode("latin-1")
            break
    media = value.split(";", 1)[0].strip().lower()
    if media == "application/json" or (media.startswith("application/") and media.endswith("+json")):
        return None
    shown = f"Content-Type {media!r}" if media else "no Content-Type"
    return problem_response(415, "unsupported_media_type",
                            f"{shown}: request bodies are JSON (Content-Type: application/json)",
                            instance=scope.get("path"), headers={"Accept-Post": "application/json"})


def _replay(body: bytes, receive):
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


# -- the app -------------------------------------------------------------------------

class ServiceState:
    def __init__(self, config: ServiceConfig, metrics: ServiceMetrics):
        self.config = config
        self.metrics = metrics
        self.store: Optional[ProgramStore] = None
        self.pool: Optional[SolverPool] = None
        self.warm_task: Optional[asyncio.Task] = None
        self.warm_error: Optional[str] = None


def _graph_error_problem(exc: GraphError, errors: Optional[list[GraphError]] = None) -> ProblemError:
    more = [e.to_dict() for e in errors] if errors and len(errors) > 1 else None
    return ProblemError(422, exc.code, exc.message, node=exc.node, errors=more)


def create_app(config: ServiceConfig) -> FastAPI:
    metrics = ServiceMetrics()
    state = ServiceState(config, metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.store = ProgramStore(config.store_path)
        state.pool = SolverPool(config.workers, config.queue_limit, on_inflight_change=metrics.inflight.set,
                                on_event=log_event)
        metrics.pool_workers.set(config.workers)

        async def warm():
            try:
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
        return from_problem_error(_graph_error_problem(exc), instance=request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        return _request_validation_problem(exc, request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return problem_response(exc.status_code, code, str(exc.detail), instance=request.url.path,
                                headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        log_event("internal_error", path=request.url.path, error=f"{type(exc).__name__}: {exc}")
        return problem_response(500, "internal_error", f"{type(exc).__name__}: {exc}", instance=request.url.path)

    # -- health --------------------------------------------------------------------
    @app.get("/healthz", summary="liveness")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", summary="readiness: 503 until the solver pool is up", responses=openapi_responses(503))
    async def readyz() -> dict[str, Any]:
        if state.pool is None or not state.pool.ready:
            detail = state.warm_error or "solver pool is starting"
            raise ProblemError(503, "not_ready", detail, headers={"Retry-After": "1"})
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
              response_model=CompileResponse, responses=openapi_responses(401, 408, 413, 415, 422, 500, 503, 504),
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": {"$ref": "#/components/schemas/CompileRequest"}}}}})
    async def compile_route(request: Request) -> Response:
        received_at = time.time()
        raw = await request.body()
        prepared = await _prepare_off_loop(state, raw, prepare_compile, raw, _limits_of(config))
        if isinstance(prepared, dict):
            return _problem_of(state, prepared, request.url.path)
        return await _compile(state, request, prepared, received_at)

    # -- simulate ------------------------------------------------------------------
    # Parsed here like /compile (FastAPI's own parsing answers an undocumented 400 for a
    # body json.loads cannot take, e.g. one nested too deeply).
    @app.post("/simulate", summary="program → validation result, simulated timing, optional trace",
              responses=openapi_responses(401, 408, 413, 415, 422, 500, 503, 504),
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": {"$ref": "#/components/schemas/SimulateRequest"}}}}})
    async def simulate_route(request: Request) -> Response:
        raw = await request.body()
        job = await _prepare_off_loop(state, raw, prepare_simulate, raw, _limits_of(config))
        if isinstance(job, dict):
            return _problem_of(state, job, request.url.path)
        return Response(json.dumps(_json_safe(await _simulate(state, request, job)), allow_nan=False),
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
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    app.add_middleware(_ServiceMiddleware, max_body_bytes=config.max_body_bytes, metrics=metrics,
                       token=config.token, body_read_timeout_s=config.body_read_timeout_s)
    return app


def _openapi(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components["Problem"] = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
    # /compile parses its own body (see compile_route): publish the model it parses with.
    _, request_defs = models_json_schema([(CompileRequest, "validation"), (SimulateRequest, "validation")],
                                         ref_template="#/components/schemas/{model}")
    for name, definition in request_defs.get("$defs", {}).items():
        components.setdefault(name, definition)
    # Exactly one of graph/export (the model's validator): say so in the schema.
    components["CompileRequest"]["oneOf"] = [{"required": ["graph"]}, {"required": ["export"]}]
    protected = {"401": openapi_responses(401)[401]}
    for path, path_item in schema.get("paths", {}).items():
        if path in OPEN_PATHS:
            continue
        for operation in path_item.values():
            operation.setdefault("responses", {}).update(
                {k: v for k, v in protected.items() if k not in operation["responses"]})
    # Errors come from our handlers as problem+json; FastAPI's default 422 schema would
    # describe a body we never send.
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)
    for path_item in schema.get("paths", {}).values():
        for operation in path_item.values():
            for status, response in operation.get("responses", {}).items():
                content = response.get("content", {})
                if status.startswith(("4", "5")) and "application/json" in content:
                    content.pop("application/json")
                    content["application/problem+json"] = {"schema": {"$ref": "#/components/schemas/Problem"}}
    app.openapi_schema = schema
    return schema


def _json_safe(value: Any) -> Any:
    """Non-finite floats (an error of inf when outputs differ in shape) as the strings
    'inf', '-inf', 'nan', as in graph documents: JSON has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _json_or_none(raw: bytes) -> Any:
    """The body as Python objects for locating a validation error, or None when it does
    not parse (invalid JSON, or nested deeper than Python's recursion limit)."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def _request_validation_problem(exc: RequestValidationError, instance: str) -> Response:
    errors = [dict(e, loc=tuple(e.get("loc", ()))[1:] if tuple(e.get("loc", ()))[:1] == ("body",)
                   else tuple(e.get("loc", ()))) for e in exc.errors()]
    return _body_validation_problem(errors, getattr(exc, "body", None), instance)


def _body_validation_problem(errors: list[dict], body: Any, instance: str) -> Response:
    found = _body_validation_findings(errors, body)
    return problem_response(422, "schema", found["detail"], node=found["node"], errors=found["errors"],
                            instance=instance)


def _body_validation_findings(errors: list[dict], body: Any) -> dict[str, Any]:
    """Pydantic errors of a request body → the 422 problem's detail, naming the graph
    node (when the error lies inside the graph document) and the JSON path."""
    from lowering.validate import json_path  # one home for "error location -> node id"

    findings: list[dict[str, Any]] = []
    for err in errors[:20]:
        loc = tuple(err.get("loc", ()))
        node = None
        path = ".".join(str(p) for p in loc)
        if len(loc) >= 1 and loc[0] == "graph" and isinstance(body, dict) and isinstance(body.get("graph"), dict):
            sub_path, node = json_path(loc[1:], body["graph"])
            path = "graph" + ("." + sub_path if sub_path and not sub_path.startswith("[") else sub_path)
        findings.append({"code": "schema", "message": f"{path or '<body>'}: {err.get('msg')}", "path": path,
                         "node": node})
    first = findings[0] if findings else {"message": "invalid request", "node": None}
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return {"detail": first["message"] + more, "node": first.get("node"),
            "errors": findings if len(findings) > 1 else None}


# -- request preparation (parse, limits, validation): on the loop or in a worker ------

@dataclass(frozen=True)
class RequestLimits:
    """The service limits a request is prepared against (picklable: large bodies are
    prepared in a pool worker)."""

    graph: pipeline.GraphLimits
    max_time_limit_s: float
    max_numerics_elements: int


def _limits_of(config: ServiceConfig) -> RequestLimits:
    return RequestLimits(config.limits, config.max_time_limit_s, config.max_numerics_elements)


@dataclass
class PreparedCompile:
    graph_hash: str
    name: str
    n_nodes: int
    options: pipeline.CompileOptions
    deadline_s: Optional[float]
    # Set when prepared in a worker (fully validated there: the document is not sent back
    # as objects); in process, the parsed document, validated only on a store miss.
    document_json: Optional[str] = None
    doc: Optional[GraphDocument] = None


def _problem_dict(status: int, code: str, detail: str, node: Optional[str] = None,
                  errors: Optional[list] = None, rejected: Optional[str] = None) -> dict[str, Any]:
    return {"problem": {"status": status, "code": code, "detail": detail, "node": node, "errors": errors,
                        "rejected": rejected or code}}


def _graph_problem_dict(exc: GraphError, errors: Optional[list[GraphError]] = None) -> dict[str, Any]:
    more = [e.to_dict() for e in errors] if errors and len(errors) > 1 else None
    return _problem_dict(422, exc.code, exc.message, node=exc.node, errors=more)


def _problem_of(state: ServiceState, prepared: dict[str, Any], instance: str) -> Response:
    p = prepared["problem"]
    if p.get("rejected"):
        state.metrics.rejected.labels(p["rejected"]).inc()
    return problem_response(p["status"], p["code"], p["detail"], node=p.get("node"), errors=p.get("errors"),
                            instance=instance)


def _schema_problem_dict(exc: ValidationError, raw: bytes) -> dict[str, Any]:
    resp = _body_validation_findings(exc.errors(include_url=False), _json_or_none(raw))
    return _problem_dict(422, "schema", resp["detail"], node=resp["node"], errors=resp["errors"], rejected="schema")


def prepare_compile(raw: bytes, limits: RequestLimits, in_worker: bool = False):
    """A /compile body -> PreparedCompile, or {"problem": ...} for a 4xx. Everything
    that costs time in proportion to the body happens here: parsing, the export
    conversion, non-finite literals, the service limits, the options, the graph hash;
    in a worker also the full validation and the canonical document."""
    try:
        body = CompileRequest.model_validate_json(raw)
    except ValidationError as exc:
        return _schema_problem_dict(exc, raw)
    opts = body.options
    try:
        try:
            doc = body.graph if body.graph is not None else pipeline.document_from_export(body.export)
        except RecursionError:
            raise GraphError("schema", "the exported program is nested too deeply") from None
        pipeline.check_graph_limits(doc, limits.graph)
        # Bare NaN/Infinity literals parse (pydantic accepts them) but have no canonical
        # form: name them before hashing.
        from lowering.validate import non_finite_problems

        non_finite = non_finite_problems(doc)
        if non_finite:
            raise non_finite[0]
        if opts.time_limit_s is not None and opts.time_limit_s > limits.max_time_limit_s:
            raise GraphError("invalid_option", f"time_limit_s {opts.time_limit_s:g} exceeds this service's cap of "
                                               f"{limits.max_time_limit_s:g} s (sticksat serve --max-time-limit)")
        options = pipeline.resolve_options(opts.planner, opts.time_limit_s, opts.deterministic, opts.target,
                                           opts.strict)
        if opts.time_limit_s is None and options.time_limit_s > limits.max_time_limit_s:
            options = dataclasses.replace(options, time_limit_s=limits.max_time_limit_s)
    except GraphError as exc:
        return _graph_problem_dict(exc)
    prepared = PreparedCompile(graph_hash=doc.graph_hash(), name=doc.name, n_nodes=len(doc.nodes),
                               options=options, deadline_s=opts.deadline_s, doc=doc)
    if in_worker:
        from lowering.validate import find_problems

        problems = find_problems(doc)
        if problems:
            return _graph_problem_dict(problems[0], problems)
        prepared.document_json = doc.to_json()
        prepared.doc = None
    return prepared


def _numerics_elements(body: "SimulateRequest") -> tuple[int, int]:
    """Elements the numerics check would materialize: (graph tensors, program tensors)."""
    graph = 0
    if body.graph is not None:
        metas = [inp.meta for inp in body.graph.inputs] + [m for n in body.graph.nodes for m in n.outputs]
        for meta in metas:
            n = 1
            for size in meta.shape:
                n *= size if isinstance(size, int) else 1
            graph += n
    program = 0
    for tensor in body.program.tensors:
        n = 1
        for size in tensor.shape:
            n *= max(0, int(size))
        program += n
    return graph, program


def prepare_simulate(raw: bytes, limits: RequestLimits, in_worker: bool = False):
    """A /simulate body -> SimulateJob, or {"problem": ...} for a 4xx."""
    try:
        body = SimulateRequest.model_validate_json(raw)
    except ValidationError as exc:
        return _schema_problem_dict(exc, raw)
    target = body.target or body.program.hardware or "spyre"
    try:
        pipeline.load_hardware(target)
    except GraphError as exc:
        return _graph_problem_dict(exc)
    if body.numerics and body.graph is None:
        return _problem_dict(422, "invalid_option", "numerics needs the graph document (the reference)")
    from target.primitives import DTYPE_BYTES

    for k, tensor in enumerate(body.program.tensors):
        if tensor.dtype not in DTYPE_BYTES:
            return _problem_dict(422, "schema", f"program.tensors[{k}].dtype: unknown dtype {tensor.dtype!r} "
                                                f"(tensor {tensor.id!r}); known: {sorted(DTYPE_BYTES)}")
    if body.graph is not None:
        from lowering.validate import non_finite_problems

        non_finite = non_finite_problems(body.graph)
        if non_finite:
            return _graph_problem_dict(non_finite[0])
    if body.numerics:
        graph_elems, program_elems = _numerics_elements(body)
        if graph_elems + program_elems > limits.max_numerics_elements:
            return _problem_dict(
                422, "numerics_too_large",
                f"numerics would materialize {graph_elems + program_elems} elements ({graph_elems} in the graph's "
                f"tensors, {program_elems} in the program's); this service allows at most "
                f"{limits.max_numerics_elements} (sticksat serve --max-numerics-elements); simulate without "
                f"numerics, or check numerics locally with `sticksat simulate --numerics`")
    return pipeline.SimulateJob(program=body.program.to_json(),
                                graph=body.graph.to_json() if body.graph is not None else None,
                                target=target, numerics=body.numerics, trace=body.trace)


async def _prepare_off_loop(state: ServiceState, raw: bytes, fn, *args):
    """Small bodies are prepared on the loop (a cache hit is mostly this); large ones in
    a pool worker, so /healthz and every other request keep answering while a 20 MB
    document is parsed (pydantic holds the GIL: a thread would not help). The parse
    takes a pool slot like any job: a full pool is a 503."""
    import hashlib

    if len(raw) < state.config.offload_parse_bytes or state.pool is None or not state.pool.ready:
        return fn(*args)
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


async def _compile(state: ServiceState, request: Request, prepared: PreparedCompile, received_at: float) -> Response:
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
            raise _graph_error_problem(problems[0], problems)
        document_json = prepared.doc.to_json()
    await asyncio.to_thread(store.put_graph, graph_hash, document_json, prepared.name)

    deadline_s = prepared.deadline_s if prepared.deadline_s is not None else max(
        config.default_deadline_s, options.time_limit_s + 60.0)
    deadline_at = received_at + deadline_s
    slot = pipeline.StoreSlot(str(config.store_path), ProgramRecord.empty(
        key=key, graph_hash=graph_hash, compiler_version=COMPILER_VERSION, options_hash=options.options_hash(),
        options=options.solve_dict(), hardware=hw.name, hardware_digest=hw.digest))
    job = pipeline.CompileJob(document=document_json, options=options, deadline_at=deadline_at,
                              hint=stored.program if stored is not None else None, slot=slot)

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
        future, joined = state.pool.submit(key, pipeline.compile_job, job, on_done=persist)
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


async def _simulate(state: ServiceState, request: Request, job: pipeline.SimulateJob) -> dict[str, Any]:
    import hashlib

    key = "simulate:" + hashlib.sha256(json.dumps(
        [job.program, job.graph, job.target, job.numerics, job.trace]).encode()).hexdigest()
    try:
        future, _ = state.pool.submit(key, pipeline.simulate_job, job)
    except PoolFull as exc:
        state.metrics.rejected.labels("pool_full").inc()
        raise ProblemError(503, "pool_full", str(exc), headers={"Retry-After": str(exc.retry_after_s)}) from None
    except PoolNotReady as exc:
        raise ProblemError(503, "not_ready", str(exc), headers={"Retry-After": "1"}) from None
    how, fate = await _await_job(state, request, key, future, state.config.default_deadline_s)
    if how != "done":
        if how == "gone":
            state.metrics.client_gone.labels(str(fate)).inc()
        raise ProblemError(504, "client_gone" if how == "gone" else "deadline_exceeded",
                           f"simulation did not finish within {state.config.default_deadline_s:g} s"
                           if how == "timeout" else "the client disconnected")
    try:
        result = future.result()
    except WorkerCrashed as exc:
        state.metrics.worker_crashes.inc()
        raise ProblemError(500, "worker_crashed", str(exc)) from None
    if result.get("graph_error"):
        err = result["errors"][0]
        raise ProblemError(422, err.get("code", "invalid_graph"), err.get("message", ""), node=err.get("node"))
    return result


def config_from_env() -> ServiceConfig:
    """For `uvicorn service.app:app_from_env --factory`."""
    return ServiceConfig(
        store_path=os.environ.get("STICKSAT_STORE", default_store_path()),
        workers=int(os.environ.get("STICKSAT_WORKERS", "1")),
        queue_limit=int(os.environ.get("STICKSAT_QUEUE_LIMIT", "8")),
        token=os.environ.get("STICKSAT_TOKEN") or None,
        max_time_limit_s=float(os.environ.get("STICKSAT_MAX_TIME_LIMIT") or pipeline.MAX_TIME_LIMIT_S),
        body_read_timeout_s=float(os.environ.get("STICKSAT_BODY_TIMEOUT") or 30.0),
    )


def default_store_path() -> str:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "sticksat", "store.sqlite")


def app_from_env() -> FastAPI:
    return create_app(config_from_env())
