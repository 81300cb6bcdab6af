"""Issue 31, the schemathesis findings, each checked directly against the app (no pool):
the OpenAPI document says what the service does."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from service.http import ServiceConfig, create_app


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    app = create_app(ServiceConfig(store_path=str(tmp_path_factory.mktemp("oa") / "store.sqlite")))
    return TestClient(app)  # no lifespan: no pool needed for these


@pytest.fixture(scope="module")
def openapi(client):
    return client.get("/openapi.json").json()


def test_an_undeclared_method_is_405_whatever_its_content_type(client):
    for method in ("PUT", "PATCH", "DELETE"):
        resp = client.request(method, "/compile", content=b"x", headers={"content-type": "text/plain"})
        assert resp.status_code == 405, (method, resp.status_code)
        assert resp.headers["content-type"].startswith("application/problem+json")
    # POST keeps the JSON-only rule
    assert client.post("/compile", content=b"x", headers={"content-type": "text/plain"}).status_code == 415


def test_a_null_source_is_invalid_in_the_schema_as_in_the_service(client, openapi):
    jsonschema_rs = pytest.importorskip("jsonschema_rs")  # schemathesis's validator

    validator = jsonschema_rs.Draft202012Validator(
        {"$ref": "#/components/schemas/CompileRequest", "components": openapi["components"]})
    assert not validator.is_valid({"export": None})
    assert client.post("/compile", json={"export": None}).status_code == 422
    assert not validator.is_valid({"graph": None})
    assert validator.is_valid({"export": {}, "graph": None})  # the other may be null


def test_the_memory_tag_is_required_as_the_service_requires_it(openapi):
    schemas = openapi["components"]["schemas"]
    assert "kind" in schemas["HbmMemory"]["required"] and "kind" in schemas["LxMemory"]["required"]
    from service.prepare import SimulateRequest

    with pytest.raises(Exception):  # pydantic needs the tag to pick the variant
        SimulateRequest.model_validate({"program": {"memory": {"offset": 0}}})


def test_the_report_is_documented_as_html_or_json(openapi):
    content = openapi["paths"]["/programs/{key}/report"]["get"]["responses"]["200"]["content"]
    assert set(content) == {"text/html", "application/json"}


def test_links_from_a_compile_to_its_program_report_and_graph(openapi):
    links = openapi["paths"]["/compile"]["post"]["responses"]["200"]["links"]
    ids = {op["operationId"]: path for path, item in openapi["paths"].items() for op in item.values()}
    assert ids[links["GetProgram"]["operationId"]] == "/programs/{key}"
    assert ids[links["GetReport"]["operationId"]] == "/programs/{key}/report"
    assert ids[links["GetGraph"]["operationId"]] == "/graphs/{graph_hash}"
    assert links["GetProgram"]["parameters"] == {"key": "$response.body#/key"}
