"""scatter (.value, .src) and scatter_add against torch eager in float32 and float16,
including FMS's mixture-of-experts block alignment (`moe_align_block_size`), which counts
tokens per expert with scatter.value and builds its expert-per-block table with
scatter_add."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lowering import lower_document
from target.interpreter import interpret
from tests.lowering_helpers import DocBuilder, capture_with_values, eager_outputs

FLOATS = [torch.float32, torch.float16]
IDS = ["fp32", "fp16"]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# (self shape, dim, index shape): index smaller than self in other dims too
CASES = [((6, 5), 1, (6, 3)), ((6, 5), 0, (4, 5)), ((8,), 0, (5,)), ((3, 7, 4), 1, (2, 9, 4)),
         ((4, 6), -1, (3, 1)), ((5, 4), 0, (5, 2))]


def _index(self_shape, dim, index_shape, seed):
    return torch.randint(0, self_shape[dim], index_shape, generator=_gen(seed))


@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
@pytest.mark.parametrize("self_shape,dim,index_shape", CASES)
def test_scatter_add_matches_torch(dtype, self_shape, dim, index_shape):
    x = torch.randn(self_shape, generator=_gen(1)).to(dtype)
    src = torch.randn([s + 1 for s in index_shape], generator=_gen(2)).to(dtype)  # src larger than index
    idx = _index(self_shape, dim, index_shape, 3)
    b = DocBuilder()
    out = b.call("aten.scatter_add.default", b.input(x), dim, b.input(idx), b.input(src))
    pg = b.check(out)
    assert any(op.kind == "reduce" for op in pg.ops) or index_shape[dim] == 1


@pytest.mark.parametrize("dtype", FLOATS + [torch.int64], ids=IDS + ["int64"])
@pytest.mark.parametrize("self_shape,dim,index_shape", CASES)
def test_scatter_value_matches_torch(dtype, self_shape, dim, index_shape):
    x = (torch.randn(self_shape, generator=_gen(4)) * 4).to(dtype)
    idx = _index(self_shape, dim, index_shape, 5)
    b = DocBuilder()
    out = b.call("aten.scatter.value", b.input(x), dim, b.input(idx), 2.5 if dtype.is_floating_point else 7)
    b.check(out)


@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
@pytest.mark.parametrize("self_shape,dim,index_shape", CASES)
def test_scatter_src_matches_torch_with_distinct_targets(dtype, self_shape, dim, index_shape):
    """Duplicate targets are unspecified in torch, so each row's index positions along dim
    get distinct targets here (a random permutation's prefix)."""
    q, J = self_shape[dim], index_shape[dim]
    if J > q:
        pytest.skip("more positions than targets: duplicates unavoidable")
    moved = list(index_shape)
    moved.append(moved.pop(dim % len(moved)))
    perms = torch.rand([*moved[:-1], q], generator=_gen(6)).argsort(dim=-1)[..., :J]
    idx = perms.movedim(-1, dim % len(index_shape)).contiguous()
    x = torch.randn(self_shape, generator=_gen(7)).to(dtype)
    src = torch.randn(index_shape, generator=_gen(8)).to(dtype)
    b = DocBuilder()
    b.check(b.call("aten.scatter.src", b.input(x), dim, b.input(idx), b.input(src)))


def test_scatter_src_duplicates_take_the_last_position():
    x = torch.zeros(5)
    idx = torch.tensor([1, 3, 1, 3])
    src = torch.tensor([10.0, 20.0, 30.0, 40.0])
    b = DocBuilder()
    out = b.call("aten.scatter.src", b.input(x), 0, b.input(idx), b.input(src))
    got = interpret(lower_document(b.document(out)), b.values)[0]
    np.testing.assert_array_equal(got, [0.0, 30.0, 0.0, 40.0, 0.0])


def test_scatter_add_accumulates_duplicates_exactly_in_int64():
    x = torch.zeros(6, dtype=torch.int64)
    idx = torch.tensor([0, 5, 5, 5, 2, 5, 0])
    b = DocBuilder()
    out = b.call("aten.scatter_add.default", b.input(x), 0, b.input(idx), b.input(torch.ones(7, dtype=torch.int64)))
    pg = b.check(out)
    assert interpret(pg, b.values)[0].tolist() == [2, 0, 1, 0, 0, 4]


def test_scatter_index_out_of_range_writes_nothing():
    """torch raises on an index outside [0, Q); the device has no error path, so such a
    position writes nothing (docs/ops.md)."""
    b = DocBuilder()
    idx = b.input(torch.tensor([0, 3, 1, 0]), name="idx")
    out = b.call("aten.scatter_add.default", b.input(torch.zeros(4)), 0, idx,
                 b.input(torch.tensor([1.0, 2.0, 4.0, 8.0])))
    b.values["idx"] = np.array([-1, 3, 4, 0])   # the graph's index input, now out of range twice
    got = interpret(lower_document(b.document(out)), b.values)[0]
    np.testing.assert_array_equal(got, [8.0, 0.0, 0.0, 2.0])


# -- FMS's block alignment: the scatters in their real context ------------------------------
class _Align(torch.nn.Module):
    """fms.triton.pytorch_ops.moe_align_block_size's tensor program (its outputs)."""

    def __init__(self, block_size: int, num_experts: int):
        super().__init__()
        self.block_size, self.num_experts = block_size, num_experts

    def forward(self, topk_ids):
        from fms.triton.pytorch_ops import moe_align_block_size

        return moe_align_block_size(topk_ids, self.block_size, self.num_experts)


@pytest.mark.parametrize("tokens,top_k,experts,block", [(6, 2, 4, 4), (16, 2, 8, 16), (3, 3, 4, 4)])
def test_fms_moe_align_block_size_lowers_and_matches(tokens, top_k, experts, block):
    pytest.importorskip("fms")
    g = _gen(tokens + experts)
    topk_ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)])
    model = _Align(block, experts)
    doc, values = capture_with_values(model, (topk_ids,))
    targets = {n.target for n in doc.nodes}
    assert {"aten.scatter.value", "aten.scatter_add.default"} <= targets, targets
    pg = lower_document(doc)
    got = interpret(pg, values)
    want = eager_outputs(model, (topk_ids,))
    # padded_token_ids_per_block is an argsort with ties (tokens of one expert, and the
    # padding ids, are equal keys) that torch does not order stably: what the MoE kernel
    # relies on is that it is a permutation putting the keys (expert ids) in sorted order.
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[2], want[2])
    n_pad = got[0].size - topk_ids.numel()
    cum_pad = np.cumsum([0] + [(-c) % block for c in np.bincount(topk_ids.reshape(-1).numpy(), minlength=experts)])
    pad_keys = np.searchsorted(cum_pad[1:-1], np.arange(n_pad), side="right")
    keys = np.concatenate([topk_ids.reshape(-1).numpy(), pad_keys])
    np.testing.assert_array_equal(np.sort(got[0]), np.arange(got[0].size))
    np.testing.assert_array_equal(keys[got[0]], keys[want[0]])
    np.testing.assert_array_equal(keys[got[0]], np.sort(keys))
