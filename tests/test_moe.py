"""Mixture of experts on device (issue 12): the routing lowerings (topk, sort, histc,
index_put) and the grouped expert matmul against torch, every planner on an MoE layer
(validated, functional run == interpreter), tiny Mixtral / Qwen2-MoE through
torch.compile with nothing falling back, and the share of matmul FLOPs on device."""
from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch

from lowering import lower_document, node_supported
from lowering.graph_format import GraphDocument
from target.interpreter import interpret
from tests.lowering_helpers import DocBuilder, assert_close, to_numpy

FLOATS = [torch.float32, torch.float16]


def rnd(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed + 11 * len(shape) + sum(shape))
    return torch.randn(*shape, generator=g).to(dtype)


# -- topk ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS, ids=["fp32", "fp16"])
@pytest.mark.parametrize("shape,k,dim", [((16, 4), 2, -1), ((16, 8), 2, -1), ((5, 60), 4, 1), ((8, 3, 6), 3, 1),
                                         ((7,), 1, 0)])
def test_topk_matches_torch(dtype, shape, k, dim):
    # a random permutation per row: distinct values, so torch's indices are unambiguous
    g = torch.Generator().manual_seed(len(shape) + k)
    x = torch.rand(*shape, generator=g).argsort(dim=dim).to(dtype) / 8 - 1
    b = DocBuilder()
    vals, idx = b.call("aten.topk.default", b.input(x), k, dim)
    pg = b.check(vals, idx)
    assert {op.kind for op in pg.ops} <= {"fill", "reduce", "gather", "copy"}


def test_topk_nan_is_largest_and_ties_take_the_lowest_index():
    x = torch.tensor([[1.0, float("nan"), 3.0, float("nan")],
                      [0.5, 0.5, 0.5, 0.5],
                      [-math.inf, -math.inf, 2.0, -math.inf],
                      [0.25, 0.75, 0.75, 0.1]])
    b = DocBuilder()
    vals, idx = b.call("aten.topk.default", b.input(x), 3)
    pg = lower_document(b.document(vals, idx))
    got_v, got_i = interpret(pg, b.values)
    want_v = torch.topk(x, 3).values.numpy()
    np.testing.assert_array_equal(got_v, want_v)  # values (NaN included) agree with torch
    # indices: ties in order of position (a stable descending sort, NaN first)
    key = torch.where(x.isnan(), torch.tensor(math.inf), x)
    want_i = torch.sort(-key, dim=-1, stable=True).indices[:, :3].numpy()
    np.testing.assert_array_equal(got_i, want_i)


# -- sort ----------------------------------------------------------------------------------
@pytest.mark.parametrize("descending", [False, True])
def test_sort_int_ids_matches_torch_stable(descending):
    ids = torch.randint(0, 4, (32,), generator=torch.Generator().manual_seed(3))
    b = DocBuilder()
    vals, perm = b.call("aten.sort.stable", b.input(ids), stable=True, dim=0, descending=descending)
    b.check(vals, perm)


def test_sort_default_floats_with_nan():
    x = rnd(4, 9)
    x[1, 3] = float("nan")
    x[2, :3] = 0.5
    b = DocBuilder()
    vals, perm = b.call("aten.sort.default", b.input(x), 1)
    pg = lower_document(b.document(vals, perm))
    got_v, got_p = interpret(pg, b.values)
    want = torch.sort(x, dim=1, stable=True)
    np.testing.assert_array_equal(got_v, want.values.numpy())
    np.testing.assert_array_equal(got_p, want.indices.numpy())


# -- histc ---------------------------------------------------------------------------------
@pytest.mark.parametrize("bins,lo,hi", [(4, 0, 3), (8, 0, 7), (10, -1.5, 2.0), (7, 0.1, 0.9)])
def test_histc_matches_torch(bins, lo, hi):
    g = torch.Generator().manual_seed(bins)
    x = torch.cat([torch.randint(0, bins, (40,), generator=g).float(),
                   torch.rand(200, generator=g) * (hi - lo + 1) + lo - 0.5,
                   torch.linspace(lo, hi, bins + 1), torch.tensor([float("nan"), lo, hi])])
    b = DocBuilder()
    b.check(b.call("aten.histc.default", b.input(x), bins, lo, hi))


# -- index_put -----------------------------------------------------------------------------
def test_index_put_inverse_permutation():
    perm = torch.randperm(32, generator=torch.Generator().manual_seed(1))
    b = DocBuilder()
    empty = b.call("aten.empty.memory_format", [32], dtype=torch.int64, device=torch.device("cpu"),
                   pin_memory=False)
    iota = b.call("prims.iota.default", 32, start=0, step=1, dtype=torch.int64, device=torch.device("cpu"),
                  requires_grad=False)
    out = b.call("aten.index_put.default", empty, [b.input(perm)], iota)
    b.check(out)


@pytest.mark.parametrize("dtype", FLOATS, ids=["fp32", "fp16"])
def test_index_put_rows_negative_indices_and_broadcast_values(dtype):
    x = rnd(10, 6, dtype=dtype)
    idx = torch.tensor([3, -1, 0, 7])
    b = DocBuilder()
    xi = b.input(x)
    rows = b.call("aten.index_put.default", xi, [b.input(idx)], b.input(rnd(4, 6, dtype=dtype, seed=2)))
    bcast = b.call("aten.index_put.default", xi, [b.input(idx)], b.input(rnd(6, dtype=dtype, seed=3)))
    b.check(rows, bcast)


# -- grouped matmul ------------------------------------------------------------------------
def _grouped_op():
    import transformers.integrations.moe  # noqa: F401  (registers transformers::grouped_mm_fallback)

    return "transformers.grouped_mm_fallback.default"


@pytest.mark.parametrize("dtype", FLOATS, ids=["fp32", "fp16"])
@pytest.mark.parametrize("counts", [[5, 0, 9, 2], [0, 0, 16, 0], [3, 3, 3, 3]])
def test_grouped_mm_matches_torch(dtype, counts):
    S, K, N = 16, 24, 40
    offs = torch.tensor(np.cumsum(counts), dtype=torch.int32)  # [3,3,3,3]: rows 12.. are zero
    b = DocBuilder()
    out = b.call(_grouped_op(), b.input(rnd(S, K, dtype=dtype)), b.input(rnd(4, K, N, dtype=dtype, seed=1),
                                                                         kind="parameter"), b.input(offs))
    pg = b.check(out)
    gm = [op for op in pg.ops if op.kind == "grouped_matmul"]
    assert len(gm) == 1 and [d.name for d in gm[0].iter_dims] == ["m", "n", "k", "g"]


def test_grouped_matmul_core_splits_are_legal_and_run_exactly():
    """Every planner's program for a grouped matmul validates; a split over experts (g)
    and over k run to the interpreter's numbers on the simulator."""
    from target.op_rules import legal_core_splits, split_granules, stick_options
    from target.hardware import load_target
    from simulator.run import run_program
    from solver.emit import emit_program
    from solver.naive import plan_naive
    from simulator.validate import validate_program

    hw = load_target()
    S, K, N = 32, 128, 128
    b = DocBuilder()
    out = b.call(_grouped_op(), b.input(rnd(S, K, dtype=torch.float16)),
                 b.input(rnd(4, K, N, dtype=torch.float16, seed=1), kind="parameter"),
                 b.input(torch.tensor([7, 7, 20, 32], dtype=torch.int32)))
    pg = lower_document(b.document(out))
    ref = interpret(pg, b.values)
    gm = next(op for op in pg.ops if op.kind == "grouped_matmul")
    ch = stick_options(gm)[0]
    dt = [pg.tensors[a.tensor].dtype for a in gm.inputs] + [pg.tensors[gm.output.tensor].dtype]
    splits = legal_core_splits(gm, split_granules(gm, [x if x != -1 else None for x in ch.inputs], ch.output,
                                                  dt, hw.stick_bytes), hw.cores)
    assert {"g": 4} in splits and {"k": 2} in splits and not any("g" in s and "k" in s for s in splits)
    for split in ({"g": 4}, {"g": 2, "n": 2}, {"k": 2, "m": 2}):
        d = plan_naive(pg, hw)
        d.ops[gm.id].core_split = dict(split)
        prog = emit_program(pg, hw, d)
        assert validate_program(prog, hw) == [], split
        got = run_program(prog, b.values, hw)
        np.testing.assert_allclose(got[0].astype(np.float32), ref[0].astype(np.float32), rtol=2e-3, atol=2e-3)


# -- MoE layers and models -----------------------------------------------------------------
def _mixtral_config(**kw):
    from transformers import MixtralConfig

    d = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, vocab_size=128, num_local_experts=4, num_experts_per_tok=2, use_cache=False)
    d.update(kw)
    return MixtralConfig(**d)


def _qwen_config():
    from transformers import Qwen2MoeConfig

    return Qwen2MoeConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                          intermediate_size=128, moe_intermediate_size=32, shared_expert_intermediate_size=64,
                          vocab_size=128, num_experts=4, num_experts_per_tok=2, use_cache=False)


def _model(name: str, dtype):
    from transformers import MixtralModel, Qwen2MoeModel

    torch.manual_seed(0)
    m = MixtralModel(_mixtral_config()) if name == "mixtral" else Qwen2MoeModel(_qwen_config())
    return m.eval().to(dtype)


def _moe_block(seed: int = 0):
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    cfg = _mixtral_config()
    cfg._experts_implementation = "grouped_mm"   # what MixtralModel selects by default
    torch.manual_seed(seed)
    blk = MixtralSparseMoeBlock(cfg).eval()
    for p in blk.parameters():
        torch.nn.init.normal_(p, std=0.1)
    return blk


@pytest.mark.parametrize("planner", ["naive", "heuristic", "cpsat"])
def test_every_planner_runs_an_moe_layer(planner):
    from simulator.api import compare, random_inputs
    from target.hardware import load_target
    from simulator.run import run_program
    from solver.planners import plan
    from tests.lowering_helpers import capture_with_values, eager_outputs

    hw = load_target()
    blk = _moe_block()
    x = rnd(1, 16, 64)
    doc, values = capture_with_values(blk, (x,))
    pg = lower_document(doc)
    assert any(op.kind == "grouped_matmul" for op in pg.ops)
    ref = interpret(pg, values)
    assert_close(ref[0], eager_outputs(blk, (x,))[0], torch.float32, "interpreter vs torch")
    prog = plan(pg, hw, planner=planner, fallback=False, time_limit_s=30)   # validated inside
    assert prog.stats.planner == planner
    got = run_program(prog, values, hw)
    assert compare(got, ref)[1] < 1e-5
    rin = random_inputs(prog, pg, seed=1)
    assert compare(run_program(prog, rin, hw), interpret(pg, {k: rin[k] for k in pg.inputs}))[1] < 1e-5


@pytest.mark.parametrize("dtype", FLOATS, ids=["fp32", "fp16"])
@pytest.mark.parametrize("name", ["mixtral", "qwen2_moe"])
def test_tiny_moe_models_compile_with_no_fallback(name, dtype, caplog):
    torch._dynamo.reset()
    model = _model(name, dtype)
    # top-k routing is discontinuous: a token whose two best experts' router probabilities
    # differ by less than fp16 rounding may be routed differently by any fp16 implementation
    # (seed 1 has one such token in layer 2 of the fp16 Mixtral: that token's row differs by
    # 0.14, every other row by <= 0.004); these inputs have no such near-tie
    ids = torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(ids).last_hidden_state
    compiled = torch.compile(model, backend="sticksat", dynamic=False, options={"planner": "heuristic"})
    with caplog.at_level(logging.WARNING):
        with torch.no_grad():
            got = compiled(ids).last_hidden_state
    messages = " ".join(r.getMessage() for r in caplog.records if "sticksat" in r.getMessage())
    assert "eager torch" not in messages and "failed" not in messages, messages
    rtol = 1e-4 if dtype == torch.float32 else 1e-2
    assert_close(to_numpy(got), to_numpy(want), torch.float32 if dtype == torch.float32 else torch.float16,
                 f"{name} {dtype}")
    scale = float(want.float().abs().max())
    assert float((got.float() - want.float()).abs().max()) <= rtol * max(1.0, scale)


# -- FLOPs on device -----------------------------------------------------------------------
def matmul_flops(doc: dict) -> dict[str, int]:
    """Per node id, the multiply-add FLOPs (2 per MAC) of its matmul work (mm, bmm, addmm,
    grouped mm: each row against one expert; SDPA's two products)."""
    shapes = {i["id"]: i["meta"]["shape"] for i in doc["inputs"]}
    for n in doc["nodes"]:
        shapes[n["id"]] = n["outputs"][0]["shape"]

    def shape(a):
        return shapes[a["node"]]

    out = {}
    for n in doc["nodes"]:
        t, a = n["target"], n["args"]
        if t in ("aten.mm.default", "aten.bmm.default"):
            x, y = shape(a[0]), shape(a[1])
            out[n["id"]] = 2 * math.prod(x) * y[-1]
        elif t in ("aten.addmm.default",):
            x, y = shape(a[1]), shape(a[2])
            out[n["id"]] = 2 * math.prod(x) * y[-1]
        elif t in ("transformers.grouped_mm_fallback.default", "aten._grouped_mm.default"):
            x, w = shape(a[0]), shape(a[1])
            out[n["id"]] = 2 * x[0] * x[1] * w[-1]
        elif "scaled_dot_product" in t:
            q, k = shape(a[0]), shape(a[1])
            out[n["id"]] = 2 * 2 * math.prod(q) * k[-2]
    return out


def test_moe_decoder_layer_runs_95_percent_of_matmul_flops_on_device():
    from backend.capture import capture
    from transformers.models.mixtral.modeling_mixtral import MixtralDecoderLayer, MixtralRotaryEmbedding

    cfg = _mixtral_config()
    cfg._experts_implementation = "grouped_mm"
    cfg._attn_implementation = "sdpa"
    layer = MixtralDecoderLayer(cfg, 0).eval()
    rope = MixtralRotaryEmbedding(cfg)
    x = rnd(1, 16, 64)
    pos = rope(x, torch.arange(16)[None])

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = layer

        def forward(self, h, cos, sin):
            out = self.layer(h, position_embeddings=(cos, sin), attention_mask=None)
            return out[0] if isinstance(out, tuple) else out

    doc = capture(Layer(), (x, pos[0], pos[1]))
    GraphDocument.model_validate(doc)
    flops = matmul_flops(doc)
    nodes = {n["id"]: n for n in doc["nodes"]}

    def plain(a):   # document literals as the plain values node_supported takes
        if a.get("kind") == "list":
            return [plain(x) for x in a["items"]]
        return a.get("value")

    def supported(n) -> bool:
        return node_supported(n["target"], [plain(a) for a in n["args"]],
                              {k: plain(v) for k, v in n["kwargs"].items()})

    on = sum(f for nid, f in flops.items() if supported(nodes[nid]))
    total = sum(flops.values())
    assert any(nodes[nid]["target"].endswith("grouped_mm_fallback.default") for nid in flops)
    assert total > 0 and on / total >= 0.95, f"{on} of {total} matmul FLOPs on device"
    unsupported = [n["target"] for n in doc["nodes"] if not supported(n)]
    assert unsupported == []
    lower_document(GraphDocument.model_validate(doc))   # and the whole layer lowers
