"""Continuous batching with FMS's paged KV cache (tests/fms_paged_serving.py, driven as vLLM's
Spyre plugin drives it) and aiu-fms-testing-utils' own paged generate, compiled with the
sticksat backend in strict mode: every graph's ATen ops on the device, tokens equal to
eager CPU fp32's, their level-1 metrics within their thresholds, one program per shape."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("fms")

from backend.region import forget_compiled_regions  # noqa: E402
from tests.fms_paged_serving import BLOCK_SIZE, Request, continuous_batching, granite, level_1_metrics  # noqa: E402

OPTIONS = {"planner": "heuristic", "strict": True}
# aiu-fms-testing-utils' default level-1 thresholds for models without their own (per token:
# cross entropy, mean |softmax difference|) and the failure rate they allow
CE_THRESHOLD, DIFF_THRESHOLD, FAILURE_RATE = 3.0, 0.001, 0.01


def _requests(spec):
    g = torch.Generator().manual_seed(0)
    return [Request(torch.randint(1, 128, (n,), generator=g), tokens, arrival) for n, tokens, arrival in spec]


def test_driver_tokens_equal_each_request_generated_alone():
    """The driver's paging (shared tkv, left padding, block tables, blocks returned and
    reused) is right: every request's tokens equal FMS generate's for that prompt alone
    with the sdpa cache. Eager, no compile."""
    from fms.utils.generation import generate

    model = granite()
    # a 70-token prompt joining a running batch moves tkv up a block; the first request
    # leaves before the last one arrives, whose blocks come from the freed ones
    requests = _requests([(7, 5, 0), (12, 9, 0), (70, 4, 3), (30, 4, 9)])
    run = continuous_batching(model, requests, num_blocks=8)
    assert len(set(run.batch_sizes)) >= 3, run.batch_sizes
    for req, got in zip(requests, run.tokens):
        n = len(req.prompt)
        with torch.no_grad():
            out = generate(model, req.prompt[None], max_seq_len=n + req.max_tokens, max_new_tokens=req.max_tokens,
                           use_cache=True, do_sample=False, contiguous_cache=True,
                           extra_kwargs={"attn_name": "sdpa_causal", "last_n_tokens": 1, "mask": None,
                                         "position_ids": torch.arange(n)[None]})
        assert got == out[0, n:].tolist()


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_continuous_batching_on_device(dtype):
    """Batch sizes 3, 2, 1 between steps; prefills of one and two blocks. Strict: all ops on
    device; one program per (prefill length) and per (decode batch, block-table width); a
    second serving of the same requests compiles nothing. Against eager CPU fp32: fp32
    tokens equal (validation level 0); fp16, fed the CPU's tokens (their GoldenTokenHook),
    within their level-1 thresholds on every token."""
    pytest.importorskip("aiu_fms_testing_utils", reason="installed with --no-deps from requirements-nodeps.txt")
    forget_compiled_regions()
    torch._dynamo.reset()
    requests = _requests([(7, 4, 0), (12, 6, 0), (70, 3, 2)])
    reference = continuous_batching(granite(), requests)
    compiled = torch.compile(granite(dtype=dtype), backend="sticksat", dynamic=False, options=OPTIONS)
    run = continuous_batching(compiled, requests)
    if dtype == torch.float32:
        assert run.tokens == reference.tokens
    assert set(run.batch_sizes) == {1, 2, 3}
    cov = run.coverage
    assert cov.device_fraction == 1.0 and not cov.eager_graphs and cov.graph_breaks == 0
    shapes = {(s.kind, s.batch, s.shape) for s in run.steps}
    assert len(cov.graphs) == len(shapes) == 5        # prefill 64, 128; decode (3, 3), (2, 2), (1, 2)
    assert all(g.sizes for g in cov.graphs)           # every graph symbolic, specialized per shape
    assert {s.shape[0] for s in run.steps if s.kind == "prefill"} == {BLOCK_SIZE, 2 * BLOCK_SIZE}
    fed = run if dtype == torch.float32 else continuous_batching(compiled, requests, golden=reference.tokens)
    metrics = level_1_metrics(fed, reference)
    assert len(metrics) == sum(r.max_tokens for r in requests)
    self_ce = level_1_metrics(reference, reference)
    for (_, _, (ce, diff)), (_, _, (ce_ref, _)) in zip(metrics, self_ce):
        assert diff < DIFF_THRESHOLD and ce < CE_THRESHOLD
        assert abs(ce - ce_ref) < (1e-4 if dtype == torch.float32 else 1e-2)  # the reference's own entropy
    again = continuous_batching(compiled, requests)
    assert again.tokens == run.tokens and again.coverage is None


@pytest.mark.slow
def test_aiu_paged_generate_on_device(monkeypatch):
    """aiu-fms-testing-utils' own `utils.paged.generate` (per-sequence prefills, a batched
    paged decode, its Dynamo marks) drives the compiled model: all ops on device, tokens
    equal to the eager run's, logits within 1e-5."""
    pytest.importorskip("aiu_fms_testing_utils", reason="installed with --no-deps from requirements-nodeps.txt")
    import backend
    from aiu_fms_testing_utils.testing.validation import LogitsExtractorHook
    from aiu_fms_testing_utils.utils.paged import generate
    from fms.utils.generation import pad_input_ids

    from tests.fms_paged_serving import paged_dynamo_settings

    monkeypatch.setenv("VLLM_DT_MAX_BATCH_SIZE", "2")
    monkeypatch.setenv("VLLM_DT_MAX_CONTEXT_LEN", "256")
    forget_compiled_regions()
    torch._dynamo.reset()
    model = granite()
    g = torch.Generator().manual_seed(1)
    ids, kwargs = pad_input_ids([torch.randint(1, 128, (n,), generator=g) for n in (7, 70)], min_pad_length=128)
    kwargs = {**kwargs, "attn_name": "spyre_paged_attn", "last_n_tokens": BLOCK_SIZE}

    def run(m):
        hook = LogitsExtractorHook()
        with paged_dynamo_settings(), torch.no_grad(), backend.track_coverage() as cov:
            out = generate(m, ids, max_new_tokens=4, use_cache=True, do_sample=False, post_iteration_hook=hook,
                           extra_kwargs=dict(kwargs))
        return out, hook.extracted_logits, cov

    want, want_logits, _ = run(model)
    got, got_logits, cov = run(torch.compile(model, backend="sticksat", dynamic=False, options=OPTIONS))
    assert torch.equal(got, want)
    assert float((got_logits - want_logits).abs().max() / want_logits.abs().max()) < 1e-5
    assert cov.device_fraction == 1.0 and not cov.eager_graphs
    assert len(cov.graphs) == 3   # prefills of 64 and 128 tokens (batch 1 each), one decode shape


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "gpt_bigcode"])
def test_continuous_batching_other_families_on_device(family):
    """The other FMS families vLLM's Spyre plugin serves with continuous batching (the zoo's
    tiny configs: prompts and tokens within their 64 positions, so one block): strict, all
    ops on device, tokens equal to CPU fp32 while the batch shrinks 3 -> 2 -> 1."""
    from tests.fms_zoo import build

    forget_compiled_regions()
    torch._dynamo.reset()
    model, _ = build(family)
    model.eval()
    requests = _requests([(7, 5, 0), (12, 8, 0), (20, 4, 2)])
    reference = continuous_batching(model, requests)
    run = continuous_batching(torch.compile(model, backend="sticksat", dynamic=False, options=OPTIONS), requests)
    assert run.tokens == reference.tokens
    assert set(run.batch_sizes) == {1, 2, 3}
    assert run.coverage.device_fraction == 1.0 and not run.coverage.eager_graphs
