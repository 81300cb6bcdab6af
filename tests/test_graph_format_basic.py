import json

import pytest
from pydantic import ValidationError

from lowering.graph_format import GraphDocument

DOC = {
    "format": "sticksat.graph", "version": 1, "name": "add",
    "inputs": [{"id": "x", "kind": "user_input",
                "meta": {"shape": [2, 3], "stride": [3, 1], "storage_offset": 0, "dtype": "float32"}}],
    "nodes": [{"id": "add", "target": "aten.add.Tensor",
               "args": [{"kind": "tensor", "node": "x"}, {"kind": "tensor", "node": "x"}],
               "outputs": [{"shape": [2, 3], "stride": [3, 1], "storage_offset": 0, "dtype": "float32"}]}],
    "outputs": [{"kind": "tensor", "node": "add"}],
}


def test_hash_ignores_labels_and_roundtrips():
    doc = GraphDocument.model_validate_json(json.dumps(DOC))
    again = GraphDocument.from_json(doc.to_json())
    assert again.graph_hash() == doc.graph_hash()
    renamed = dict(DOC, name="other")
    assert GraphDocument.model_validate_json(json.dumps(renamed)).graph_hash() == doc.graph_hash()
    changed = json.loads(json.dumps(DOC))
    changed["nodes"][0]["target"] = "aten.mul.Tensor"
    assert GraphDocument.model_validate_json(json.dumps(changed)).graph_hash() != doc.graph_hash()


def test_unknown_field_rejected():
    bad = dict(DOC, extra=1)
    with pytest.raises(ValidationError):
        GraphDocument.model_validate_json(json.dumps(bad))
