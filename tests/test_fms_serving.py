"""The static-batching serving loop of FMS (prefill, then 32 decode steps with the sdpa KV
cache; tests/fms_serving.py) compiled with the sticksat backend in strict mode: every
graph's ATen ops on the device, the generated tokens equal to eager CPU fp32's."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("fms")

from backend.region import forget_compiled_regions  # noqa: E402
from tests.fms_serving import compile_for_serving, max_logit_error, static_batching  # noqa: E402
from tests.fms_zoo import build  # noqa: E402

OPTIONS = {"planner": "heuristic", "strict": True}


def _prompts():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(1, 128, (n,), generator=g) for n in (7, 12)]  # two lengths: left padding


@pytest.mark.slow
def test_static_batching_32_decode_steps_on_device():
    """FMS's default Dynamo settings (the KV cache marked dynamic): the decode steps share
    one symbolic Dynamo graph, specialized per KV length; a second generate is all hits."""
    forget_compiled_regions()
    model, _ = build("granite")
    prompts = _prompts()
    reference = static_batching(model, prompts, 33)
    compiled = compile_for_serving(model, OPTIONS)
    run = static_batching(compiled, prompts, 33, dynamo="mark_dynamic")
    assert torch.equal(run.tokens, reference.tokens)
    assert all(len(set(row[-33:].tolist())) > 3 for row in reference.tokens)  # not a degenerate repeat
    assert max_logit_error(run, reference) <= 1e-4
    cov = run.coverage
    assert cov.device_fraction == 1.0 and not cov.eager_graphs and cov.graph_breaks == 0
    # the prefill graph, and one symbolic decode graph compiled for each of the 32 KV lengths
    assert run.dynamo_graphs == 2 and run.programs == 33
    assert [g.sizes != "" for g in cov.graphs] == [False] + [True] * 32
    again = static_batching(compiled, prompts, 33, dynamo="mark_dynamic")
    assert torch.equal(again.tokens, reference.tokens) and not again.coverage.graphs


def test_static_batching_with_static_dynamo_settings():
    """The Spyre scripts' settings without --compile_dynamic: Dynamo recompiles each step."""
    forget_compiled_regions()
    model, _ = build("granite")
    prompts = _prompts()
    reference = static_batching(model, prompts, 4)
    run = static_batching(compile_for_serving(model, OPTIONS), prompts, 4, dynamo="static")
    assert torch.equal(run.tokens, reference.tokens) and max_logit_error(run, reference) <= 1e-4
    assert run.coverage.device_fraction == 1.0 and run.programs == run.dynamo_graphs == 4
    assert not any(g.sizes for g in run.coverage.graphs)


def test_prefill_buckets_pad_the_fms_mask_and_cut_the_cache_back():
    """A symbolic FMS prefill padded by the backend: prompts of 5, 9, 12 and 17 tokens run as
    two programs (buckets 16 and 32); logits and the returned KV cache are cut back to the
    real length and equal eager's. The additive mask is padded with the lowest finite
    float (a -inf pad is refused: it would make the padded rows NaN)."""
    from fms.utils.generation import pad_input_ids

    torch._dynamo.reset()
    forget_compiled_regions()
    model, _ = build("granite")
    options = {**OPTIONS, "buckets": {"x.1": 16, "mask.2": 16, "mask.3": 16, "position_ids.1": 16},
               "pad_values": {"x": 0, "mask": torch.finfo(torch.float32).min, "position_ids": 0}}
    compiled = torch.compile(model, backend="sticksat", dynamic=True, options=options)
    g = torch.Generator().manual_seed(0)
    import backend

    with torch.no_grad(), backend.track_coverage() as cov:
        for n in (5, 9, 12, 17):
            ids, padding = pad_input_ids([torch.randint(1, 128, (k,), generator=g) for k in (n - 2, n)])
            kwargs = {**padding, "attn_name": "sdpa_causal", "use_cache": True}
            kwargs["mask"] = kwargs["mask"].unsqueeze(1)
            want, want_cache = model(ids, **kwargs)
            got, got_cache = compiled(ids, **kwargs)
            assert got.shape == want.shape == (2, n, 128)
            assert ((got - want).abs().max() / want.abs().max()).item() <= 1e-5
            for got_kv, want_kv in zip(got_cache, want_cache):
                assert got_kv[0].shape == want_kv[0].shape == (2, 2, n, 16)
                assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got_kv, want_kv))
    assert len(cov.graphs) == 2 and cov.device_fraction == 1.0
    assert "5->16" in cov.graphs[0].sizes and "17->32" in cov.graphs[1].sizes
