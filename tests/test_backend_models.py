"""torch.compile(backend="sticksat") on the five tiny models (outputs vs eager, document
JSON round trip, the torch.export path), the partition fallback and strict mode.

Tolerance: max |compiled - eager| / max |eager| over every output tensor.
- fp32: 1e-5 (same arithmetic as eager, different summation order; measured <= 5e-7);
- fp16: 5e-3 against fp16 eager (both store fp16 intermediates and accumulate in fp32;
  the rounding points differ: a few fp16 ulps (9.8e-4) of the largest value; measured
  <= 8e-4).
"""
from __future__ import annotations

import json
import logging

import pytest

torch = pytest.importorskip("torch")

from torch._export.serde.serialize import serialize  # noqa: E402

from backend.capture import decomposition_table, exported_program_to_document  # noqa: E402
from backend.dynamo import SticksatBackendError  # noqa: E402
from backend.options import BackendOptionError  # noqa: E402
from backend.region import compiled_regions, forget_compiled_regions, last_run_info  # noqa: E402
from lowering.canonical import canonical_hash  # noqa: E402
from lowering.export_serde import document_from_export  # noqa: E402
from lowering.graph_format import GraphDocument  # noqa: E402
from lowering.validate import parse_document, validate_document  # noqa: E402
from tests.models import TINY_MODEL_NAMES, tiny_model  # noqa: E402

TOLERANCE = {torch.float32: 1e-5, torch.float16: 5e-3}
# Models whose torch.compile and torch.export captures are the same op sequence. BERT and
# ViT differ for a real reason: Dynamo constant-folds the attention-mask construction
# that torch.export keeps as ops (iota, where, ...).
SAME_TRACE = {"gpt2", "llama", "resnet"}


def _tensors(output) -> list:
    if isinstance(output, torch.Tensor):
        return [output]
    if hasattr(output, "to_tuple"):
        output = output.to_tuple()
    return [t for item in output for t in _tensors(item)]


def _relative_error(actual, expected) -> float:
    errors = []
    for a, e in zip(_tensors(actual), _tensors(expected), strict=True):
        assert a.shape == e.shape and a.dtype == e.dtype
        assert torch.isfinite(a).all()
        errors.append((a.float() - e.float()).abs().max().item() / max(e.float().abs().max().item(), 1e-30))
    return max(errors)


def _compile(model, **options):
    """The default executor (plan in process, run the program on the simulator) with the
    fast baseline planner; CP-SAT plans of these models are tested in test_cpsat_planner."""
    torch._dynamo.reset()
    forget_compiled_regions()
    options.setdefault("planner", "heuristic")
    return torch.compile(model, backend="sticksat", dynamic=False, options=options)


@pytest.mark.parametrize("name", TINY_MODEL_NAMES)
def test_tiny_model_matches_eager_in_fp32_and_fp16(name, caplog):
    for dtype in (torch.float32, torch.float16):
        model, inputs = tiny_model(name, dtype)
        with torch.no_grad():
            expected = model(*inputs)
            with caplog.at_level(logging.WARNING, logger="sticksat"):
                actual = _compile(model, strict=True)(*inputs)
        error = _relative_error(actual, expected)
        assert error <= TOLERANCE[dtype], f"{name} {dtype}: relative error {error:.3g}"
        info = last_run_info()
        assert info.executor == "simulator" and info.latency_us > 0

        regions = compiled_regions()
        assert len(regions) == 1, "strict mode: the whole model is one sticksat region"
        doc = regions[0].doc
        parameters = [i for i in doc["inputs"] if i["kind"] == "parameter"]
        assert len(parameters) == len(list(model.parameters()))
        assert all(m["dtype"] == str(dtype).removeprefix("torch.") for m in (p["meta"] for p in parameters))
        # The document survives JSON unchanged: same hash after a round trip.
        document = parse_document(json.dumps(doc))
        validate_document(document)
        assert GraphDocument.from_json(document.to_json()).graph_hash() == regions[0].graph_hash
        if dtype == torch.float32:
            _check_export_path(model, inputs, document, same_trace=name in SAME_TRACE)


def _check_export_path(model, inputs, compiled: GraphDocument, same_trace: bool) -> None:
    """The torch.export path: the serialized program converts to exactly the document
    live capture gives (same ids, targets, metadata, hash), and, where both captures
    trace the same ops, to the torch.compile document up to naming."""
    with torch.no_grad():
        ep = torch.export.export(model, tuple(inputs), strict=False).run_decompositions(decomposition_table())
    live = GraphDocument.model_validate(exported_program_to_document(ep))
    serialized = document_from_export(serialize(ep).exported_program)
    assert [n.target for n in serialized.nodes] == [n.target for n in live.nodes]
    assert serialized.inputs == live.inputs  # kinds and parameter names too
    assert serialized.graph_hash() == live.graph_hash()
    validate_document(serialized)
    if same_trace:
        assert serialized.graph_hash() != compiled.graph_hash()  # different ids ...
        assert canonical_hash(serialized) == canonical_hash(compiled)  # ... same computation


class _DepthwiseBlock(torch.nn.Module):
    """A depthwise-separable block: depthwise 3x3 (bias), clamp against a per-channel tensor,
    grouped 1x1 (groups=2), plus an isinf mask: every op used to fall back to eager."""

    def __init__(self):
        super().__init__()
        self.dw = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.pw = torch.nn.Conv2d(8, 6, 1, groups=2)
        self.register_buffer("floor", torch.tensor([0.0, -0.3, 0.0, -0.1, 0.1, 0.0, -0.2, 0.0]).reshape(8, 1, 1))

    def forward(self, x):
        y = torch.clamp_min(self.dw(x), self.floor)
        return self.pw(y), torch.isinf(1 / y)  # inf where a 0 floor clamped


def test_depthwise_conv_model_runs_without_fallback(caplog):
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.float16):
        model, x = _DepthwiseBlock().eval().to(dtype), torch.randn(2, 8, 6, 6).to(dtype)
        with torch.no_grad():
            expected = model(x)
            with caplog.at_level(logging.INFO, logger="sticksat"):
                actual = _compile(model)(x)
        # No fallback: no WARNING, and the coverage INFO line counts nothing on CPU.
        assert [r.getMessage() for r in caplog.records if r.name == "sticksat" and r.levelno >= logging.WARNING] == []
        assert "ops on device in 1 region, 0 on CPU" in caplog.records[-1].getMessage()
        assert _relative_error(actual[:1], expected[:1]) <= TOLERANCE[dtype]
        assert torch.equal(actual[1], expected[1]) and expected[1].any()
        regions = compiled_regions()
        assert len(regions) == 1
        targets = [n["target"] for n in regions[0].doc["nodes"]]
        assert targets.count("aten.convolution.default") == 2
        assert {"aten.clamp_min.Tensor", "aten.isinf.default"} <= set(targets)
        assert last_run_info().executor == "simulator"


class _WithCumprod(torch.nn.Module):
    """A linear layer, a cumprod (no sticksat lowering; sort was the example until MoE
    routing lowered it) and more supported ops after it."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        y = torch.relu(self.fc(x))
        values = torch.cumprod(y, dim=-1)
        return (values * 2 + y).sum(-1), y


def test_unsupported_op_falls_back_with_one_log_line(caplog):
    torch.manual_seed(0)
    model, x = _WithCumprod().eval(), torch.randn(4, 16)
    with torch.no_grad():
        expected = model(x)
        with caplog.at_level(logging.INFO, logger="sticksat"):
            actual = _compile(model)(x)
    assert _relative_error(actual, expected) <= 1e-5
    lines = [r for r in caplog.records if r.name == "sticksat" and r.levelno >= logging.WARNING]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert "aten.cumprod" in lines[0].getMessage() and "eager" in lines[0].getMessage()
    # The supported ops before and after the cumprod ran as sticksat regions.
    regions = compiled_regions()
    assert len(regions) == 2
    targets = [{n["target"] for n in r.doc["nodes"]} for r in regions]
    assert any("aten.addmm.default" in t for t in targets)
    assert all("aten.cumprod.default" not in t for t in targets)


def test_strict_mode_raises_on_unsupported_op(monkeypatch):
    torch.manual_seed(0)
    model, x = _WithCumprod().eval(), torch.randn(4, 16)
    with torch.no_grad():
        with pytest.raises(Exception, match="unsupported_op.*aten.cumprod"):
            _compile(model, strict=True)(x)
        monkeypatch.setenv("STICKSAT_STRICT", "1")
        with pytest.raises(Exception, match="unsupported_op.*aten.cumprod"):
            _compile(model)(x)


def test_grad_mode_is_refused_or_runs_eager():
    torch.manual_seed(0)
    model, x = torch.nn.Linear(8, 4), torch.randn(2, 8)
    with pytest.raises(Exception) as info:
        _compile(model)(x)
    assert isinstance(info.value, SticksatBackendError) or "no_grad" in str(info.value)
    out = _compile(model, on_grad="eager")(x)
    assert out.requires_grad  # eager torch ran it, autograd intact
    assert torch.allclose(out, model(x))
    assert compiled_regions() == []


def test_unknown_option_is_rejected():
    from backend.options import BackendOptions

    with pytest.raises(BackendOptionError, match="stricct"):
        BackendOptions.from_mapping({"stricct": True}, environ={})
    assert BackendOptions.from_mapping({}, environ={"STICKSAT_STRICT": "1"}).strict is True
    assert BackendOptions.from_mapping({"strict": False}, environ={"STICKSAT_STRICT": "1"}).strict is False


def test_simulator_executor_runs_the_planned_program():
    """executor="simulator": the region is planned in process and its SuperDSC program
    runs on the simulator, which also reports a simulated latency."""
    from backend.region import last_run_info

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64)).eval()
    x = torch.randn(8, 64)
    with torch.no_grad():
        expected = model(x)
        actual = _compile(model, strict=True, executor="simulator", planner="heuristic")(x)
    assert _relative_error(actual, expected) <= 1e-5  # fp32 graph: fp32 storage, as in eager
    info = last_run_info()
    assert info.executor == "simulator"
    assert info.latency_us is not None and info.latency_us > 0


def test_node_refused_by_lowering_joins_the_fallback(monkeypatch, caplog):
    """An op in the support table whose arguments the lowering refuses (GraphError
    unsupported_op naming the node) is re-partitioned out to eager torch: still one log
    line, naming it; strict mode raises the lowering's error."""
    import backend.dynamo as dynamo
    from lowering.errors import GraphError

    real_compile_region = dynamo.compile_region

    def refusing_compile_region(doc, options):
        for node in doc["nodes"]:
            if node["target"] == "aten.mul.Tensor":
                raise GraphError("unsupported_op", "refused for this test", node["id"])
        return real_compile_region(doc, options)

    monkeypatch.setattr(dynamo, "compile_region", refusing_compile_region)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval()

    def forward(x):
        y = model(x)
        return (y * 3.0 + 1.0).sum(-1)

    x = torch.randn(4, 16)
    with torch.no_grad():
        expected = forward(x)
        with caplog.at_level(logging.INFO, logger="sticksat"):
            torch._dynamo.reset()
            forget_compiled_regions()
            actual = torch.compile(forward, backend="sticksat", dynamic=False)(x)
        assert _relative_error(actual, expected) <= 1e-5
        lines = [r.getMessage() for r in caplog.records if r.name == "sticksat" and r.levelno >= logging.WARNING]
        assert len(lines) == 1 and "aten.mul.Tensor x1" in lines[0], lines
        assert all("aten.mul.Tensor" not in {n["target"] for n in r.doc["nodes"]} for r in compiled_regions())
        with pytest.raises(Exception, match="refused for this test"):
            _compile(forward, strict=True)(x)


def test_entry_point_registers_the_backend():
    """`backend="sticksat"` resolves through the installed entry point, no import needed."""
    from importlib.metadata import entry_points

    from backend.dynamo import sticksat_backend

    (entry,) = [e for e in entry_points(group="torch_dynamo_backends") if e.name == "sticksat"]
    assert entry.load() is sticksat_backend
    assert "sticksat" in torch._dynamo.list_backends(exclude_tags=())
