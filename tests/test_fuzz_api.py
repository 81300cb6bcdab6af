"""API fuzzing (issue 16): schemathesis against the service's own OpenAPI, on a real
`sticksat serve` bound to 127.0.0.1.

1. Generated cases for every operation, schema-valid (positive) and schema-invalid
   (negative) bodies, parameters and queries: at least 500 requests in all.
2. An example-seeded run from the real graph documents of benchmarks/graphs/tiny: each
   is compiled (naive and heuristic), its program simulated with numerics against the
   graph, fetched back by key and by graph hash; then generated variants of those
   documents (sizes, arguments, options and the program's fields replaced by generated
   values), so the lowering, the planners and the simulator see valid and nearly valid
   input, not only what the schema alone generates.

Every response: no 5xx, the status documented for the operation, the body conforming to
the documented schema, every 4xx/5xx an application/problem+json document with its
code. The server is tight on purpose (`--max-time-limit 2`, `--max-nodes 200`) so a
fuzzed request never asks for a long solve.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import httpx
import pytest

hypothesis = pytest.importorskip("hypothesis")
schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from schemathesis.checks import (  # noqa: E402
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.generation import GenerationMode  # noqa: E402

from service_helpers import ServiceProcess  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TINY = sorted((REPO / "benchmarks" / "graphs" / "tiny").glob("*.json"))
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
PROBLEM = "application/problem+json"
# Per operation and generation mode (hypothesis stops early for an operation with few
# distinct inputs, e.g. GET /healthz): over 500 requests in all.
# Generating request bodies from the graph and program schemas costs ~0.2 s a case.
EXAMPLES = 100
BODY_EXAMPLES = 50


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("fuzz")
    proc = ServiceProcess(base / "store.sqlite", base / "server.log",
                          ["--workers", "1", "--queue-limit", "32", "--max-time-limit", "2", "--max-nodes", "200"])
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def schema(server):
    return schemathesis.openapi.from_url(server.url + "/openapi.json")


def _check_problem(response) -> None:
    """Every error is an RFC 9457 problem document with its stable code."""
    if response.status_code >= 400:
        content_type = {k.lower(): v for k, v in response.headers.items()}.get("content-type", [""])[0]
        assert content_type.startswith(PROBLEM), (response.status_code, content_type)
        body = json.loads(response.content)
        assert body["status"] == response.status_code
        assert body["type"] == f"urn:sticksat:problem:{body['code']}" and body["detail"]


def _call(case, server, counter):
    response = case.call_and_validate(base_url=server.url, checks=CHECKS, timeout=60)
    counter.append(response.status_code)
    _check_problem(response)
    return response


def _run(strategy, server, counter, examples=EXAMPLES):
    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def run(case):
        _call(case, server, counter)

    run()


def test_generated_cases_for_every_operation(server, schema):
    statuses: list[int] = []
    operations = []
    for result in schema.get_all_operations():
        operation = result.ok()
        operations.append(f"{operation.method.upper()} {operation.path}")
        examples = BODY_EXAMPLES if operation.body else EXAMPLES
        _run(operation.as_strategy(generation_mode=GenerationMode.POSITIVE), server, statuses, examples)
        try:
            _run(operation.as_strategy(generation_mode=GenerationMode.NEGATIVE), server, statuses, examples)
        except hypothesis.errors.Unsatisfiable:
            # an operation without parameters or body (GET /healthz) has no invalid input
            assert not operation.body and not list(operation.iter_parameters()), operations[-1]
    assert {"POST /compile", "POST /simulate", "GET /programs/{key}", "GET /graphs/{graph_hash}"} <= set(operations)
    assert len(statuses) >= 500, len(statuses)
    assert all(s < 500 for s in statuses)
    print(f"fuzz: {len(statuses)} requests over {len(operations)} operations; statuses "
          f"{ {s: statuses.count(s) for s in sorted(set(statuses))} }")
    assert server.metric("sticksat_requests_total", {"status": "500"}) == 0
    assert httpx.get(server.url + "/healthz").status_code == 200


def _tiny_documents():
    return [json.loads(p.read_text()) for p in TINY]


def test_example_seeded_run_reaches_lowering_planner_and_simulator(server, schema):
    compile_op = schema["/compile"]["POST"]
    simulate_op = schema["/simulate"]["POST"]
    program_op = schema["/programs/{key}"]["GET"]
    graph_op = schema["/graphs/{graph_hash}"]["GET"]
    statuses: list[int] = []
    compiled = 0
    for doc in _tiny_documents():
        for planner in ("naive", "heuristic"):
            options = {"planner": planner, "deterministic": True, "time_limit_s": 1}
            resp = _call(compile_op.Case(body={"graph": doc, "options": options},
                                         media_type="application/json"), server, statuses)
            assert resp.status_code == 200, resp.content[:500]
            body = json.loads(resp.content)
            compiled += 1
            sim = _call(simulate_op.Case(body={"program": body["program"], "graph": doc, "numerics": True},
                                         media_type="application/json"), server, statuses)
            assert sim.status_code == 200
            verdict = json.loads(sim.content)
            assert verdict["valid"] is True and verdict["simulated_us"] > 0 and verdict["max_rel_err"] < 5e-2
            assert _call(program_op.Case(path_parameters={"key": body["key"]}), server, statuses).status_code == 200
            assert _call(graph_op.Case(path_parameters={"graph_hash": body["graph_hash"]}), server,
                         statuses).status_code == 200
    assert compiled == 2 * len(TINY) >= 10

    # Generated variants of the real documents: one field at a time replaced by a
    # generated value (a size, an argument, a dtype, an option, a program field).
    seeds = _tiny_documents()
    programs = {}
    for doc in seeds:
        resp = httpx.post(server.url + "/compile", json={"graph": doc, "options": {"planner": "naive",
                                                                                    "deterministic": True}},
                          timeout=60)
        programs[doc["name"]] = resp.json()["program"]
    values = st.one_of(st.integers(-3, 3), st.integers(0, 2**40), st.sampled_from([0, 1, 7, 16, 64, 2**31]),
                       st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8),
                       st.sampled_from(["float16", "float32", "int64", "bool", "bfloat16", "x"]),
                       st.none(), st.lists(st.integers(0, 64), max_size=4), st.booleans())

    def paths(obj, prefix=()):
        if isinstance(obj, dict):
            for k, v in obj.items():
                yield prefix + (k,)
                yield from paths(v, prefix + (k,))
        elif isinstance(obj, list):
            for i, v in enumerate(obj):
                yield prefix + (i,)
                yield from paths(v, prefix + (i,))

    def mutate(obj, path, value):
        out = copy.deepcopy(obj)
        target = out
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = value
        return out

    graph_paths = {doc["name"]: [p for p in paths(doc) if p[0] in ("inputs", "nodes")] for doc in seeds}

    @st.composite
    def compile_variants(draw):
        doc = draw(st.sampled_from(seeds))
        path = draw(st.sampled_from(graph_paths[doc["name"]]))
        options = draw(st.fixed_dictionaries({"planner": st.sampled_from(["naive", "heuristic"])},
                                             optional={"time_limit_s": st.floats(0.01, 3),
                                                       "deterministic": st.booleans()}))
        return {"graph": mutate(doc, path, draw(values)), "options": options}

    @st.composite
    def simulate_variants(draw):
        doc = draw(st.sampled_from(seeds))
        program = programs[doc["name"]]
        path = draw(st.sampled_from([p for p in paths(program) if p[0] in ("tensors", "ops", "outputs")][:400]))
        return {"program": mutate(program, path, draw(values)), "graph": doc,
                "numerics": draw(st.booleans())}

    before = len(statuses)
    _run(compile_variants().map(lambda b: compile_op.Case(body=b, media_type="application/json")), server,
         statuses, examples=60)
    _run(simulate_variants().map(lambda b: simulate_op.Case(body=b, media_type="application/json")), server,
         statuses, examples=60)
    variants = statuses[before:]
    assert len(variants) >= 100 and all(s < 500 for s in variants)
    assert 200 in variants and 422 in variants  # some variants still compile, some are refused
    assert server.metric("sticksat_requests_total", {"status": "500"}) == 0


def test_stateful_phase_follows_the_links(server):
    """Issue 31: the OpenAPI document declares links (a compile's key -> its program and
    report, its graph hash -> the graph), so schemathesis's stateful phase can chain calls:
    compile, then fetch what the answer names. Every step passes the same checks. Half of
    the generated /compile bodies are replaced by the real tiny documents (a generated
    graph rarely compiles, and only a 200 has links to follow)."""
    from hypothesis.stateful import run_state_machine_as_test

    stateful = schemathesis.openapi.from_url(server.url + "/openapi.json")
    raw = httpx.get(server.url + "/openapi.json").json()
    links = raw["paths"]["/compile"]["post"]["responses"]["200"]["links"]
    assert {"GetProgram", "GetReport", "GetGraph"} <= set(links)
    real_bodies = [{"graph": doc, "options": {"planner": "naive"}} for doc in _tiny_documents()[:4]]

    @stateful.hook
    def flatmap_body(context, body):
        if context.operation is None or context.operation.path != "/compile":
            return st.just(body)
        return st.one_of(st.just(body), st.sampled_from(real_bodies))

    statuses: list[int] = []
    followed: list[str] = []

    class Workflow(stateful.as_state_machine()):
        def get_call_kwargs(self, case):
            return {"base_url": server.url, "timeout": 60}

        def validate_response(self, response, case, additional_checks=None, **kwargs):
            statuses.append(response.status_code)
            followed.append(f"{case.operation.method.upper()} {case.operation.path}")
            case.validate_response(response, checks=CHECKS)
            _check_problem(response)

    run_state_machine_as_test(Workflow, settings=settings(
        max_examples=25, stateful_step_count=4, deadline=None, database=None, derandomize=True,
        suppress_health_check=list(HealthCheck)))
    assert all(s < 500 for s in statuses), statuses
    # the chain went past the first call: a link was followed to a program, report or graph
    assert any(op in followed for op in ("GET /programs/{key}", "GET /programs/{key}/report",
                                        "GET /graphs/{graph_hash}")), sorted(set(followed))
    print(f"stateful: {len(statuses)} calls; " + ", ".join(f"{op}: {followed.count(op)}"
                                                           for op in sorted(set(followed))))
