"""Strict argument checking of a node against its op's schema (lowering/op_schemas.json,
generated from torch's operator registry): extra positional arguments and unknown keywords
were accepted silently; now they are `unexpected_argument`, a required argument left out
`missing_argument`, each naming the node."""
from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest

from lowering.errors import GraphError
from lowering.validate import find_problems, op_schemas, parse_document, validate_document
from test_graph_validation import good_doc

REPO = Path(__file__).resolve().parent.parent


def test_the_schema_file_matches_the_pinned_torch():
    # in this process (torch is usually imported already by other tests): the script's --check
    spec = importlib.util.spec_from_file_location("gen_op_schemas", REPO / "scripts" / "gen_op_schemas.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.main(["--check"]) == 0, "lowering/op_schemas.json is stale: run python scripts/gen_op_schemas.py"
    from lowering import SUPPORTED_TARGETS

    assert set(op_schemas()) == set(SUPPORTED_TARGETS)
    assert op_schemas()["aten.cat.default"] == {"args": ["tensors", "dim"], "required": 1, "kwargs": []}


def _first(doc) -> GraphError:
    with pytest.raises(GraphError) as info:
        validate_document(parse_document(doc))
    return info.value


def test_an_extra_positional_argument():
    doc = good_doc()
    doc["nodes"][1]["args"].append({"kind": "int", "value": 3})  # aten.relu(self) takes one
    err = _first(doc)
    assert (err.code, err.node) == ("unexpected_argument", "relu")
    assert "2 positional arguments" in err.message and "at most 1 (self)" in err.message


def test_an_unknown_keyword():
    doc = good_doc()
    doc["nodes"][2]["kwargs"] = {"dimension": {"kind": "int", "value": 0}}
    err = _first(doc)
    assert (err.code, err.node) == ("unexpected_argument", "amax")
    assert "keyword 'dimension'" in err.message and "self, dim, keepdim" in err.message


def test_an_argument_given_twice():
    doc = good_doc()
    doc["nodes"][2]["kwargs"] = {"keepdim": {"kind": "bool", "value": False}}  # also the third positional
    err = _first(doc)
    assert err.code == "unexpected_argument" and "both by position and by keyword" in err.message


def test_a_missing_required_argument():
    doc = good_doc()
    doc["nodes"][0]["args"] = doc["nodes"][0]["args"][:1]  # aten.mm(self, mat2)
    err = _first(doc)
    assert (err.code, err.node) == ("missing_argument", "mm") and "mat2" in err.message


def test_keywords_and_defaults_the_schema_has_are_fine():
    doc = good_doc()
    amax = doc["nodes"][2]
    amax["args"] = amax["args"][:1]
    amax["kwargs"] = {"dim": {"kind": "list", "items": [{"kind": "int", "value": -1}]},
                      "keepdim": {"kind": "bool", "value": True}}
    assert find_problems(parse_document(doc)) == []
    assert find_problems(parse_document(good_doc())) == []


def test_every_problem_is_listed():
    doc = copy.deepcopy(good_doc())
    doc["nodes"][0]["kwargs"] = {"out": {"kind": "int", "value": 1}}
    doc["nodes"][1]["args"].append({"kind": "int", "value": 3})
    codes = [(p.code, p.node) for p in find_problems(parse_document(doc))]
    assert codes == [("unexpected_argument", "mm"), ("unexpected_argument", "relu")]


def test_the_service_answers_422(tmp_path):
    from fastapi.testclient import TestClient

    from service.app import ServiceConfig, create_app

    doc = good_doc()
    doc["nodes"][1]["kwargs"] = {"inplace": {"kind": "bool", "value": True}}
    with TestClient(create_app(ServiceConfig(store_path=str(tmp_path / "store.sqlite"), workers=1))) as client:
        reply = client.post("/compile", json={"graph": doc})
    assert reply.status_code == 422 and reply.json()["code"] == "unexpected_argument"
    assert reply.json()["node"] == "relu"
