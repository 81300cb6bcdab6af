"""Prometheus metrics of one service instance.

Each app owns its own CollectorRegistry (not the process-global default), so two apps in
one process (tests) never clash and /metrics shows exactly this service's numbers.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# Solve times range from milliseconds (naive planner, tiny graph) to minutes (CP-SAT with
# a large budget on a big model).
_SOLVE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)
# ATen nodes of one graph document: a single op up to a large model's whole forward.
_NODE_BUCKETS = (1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 65536)
_REQUEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class ServiceMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("sticksat_requests", "HTTP requests by route, method and status",
                                ["route", "method", "status"], registry=r)
        self.request_seconds = Histogram("sticksat_request_seconds", "HTTP request latency by route",
                                         ["route"], buckets=_REQUEST_BUCKETS, registry=r)
        self.solve_seconds = Histogram("sticksat_solve_seconds",
                                       "Wall time of one compile job in a worker (lower + plan + validate)",
                                       ["planner"], buckets=_SOLVE_BUCKETS, registry=r)
        self.cache_hits = Counter("sticksat_cache_hits", "Compiles answered from the program store", registry=r)
        self.cache_misses = Counter("sticksat_cache_misses", "Compiles that needed a solve", registry=r)
        self.coalesced = Counter("sticksat_coalesced", "Requests that joined an identical in-flight solve",
                                 registry=r)
        self.solver_status = Counter("sticksat_solver_status", "Finished solves by planner and solver status",
                                     ["planner", "status"], registry=r)
        self.planner_fallbacks = Counter("sticksat_planner_fallbacks",
                                         "Solves whose requested planner failed, by requested and used planner",
                                         ["requested", "used"], registry=r)
        self.rejected = Counter("sticksat_rejected", "Requests refused before solving, by reason",
                                ["reason"], registry=r)
        self.deadline_exceeded = Counter("sticksat_deadline_exceeded",
                                         "Compiles whose deadline passed before a plan was ready", registry=r)
        # What the service sees of a model: its graph documents. Which ops a client ran in
        # eager torch never reaches the service (the backend's coverage report has those).
        self.documents_compiled = Counter("sticksat_documents_compiled",
                                          "Graph documents answered with a program, by whether the store had it",
                                          ["cached"], registry=r)
        self.document_nodes = Histogram("sticksat_document_nodes",
                                        "ATen nodes per graph document answered with a program "
                                        "(_sum: nodes compiled in all)",
                                        buckets=_NODE_BUCKETS, registry=r)
        self.wall_time_exceeded = Counter("sticksat_wall_time_exceeded",
                                          "Compiles stopped at their wall-time bound (answered with the plan "
                                          "stored so far, or 504)", registry=r)
        self.worker_crashes = Counter("sticksat_worker_crashes",
                                      "Jobs whose worker process died under them (only that job fails)", registry=r)
        self.jobs_dropped = Counter("sticksat_jobs_dropped",
                                    "Queued jobs removed before they ran because nobody waited any more, by reason",
                                    ["reason"], registry=r)
        self.client_gone = Counter("sticksat_client_gone",
                                   "Requests whose client disconnected while their job was in flight, by what "
                                   "became of the job (dropped, running, queued)", ["fate"], registry=r)
        self.inflight = Gauge("sticksat_inflight_jobs", "Distinct jobs running or queued in the solver pool",
                              registry=r)
        self.bodies_offloaded = Counter("sticksat_bodies_offloaded",
                                        "Request bodies parsed in a pool worker instead of on the event loop, by "
                                        "reason (size: the body alone; budget: bodies in flight together)",
                                        ["reason"], registry=r)
        self.body_bytes_inflight = Gauge("sticksat_body_bytes_inflight",
                                         "Bytes of request bodies received and not yet answered", registry=r)
        self.pool_workers = Gauge("sticksat_pool_workers", "Worker processes of the solver pool", registry=r)

    def document_compiled(self, nodes: int, cached: bool) -> None:
        self.documents_compiled.labels("true" if cached else "false").inc()
        self.document_nodes.observe(nodes)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
