"""torch.compile(model, backend="sticksat") with the service URL set compiles through a
real `sticksat serve` process: outputs equal eager for the tiny foundation models, the
second compile of the same graph is a cache hit in /metrics, and an unreachable service
is a clear error."""
from __future__ import annotations

import json

import pytest
import torch

from backend.remote import ServiceUnavailable, compile_remote_executable
from backend.region import compiled_regions, forget_compiled_regions
from models import TINY_MODEL_NAMES, tiny_model
from service_helpers import ServiceProcess, chain_graph, free_port

# fp32 throughout: the functional run stores fp32 and accumulates in fp32 like eager.
RTOL = ATOL = 1e-4


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("backend_service")
    proc = ServiceProcess(base / "store.sqlite", base / "server.log", ["--workers", "1", "--queue-limit", "16"])
    proc.start()
    yield proc
    proc.stop()


def _flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    flat = []
    for item in out:
        flat.extend(_flat(item) if not isinstance(item, torch.Tensor) else [item])
    return flat


class _Block(torch.nn.Module):
    """A small attention-free block (linear, gelu, layer norm, softmax): the default-suite
    stand-in for the foundation models, which are marked slow (torch.compile of each costs
    10-50 s on a shared 2-core machine)."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(64, 128)
        self.down = torch.nn.Linear(128, 64)
        self.norm = torch.nn.LayerNorm(64)

    def forward(self, x):
        h = self.norm(x + self.down(torch.nn.functional.gelu(self.up(x))))
        return torch.softmax(h, dim=-1)


def _model(name: str):
    if name == "block":
        torch.manual_seed(0)
        return _Block().eval(), (torch.randn(2, 8, 64),)
    return tiny_model(name, torch.float32)


MODEL_PARAMS = ["block"] + [pytest.param(n, marks=pytest.mark.slow) for n in TINY_MODEL_NAMES]


@pytest.mark.parametrize("name", MODEL_PARAMS)
def test_torch_compile_through_the_service_matches_eager(server, name, monkeypatch):
    model, inputs = _model(name)
    # The URL comes from the environment, as a developer would set it.
    monkeypatch.setenv("STICKSAT_URL", server.url)
    options = {"planner": "naive"}
    forget_compiled_regions()
    with torch.no_grad():
        expected = _flat(model(*inputs))
        torch._dynamo.reset()
        requests_before = server.metric("sticksat_requests_total", {"route": "/compile", "status": "200"})
        got = _flat(torch.compile(model, backend="sticksat", options=options)(*inputs))
    torch._dynamo.reset()
    assert server.metric("sticksat_requests_total", {"route": "/compile", "status": "200"}) > requests_before
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g, e, rtol=RTOL, atol=ATOL)
    regions = compiled_regions()
    assert regions and all(r.executable.executor == "service" for r in regions)

    # The same graph sent again (what a second process compiling this model sends) is
    # answered from the store, visibly in /metrics.
    hits_before = server.metric("sticksat_cache_hits_total")
    again = compile_remote_executable(regions[0].doc, options, url=server.url)
    assert again.cached and again.key == regions[0].executable.key
    assert server.metric("sticksat_cache_hits_total") == hits_before + 1
    assert again.last_latency_us > 0


def test_unreachable_service_is_a_clear_error():
    doc = chain_graph(rows=64)
    with pytest.raises(ServiceUnavailable, match="unavailable after 2 attempts"):
        compile_remote_executable(doc, {"planner": "naive", "retries": 1, "backoff_s": 0.01},
                                  url=f"http://127.0.0.1:{free_port()}")


def test_unreachable_service_from_torch_compile_raises_or_runs_eager_when_asked(caplog):
    """torch.compile with a dead service URL: a clear error by default; with
    on_service_error='eager' the model runs in eager torch with a warning."""
    torch.manual_seed(0)
    model, x = _Block().eval(), torch.randn(2, 8, 64)
    url = f"http://127.0.0.1:{free_port()}"
    forget_compiled_regions()
    with torch.no_grad():
        expected = model(x)
        torch._dynamo.reset()
        with pytest.raises(Exception, match="unavailable after"):
            torch.compile(model, backend="sticksat", options={"url": url})(x)
        torch._dynamo.reset()
        with caplog.at_level("WARNING", logger="sticksat"):
            got = torch.compile(model, backend="sticksat", options={"url": url, "on_service_error": "eager"})(x)
    torch._dynamo.reset()
    torch.testing.assert_close(got, expected)
    assert compiled_regions() == []
    assert any("unreachable" in r.getMessage() for r in caplog.records)


class _Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(64, 128)
        self.down = torch.nn.Linear(128, 64)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def test_compile_a_torch_export_serialized_program(server):
    """POST /compile {"export": <serialized exported program>} gives the same program
    (same graph hash, same store key) as the document captured live."""
    import httpx
    from torch._export.serde.serialize import serialize

    from backend.capture import capture, decomposition_table

    model, x = _Mlp().eval(), torch.randn(4, 64)
    with torch.no_grad():
        ep = torch.export.export(model, (x,), strict=False).run_decompositions(decomposition_table())
    exported = json.loads(serialize(ep).exported_program)
    options = {"planner": "naive", "deterministic": True}
    via_export = httpx.post(server.url + "/compile", json={"export": exported, "options": options}, timeout=120)
    assert via_export.status_code == 200, via_export.text
    via_doc = httpx.post(server.url + "/compile", json={"graph": capture(model, (x,)), "options": options},
                         timeout=120)
    assert via_doc.status_code == 200
    assert via_doc.json()["graph_hash"] == via_export.json()["graph_hash"]
    assert via_doc.json()["cached"] is True  # the export request stored it

    broken = dict(exported, graph_module={"graph": {"nodes": "not a list"}})
    resp = httpx.post(server.url + "/compile", json={"export": broken, "options": options}, timeout=60)
    assert resp.status_code == 422 and resp.headers["content-type"].startswith("application/problem+json")
