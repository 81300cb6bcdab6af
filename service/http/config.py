"""The service's configuration (`ServiceConfig`), read from flags by `sticksat serve` or
from the environment by `app_from_env`."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

from service import pipeline
from service.locations import default_store_path
from service.prepare import RequestLimits

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class ServiceConfig:
    """What one service instance runs with (flags of `sticksat serve`)."""

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
    # ... and any body while the bodies of all requests in flight together pass this
    # many bytes: eight 986 KiB bodies parsed one after another on the loop stalled
    # every other request (/healthz) for seconds.
    loop_parse_budget_bytes: int = 1024 * 1024
    # A compile's wall-time bound is its time limit plus max(this, half the limit)
    # (pipeline.wall_limit_s); the pool kills a job still running `wall_kill_grace_s`
    # after it, and the service answers with the best plan stored so far.
    wall_grace_min_s: float = pipeline.WALL_GRACE_MIN_S
    wall_kill_grace_s: float = 5.0
    # Address-space cap of every pool worker (RLIMIT_AS; None: none): a job past it fails
    # alone (MemoryError, or its worker dies and is replaced) instead of the host swapping.
    worker_memory_bytes: Optional[int] = None
    # /readyz reports not ready while the SQLite store's directory has less free space
    # (a write that fails for lack of space is a 507 whatever this says).
    min_free_bytes: int = 64 * 1024 * 1024



def limits_of(config: ServiceConfig) -> RequestLimits:
    return RequestLimits(config.limits, config.max_time_limit_s, config.max_numerics_elements)


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
