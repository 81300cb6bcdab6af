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
