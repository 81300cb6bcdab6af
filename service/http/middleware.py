"""The service's ASGI middleware: bearer-token auth, the JSON-only Content-Type rule,
the body size limit and read deadline, and per-route request metrics."""
from __future__ import annotations

import asyncio
import hmac
import time
from typing import Optional

from starlette.responses import Response

from service.metrics import ServiceMetrics
from service.problems import problem_response

class ServiceMiddleware:
    """Body size limit (413 before the app sees the body) and per-route request metrics.

    The body is read here, up to the limit, and replayed to the app: a chunked upload
    without Content-Length is bounded as well as a declared one."""

    def __init__(self, app, max_body_bytes: int, metrics: ServiceMetrics, token: Optional[str] = None,
                 body_read_timeout_s: float = 30.0, bodies: Optional["BodyBytes"] = None):
        self.app = app
        self.bodies = bodies if bodies is not None else BodyBytes()
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
        counted = [0]  # body bytes of this request counted in self.bodies

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
                # Only POST has routes (and a body): a PUT or PATCH is read within the
                # size limit like any body, then answered 405 by the router.
                refused = _content_type_problem(scope) if scope["method"] == "POST" else None
                if refused is not None:
                    self.metrics.rejected.labels("unsupported_media_type").inc()
                    await refused(scope, receive, send_wrapper)
                    return
                body_or_response = await self._read_body(scope, receive, counted)
                if isinstance(body_or_response, Response):
                    await body_or_response(scope, receive, send_wrapper)
                    return
                receive = _replay(body_or_response, receive)
            await self.app(scope, receive, send_wrapper)
        finally:
            self.bodies.release(counted[0])
            self.metrics.body_bytes_inflight.set(self.bodies.inflight)
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

    async def _read_body(self, scope, receive, counted: list[int]):
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
            self.bodies.add(len(chunk))
            counted[0] += len(chunk)
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


class BodyBytes:
    """Bytes of request bodies received (in part or whole) by requests not yet answered:
    the handlers parse a body on the event loop only while this stays under a budget."""

    def __init__(self) -> None:
        self.inflight = 0

    def add(self, n: int) -> None:
        self.inflight += n

    def release(self, n: int) -> None:
        self.inflight = max(0, self.inflight - n)


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
