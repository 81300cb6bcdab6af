"""Malformed documents: each gets one precise GraphError naming the node, never a traceback."""
from __future__ import annotations

import copy
import json

import pytest

from lowering.errors import GraphError
from lowering.graph_format import GraphDocument
from lowering.validate import find_problems, parse_document, validate_document


def _meta(shape, dtype="float32"):
    stride, acc = [], 1
    for s in reversed(shape):
        stride.insert(0, acc)
        acc *= s
    return {"shape": list(shape), "stride": stride, "storage_offset": 0, "dtype": dtype}


def _ref(node, output=0):
    return {"kind": "tensor", "node": node, "output": output}


def good_doc() -> dict:
    """x @ w -> relu -> amax: small but with a parameter, a matmul and a reduction."""
    return {
        "format": "sticksat.graph", "version": 1, "name": "mlp",
        "inputs": [
            {"id": "x", "kind": "user_input", "meta": _meta([4, 8])},
            {"id": "w", "kind": "parameter", "name": "fc.weight", "meta": _meta([8, 16])},
        ],
        "nodes": [
            {"id": "mm", "target": "aten.mm.default", "args": [_ref("x"), _ref("w")],
             "outputs": [_meta([4, 16])]},
            {"id": "relu", "target": "aten.relu.default", "args": [_ref("mm")],
             "outputs": [_meta([4, 16])]},
            {"id": "amax", "target": "aten.amax.default",
             "args": [_ref("relu"), {"kind": "list", "items": [{"kind": "int", "value": -1}]},
                      {"kind": "bool", "value": True}],
             "outputs": [_meta([4, 1])]},
        ],
        "outputs": [_ref("amax")],
    }


def _raises(raw, code, node, check_support=False, *fragments) -> GraphError:
    with pytest.raises(GraphError) as info:
        validate_document(parse_document(raw), check_support=check_support)
    err = info.value
    assert err.code == code, err
    assert err.node == node, err
    for fragment in fragments:
        assert fragment in err.message, err.message
    return err


def test_good_document_passes_and_parses_from_every_form():
    doc = good_doc()
    for raw in (doc, json.dumps(doc), json.dumps(doc).encode()):
        parsed = parse_document(raw)
        validate_document(parsed, check_support=False)
        assert isinstance(parsed, GraphDocument)
    assert find_problems(parse_document(doc), check_support=False) == []


def test_duplicate_id_between_nodes():
    doc = good_doc()
    doc["nodes"][1]["id"] = "mm"
    doc["nodes"][2]["args"][0] = _ref("mm")
    _raises(doc, "duplicate_id", "mm", False, "'mm'")


def test_duplicate_id_between_input_and_node():
    doc = good_doc()
    doc["nodes"][0]["id"] = "x"
    doc["nodes"][1]["args"][0] = _ref("x")
    _raises(doc, "duplicate_id", "x", False, "graph input", "node")


def test_dangling_ref_to_unknown_node():
    doc = good_doc()
    doc["nodes"][1]["args"][0] = _ref("nowhere")
    _raises(doc, "dangling_ref", "relu", False, "'nowhere'")


def test_dangling_ref_inside_list_arg():
    doc = good_doc()
    doc["nodes"].append({"id": "cat", "target": "aten.cat.default",
                         "args": [{"kind": "list", "items": [_ref("relu"), _ref("ghost")]},
                                  {"kind": "int", "value": 0}],
                         "outputs": [_meta([8, 16])]})
    _raises(doc, "dangling_ref", "cat", False, "'ghost'")


def test_dangling_ref_to_missing_output_index():
    doc = good_doc()
    doc["nodes"][1]["args"][0] = _ref("mm", output=1)
    _raises(doc, "dangling_ref", "relu", False, "output 1 of 'mm'", "1 output")


def test_graph_output_to_missing_output_index():
    doc = good_doc()
    doc["outputs"] = [_ref("amax", output=2)]
    _raises(doc, "dangling_ref", "amax", False, "graph output 0", "output 2")


def test_graph_output_to_unknown_node():
    doc = good_doc()
    doc["outputs"].append(_ref("missing"))
    _raises(doc, "dangling_ref", "missing", False, "graph output 1")


def test_self_cycle():
    doc = good_doc()
    doc["nodes"][1]["args"] = [_ref("relu")]
    _raises(doc, "cycle", "relu", False, "its own output")


def test_two_node_cycle_names_the_loop():
    doc = good_doc()
    # mm now reads relu, which reads mm.
    doc["nodes"][0]["args"][0] = _ref("relu")
    err = _raises(doc, "cycle", "mm", False, "mm -> relu -> mm")
    assert "cycle" in err.message


def test_use_before_definition_without_cycle():
    doc = good_doc()
    doc["nodes"][0], doc["nodes"][1] = doc["nodes"][1], doc["nodes"][0]
    _raises(doc, "use_before_definition", "relu", False, "'mm'", "topological")


def test_symbolic_shape_names_node_and_symbol():
    doc = good_doc()
    doc["nodes"][1]["outputs"][0]["shape"][0] = {"sym": "s0"}
    _raises(doc, "symbolic_size", "relu", False, "s0", "shape[0]")


def test_symbolic_input_size_names_the_input():
    doc = good_doc()
    doc["inputs"][0]["meta"]["shape"][0] = {"sym": "s7"}
    _raises(doc, "symbolic_size", "x", False, "s7", "graph input 'x'")


def test_symbolic_argument():
    doc = good_doc()
    doc["nodes"].append({"id": "view", "target": "aten.view.default",
                         "args": [_ref("amax"), {"kind": "list", "items": [{"kind": "sym", "sym": "s1"},
                                                                             {"kind": "int", "value": 1}]}],
                         "outputs": [_meta([4, 1])]})
    _raises(doc, "symbolic_size", "view", False, "s1", "aten.view.default")


def test_shape_stride_rank_mismatch():
    doc = good_doc()
    doc["nodes"][0]["outputs"][0]["stride"] = [16]
    _raises(doc, "shape_mismatch", "mm", False, "rank-2", "1 strides")


def test_dtype_stated_by_argument_must_match_output():
    doc = good_doc()
    doc["nodes"].append({"id": "cast", "target": "prims.convert_element_type.default",
                         "args": [_ref("amax"), {"kind": "dtype", "value": "float16"}],
                         "outputs": [_meta([4, 1], "float32")]})
    _raises(doc, "dtype_mismatch", "cast", False, "float16", "float32")


def test_unsupported_op_names_node_and_all_unsupported_targets(monkeypatch):
    import lowering.validate as validate

    monkeypatch.setattr(validate, "supported_targets",
                        lambda: frozenset({"aten.mm.default", "aten.amax.default"}))
    doc = good_doc()
    _raises(doc, "unsupported_op", "relu", True, "aten.relu.default")
    # With support checks off (the backend partitions instead), the same graph is fine.
    validate_document(parse_document(doc), check_support=False)


def test_unsupported_op_against_the_real_lowering_table():
    doc = good_doc()
    doc["nodes"].append({"id": "det", "target": "aten.linalg_det.default", "args": [_ref("amax")],
                         "outputs": [_meta([4])]})
    _raises(doc, "unsupported_op", "det", True, "aten.linalg_det.default")


def test_supported_op_with_refused_arguments_is_unsupported():
    """A transposed convolution: the target is lowerable, these arguments are not."""
    ints = lambda *v: {"kind": "list", "items": [{"kind": "int", "value": x} for x in v]}  # noqa: E731
    doc = {
        "inputs": [{"id": "x", "kind": "user_input", "meta": _meta([1, 4, 8, 8])},
                   {"id": "w", "kind": "parameter", "meta": _meta([4, 2, 3, 3])}],
        "nodes": [{"id": "conv", "target": "aten.convolution.default",
                   "args": [_ref("x"), _ref("w"), {"kind": "none"}, ints(1, 1), ints(0, 0), ints(1, 1),
                            {"kind": "bool", "value": True}, ints(0, 0), {"kind": "int", "value": 2}],
                   "outputs": [_meta([1, 4, 10, 10])]}],
        "outputs": [_ref("conv")],
    }
    _raises(doc, "unsupported_op", "conv", True, "arguments")
    # the same weight as a grouped (groups=2) convolution is supported
    doc["nodes"][0]["args"][6]["value"] = False
    doc["nodes"][0]["outputs"] = [_meta([1, 4, 6, 6])]
    validate_document(parse_document(doc), check_support=True)


# -- schema errors: JSON path and the node it lies in -------------------------------------


def test_schema_error_has_json_path_and_node():
    doc = good_doc()
    doc["nodes"][1]["args"][0]["output"] = "0"
    err = _raises(doc, "schema", "relu", False, "nodes[1].args[0].output")
    assert "integer" in err.message


def test_schema_error_unknown_field_in_input():
    doc = good_doc()
    doc["inputs"][1]["weights"] = [1.0, 2.0]
    _raises(doc, "schema", "w", False, "inputs[1].weights")


def test_schema_error_bad_target_and_top_level():
    doc = good_doc()
    doc["nodes"][2]["target"] = "os.system"
    _raises(doc, "schema", "amax", False, "nodes[2].target")
    doc = good_doc()
    doc["version"] = 2
    _raises(doc, "schema", None, False, "version")


@pytest.mark.parametrize("raw, fragment", [
    (b"{not json", "invalid JSON"),
    ("[1, 2]", "JSON object"),
    (b"\xff\xfe\x00", "UTF-8"),
    ('{"inputs": [], "nodes": [], "outputs": [], "x": NaN}', "NaN"),
    (42, "JSON object"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
])
def test_unparseable_input_is_a_schema_error(raw, fragment):
    with pytest.raises(GraphError) as info:
        parse_document(raw)
    assert info.value.code == "schema"
    assert fragment in info.value.message


def test_find_problems_reports_every_node():
    doc = good_doc()
    doc["nodes"][0]["outputs"][0]["shape"][1] = {"sym": "a"}
    doc["nodes"][2]["outputs"][0]["shape"][0] = {"sym": "b"}
    problems = find_problems(parse_document(doc), check_support=False)
    assert [(p.code, p.node) for p in problems] == [("symbolic_size", "mm"), ("symbolic_size", "amax")]


def test_validation_does_not_mutate_the_document():
    doc = good_doc()
    before = copy.deepcopy(doc)
    validate_document(parse_document(doc), check_support=False)
    assert doc == before


def test_long_backwards_chain_and_long_cycle():
    """3,000 nodes listed backwards: every reference is forward, no loop (and no
    recursion-depth failure); closing the chain makes one loop, reported abbreviated."""
    n = 3000
    nodes = [{"id": f"n{i}", "target": "aten.relu.default",
              "args": [_ref(f"n{i + 1}" if i + 1 < n else "x")], "outputs": [_meta([2])]} for i in range(n)]
    doc = {"inputs": [{"id": "x", "kind": "user_input", "meta": _meta([2])}], "nodes": nodes,
           "outputs": [_ref("n0")]}
    problems = find_problems(parse_document(doc), check_support=False)
    assert len(problems) == n - 1 and {p.code for p in problems} == {"use_before_definition"}
    nodes[-1]["args"] = [_ref("n0")]
    err = _raises(doc, "cycle", "n0", False, "n0 -> n1 -> n2", "more", f"n{n - 1} -> n0")
    assert len(err.message) < 300


# -- `sticksat validate` ------------------------------------------------------------------


def test_cli_validate_reports_each_file(tmp_path, capsys):
    from service.cli import main

    good, bad, broken = tmp_path / "good.json", tmp_path / "bad.json", tmp_path / "broken.json"
    good.write_text(json.dumps(good_doc()))
    doc = good_doc()
    doc["nodes"][1]["args"][0] = _ref("nowhere")
    bad.write_text(json.dumps(doc))
    broken.write_text("{")
    assert main(["validate", str(good)]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["ok"] and line["source"] == "graph" and line["nodes"] == 3
    assert line["graph_hash"] == parse_document(good_doc()).graph_hash()

    assert main(["validate", str(good), str(bad), str(broken), "--no-support-check"]) == 1
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["ok"] for x in lines] == [True, False, False]
    assert lines[1]["problems"] == [{"code": "dangling_ref", "node": "relu",
                                     "message": lines[1]["problems"][0]["message"]}]
    assert lines[2]["problems"][0]["code"] == "schema"
    assert main(["validate", str(tmp_path / "missing.json")]) == 2
