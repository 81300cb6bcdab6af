"""The torch.export serialized path gives the same document as live capture.

The five tiny models go through this path in tests/test_backend_models.py (one export
per model, shared with the torch.compile comparison); here: multi-output ops, buffers,
keyword args, the .pt2 archive, undecomposed and malformed programs, canonical form."""
from __future__ import annotations

import io
import json

import pytest

torch = pytest.importorskip("torch")

from torch._export.serde.serialize import serialize  # noqa: E402

from backend.capture import decomposition_table, exported_program_to_document  # noqa: E402
from lowering.errors import GraphError  # noqa: E402
from lowering.export_serde import document_from_export  # noqa: E402
from lowering.graph_format import GraphDocument  # noqa: E402
from lowering.validate import validate_document  # noqa: E402


def _exported(model, inputs):
    with torch.no_grad():
        ep = torch.export.export(model, tuple(inputs), strict=False)
        return ep.run_decompositions(decomposition_table())


class _Mixed(torch.nn.Module):
    """Multi-output op (max.dim), a buffer, keyword args (dtype cast) and a float literal."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 6)
        self.register_buffer("shift", torch.linspace(-1, 1, 6))

    def forward(self, x):
        y = torch.nn.functional.gelu(self.fc(x)) + self.shift
        best = y.max(dim=-1)
        return torch.softmax(y.to(torch.float16), -1), best.values, best.indices


def _serialized_json(ep) -> bytes:
    return serialize(ep).exported_program


def test_multi_output_buffer_kwargs_and_pt2_archive():
    torch.manual_seed(0)
    ep = _exported(_Mixed().eval(), (torch.randn(3, 8),))
    live = GraphDocument.model_validate(exported_program_to_document(ep))
    doc = document_from_export(_serialized_json(ep))
    assert doc.graph_hash() == live.graph_hash()
    kinds = {i.kind for i in doc.inputs}
    assert kinds == {"user_input", "parameter", "buffer"}
    max_node = next(n for n in doc.nodes if n.target == "aten.max.dim")
    assert [m.dtype for m in max_node.outputs] == ["float32", "int64"]
    # The graph outputs select both outputs of the max node by index.
    assert {(r.node, r.output) for r in doc.outputs} >= {(max_node.id, 0), (max_node.id, 1)}
    # The .pt2 archive written by torch.export.save: only its JSON entry is read.
    buffer = io.BytesIO()
    torch.export.save(ep, buffer)
    from_archive = document_from_export(buffer.getvalue())
    assert from_archive.graph_hash() == live.graph_hash()


def test_undecomposed_program_is_reported_as_unsupported():
    ep = torch.export.export(_Mixed().eval(), (torch.randn(3, 8),), strict=False)
    doc = document_from_export(_serialized_json(ep))
    linear = next(n for n in doc.nodes if n.target == "aten.linear.default")
    with pytest.raises(GraphError) as info:
        validate_document(doc)
    assert info.value.code == "unsupported_op" and info.value.node == linear.id


def _program() -> dict:
    ep = _exported(_Mixed().eval(), (torch.randn(3, 8),))
    return json.loads(_serialized_json(ep))


def test_malformed_programs_raise_graph_errors():
    program = _program()
    nodes = program["graph_module"]["graph"]["nodes"]

    broken = json.loads(json.dumps(program))
    broken["graph_module"]["graph"]["nodes"][1]["inputs"][0]["arg"] = {"as_tensor": {"name": "ghost"}}
    with pytest.raises(GraphError) as info:
        validate_document(document_from_export(broken), check_support=False)
    assert info.value.code == "dangling_ref" and info.value.node == nodes[1]["name"]

    broken = json.loads(json.dumps(program))
    broken["graph_module"]["graph"]["tensor_values"][nodes[0]["outputs"][0]["as_tensor"]["name"]]["sizes"][0] = \
        {"as_expr": {"expr_str": "s0", "hint": None}}
    with pytest.raises(GraphError) as info:
        validate_document(document_from_export(broken), check_support=False)
    assert info.value.code == "symbolic_size" and info.value.node == nodes[0]["name"]
    assert "s0" in info.value.message

    broken = json.loads(json.dumps(program))
    broken["graph_module"]["graph"]["nodes"][2]["target"] = "torch.ops.higher_order.cond"
    with pytest.raises(GraphError) as info:
        document_from_export(broken)
    assert info.value.code == "unsupported_op" and info.value.node == nodes[2]["name"]

    for bad in (b"not json", b"PK\x03\x04garbage", "[" * 100_000 + "]" * 100_000, json.dumps({"schema_version": {"major": 3}}),
                json.dumps({"schema_version": {"major": 8, "minor": 0}, "graph_module": []})):
        with pytest.raises(GraphError) as info:
            document_from_export(bad)
        assert info.value.code == "schema"


# -- canonical form (torch.compile vs torch.export documents: tests/test_backend_models.py)


def test_canonical_document_renames_reorders_and_drops_unused_inputs():
    from lowering.canonical import canonical_document

    meta = {"shape": [2], "stride": [1], "storage_offset": 0, "dtype": "float32"}
    doc = GraphDocument.model_validate({
        "inputs": [{"id": "w", "kind": "parameter", "meta": meta}, {"id": "unused", "kind": "buffer", "meta": meta},
                   {"id": "x", "kind": "user_input", "meta": meta}],
        "nodes": [{"id": "add", "target": "aten.add.Tensor",
                   "args": [{"kind": "tensor", "node": "x"}, {"kind": "tensor", "node": "w"}], "outputs": [meta]},
                  {"id": "cat", "target": "aten.cat.default",
                   "args": [{"kind": "list", "items": [{"kind": "tensor", "node": "add"}, {"kind": "tensor", "node": "x"}]}],
                   "outputs": [{**meta, "shape": [4]}]}],
        "outputs": [{"kind": "tensor", "node": "cat"}],
    })
    canon = canonical_document(doc)
    assert [(i.id, i.kind) for i in canon.inputs] == [("in0", "user_input"), ("in1", "parameter")]
    assert [n.id for n in canon.nodes] == ["n0", "n1"]
    assert [a.node for a in canon.nodes[0].args] == ["in0", "in1"]
    assert [a.node for a in canon.nodes[1].args[0].items] == ["n0", "in0"]
    assert canon.outputs[0].node == "n1"
    validate_document(canon, check_support=False)


def test_cli_validate_converts_a_pt2_archive(tmp_path, capsys):
    from service.cli import main

    torch.manual_seed(0)
    ep = _exported(_Mixed().eval(), (torch.randn(3, 8),))
    archive = tmp_path / "mixed.pt2"
    torch.export.save(ep, str(archive))
    out = tmp_path / "mixed.json"
    status = main(["validate", str(archive), "-o", str(out)])
    line = json.loads(capsys.readouterr().out)
    assert line["source"] == "export"
    assert status == (0 if line["ok"] else 1)
    document = GraphDocument.from_json(out.read_text())
    assert document.graph_hash() == line["graph_hash"]
    assert document.graph_hash() == GraphDocument.model_validate(exported_program_to_document(ep)).graph_hash()
