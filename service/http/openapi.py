"""The published OpenAPI document: FastAPI's, plus the request bodies the routes parse
themselves, problem+json for every error response and the 401 on protected paths."""
from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic.json_schema import models_json_schema

from service.http.middleware import OPEN_PATHS
from service.prepare import CompileRequest, SimulateRequest
from service.problems import Problem, openapi_responses

def service_openapi(app: FastAPI) -> dict[str, Any]:
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
    # Exactly one of graph/export (the model's validator), and that one not null (the
    # other may be absent or null): say so in the schema.
    components["CompileRequest"]["oneOf"] = [
        {"required": ["graph"], "properties": {"graph": {"type": "object"}}},
        {"required": ["export"], "properties": {"export": {"type": "object"}}},
    ]
    _require_discriminators(components)
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
    _add_links(schema)
    app.openapi_schema = schema
    return schema


def _require_discriminators(components: dict[str, Any]) -> None:
    """A discriminated union (a program tensor's `memory`, tagged by `kind`) is parsed by
    its tag: the tag must be present even where the model gives it a default, so each
    variant the mapping names requires it (OpenAPI: the discriminator property must be
    required in every variant)."""

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            disc = node.get("discriminator")
            if isinstance(disc, dict) and disc.get("propertyName"):
                for ref in (disc.get("mapping") or {}).values():
                    target = components.get(ref.rsplit("/", 1)[-1])
                    if target is not None and disc["propertyName"] not in target.setdefault("required", []):
                        target["required"].append(disc["propertyName"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(components)


def _operation_id(schema: dict[str, Any], path: str, method: str) -> str:
    return schema["paths"][path][method]["operationId"]


def _add_links(schema: dict[str, Any]) -> None:
    """OpenAPI links: what a response's values open next (a compile's key -> the program,
    its report; its graph hash -> the graph; a graph's first program -> that program).
    Clients and schemathesis's stateful phase follow them."""
    get_program = _operation_id(schema, "/programs/{key}", "get")
    get_report = _operation_id(schema, "/programs/{key}/report", "get")
    get_graph = _operation_id(schema, "/graphs/{graph_hash}", "get")
    compiled = schema["paths"]["/compile"]["post"]["responses"]["200"]
    compiled["links"] = {
        "GetProgram": {"operationId": get_program, "parameters": {"key": "$response.body#/key"},
                       "description": "the stored program of this compile"},
        "GetReport": {"operationId": get_report, "parameters": {"key": "$response.body#/key"},
                      "description": "its report"},
        "GetGraph": {"operationId": get_graph, "parameters": {"graph_hash": "$response.body#/graph_hash"},
                     "description": "the stored graph document and its programs"},
    }
    program = schema["paths"]["/programs/{key}"]["get"]["responses"]["200"]
    program["links"] = {
        "GetGraph": {"operationId": get_graph, "parameters": {"graph_hash": "$response.body#/graph_hash"}},
        "GetReport": {"operationId": get_report, "parameters": {"key": "$response.body#/key"}},
    }
