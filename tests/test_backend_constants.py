"""Tensor constants (FX get_attr) travel in the graph document instead of sending the whole
graph to eager torch, and input kinds survive partitioning (weights stay parameters)."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from backend.region import compiled_regions, forget_compiled_regions  # noqa: E402
from lowering import lower_document  # noqa: E402
from lowering.errors import GraphError  # noqa: E402
from lowering.validate import parse_document, validate_document  # noqa: E402
from simulator.api import simulate  # noqa: E402
from solver.planners import plan  # noqa: E402


class WithConstants(torch.nn.Module):
    """A 0-d constant (what attention-mask builders create) and a non-uniform one."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(64, 64)

    def forward(self, x):
        pattern = torch.tensor([1.0, -2.0, 0.5, 4.0]).repeat(16)
        return self.lin(x) * torch.tensor(3.0) + pattern


class UnsupportedInTheMiddle(torch.nn.Module):
    """cumprod has no lowering: the graph is partitioned around it."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(64, 64)
        self.b = torch.nn.Linear(64, 64)

    def forward(self, x):
        y = torch.cumprod(self.a(x), dim=-1)
        return self.b(y) + torch.tensor([1.0, 2.0]).repeat(32)


def _compile(model, x, caplog=None):
    torch._dynamo.reset()
    forget_compiled_regions()
    compiled = torch.compile(model, backend="sticksat", dynamic=False, options={"planner": "heuristic"})
    with torch.no_grad():
        got, want = compiled(x), model(x)
    return got, want, compiled_regions()


def test_graph_with_tensor_constants_runs_on_sticksat_not_eager(caplog):
    torch.manual_seed(0)
    got, want, regions = _compile(WithConstants().eval(), torch.randn(4, 64))
    assert len(regions) == 1, "the whole graph must be compiled, not sent to eager torch"
    assert not any("eager" in r.message for r in caplog.records)
    constants = regions[0].doc["constants"]
    assert {len(c["values"]) for c in constants} == {1, 4}
    assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()


def test_partitioned_graph_keeps_weights_as_parameters_and_constants_as_constants():
    torch.manual_seed(0)
    got, want, regions = _compile(UnsupportedInTheMiddle().eval(), torch.randn(4, 64))
    assert len(regions) == 2
    kinds = [{i["id"]: i["kind"] for i in r.doc["inputs"]} for r in regions]
    for k in kinds:
        assert sorted(k.values()).count("parameter") == 2, k  # each Linear's weight and bias
    assert "constant" in kinds[1].values()
    assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()


def _doc_with_constant(values, shape):
    meta = {"shape": shape, "stride": [shape[1], 1], "storage_offset": 0, "dtype": "float32"}
    return {"format": "sticksat.graph", "version": 1, "name": "c",
            "inputs": [{"id": "x", "kind": "user_input", "meta": meta}],
            "constants": [{"id": "c", "meta": meta, "values": values}],
            "nodes": [{"id": "add", "target": "aten.add.Tensor",
                       "args": [{"kind": "tensor", "node": "x"}, {"kind": "tensor", "node": "c"}],
                       "outputs": [meta]}],
            "outputs": [{"kind": "tensor", "node": "add"}]}


def test_constant_document_lowers_and_simulates_with_its_values():
    values = [float(i) - 31.5 for i in range(64)] + ["inf"] + [0.0] * 63
    doc = parse_document(_doc_with_constant(values, [2, 64]))
    validate_document(doc)
    pg = lower_document(doc)
    assert pg.tensors["c"].role == "constant" and "c" in pg.inputs
    program = plan(pg, planner="heuristic")
    res = simulate(program, graph=pg, numerics=True)
    assert res.valid and res.max_rel_err is not None and res.max_rel_err < 1e-6
    x = res.reference[0]
    assert x.shape == (2, 64) and float(x[1, 0]) == float("inf")


def test_uniform_constant_folds_into_its_consumer():
    pg = lower_document(parse_document(_doc_with_constant([2.5] * 128, [2, 64])))
    assert "c" not in pg.inputs
    assert all(op.body.kind != "fill" for op in pg.ops)  # folded as Const, the fill died


def test_constant_value_count_must_match_its_shape():
    with pytest.raises(GraphError) as info:
        validate_document(parse_document(_doc_with_constant([1.0, 2.0], [2, 64])))
    assert info.value.code == "shape_mismatch" and info.value.node == "c"


def test_documents_without_constants_hash_as_before():
    doc = parse_document(_doc_with_constant([1.0] * 128, [2, 64]))
    data = json.loads(doc.to_json())
    data.pop("constants")
    data["nodes"][0]["args"][1] = {"kind": "float", "value": 1.0}
    plain = parse_document(data)
    assert "constants" not in plain.canonical_json()
