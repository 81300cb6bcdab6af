"""RFC 9457 problem details: every error the service returns has this shape and the
media type application/problem+json.

`type` is a URN per problem code (stable, not a web page), `title` is the same for every
occurrence of a code, `detail` explains this occurrence. Extension members: `code`
(the stable machine-readable code, e.g. `dangling_ref`), `node` (the offending graph
node, when there is one) and `errors` (a list of individual findings when several).
"""
from __future__ import annotations

import json
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict
from starlette.responses import Response

PROBLEM_MEDIA_TYPE = "application/problem+json"

_TITLES = {
    400: "Bad request",
    401: "Unauthorized",
    404: "Not found",
    405: "Method not allowed",
    408: "Request body timeout",
    413: "Request body too large",
    415: "Unsupported media type",
    422: "Invalid graph or request",
    500: "Internal error",
    503: "Service unavailable",
    504: "Deadline exceeded",
    507: "Insufficient storage",
}


class Problem(BaseModel):
    """The problem+json body (documented in OpenAPI for every error response)."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str
    instance: Optional[str] = None
    code: str
    node: Optional[str] = None
    errors: Optional[list[dict[str, Any]]] = None


class ProblemError(Exception):
    """Raise anywhere in a request handler to answer with a problem document."""

    def __init__(self, status: int, code: str, detail: str, *, node: Optional[str] = None,
                 errors: Optional[list[dict[str, Any]]] = None, headers: Optional[dict[str, str]] = None,
                 title: Optional[str] = None):
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.node = node
        self.errors = errors
        self.headers = headers or {}
        self.title = title


# The store's own failures (service.store.StoreError subclasses, by `code`): not the
# client's mistake and not a bug, so neither 4xx nor 500. A damaged database stays damaged
# until it is restored (docs/reliability.md, "The store"): 503, and /readyz says so
# (`ProgramStore.health()`); a full disk may clear: 507 with a Retry-After.
STORE_PROBLEMS: dict[str, tuple[int, str, Optional[int]]] = {
    # code: (status, what the detail says next, Retry-After seconds or None)
    "store_damaged": (503, "the program store is damaged; the operator restores it from a backup", 60),
    "store_full": (507, "the program store's disk is full", 30),
}


def store_problem(exc: Exception) -> ProblemError:
    """The problem document for a `service.store.StoreError` (by its `code`); any other
    store error is a 500 `store_error`."""
    code = getattr(exc, "code", "store_error")
    status, what, retry = STORE_PROBLEMS.get(code, (500, "the program store failed", None))
    headers = {"Retry-After": str(retry)} if retry else None
    return ProblemError(status, code if code in STORE_PROBLEMS else "store_error", f"{what}: {exc}",
                        headers=headers)


def problem_body(status: int, code: str, detail: str, *, node: Optional[str] = None,
                 errors: Optional[list[dict[str, Any]]] = None, instance: Optional[str] = None,
                 title: Optional[str] = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": f"urn:sticksat:problem:{code}",
        "title": title or _TITLES.get(status, "Error"),
        "status": status,
        "detail": detail,
        "code": code,
    }
    if instance is not None:
        body["instance"] = instance
    if node is not None:
        body["node"] = node
    if errors:
        body["errors"] = errors
    return body


def problem_response(status: int, code: str, detail: str, *, node: Optional[str] = None,
                     errors: Optional[list[dict[str, Any]]] = None, instance: Optional[str] = None,
                     headers: Optional[dict[str, str]] = None, title: Optional[str] = None) -> Response:
    body = problem_body(status, code, detail, node=node, errors=errors, instance=instance, title=title)
    if status == 500:
        # After an internal error the server may drop the connection (uvicorn does when the
        # exception propagates past the response): tell the client not to reuse it.
        headers = {**(headers or {}), "Connection": "close"}
    return Response(json.dumps(body), status_code=status, media_type=PROBLEM_MEDIA_TYPE, headers=headers)


def from_problem_error(exc: ProblemError, instance: Optional[str] = None) -> Response:
    return problem_response(exc.status, exc.code, exc.detail, node=exc.node, errors=exc.errors,
                            instance=instance, headers=exc.headers, title=exc.title)


def openapi_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The `responses=` entry of a route for its error statuses."""
    return {
        status: {
            "description": _TITLES.get(status, "Error"),
            "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        for status in statuses
    }
