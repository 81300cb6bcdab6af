"""Internal errors (500) close the connection: `Connection: close` on every 500, so a
keep-alive client does not send its next request on a connection the server drops.
A real uvicorn on 127.0.0.1 in a thread (no solver pool: lifespan off)."""
from __future__ import annotations

import threading
import time

import httpx
import pytest
import uvicorn

from service.http import ServiceConfig, create_app
from service.problems import ProblemError
from service_helpers import free_port


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    app = create_app(ServiceConfig(store_path=str(tmp_path_factory.mktemp("errors") / "store.sqlite")))

    async def crash():
        raise RuntimeError("boom")

    async def planner_bug():
        raise ProblemError(500, "planner_failed", "the planner produced no valid program")

    app.add_api_route("/test/crash", crash)
    app.add_api_route("/test/planner-bug", planner_bug)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off", log_config=None,
                                           access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.mark.parametrize("path,code", [("/test/crash", "internal_error"), ("/test/planner-bug", "planner_failed")])
def test_500_says_connection_close_and_the_client_recovers(url, path, code):
    with httpx.Client(base_url=url, timeout=10) as client:
        assert client.get("/healthz").status_code == 200  # a kept-alive connection
        resp = client.get(path)
        assert resp.status_code == 500
        assert resp.headers["connection"].lower() == "close"
        assert resp.headers["content-type"].startswith("application/problem+json")
        assert resp.json()["code"] == code
        # the next request on the same client works (a fresh connection)
        assert client.get("/healthz").json() == {"status": "ok"}


def test_4xx_keeps_the_connection(url):
    with httpx.Client(base_url=url, timeout=10) as client:
        resp = client.post("/compile", content=b"{}", headers={"content-type": "text/plain"})
        assert resp.status_code == 415
        assert resp.headers.get("connection", "keep-alive").lower() != "close"
