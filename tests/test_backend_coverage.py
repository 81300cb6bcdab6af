"""The backend's coverage report (backend/coverage.py): one INFO line per compiled graph,
device vs CPU op counts, fallback ops by target, whole-graph fallback reasons (each with a
WARNING), graph breaks and recompiles, and the process-wide API exported by `backend`."""
from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")

import backend  # noqa: E402
from backend.coverage import DYNAMIC_SHAPES, GRAD_MODE, SERIALIZATION, SERVICE_UNREACHABLE  # noqa: E402
from backend.region import forget_compiled_regions  # noqa: E402


def _compile(fn, **options):
    torch._dynamo.reset()
    forget_compiled_regions()
    options.setdefault("planner", "heuristic")
    dynamic = options.pop("dynamic", False)
    return torch.compile(fn, backend="sticksat", dynamic=dynamic, options=options)


def _lines(caplog, level):
    return [r.getMessage() for r in caplog.records if r.name == "sticksat" and r.levelno == level]


class _WithCumprod(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        y = torch.relu(self.fc(x))
        values = torch.cumprod(y, dim=-1)  # no sticksat lowering
        return (values * 2 + y).sum(-1), y


def test_fully_supported_graph_is_all_on_device(caplog):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).eval()
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="sticksat"), backend.track_coverage() as cov:
        _compile(model)(torch.randn(2, 8))
    (g,) = cov.graphs
    assert g.total_ops == g.device_ops > 0 and g.cpu_ops == 0 and g.regions == 1
    assert g.fallback_ops == {} and g.reason is None and g.level == "aten"
    assert g.compile_id == "0/0" and not g.recompile and not g.graph_break and g.compile_seconds > 0
    assert cov.device_fraction == 1.0
    assert _lines(caplog, logging.WARNING) == []
    (info,) = _lines(caplog, logging.INFO)
    assert f"{g.device_ops} of {g.total_ops} ops on device in 1 region, 0 on CPU" in info


def test_partial_fallback_counts_ops_by_target(caplog):
    torch.manual_seed(0)
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="sticksat"), backend.track_coverage() as cov:
        _compile(_WithCumprod().eval())(torch.randn(4, 16))
    (g,) = cov.graphs
    assert g.fallback_ops == {"aten.cumprod.default": 1} and g.cpu_ops == 1
    assert g.device_ops == g.total_ops - 1 and g.regions == 2 and g.reason is None
    (warning,) = _lines(caplog, logging.WARNING)
    assert warning == f"sticksat: 1 of {g.total_ops} ops fall back to eager torch: aten.cumprod.default x1"
    (info,) = _lines(caplog, logging.INFO)
    assert "1 on CPU (aten.cumprod.default x1)" in info and "in 2 regions" in info
    assert cov.fallback_ops == {"aten.cumprod.default": 1}
    assert "aten.cumprod.default x1" in cov.summary()


def test_grad_mode_whole_graph_fallback_names_the_reason(caplog):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    with caplog.at_level(logging.INFO, logger="sticksat"), backend.track_coverage() as cov:
        _compile(model, on_grad="eager")(torch.randn(2, 8))
    (g,) = cov.graphs
    assert g.reason.startswith(GRAD_MODE) and g.level == "torch"
    assert g.device_ops == 0 and g.cpu_ops == g.total_ops >= 1 and g.regions == 0
    (warning,) = _lines(caplog, logging.WARNING)
    assert GRAD_MODE in warning and "eager torch" in warning
    assert cov.eager_graphs == [g] and GRAD_MODE in cov.summary()


def test_dynamic_shapes_are_specialized_per_size_not_eager(caplog):
    def f(x):
        return torch.relu(x) * 2

    with torch.no_grad(), caplog.at_level(logging.INFO, logger="sticksat"), backend.track_coverage() as cov:
        out = _compile(f, dynamic=True)(torch.randn(3, 4))
    assert out.shape == (3, 4)
    (g,) = cov.graphs
    assert g.reason is None and g.device_ops == g.total_ops == 2 and "=3" in g.sizes and "=4" in g.sizes
    assert _lines(caplog, logging.WARNING) == []
    (info,) = _lines(caplog, logging.INFO)
    assert "specialized for" in info and DYNAMIC_SHAPES not in info


def test_serialization_error_whole_graph_fallback(monkeypatch, caplog):
    import backend.dynamo as dynamo
    from backend.capture import CaptureError

    def refuse(*args, **kwargs):
        raise CaptureError("refused for this test")

    monkeypatch.setattr(dynamo, "graph_to_document", refuse)
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="sticksat"), backend.track_coverage() as cov:
        x = torch.randn(3, 4)
        assert torch.equal(_compile(lambda t: t + 1)(x), x + 1)
    (g,) = cov.graphs
    assert g.reason.startswith(SERIALIZATION) and "refused for this test" in g.reason
    assert g.device_ops == 0 and g.cpu_ops == g.total_ops == 1 and g.fallback_ops == {"aten.add.Tensor": 1}
    (warning,) = _lines(caplog, logging.WARNING)
    assert SERIALIZATION in warning and "refused for this test" in warning


def test_unreachable_service_whole_graph_fallback(monkeypatch, caplog):
    import backend.dynamo as dynamo
    from backend.remote import ServiceUnavailable

    def unreachable(doc, options):
        raise ServiceUnavailable("no service for this test")

    monkeypatch.setattr(dynamo, "compile_region", unreachable)
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="sticksat"), backend.track_coverage() as cov:
        x = torch.randn(3, 4)
        assert torch.equal(_compile(lambda t: t * 3, on_service_error="eager")(x), x * 3)
    (g,) = cov.graphs
    assert g.reason.startswith(SERVICE_UNREACHABLE) and g.device_ops == 0
    (warning,) = _lines(caplog, logging.WARNING)
    assert "unreachable" in warning and "eager torch" in warning


def test_graph_breaks_and_recompiles_are_counted():
    def f(x):
        y = torch.relu(x) + 1
        torch._dynamo.graph_break()
        return y * 2

    with torch.no_grad(), backend.track_coverage() as cov:
        compiled = _compile(f)
        compiled(torch.randn(2, 4))
    assert len(cov.graphs) == 2 and cov.graph_breaks == 1 and cov.recompiles == 0
    assert cov.graphs[1].graph_break and cov.graphs[1].code.startswith("torch_dynamo_resume_in_f")
    with torch.no_grad(), backend.track_coverage() as again:
        compiled(torch.randn(3, 4))  # another static shape: Dynamo recompiles both frames
    assert again.recompiles == 2 and all(g.compile_id.endswith("/1") for g in again.graphs)


def test_process_report_accumulates_and_resets():
    backend.reset_coverage()
    with torch.no_grad():
        _compile(lambda t: t - 1)(torch.randn(2, 2))
        _compile(_WithCumprod().eval())(torch.randn(4, 16))
    report = backend.coverage_report()
    assert isinstance(report, backend.CoverageReport) and len(report.graphs) == 2
    assert [g.index for g in report.graphs] == [1, 2]
    assert report.total_ops == sum(g.total_ops for g in report.graphs)
    assert report.cpu_ops == 1 and report.regions == 3
    data = report.to_dict()
    assert data["fallback_ops"] == {"aten.cumprod.default": 1} and len(data["per_graph"]) == 2
    assert isinstance(report.graphs[0], backend.GraphCoverage)
    backend.reset_coverage()
    assert backend.coverage_report().graphs == []


def test_as_strided_restride_runs_on_device():
    """A keepdim reduction followed by a restride of its size-1 dims (Swin's adaptive
    average pooling) lowers as a view instead of falling back."""

    def f(x):
        m = x.mean(dim=(-1, -2), keepdim=True)
        return torch.as_strided(m, (2, 8, 1, 1), (8, 1, 8, 8)).squeeze(-1) + 1

    x = torch.randn(2, 8, 3, 3)
    with torch.no_grad(), backend.track_coverage() as cov:
        out = _compile(f)(x)
    assert torch.allclose(out, f(x), atol=1e-6)
    assert cov.fallback_ops == {} and cov.device_fraction == 1.0


def test_a_graph_with_an_empty_tensor_runs_in_eager_torch_with_its_reason(caplog):
    """Graph format v1 has no empty tensors (422 zero_size at the service); the backend runs
    such a graph in eager torch and says why, instead of failing the user's model."""
    import torch

    from backend import track_coverage

    class Cat(torch.nn.Module):
        def forward(self, x, e):
            return torch.cat([x, e], dim=1) * 2

    torch._dynamo.reset()
    x, e = torch.randn(4, 64), torch.randn(4, 0)
    compiled = torch.compile(Cat(), backend="sticksat", dynamic=False, options={"planner": "heuristic"})
    with torch.no_grad(), track_coverage() as cov, caplog.at_level("WARNING", logger="sticksat"):
        out = compiled(x, e)
    assert torch.equal(out, torch.cat([x, e], dim=1) * 2)
    assert cov.graphs and cov.graphs[-1].reason.startswith("zero_size")
    assert any("zero_size" in r.message for r in caplog.records)
