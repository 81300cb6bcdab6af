"""`sticksat serve`: run the compile service (FastAPI under uvicorn)."""
from __future__ import annotations

import os


def _default_workers() -> int:
    # One core stays with the event loop and the store.
    return max(1, (os.cpu_count() or 2) - 1)


def register(sub) -> None:
    p = sub.add_parser("serve", help="run the compile service (HTTP)")
    p.add_argument("--host", default=os.environ.get("STICKSAT_HOST", "127.0.0.1"),
                   help="bind address (default 127.0.0.1; the Docker image binds 0.0.0.0)")
    p.add_argument("--port", type=int, default=int(os.environ.get("STICKSAT_PORT", "8000")))
    p.add_argument("--store", default=None,
                   help="SQLite store file (default $STICKSAT_STORE or ~/.local/share/sticksat/store.sqlite)")
    p.add_argument("--workers", type=int, default=None,
                   help=f"solver worker processes (default $STICKSAT_WORKERS or cores-1 = {_default_workers()})")
    p.add_argument("--queue-limit", type=int, default=int(os.environ.get("STICKSAT_QUEUE_LIMIT", "8")),
                   help="distinct jobs that may wait for a worker before requests get 503 (default 8)")
    p.add_argument("--max-body-bytes", type=int, default=None, help="request body limit (413 beyond)")
    p.add_argument("--max-nodes", type=int, default=None, help="graph node limit (422 beyond)")
    p.add_argument("--max-total-elements", type=int, default=None,
                   help="limit on the summed elements of all graph tensors (422 beyond)")
    p.add_argument("--max-time-limit", type=float, default=_env_float("STICKSAT_MAX_TIME_LIMIT"),
                   metavar="S", help="largest time_limit_s a request may ask for; above it a request is "
                                     "refused (422 invalid_option), not clamped (default $STICKSAT_MAX_TIME_LIMIT or "
                                     "3600)")
    p.add_argument("--body-timeout", type=float, default=_env_float("STICKSAT_BODY_TIMEOUT"), metavar="S",
                   help="a request body must arrive whole within S seconds, else 408 and the connection is "
                        "closed (default $STICKSAT_BODY_TIMEOUT or 30)")
    p.add_argument("--header-timeout", type=float, default=_env_float("STICKSAT_HEADER_TIMEOUT"), metavar="S",
                   help="a connection must deliver a request's complete headers within S seconds of its first "
                        "byte (or of connecting), else it is closed (default $STICKSAT_HEADER_TIMEOUT or 10)")
    p.add_argument("--max-numerics-elements", type=int, default=None,
                   help="/simulate numerics: most elements the reference and functional run may materialize "
                        "(422 numerics_too_large beyond; default 2^26)")
    p.add_argument("--worker-memory-limit", type=float, default=None, metavar="GIB",
                   help="address-space limit of each solver worker in GiB: a job past it fails alone (its "
                        "worker is replaced) instead of the host running out of memory (default: none)")
    p.add_argument("--min-free-bytes", type=int, default=None,
                   help="/readyz reports not ready while the SQLite store's disk has less free space "
                        "(default 64 MiB); a write that fails for lack of space is a 507 either way")
    p.add_argument("--token-file", default=None,
                   help="require 'Authorization: Bearer <token>' on every route but /healthz and /readyz; "
                        "the token is this file's content (default: $STICKSAT_TOKEN; neither: no auth)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=run)


def _env_float(name):
    value = os.environ.get(name)
    return float(value) if value else None


def resolve_token(token_file=None):
    """The bearer token: the file's content (stripped) or $STICKSAT_TOKEN; None for none.
    An empty token is refused (it would let every request in)."""
    if token_file:
        from pathlib import Path

        token = Path(token_file).read_text().strip()
        if not token:
            raise SystemExit(f"sticksat serve: token file {token_file} is empty")
        return token
    return os.environ.get("STICKSAT_TOKEN") or None


def header_timeout_protocol(timeout_s: float):
    """uvicorn's h11 protocol with a deadline on request headers. uvicorn times out idle
    keep-alive connections and the service times out bodies (408), but nothing bounds a
    client that connects, or sends part of a request line or headers, and then stalls:
    each such connection would be held open for good. Here a connection that is not in a
    request (headers complete, response not yet sent) must complete its headers within
    `timeout_s` of connecting or of its first byte after a response; else it is closed."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderTimeoutProtocol(H11Protocol):
        _header_timer = None

        def _in_request(self) -> bool:
            return self.cycle is not None and not self.cycle.response_complete

        def _arm(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(timeout_s, self._headers_too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if not self._in_request() and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._in_request():
                self._disarm()
            else:
                self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self._in_request():
                self._disarm()  # idle now: uvicorn's keep-alive timeout takes over

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeaderTimeoutProtocol


def run(args) -> int:
    import dataclasses

    import uvicorn

    from service.http.app import create_app
    from service.http.config import DEFAULT_MAX_BODY_BYTES, ServiceConfig
    from service.locations import default_store_path
    from service.logging import configure
    from service.pipeline import GraphLimits

    configure(args.log_level)
    limits = GraphLimits()
    if args.max_nodes is not None:
        limits = dataclasses.replace(limits, max_nodes=args.max_nodes)
    if args.max_total_elements is not None:
        limits = dataclasses.replace(limits, max_total_elements=args.max_total_elements)
    workers = args.workers if args.workers is not None else int(os.environ.get("STICKSAT_WORKERS",
                                                                              _default_workers()))
    config = ServiceConfig(
        store_path=args.store or os.environ.get("STICKSAT_STORE") or default_store_path(),
        workers=workers,
        queue_limit=args.queue_limit,
        max_body_bytes=args.max_body_bytes or DEFAULT_MAX_BODY_BYTES,
        limits=limits,
        token=resolve_token(args.token_file),
    )
    if args.max_time_limit is not None:
        if not args.max_time_limit > 0:
            raise SystemExit("sticksat serve: --max-time-limit must be > 0")
        config = dataclasses.replace(config, max_time_limit_s=args.max_time_limit)
    if args.body_timeout is not None:
        config = dataclasses.replace(config, body_read_timeout_s=args.body_timeout)
    if args.worker_memory_limit is not None:
        if not args.worker_memory_limit > 0:
            raise SystemExit("sticksat serve: --worker-memory-limit must be > 0")
        config = dataclasses.replace(config, worker_memory_bytes=int(args.worker_memory_limit * 2**30))
    if args.min_free_bytes is not None:
        config = dataclasses.replace(config, min_free_bytes=args.min_free_bytes)
    if args.max_numerics_elements is not None:
        config = dataclasses.replace(config, max_numerics_elements=args.max_numerics_elements)
    header_timeout = args.header_timeout if args.header_timeout is not None else 10.0
    uvicorn.run(create_app(config), host=args.host, port=args.port, log_config=None,
                http=header_timeout_protocol(header_timeout),
                log_level=args.log_level, access_log=False, timeout_graceful_shutdown=5)
    return 0
