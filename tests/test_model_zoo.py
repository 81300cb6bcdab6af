"""The model zoo (tests/zoo.py): every family through torch.compile(backend="sticksat",
dynamic=False, options={"planner": "heuristic"}) under no_grad, in fp32 and fp16.

Each family must
- run at least 95% of its ATen ops inside sticksat regions (backend.coverage), with no
  graph left wholly to eager torch;
- match eager torch: max |compiled - eager| / max |eager| <= 1e-4 in fp32 and <= 1e-2 in
  fp16 (against the fp16 eager model; a family whose fp16 eager fails on CPU skips only
  its fp16 half, saying so).

Every family, MoE included (routing and grouped expert matmuls lower since 6e66dfb), runs
all its ops on device today, so any fallback op fails the test as a regression.
The table in docs/backend.md is these runs, written by scripts/zoo_table.py.
"""
from __future__ import annotations

import functools

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.zoo import MIN_DEVICE_FRACTION, TOLERANCE, ZOO, ZOO_NAMES, run_zoo_model  # noqa: E402

@functools.lru_cache(maxsize=None)
def _run(name: str, dtype: torch.dtype):
    return run_zoo_model(name, dtype)


def _params(names):
    return [pytest.param(n, marks=[pytest.mark.slow] if ZOO[n].slow else []) for n in names]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("name", _params(ZOO_NAMES))
def test_zoo_model_matches_eager_on_device(name, dtype):
    run = _run(name, dtype)
    if run.eager_failure is not None:
        assert dtype == torch.float16, f"{name}: fp32 eager torch failed: {run.eager_failure}"
        pytest.skip(f"{name}: fp16 eager torch fails on CPU ({run.eager_failure}); fp16 half skipped")
    cov = run.coverage
    assert cov.graphs, f"{name}: nothing was compiled"
    assert not cov.eager_graphs, f"{name}: whole graphs in eager torch: {cov.summary()}"
    assert run.error <= TOLERANCE[dtype], f"{name} {dtype}: relative error {run.error:.3g} vs eager"
    assert cov.device_fraction >= MIN_DEVICE_FRACTION, f"{name} {dtype}: {cov.summary()}"
    # Every family runs fully on device today: a new fallback op is a regression.
    assert cov.fallback_ops == {}, f"{name} {dtype}: {cov.summary()}"


def test_zoo_has_the_required_families():
    required = {"llama", "qwen2", "mistral", "falcon", "gpt_bigcode", "gemma", "gemma2", "gemma3_text", "phi3",
                "gpt2", "gpt_neox", "opt", "bloom", "t5", "bart", "bert", "roberta", "distilbert", "electra",
                "vit", "deit", "swin", "resnet", "convnext", "mixtral", "qwen2_moe"}
    assert required <= set(ZOO_NAMES)
    assert len(ZOO_NAMES) >= 15
