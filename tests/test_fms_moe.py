"""Foundation Model Stack's mixture of experts on device: the custom op `moe::moe_mm`
against FMS's own CPU kernel (fp32, fp16), and FMS's MOEFeedForward layer (router top-k,
block alignment with scatter/scatter_add, two moe_mm expert matmuls) lowered whole and
run through torch.compile(backend="sticksat") with nothing left to eager torch."""
from __future__ import annotations

import logging

import pytest
import torch

from lowering import lower_document, node_supported
from target.interpreter import interpret
from tests.lowering_helpers import DocBuilder, assert_close, capture_with_values, eager_outputs, to_numpy

fms_ops = pytest.importorskip("fms.triton.pytorch_ops")  # registers moe::moe_mm and its CPU kernel

FLOATS = [torch.float32, torch.float16]
IDS = ["fp32", "fp16"]


def _gen(seed):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
@pytest.mark.parametrize("tokens,topk,experts", [(6, 2, 4), (9, 1, 3), (5, 3, 8)])
def test_moe_mm_matches_fms_cpu_kernel(dtype, tokens, topk, experts):
    D, N = 24, 40
    x = torch.randn(tokens, D, generator=_gen(1)).to(dtype)
    w = (torch.randn(experts, N, D, generator=_gen(2)) / D ** 0.5).to(dtype)
    mapping = torch.randint(0, experts, (tokens, topk), generator=_gen(3))
    mapping[0, -1] = experts   # an id no expert has: FMS's kernel leaves that row 0
    align = fms_ops.moe_align_block_size(mapping.clamp(max=experts - 1), 16, experts)
    b = DocBuilder()
    out = b.call("moe.moe_mm.default", b.input(x), b.input(w, kind="parameter"), b.input(mapping),
                 *[b.input(t) for t in align], topk, 16)
    pg = b.check(out)
    gm = [op for op in pg.ops if op.kind == "grouped_matmul"]
    assert len(gm) == 1 and [d.size for d in gm[0].iter_dims] == [tokens * topk, N, D, experts]
    assert (interpret(pg, b.values)[0][0, -1] == 0).all()


def test_moe_mm_as_fms_calls_it_second_time_topk_1():
    """The down projection: input already one row per (token, slot), topk=1."""
    T, A, E, H, D = 4, 2, 4, 16, 8
    mapping = torch.randint(0, E, (T, A), generator=_gen(5))
    align = fms_ops.moe_align_block_size(mapping, 16, E)
    b = DocBuilder()
    out = b.call("moe.moe_mm.default", b.input(torch.randn(T * A, H, generator=_gen(6))),
                 b.input(torch.randn(E, D, H, generator=_gen(7)), kind="parameter"), b.input(mapping),
                 *[b.input(t) for t in align], 1, 16)
    pg = b.check(out)
    assert not any(op.kind == "copy" and op.output.tensor.endswith(".rows") for op in pg.ops)


def _moe_layer(dtype, seed=0, use_bias=False):
    from fms.modules.feedforward import MOEFeedForward

    torch.manual_seed(seed)
    layer = MOEFeedForward(num_experts=4, num_activated_experts=2, dim=32, intermediate_size=48, use_bias=use_bias)
    layer.reset_parameters()
    with torch.no_grad():
        for p in layer.parameters():   # FMS's init (std 0.02) makes every expert output ~0
            p.normal_(0, 0.2)
    return layer.eval().to(dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
@pytest.mark.parametrize("use_bias", [False, True], ids=["glu", "bias_swiglu"])
def test_fms_moe_feedforward_lowers_whole_and_matches_eager(dtype, use_bias):
    layer = _moe_layer(dtype, use_bias=use_bias)
    x = torch.randn(1, 8, 32, generator=_gen(9)).to(dtype)
    doc, values = capture_with_values(layer, (x,))
    targets = [n.target for n in doc.nodes]
    assert targets.count("moe.moe_mm.default") == 2
    assert all(node_supported(n.target) for n in doc.nodes), [t for t in targets if not node_supported(t)]
    pg = lower_document(doc)
    assert sum(op.kind == "grouped_matmul" for op in pg.ops) == 2
    got = interpret(pg, values)
    assert_close(got[0], eager_outputs(layer, (x,))[0], dtype, "MOEFeedForward")


@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
def test_fms_moe_feedforward_compiles_with_no_fallback(dtype, caplog):
    torch._dynamo.reset()
    layer = _moe_layer(dtype, seed=1)
    x = torch.randn(2, 8, 32, generator=_gen(10)).to(dtype)
    with torch.no_grad():
        want = layer(x)
    compiled = torch.compile(layer, backend="sticksat", dynamic=False, options={"planner": "heuristic", "strict": True})
    with caplog.at_level(logging.WARNING):
        with torch.no_grad():
            got = compiled(x)
    messages = " ".join(r.getMessage() for r in caplog.records if "sticksat" in r.getMessage())
    assert "eager torch" not in messages and "failed" not in messages, messages
    assert_close(to_numpy(got), to_numpy(want), dtype, "compiled MOEFeedForward")


def test_without_the_lowering_the_layer_would_fall_back():
    """The strict compile above is meaningful: moe_mm is a custom op the partitioner only
    keeps on device because it is registered (an unknown namespace op is refused)."""
    assert node_supported("moe.moe_mm.default")
    assert not node_supported("moe.moe_mm_unknown.default")
