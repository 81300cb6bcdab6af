"""HTTP client of the compile service, used by the torch backend when a service URL is
set (option `url`, or the environment variable STICKSAT_URL).

    program = compile_remote(doc, RemoteOptions(planner="cpsat"), url="http://host:8000")

- Timeouts: a connect timeout and a read timeout (the read timeout covers the solve, so
  it defaults to the solve deadline plus a margin).
- Bounded retries with exponential backoff, only where a retry can help: the service
  is unreachable (connection refused/reset, DNS), or it answered 503 (pool full or
  starting; its Retry-After is honored, capped). A 4xx/5xx problem is not retried.
- Errors: `ServiceUnavailable` when the service cannot be reached after the retries
  (the backend may then fall back to eager torch if the user asked for it);
  `lowering.errors.GraphError` for a 422 (the same error the in-process compile
  raises, with the offending node); `RemoteCompileError` for any other problem.

Standard library only (http.client), so the backend needs no HTTP dependency.
"""
from __future__ import annotations

import http.client
import json
import os
import socket
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from lowering.errors import GraphError

ENV_URL = "STICKSAT_URL"


class RemoteCompileError(RuntimeError):
    """The service answered with an error (RFC 9457 problem in `problem`)."""

    def __init__(self, message: str, status: Optional[int] = None, problem: Optional[dict] = None):
        super().__init__(message)
        self.status = status
        self.problem = problem or {}


class ServiceUnavailable(RemoteCompileError):
    """The service could not be reached, or stayed at 503, through every retry."""


@dataclass(frozen=True)
class RemoteOptions:
    planner: Optional[str] = None
    time_limit_s: Optional[float] = None
    deterministic: bool = False
    strict: bool = False  # a planner failure is an error, not a fallback plan
    target: Optional[str] = None
    # The service answers within this many seconds (best feasible plan, else 504).
    deadline_s: Optional[float] = None
    connect_timeout_s: float = 5.0
    # None: the deadline (or the time limit, or 10 s) plus 30 s for transfer and queueing.
    read_timeout_s: Optional[float] = None
    retries: int = 3  # extra attempts after the first
    backoff_s: float = 0.25  # first backoff; doubles per attempt
    max_retry_after_s: float = 10.0

    def request_options(self) -> dict[str, Any]:
        out: dict[str, Any] = {"deterministic": self.deterministic}
        if self.strict:
            out["strict"] = True
        for name in ("planner", "time_limit_s", "target", "deadline_s"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out

    def effective_read_timeout(self) -> float:
        if self.read_timeout_s is not None:
            return self.read_timeout_s
        budget = self.deadline_s or self.time_limit_s or 10.0
        return float(budget) + 30.0


def service_url(url: Optional[str] = None) -> Optional[str]:
    """The service URL to use: the explicit one, else $STICKSAT_URL, else None
    (compile in process)."""
    value = url or os.environ.get(ENV_URL) or None
    return value.rstrip("/") if value else None


def compile_remote(doc: Union[dict, str], options: Optional[Union[RemoteOptions, dict]] = None,
                   url: Optional[str] = None, *, full_response: bool = False,
                   sleep: Callable[[float], None] = time.sleep) -> dict:
    """POST the graph document to `{url}/compile` and return the program dict (or the
    whole response: key, cached, stats, program, ... with `full_response=True`)."""
    base = service_url(url)
    if base is None:
        raise ValueError(f"no service URL: pass url= or set {ENV_URL}")
    if isinstance(options, dict):
        options = RemoteOptions(**options)
    options = options or RemoteOptions()
    graph = json.loads(doc) if isinstance(doc, str) else doc
    body = json.dumps({"graph": graph, "options": options.request_options()}).encode()
    response = _post_json(f"{base}/compile", body, options, sleep)
    return response if full_response else response["program"]


def _post_json(url: str, body: bytes, options: RemoteOptions, sleep: Callable[[float], None]) -> dict:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"service URL must be http(s)://host[:port]: {url!r}")
    path = parts.path or "/"
    last_reason = ""
    attempts = options.retries + 1
    for attempt in range(attempts):
        wait_s = options.backoff_s * (2 ** attempt)
        conn_cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = conn_cls(parts.hostname, parts.port, timeout=options.connect_timeout_s)
        try:
            try:
                conn.connect()
            except (OSError, socket.timeout) as err:  # refused, unreachable, DNS, connect timeout
                last_reason = f"connect: {err}"
                conn.close()
                if attempt + 1 < attempts:
                    sleep(wait_s)
                continue
            # The response may take as long as the solve: widen the timeout now.
            conn.sock.settimeout(options.effective_read_timeout())
            try:
                conn.request("POST", path, body=body, headers=_headers())
                reply = conn.getresponse()
                status, data, retry_after = reply.status, reply.read(), reply.getheader("Retry-After")
            except (socket.timeout, TimeoutError):
                # The service took the request and is still working: sending it again
                # would only wait behind the same solve.
                raise ServiceUnavailable(f"{url}: no answer within {options.effective_read_timeout():g} s",
                                         status=None) from None
            except (ConnectionError, http.client.HTTPException, OSError) as err:
                last_reason = f"{type(err).__name__}: {err}"  # reset/closed mid-request: retry
                if attempt + 1 < attempts:
                    sleep(wait_s)
                continue
        finally:
            conn.close()
        if status == 200:
            return json.loads(data)
        problem = _problem_of(data)
        detail = problem.get("detail", data[:200].decode("utf-8", "replace"))
        if status == 503:
            last_reason = f"503 {detail}"
            hint = _seconds(retry_after)
            if hint is not None:
                wait_s = min(hint, options.max_retry_after_s)
            if attempt + 1 < attempts:
                sleep(wait_s)
            continue
        if status == 422:
            raise GraphError(problem.get("code", "invalid_graph"), detail, problem.get("node"))
        raise RemoteCompileError(f"{url}: {status} {detail}", status=status, problem=problem)
    raise ServiceUnavailable(f"sticksat service at {url} unavailable after {attempts} attempts: {last_reason}")


ENV_TOKEN = "STICKSAT_TOKEN"


def _headers() -> dict[str, str]:
    """JSON in and out; the bearer token when $STICKSAT_TOKEN is set (a service started
    with a token answers 401 without it)."""
    headers = {"Content-Type": "application/json", "Accept": "application/json, application/problem+json"}
    token = os.environ.get(ENV_TOKEN)
    if token:
        headers["Authorization"] = f"Bearer {token.strip()}"
    return headers


def _problem_of(data: bytes) -> dict:
    try:
        parsed = json.loads(data or b"{}")
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _seconds(value: Optional[str]) -> Optional[float]:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _remote_executable(response: dict):
    """The service's program, accepted only after the local simulator validated it
    (backend.region.SimulatedProgramExecutable), tagged with the store key and whether
    it was a cache hit."""
    from backend.region import SimulatedProgramExecutable

    try:
        executable = SimulatedProgramExecutable(response["program"])
    except RuntimeError as e:
        raise RemoteCompileError(f"program from the service refused: {e}") from None
    executable.executor = "service"
    executable.key = response.get("key", "")
    executable.cached = bool(response.get("cached", False))
    return executable


def compile_remote_executable(doc: Union[dict, str], options: Any = None,
                              url: Optional[str] = None):
    """compile_remote + a runnable program: what the backend's compile_region returns when
    a service URL is set. `options` may be RemoteOptions, a dict of its fields, or any
    object with `planner` / `time_limit_s` attributes (the backend's own options)."""
    if options is not None and not isinstance(options, (RemoteOptions, dict)):
        options = RemoteOptions(planner=getattr(options, "planner", None),
                                time_limit_s=getattr(options, "time_limit_s", None),
                                strict=bool(getattr(options, "strict", False)))
    response = compile_remote(doc, options, url, full_response=True)
    return _remote_executable(response)
