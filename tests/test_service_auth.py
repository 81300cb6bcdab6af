"""Security of the service: optional bearer-token auth (STICKSAT_TOKEN / --token-file,
constant-time compare, 401 problem+json without it, the probes open) and JSON-only
request bodies (415 otherwise: a cross-site text/plain POST cannot start a compile).
A real `sticksat serve` on 127.0.0.1."""
from __future__ import annotations

import json
import os

import httpx
import pytest

from backend.remote import RemoteCompileError, RemoteOptions, compile_remote
from service.commands.serve import resolve_token
from service_helpers import ServiceProcess, chain_graph

TOKEN = "s3cret-token-for-tests"
PROBLEM = "application/problem+json"
OPTIONS = {"planner": "naive", "deterministic": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("auth")
    env = dict(os.environ, STICKSAT_TOKEN=TOKEN)
    proc = ServiceProcess(base / "store.sqlite", base / "server.log", ["--workers", "1", "--queue-limit", "2"],
                          env=env)
    proc.start()
    yield proc
    proc.stop()


def _auth(token=TOKEN):
    return {"Authorization": f"Bearer {token}"}


def _problem(resp, status, code):
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith(PROBLEM)
    assert resp.json()["code"] == code
    return resp.json()


def test_probes_stay_open(server):
    assert httpx.get(server.url + "/healthz").json() == {"status": "ok"}
    assert httpx.get(server.url + "/readyz").status_code == 200


@pytest.mark.parametrize("headers", [{}, _auth("wrong"), _auth(TOKEN + "x"), {"Authorization": TOKEN},
                                     {"Authorization": f"Basic {TOKEN}"}, {"Authorization": "bearer wrong"}])
def test_without_the_token_401(server, headers):
    body = {"graph": chain_graph(rows=32), "options": OPTIONS}
    resp = httpx.post(server.url + "/compile", json=body, headers=headers, timeout=30)
    _problem(resp, 401, "unauthorized")
    assert resp.headers["www-authenticate"].startswith("Bearer")
    for path in ("/metrics", "/version", "/openapi.json", "/programs/" + "0" * 64):
        _problem(httpx.get(server.url + path, headers=headers), 401, "unauthorized")


def test_with_the_token(server):
    resp = httpx.post(server.url + "/compile", json={"graph": chain_graph(rows=32), "options": OPTIONS},
                      headers=_auth(), timeout=120)
    assert resp.status_code == 200, resp.text
    assert httpx.get(server.url + "/metrics", headers=_auth()).status_code == 200


def test_json_only_bodies(server):
    """A page can make a browser POST text/plain, a form or multipart anywhere without a
    preflight: none of them starts a compile (415 before the body is read)."""
    body = json.dumps({"graph": chain_graph(rows=40), "options": OPTIONS})
    misses = server.metric("sticksat_cache_misses_total")
    for content_type in ("text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                         "multipart/form-data; boundary=x", "application/octet-stream", None):
        headers = _auth() | ({"content-type": content_type} if content_type else {})
        for route in ("/compile", "/simulate"):
            resp = httpx.post(server.url + route, content=body, headers=headers, timeout=30)
            _problem(resp, 415, "unsupported_media_type")
    assert server.metric("sticksat_cache_misses_total") == misses
    ok = httpx.post(server.url + "/compile", content=body,
                    headers=_auth() | {"content-type": "application/json; charset=utf-8"}, timeout=120)
    assert ok.status_code == 200, ok.text


def test_remote_client_sends_the_token(server, monkeypatch):
    options = RemoteOptions(planner="naive", deterministic=True, retries=0)
    monkeypatch.delenv("STICKSAT_TOKEN", raising=False)
    with pytest.raises(RemoteCompileError) as info:
        compile_remote(chain_graph(rows=56), options, url=server.url)
    assert info.value.status == 401
    monkeypatch.setenv("STICKSAT_TOKEN", TOKEN)
    program = compile_remote(chain_graph(rows=56), options, url=server.url)
    assert program["format"] == "sticksat.superdsc"


def test_token_file(tmp_path, monkeypatch):
    monkeypatch.delenv("STICKSAT_TOKEN", raising=False)
    assert resolve_token(None) is None
    monkeypatch.setenv("STICKSAT_TOKEN", "from-env")
    assert resolve_token(None) == "from-env"
    path = tmp_path / "token"
    path.write_text("from-file\n")
    assert resolve_token(str(path)) == "from-file"
    path.write_text("  \n")
    with pytest.raises(SystemExit):
        resolve_token(str(path))
