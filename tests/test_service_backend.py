"""torch.compile(model, backend="sticksat") with the service URL set compiles through a
real `sticksat serve` process: outputs equal eager for the tiny foundation models, the
second compile of the same graph is a cache hit in /metrics, and an unreachable service
is a clear error."""
from __future__ import annotations

import pytest
import torch

from backend.remote import ServiceUnavailable, compile_remote_executable
from backend.capture import capture
from models import TINY_MODEL_NAMES, tiny_model
from service_helpers import ServiceProcess, free_port

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


@pytest.mark.parametrize("name", TINY_MODEL_NAMES)
def test_torch_compile_through_the_service_matches_eager(server, name):
    model, inputs = tiny_model(name, torch.float32)
    options = {"url": server.url, "planner": "naive"}
    with torch.no_grad():
        expected = _flat(model(*inputs))
        torch._dynamo.reset()
        requests_before = server.metric("sticksat_requests_total", {"route": "/compile", "status": "200"})
        got = _flat(torch.compile(model, backend="sticksat", options=options)(*inputs))
        assert server.metric("sticksat_requests_total", {"route": "/compile", "status": "200"}) > requests_before
        for e, g in zip(expected, got, strict=True):
            torch.testing.assert_close(g, e, rtol=RTOL, atol=ATOL)

        # The same graph compiled again (a fresh dynamo cache) is answered from the store.
        hits_before = server.metric("sticksat_cache_hits_total")
        torch._dynamo.reset()
        again = _flat(torch.compile(model, backend="sticksat", options=options)(*inputs))
        assert server.metric("sticksat_cache_hits_total") > hits_before
        for e, g in zip(expected, again, strict=True):
            torch.testing.assert_close(g, e, rtol=RTOL, atol=ATOL)
    torch._dynamo.reset()


def test_remote_executable_runs_the_served_program(server):
    model, inputs = tiny_model("gpt2", torch.float32)
    doc = capture(model, inputs)
    executable = compile_remote_executable(doc, {"planner": "naive"}, url=server.url)
    assert executable.program.format == "sticksat.superdsc" and executable.last_latency_us > 0


def test_unreachable_service_is_a_clear_error():
    model, inputs = tiny_model("gpt2", torch.float32)
    doc = capture(model, inputs)
    with pytest.raises(ServiceUnavailable, match="unavailable after 2 attempts"):
        compile_remote_executable(doc, {"planner": "naive", "retries": 1, "backoff_s": 0.01},
                                  url=f"http://127.0.0.1:{free_port()}")
