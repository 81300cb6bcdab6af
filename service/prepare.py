"""Request bodies of the HTTP API and their preparation: the Pydantic models the
/compile and /simulate bodies are parsed with, and `prepare_compile` / `prepare_simulate`
(parse, service limits, options, graph hash; in a worker also full validation).

Kept out of `service.http`: large bodies are prepared in a pool worker, and a pool
worker never imports FastAPI or Starlette (tests/test_service_split.py checks it). The
preparation returns plain data: a `PreparedCompile`, a `pipeline.SimulateJob`, or
`{"problem": {...}}` for a 4xx, which the HTTP layer turns into a problem+json response.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from lowering.errors import GraphError
from lowering.graph_format import GraphDocument
from service import pipeline
from target.superdsc import Program

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


def json_or_none(raw: bytes) -> Any:
    """The body as Python objects for locating a validation error, or None when it does
    not parse (invalid JSON, or nested deeper than Python's recursion limit)."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None



def body_validation_findings(errors: list[dict], body: Any) -> dict[str, Any]:
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


def _schema_problem_dict(exc: ValidationError, raw: bytes) -> dict[str, Any]:
    resp = body_validation_findings(exc.errors(include_url=False), json_or_none(raw))
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
