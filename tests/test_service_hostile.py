"""The hostile corpus (tests/hostile/corpus.py) against a real `sticksat serve` on
127.0.0.1 and against `sticksat compile` / `sticksat simulate`: every document is a 4xx
problem+json with a precise code and message (a /simulate verdict on an invalid program
is the documented 200 `valid: false` naming the issue), never a 5xx; the CLI exits 2
(1: an invalid program's verdict) with a JSON error; the server stays healthy, its
memory bounded, and nothing is ever unpickled."""
from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest

from hostile.corpus import Case, base_graph, compile_cases, simulate_cases
from service_helpers import ServiceProcess

PROBLEM = "application/problem+json"
PWNED = Path("/tmp/sticksat-pwned")
MAX_NODES = 60
RSS_LIMIT_BYTES = 2 * 1024**3

COMPILE_CASES = compile_cases()
# route -> statuses the corpus got (checked against the OpenAPI document at the end)
SEEN: dict[str, set[int]] = {}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("hostile")
    proc = ServiceProcess(base / "store.sqlite", base / "server.log",
                          ["--workers", "1", "--queue-limit", "4", "--max-nodes", str(MAX_NODES)])
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def program(server):
    r = httpx.post(server.url + "/compile", json={"graph": base_graph(), "options": {"planner": "naive",
                                                                                     "deterministic": True}},
                   timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["program"]


def _check(resp: httpx.Response, case: Case) -> None:
    assert resp.status_code < 500, f"{case.name}: {resp.status_code} {resp.text[:300]}"
    assert resp.status_code == case.status, f"{case.name}: {resp.status_code} {resp.text[:300]}"
    body = resp.json()
    if case.status == 200:  # a /simulate verdict
        assert body["valid"] is False, case.name
        assert case.code in [e["code"] for e in body["errors"]], (case.name, body["errors"])
        return
    assert resp.headers["content-type"].startswith(PROBLEM), case.name
    assert body["status"] == case.status and body["detail"] and body["type"].startswith("urn:sticksat:problem:")
    if case.code is not None:
        assert body["code"] == case.code, (case.name, body)
    assert "Error: " not in body["detail"] or body["code"] == "bad_argument", (case.name, body["detail"])


def _post(server, case: Case) -> httpx.Response:
    resp = httpx.post(server.url + case.route, content=case.body, headers={"content-type": case.content_type},
                      timeout=120)
    SEEN.setdefault(case.route, set()).add(resp.status_code)
    return resp


def test_corpus_is_large_enough(program):
    assert len(COMPILE_CASES) + len(simulate_cases(program, base_graph())) >= 40


@pytest.mark.parametrize("case", COMPILE_CASES, ids=[c.name for c in COMPILE_CASES])
def test_compile_hostile(server, case):
    _check(_post(server, case), case)


def test_simulate_hostile(server, program):
    failures = []
    for case in simulate_cases(program, base_graph()):
        try:
            _check(_post(server, case), case)
        except AssertionError as exc:
            failures.append(str(exc))
    assert not failures, failures


def test_server_healthy_after_the_corpus(server, program):
    """Runs after the corpus (pytest keeps file order): alive, ready, still compiling, no
    pickle ever executed, memory bounded."""
    assert httpx.get(server.url + "/healthz", timeout=10).json() == {"status": "ok"}
    assert httpx.get(server.url + "/readyz", timeout=10).status_code == 200
    r = httpx.post(server.url + "/compile", json={"graph": base_graph(rows=48), "options": {"planner": "naive"}},
                   timeout=120)
    assert r.status_code == 200, r.text
    assert not PWNED.exists()
    assert server.metric("sticksat_requests_total", {"status": "500"}) == 0
    rss = _rss_bytes(server.proc.pid)
    assert rss is None or rss < RSS_LIMIT_BYTES, rss
    assert not [e for e in server.log_events() if e.get("event") == "internal_error"]


def _rss_bytes(pid: int):
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


# -- the CLI -------------------------------------------------------------------------

def _cli(argv, capsys):
    from service.cli import main

    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


CLI_CASES = [c for c in COMPILE_CASES if c.graph is not None and c.cli]


@pytest.mark.parametrize("case", CLI_CASES, ids=[c.name for c in CLI_CASES])
def test_cli_compile_hostile(case, tmp_path, capsys):
    path = tmp_path / "graph.json"
    path.write_bytes(case.graph)
    rc, _, err = _cli(["compile", str(path), "--planner", "naive", "-o", str(tmp_path / "out.json")], capsys)
    assert rc == 2, (case.name, rc, err[-500:])
    error = json.loads(err.strip().splitlines()[-1])
    assert error["error"] and error["message"], error
    if case.code is not None:
        assert error["error"] == case.code, (case.name, error)


def test_cli_simulate_hostile(program, tmp_path, capsys):
    failures = []
    for case in simulate_cases(program, base_graph()):
        if case.program is None:
            continue  # a request-level case (body framing, content type)
        prog = tmp_path / f"{case.name}.json"
        prog.write_bytes(case.program)
        argv = ["simulate", str(prog), "--json"]
        if case.cli_graph is not None:
            graph = tmp_path / f"{case.name}.graph.json"
            graph.write_bytes(case.cli_graph)
            argv += ["--graph", str(graph)]
        if case.numerics:
            argv += ["--numerics"]
        if case.code == "unknown_target":
            argv += ["--hardware", "tpu_v9"]
        try:
            rc, out, err = _cli(argv, capsys)
        except SystemExit as exc:  # argparse / an unknown hardware name
            rc, out = exc.code, ""
        except Exception as exc:  # noqa: BLE001 - what this test is about
            failures.append(f"{case.name}: raised {type(exc).__name__}: {exc}")
            continue
        if case.name == "sim_numerics_without_graph":
            continue  # the CLI runs numerics without a reference (it notes that); not an error
        if rc not in (1, 2):
            failures.append(f"{case.name}: exit {rc} {out[-300:]}")
            continue
        if out.strip():
            verdict = json.loads(out.strip().splitlines()[-1])
            if verdict["valid"] is not False or not verdict["errors"]:
                failures.append(f"{case.name}: {verdict}")
    assert not failures, failures


def test_openapi_documents_what_the_corpus_got(server):
    """Runs after the corpus: every status it produced is documented for its route (as
    problem+json for errors), and the request schema says exactly one of graph/export."""
    spec = httpx.get(server.url + "/openapi.json", timeout=10).json()
    assert SEEN, "the corpus tests did not run first"
    for route, statuses in SEEN.items():
        documented = spec["paths"][route]["post"]["responses"]
        for status in statuses:
            assert str(status) in documented, (route, status, sorted(documented))
            if status >= 400:
                assert "application/problem+json" in documented[str(status)]["content"], (route, status)
    for path, item in spec["paths"].items():
        for operation in item.values():
            if path not in ("/healthz", "/readyz"):
                assert "401" in operation["responses"], path
    for route in ("/compile", "/simulate"):
        documented = set(spec["paths"][route]["post"]["responses"])
        assert {"401", "413", "415", "422", "503", "504"} <= documented, (route, documented)
        assert "400" not in documented
    compile_schema = spec["components"]["schemas"]["CompileRequest"]
    assert compile_schema["oneOf"] == [{"required": ["graph"], "properties": {"graph": {"type": "object"}}},
                                       {"required": ["export"], "properties": {"export": {"type": "object"}}}]
    assert spec["paths"]["/simulate"]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"] \
        .endswith("/SimulateRequest")
    assert "SimulateRequest" in spec["components"]["schemas"]
