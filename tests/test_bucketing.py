"""Sequence-length bucketing: prompts of many lengths are served by one compiled graph per
bucket, and the real positions' outputs equal the unpadded eager model's."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import backend  # noqa: E402
from backend.bucketing import BucketError  # noqa: E402
from backend.region import forget_compiled_regions  # noqa: E402
from tests.models import tiny_model  # noqa: E402


@pytest.mark.parametrize("name", ["llama", "bert"])
def test_every_length_is_served_by_one_graph_per_bucket(name):
    torch._dynamo.reset()
    forget_compiled_regions()
    model, _ = tiny_model(name)
    compiled = torch.compile(model, backend="sticksat", dynamic=False, options={"planner": "heuristic"})
    serve = backend.bucketed(compiled, buckets=(8, 16))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad(), backend.track_coverage() as cov:
        for length in (5, 7, 8, 9, 13, 16):
            ids = torch.randint(0, 128, (1, length), generator=g)
            mask = torch.ones(1, length, dtype=torch.long)
            got = serve(ids, attention_mask=mask).last_hidden_state
            want = model(ids, attention_mask=mask).last_hidden_state
            assert got.shape == want.shape == (1, length, 64)
            assert (got - want).abs().max().item() <= 1e-4 * want.abs().max().item(), length
    assert serve.calls == {8: 3, 16: 3}
    # one Dynamo graph per bucket (the first call of each), however many lengths arrived
    assert len(cov.graphs) == 2


def test_bucketing_refuses_what_it_cannot_serve():
    serve = backend.bucketed(lambda ids, **kw: ids, buckets=(8,))
    with pytest.raises(BucketError, match="attention_mask"):
        serve(torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(BucketError, match="largest bucket 8"):
        serve(torch.zeros(1, 9, dtype=torch.long), attention_mask=torch.ones(1, 9))
    assert backend.bucketed(lambda ids, **kw: ids, buckets=(8,), mask_required=False)(
        torch.ones(1, 3, dtype=torch.long)).shape == (1, 3)
