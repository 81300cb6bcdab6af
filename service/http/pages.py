"""Human-facing HTML pages of the service: the store's index and each stored program's
report. Kept apart from the JSON API; included by `create_app`. The pages are built in a pool
worker (service/page_jobs.py), never on the server's own process.

- `GET /`: the store index: every graph (by name, at most `INDEX_GRAPH_LIMIT`) with
  its best program's simulated time, planner, gaps and when it was solved, then every
  program of those graphs, each linking to its report.
- `GET /programs/{key}/report`: the self-contained HTML report of a stored program
  (simulator/report_html.py: per-op table, timeline per core, roofline, LX occupancy,
  restickifies), timed on the simulator when asked; `?format=json` gives the report
  model it is rendered from (`simulator.report.Report.to_dict()`); `?against=KEY` adds
  the diff against another stored program of the same graph (simulator.report.diff_programs).

Both pages are self-contained: no scripts, no external assets, and a Content-Security-
Policy that would block any script or fetch even if one slipped in. Every string a client
chose (graph names above all) is HTML-escaped. They sit behind the same optional bearer
token as the JSON API (the middleware in app.py guards every path but the probes): with
STICKSAT_TOKEN set a browser must send `Authorization: Bearer <token>` (a header-injecting
client or proxy; docs/report.md), without it the pages answer 401 problem+json.
"""
from __future__ import annotations

import hashlib
from typing import Literal, Optional

from fastapi import APIRouter, Path, Query, Request
from starlette.responses import Response

from service import page_jobs
from service.http.handlers import run_pool_job
from service.problems import ProblemError, openapi_responses

router = APIRouter()

# Self-contained pages: inline styles and data: images only; no script, no connection.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
                               "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

_KEY = r"^[0-9a-f]{64}$"


async def _page(request: Request, what: str, fn, *args) -> Response:
    """Run a page job in the pool (coalesced by `what`) and answer its text."""
    state = request.app.state.service
    key = "page:" + hashlib.sha256(what.encode()).hexdigest()
    answer: page_jobs.PageAnswer = await run_pool_job(state, request, key, fn, *args)
    if answer.problem is not None:
        status, code, detail = answer.problem
        raise ProblemError(status, code, detail)
    headers = PAGE_HEADERS if answer.media_type.startswith("text/html") else {"Cache-Control": "no-store"}
    return Response(answer.body, media_type=answer.media_type, headers=headers)


@router.get("/", summary="the store index (HTML): graphs, best times, gaps, planners, links to reports",
            response_class=Response, responses={**openapi_responses(401, 503, 504),
                                                200: {"content": {"text/html": {"schema": {"type": "string"}}}}})
async def index(request: Request) -> Response:
    state = request.app.state.service
    return await _page(request, "index", page_jobs.index_page, str(state.config.store_path))


@router.get("/programs/{key}/report",
            summary="a stored program's report: HTML page (default) or the JSON model it is rendered from; "
                    "with against=KEY, the diff against another stored program of the same graph",
            response_class=Response,
            responses={**openapi_responses(401, 404, 422, 503, 504),
                       200: {"description": "text/html by default; application/json with format=json",
                             "content": {"text/html": {"schema": {"type": "string"}},
                                         "application/json": {"schema": {"type": "object"}}}}})
async def program_report(request: Request, key: str = Path(pattern=_KEY),
                         format: Literal["html", "json"] = Query("html", description="html or json"),
                         against: Optional[str] = Query(None, pattern=_KEY,
                                                        description="key of another program of the same graph: "
                                                                    "which decisions differ and what each costs")
                         ) -> Response:
    state = request.app.state.service
    return await _page(request, f"report:{key}:{format}:{against}", page_jobs.report_page,
                       str(state.config.store_path), key, format, against)
