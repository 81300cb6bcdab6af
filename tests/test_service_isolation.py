"""Bounded work and isolation of the compile service (issue 16), against a real uvicorn on
127.0.0.1 running in a thread with its real solver pool (spawned workers), so a test can
reach the pool (which process runs which job) and add a route that occupies a worker:

- a stalled upload gets 408 and its connection closed (raw socket); so does a
  connection that stalls before its headers are complete (`sticksat serve
  --header-timeout`, the protocol the CLI runs uvicorn with);
- `time_limit_s` above the operator's cap is a 422 naming the cap;
- /simulate numerics beyond the element limit is a 422 before any job starts;
- a 20 MB-class body is parsed in a worker while /healthz keeps answering;
- a job still queued at its deadline is dropped and the 504 says nothing is stored;
  a running one is stored under the key its 504 names;
- a client that disconnects: its queued job is dropped, a running one still stored;
- SIGKILL of the worker running a cpsat compile: that request gets the stored fallback
  plan (`complete: false`), a compile on the other worker is untouched.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn

from lowering.graph_format import GraphDocument
from lowering.version import COMPILER_VERSION
from service import pipeline
from service.http import ServiceConfig, create_app
from service.commands.serve import header_timeout_protocol
from service.store import program_key
from service_helpers import chain_graph, free_port

REPO = Path(__file__).resolve().parent.parent
NAIVE = {"planner": "naive", "deterministic": True}


class _Server:
    def __init__(self, config: ServiceConfig):
        self.app = create_app(config)
        self.state = self.app.state.service

        async def occupy(seconds: float, key: str = "occupy"):
            self.state.pool.submit(key, time.sleep, float(seconds))
            return {"submitted": key}

        self.app.add_api_route("/test/occupy", occupy, methods=["GET"])
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_config=None,
                                                    access_log=False, lifespan="on",
                                                    http=header_timeout_protocol(1.0)))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "_Server":
        self.thread.start()
        deadline = time.time() + 180
        while time.time() < deadline:
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError("service not ready")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    @property
    def pool(self):
        return self.state.pool

    def wait_until(self, predicate, timeout_s: float = 60.0, what: str = "condition") -> None:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if predicate():
                return
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}")

    def idle(self, timeout_s: float = 120.0) -> None:
        self.wait_until(lambda: self.pool.inflight == 0, timeout_s, "the pool to drain")

    def metric(self, name: str, labels: dict) -> float:
        for family in self.state.metrics.registry.collect():
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    return sample.value
        return 0.0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("isolation")
    srv = _Server(ServiceConfig(store_path=str(base / "store.sqlite"), workers=2, queue_limit=4,
                                body_read_timeout_s=1.5, max_time_limit_s=20.0, max_numerics_elements=50_000,
                                offload_parse_bytes=200_000)).start()
    yield srv
    srv.stop()


def _key(graph: dict, planner="naive", time_limit_s=None, deterministic=True) -> str:
    doc = GraphDocument.model_validate(graph)
    options = pipeline.resolve_options(planner, time_limit_s, deterministic, None, False)
    return program_key(doc.graph_hash(), COMPILER_VERSION, options.options_hash(),
                       pipeline.load_hardware("spyre").digest)


def _post_raw(port: int, path: str, body: bytes, send_bytes: int | None = None) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    sock.sendall(head + body[: len(body) if send_bytes is None else send_bytes])
    return sock


def _read_all(sock: socket.socket, timeout_s: float) -> bytes:
    sock.settimeout(timeout_s)
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data  # the server closed the connection
        data += chunk


def test_stalled_upload_gets_408_and_the_connection_closed(server):
    body = json.dumps({"graph": chain_graph(rows=64), "options": NAIVE}).encode()
    started = time.time()
    sock = _post_raw(server.port, "/compile", body, send_bytes=20)  # then nothing more
    try:
        reply = _read_all(sock, timeout_s=20)  # returns only once the server closes
    finally:
        sock.close()
    assert time.time() - started < 10
    head, _, payload = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), reply[:200]
    assert b"connection: close" in head.lower()
    problem = json.loads(payload)
    assert problem["code"] == "body_timeout" and f"20 of {len(body)} bytes" in problem["detail"]
    assert server.metric("sticksat_rejected_total", {"reason": "body_timeout"}) >= 1
    assert httpx.get(server.url + "/healthz").status_code == 200


@pytest.mark.parametrize("first_bytes", [b"", b"POST /compile HTTP/1.1\r\nHost: 127.0.0.1\r\n", b"G"])
def test_stalled_headers_get_the_connection_closed(server, first_bytes):
    started = time.time()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    try:
        if first_bytes:
            sock.sendall(first_bytes)
        assert _read_all(sock, timeout_s=20) == b""  # closed, nothing answered
    finally:
        sock.close()
    assert time.time() - started < 6


def test_a_kept_alive_connection_that_stalls_in_its_next_headers_is_closed(server):
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    try:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.endswith(b"}"):
            reply += sock.recv(4096)
        assert reply.startswith(b"HTTP/1.1 200")
        started = time.time()
        sock.sendall(b"GET /hea")  # the next request never completes its headers
        assert _read_all(sock, timeout_s=20) == b""
        assert time.time() - started < 4  # our 1 s header deadline, not a keep-alive timer
    finally:
        sock.close()
    assert httpx.get(server.url + "/healthz").status_code == 200


def test_time_limit_above_the_operator_cap_is_refused(server):
    graph = chain_graph(rows=64, n_ops=2, name="cap")
    resp = httpx.post(server.url + "/compile", json={"graph": graph, "options": {**NAIVE, "time_limit_s": 25}},
                      timeout=60)
    assert resp.status_code == 422, resp.text
    assert resp.json()["code"] == "invalid_option" and "cap of 20 s" in resp.json()["detail"]
    ok = httpx.post(server.url + "/compile", json={"graph": graph, "options": {**NAIVE, "time_limit_s": 20}},
                    timeout=60)
    assert ok.status_code == 200 and ok.json()["options"]["time_limit_s"] == 20


def test_numerics_beyond_the_element_limit_is_refused_before_any_job(server):
    small = chain_graph(rows=64, n_ops=2, name="num-small")  # 3 x 64x64 graph tensors
    program = httpx.post(server.url + "/compile", json={"graph": small, "options": NAIVE}, timeout=60).json()
    ok = httpx.post(server.url + "/simulate", json={"program": program["program"], "graph": small,
                                                    "numerics": True}, timeout=60)
    assert ok.status_code == 200 and ok.json()["valid"] is True
    big = chain_graph(rows=1024, n_ops=2, name="num-big")  # 3 x 1024x64 = 196,608 elements
    big_program = httpx.post(server.url + "/compile", json={"graph": big, "options": NAIVE}, timeout=60).json()
    server.idle()
    resp = httpx.post(server.url + "/simulate", json={"program": big_program["program"], "graph": big,
                                                      "numerics": True}, timeout=60)
    assert resp.status_code == 422, resp.text
    problem = resp.json()
    assert problem["code"] == "numerics_too_large"
    assert "196608 in the graph's tensors" in problem["detail"] and "at most 50000" in problem["detail"]
    assert server.pool.inflight == 0
    # Without numerics the same program is simulated (timing needs no tensors).
    timed = httpx.post(server.url + "/simulate", json={"program": big_program["program"]}, timeout=60)
    assert timed.status_code == 200 and timed.json()["valid"] is True


def test_healthz_answers_while_a_large_body_is_parsed(server):
    server.idle()
    # 24,000 nodes (about 5 MB): over the format's 20,000-node bound, so a 422 after a
    # parse of seconds, which happens in a worker (offload_parse_bytes = 200 kB here).
    raw = json.dumps({"graph": chain_graph(rows=64, n_ops=24_000, name="huge"), "options": NAIVE})
    result: dict = {}

    def post():
        started = time.perf_counter()
        result["resp"] = httpx.post(server.url + "/compile", content=raw,
                                    headers={"content-type": "application/json"}, timeout=120)
        result["seconds"] = time.perf_counter() - started

    thread = threading.Thread(target=post)
    thread.start()
    worst = 0.0
    probes = 0
    while thread.is_alive():
        started = time.perf_counter()
        assert httpx.get(server.url + "/healthz", timeout=30).status_code == 200
        worst = max(worst, time.perf_counter() - started)
        probes += 1
        time.sleep(0.05)
    thread.join()
    assert result["resp"].status_code == 422 and result["resp"].json()["code"] == "schema", result["resp"].text
    assert "20000" in result["resp"].json()["detail"]
    assert probes >= 3 and result["seconds"] > 0.5  # the parse lasted long enough to be probed
    # Parsed on the event loop, one probe would wait out the whole parse (seconds).
    assert worst < min(1.5, result["seconds"] / 2), (worst, result["seconds"])


def test_queued_at_its_deadline_is_dropped_and_the_504_says_so(server):
    server.idle()
    httpx.get(server.url + "/test/occupy", params={"seconds": 2.5, "key": "busy1"})
    httpx.get(server.url + "/test/occupy", params={"seconds": 2.5, "key": "busy2"})
    graph = chain_graph(rows=64, n_ops=3, name="queued-deadline")
    key = _key(graph)
    resp = httpx.post(server.url + "/compile", json={"graph": graph, "options": {**NAIVE, "deadline_s": 0.5}},
                      timeout=60)
    assert resp.status_code == 504, resp.text
    detail = resp.json()["detail"]
    assert "dropped" in detail and "nothing will be stored" in detail and key in detail
    server.idle()
    assert httpx.get(server.url + f"/programs/{key}").status_code == 404  # as the 504 said
    assert server.metric("sticksat_jobs_dropped_total", {"reason": "deadline"}) >= 1


def test_running_at_its_deadline_is_stored_under_the_key_the_504_names(server):
    server.idle()
    graph = chain_graph(rows=256, n_ops=6, name="running-deadline")
    resp = httpx.post(server.url + "/compile", json={"graph": graph, "options": {**NAIVE, "deadline_s": 0.001}},
                      timeout=60)
    key = _key(graph)
    if resp.status_code == 200:  # the late plan was stored just as the wait ended: it is the answer
        assert resp.json()["complete"] is False and resp.json()["key"] == key
    else:
        assert resp.status_code == 504, resp.text
        assert key in resp.json()["detail"] and "will be stored" in resp.json()["detail"]
    server.idle()
    stored = httpx.get(server.url + f"/programs/{key}")
    assert stored.status_code == 200 and stored.json()["complete"] is False


def test_a_client_that_leaves_drops_its_queued_job(server):
    server.idle()
    httpx.get(server.url + "/test/occupy", params={"seconds": 2, "key": "busy3"})
    httpx.get(server.url + "/test/occupy", params={"seconds": 2, "key": "busy4"})
    graph = chain_graph(rows=64, n_ops=5, name="gone-queued")
    key = _key(graph)
    sock = _post_raw(server.port, "/compile", json.dumps({"graph": graph, "options": NAIVE}).encode())
    server.wait_until(lambda: server.pool.state(key) == "queued", 30, "the job to queue")
    sock.close()
    server.wait_until(lambda: server.pool.state(key) is None, 10, "the job to be dropped")
    assert server.metric("sticksat_client_gone_total", {"fate": "dropped"}) >= 1
    server.idle()
    assert httpx.get(server.url + f"/programs/{key}").status_code == 404


def test_a_client_that_leaves_a_running_solve_still_gets_it_stored(server):
    if "cpsat" not in pipeline.available_planners():
        pytest.skip("cpsat planner not registered")
    server.idle()
    graph = json.loads((REPO / "benchmarks" / "graphs" / "tiny" / "gpt2_tiny_block16.json").read_text())
    graph["name"] = "gone-running"
    key = _key(graph, planner="cpsat", time_limit_s=3)
    body = {"graph": graph, "options": {"planner": "cpsat", "time_limit_s": 3, "deterministic": True}}
    sock = _post_raw(server.port, "/compile", json.dumps(body).encode())
    server.wait_until(lambda: server.pool.state(key) == "running", 30, "the solve to start")
    sock.close()
    time.sleep(0.5)
    assert server.pool.state(key) == "running"  # not cancelled: a solve cannot be interrupted safely
    server.idle()
    assert server.metric("sticksat_client_gone_total", {"fate": "running"}) >= 1
    stored = httpx.get(server.url + f"/programs/{key}")
    assert stored.status_code == 200


def test_sigkill_of_a_cpsat_worker_answers_with_its_fallback_plan(server):
    if "cpsat" not in pipeline.available_planners():
        pytest.skip("cpsat planner not registered")
    server.idle()
    graph = json.loads((REPO / "benchmarks" / "graphs" / "tiny" / "gpt2_tiny_block16.json").read_text())
    graph["name"] = "killed"
    key = _key(graph, planner="cpsat", time_limit_s=20)
    other = chain_graph(rows=512, n_ops=8, name="bystander")
    result: dict = {}

    def post(name, payload):
        result[name] = httpx.post(server.url + "/compile", json=payload, timeout=120)

    victim = threading.Thread(target=post, args=("victim", {"graph": graph, "options": {
        "planner": "cpsat", "time_limit_s": 20, "deterministic": True}}))
    victim.start()
    # the fallback plan is in the store once the worker made it
    server.wait_until(lambda: server.state.store.get_program(key) is not None, 60, "the fallback plan")
    assert server.pool.state(key) == "running"
    bystander = threading.Thread(target=post, args=("bystander", {"graph": other, "options": NAIVE}))
    bystander.start()
    os.kill(server.pool.running_pids()[key], signal.SIGKILL)
    victim.join(120)
    bystander.join(120)
    resp = result["victim"]
    assert resp.status_code == 200, resp.text
    assert resp.json()["complete"] is False and resp.json()["stats"]["planner"] in ("heuristic", "naive")
    assert result["bystander"].status_code == 200
    assert server.metric("sticksat_worker_crashes_total", {}) >= 1
    # the slot was restarted: the service still compiles on both workers
    server.wait_until(lambda: len(server.pool.worker_pids()) == 2, 60, "the restarted worker")
    again = httpx.post(server.url + "/compile", json={"graph": chain_graph(rows=32, name="after-kill"),
                                                      "options": NAIVE}, timeout=120)
    assert again.status_code == 200
