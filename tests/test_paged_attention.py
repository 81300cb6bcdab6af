"""FMS's Spyre paged attention ops (`spyre.paged_attn_store`, `spyre.paged_attn_compute`,
`spyre.paged_attn_compute_with_sinks`) lowered to primitive ops, checked against the ops'
own reference implementation: FMS's registered CPU kernels (fms/utils/spyre/paged.py),
which DocBuilder calls eagerly, in float32 and float16. Shapes cover decode and prefill,
MHA / GQA / MQA, left padding, query rows cut for a short first prefill, block tables with
ids past the sequence, duplicate slots, and sinks with and without a sliding window."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from lowering import lower_document, node_supported
from target.interpreter import interpret
from tests.lowering_helpers import DocBuilder, assert_close, to_numpy

pytest.importorskip("fms.utils.spyre.paged")  # registers spyre::paged_attn_* and their CPU kernels

FLOATS = [torch.float32, torch.float16]
IDS = ["fp32", "fp16"]
STORE = "spyre.paged_attn_store.default"
COMPUTE = "spyre.paged_attn_compute.default"
SINKS = "spyre.paged_attn_compute_with_sinks.default"


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _paged_case(seed, B, Lq, H, KH, D, BS, NB, tkv, start, junk_table=False):
    """query [B, Lq, H, D], caches [NB, BS, KH, D], per-sequence distinct blocks; with
    junk_table, block-table entries past a sequence's keys are ids no block has."""
    g = _gen(seed)
    T = max((t + BS - 1) // BS for t in tkv)
    perm = torch.randperm(NB, generator=g)
    assert B * T <= NB
    table = perm[:B * T].reshape(B, T).clone()
    if junk_table:
        for i, t in enumerate(tkv):
            table[i, (t + BS - 1) // BS:] = NB + 7
            table[i, :start[i] // BS] = -NB - 3
    q = torch.randn(B, Lq, H, D, generator=g)
    kc = torch.randn(NB, BS, KH, D, generator=g)
    vc = torch.randn(NB, BS, KH, D, generator=g)
    return q, kc, vc, torch.tensor(tkv), torch.tensor(start), table


# (B, Lq, H, KH, D, BS, NB, tkv, start)
COMPUTE_CASES = {
    "decode_gqa": (3, 1, 4, 2, 8, 4, 12, [9, 4, 12], [0, 1, 3]),
    "decode_mha": (2, 1, 2, 2, 16, 8, 6, [13, 16], [2, 0]),
    "decode_mqa": (2, 1, 4, 1, 8, 4, 8, [5, 11], [0, 0]),
    "prefill": (2, 8, 4, 2, 8, 4, 8, [8, 8], [0, 3]),
    "prefill_cut": (2, 8, 2, 1, 8, 4, 10, [12, 8], [6, 2]),   # 6 keys for 8 query rows: 2 rows are 0
    "chunked": (1, 4, 4, 4, 8, 4, 6, [16], [1]),               # a later chunk: queries at the end
}


@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
@pytest.mark.parametrize("case", sorted(COMPUTE_CASES))
def test_paged_attn_compute_matches_fms(dtype, case):
    B, Lq, H, KH, D, BS, NB, tkv, start = COMPUTE_CASES[case]
    q, kc, vc, tkv_t, start_t, table = _paged_case(len(case), *COMPUTE_CASES[case], junk_table=case == "decode_gqa")
    b = DocBuilder()
    out = b.call(COMPUTE, b.input(q.to(dtype)), b.input(kc.to(dtype)), b.input(vc.to(dtype)), 0.3,
                 b.input(tkv_t), b.input(start_t), b.input(table))
    pg = b.check(out)
    kinds = [op.kind for op in pg.ops]
    assert kinds.count("matmul") == 2 and kinds.count("gather") == 3, kinds


@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
@pytest.mark.parametrize("case,window", [("decode_gqa", 0), ("decode_gqa", 5), ("prefill", 3),
                                         ("prefill_cut", 0), ("chunked", 6), ("decode_mha", 100)])
def test_paged_attn_compute_with_sinks_matches_fms(dtype, case, window):
    B, Lq, H, KH, D, BS, NB, tkv, start = COMPUTE_CASES[case]
    q, kc, vc, tkv_t, start_t, table = _paged_case(len(case) + window, *COMPUTE_CASES[case])
    sinks = torch.randn(H, generator=_gen(window)) * 2
    b = DocBuilder()
    out = b.call(SINKS, b.input(q.to(dtype)), b.input(kc.to(dtype)), b.input(vc.to(dtype)), 0.25,
                 b.input(tkv_t), b.input(start_t), b.input(table), b.input(sinks.to(dtype), kind="parameter"), window)
    b.check(out)


@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
@pytest.mark.parametrize("B,S,duplicates", [(2, 3, False), (4, 1, False), (2, 4, True)])
def test_paged_attn_store_matches_fms(dtype, B, S, duplicates):
    NB, BS, KH, D = 5, 4, 2, 8
    g = _gen(B * S)
    slots = torch.randperm(NB * BS, generator=g)[:B * S].reshape(B, S)
    if duplicates:   # padding tokens all writing one pad slot, and a token rewriting another's
        slots[0, :3] = slots[0, 3]
        slots[1, 2] = slots[0, 0]
    key, value = torch.randn(B, S, KH, D, generator=g).to(dtype), torch.randn(B, S, KH, D, generator=g).to(dtype)
    kc, vc = torch.randn(NB, BS, KH, D, generator=g).to(dtype), torch.randn(NB, BS, KH, D, generator=g).to(dtype)
    b = DocBuilder()
    new_k, new_v = b.call(STORE, b.input(key), b.input(value), b.input(kc, kind="buffer"), b.input(vc, kind="buffer"),
                          b.input(slots))
    pg = b.check(new_k, new_v)
    got = interpret(pg, b.values)
    # exact: a store only moves values
    np.testing.assert_array_equal(got[0], to_numpy(new_k.value))
    np.testing.assert_array_equal(got[1], to_numpy(new_v.value))


def test_store_then_decode_reads_the_new_token():
    """The decode step as FMS runs it: store the new token's k/v, then attend over the
    stored cache; the new token's key is what the query sees at position tkv - 1."""
    B, H, KH, D, BS, NB = 2, 4, 2, 8, 4, 8
    q, kc, vc, tkv, start, table = _paged_case(1, B, 1, H, KH, D, BS, NB, [6, 3], [0, 1])
    slots = torch.stack([table[i, (t - 1) // BS] * BS + (t - 1) % BS for i, t in enumerate(tkv.tolist())])[:, None]
    g = _gen(2)
    key, value = torch.randn(B, 1, KH, D, generator=g), torch.randn(B, 1, KH, D, generator=g)
    b = DocBuilder()
    kc2, vc2 = b.call(STORE, b.input(key), b.input(value), b.input(kc, kind="buffer"), b.input(vc, kind="buffer"),
                      b.input(slots))
    out = b.call(COMPUTE, b.input(q), kc2, vc2, D ** -0.5, b.input(tkv), b.input(start), b.input(table))
    b.check(out, kc2, vc2)
    # the result does depend on the stored token: against the old cache it differs
    stale = torch.ops.spyre.paged_attn_compute(q, kc, vc, D ** -0.5, tkv, start, table)
    assert float((stale - out.value).abs().max()) > 1e-3


class _PagedStep(torch.nn.Module):
    """One attention step the way FMS's spyre_paged_attn calls the ops."""

    def forward(self, q, k, v, kc, vc, slots, tkv, start, table):
        kc, vc = torch.ops.spyre.paged_attn_store(k, v, kc, vc, slots)
        out = torch.ops.spyre.paged_attn_compute(q, kc, vc, 0.35, tkv, start, table)
        return out, kc, vc


@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
def test_paged_step_compiles_strict_with_nothing_on_eager(dtype, caplog):
    torch._dynamo.reset()
    B, H, KH, D, BS, NB = 2, 4, 2, 8, 4, 8
    q, kc, vc, tkv, start, table = _paged_case(3, B, 1, H, KH, D, BS, NB, [7, 4], [1, 0])
    slots = torch.stack([table[i, (t - 1) // BS] * BS + (t - 1) % BS for i, t in enumerate(tkv.tolist())])[:, None]
    g = _gen(4)
    args = (q.to(dtype), torch.randn(B, 1, KH, D, generator=g).to(dtype), torch.randn(B, 1, KH, D, generator=g).to(dtype),
            kc.to(dtype), vc.to(dtype), slots, tkv, start, table)
    model = _PagedStep()
    with torch.no_grad():
        want = model(*args)
    compiled = torch.compile(model, backend="sticksat", dynamic=False, options={"planner": "heuristic", "strict": True})
    with caplog.at_level(logging.WARNING):
        with torch.no_grad():
            got = compiled(*args)
    messages = " ".join(r.getMessage() for r in caplog.records if "sticksat" in r.getMessage())
    assert "eager torch" not in messages, messages
    for g_, w_ in zip(got, want):
        assert_close(to_numpy(g_), to_numpy(w_), dtype, "paged step")
    assert all(node_supported(t) for t in (STORE, COMPUTE, SINKS))


@pytest.mark.parametrize("planner", ["naive", "heuristic", "cpsat"])
def test_every_planner_runs_a_paged_decode_step(planner):
    """Store + GQA decode with sinks and a window: every planner's program validates and
    its functional run on the simulator equals the interpreter."""
    from simulator.api import compare
    from simulator.run import run_program
    from solver.planners import plan
    from target.hardware import load_target

    hw = load_target()
    B, H, KH, D, BS, NB = 2, 4, 2, 64, 16, 6
    q, kc, vc, tkv, start, table = _paged_case(5, B, 1, H, KH, D, BS, NB, [40, 23], [3, 0])
    slots = torch.stack([table[i, (t - 1) // BS] * BS + (t - 1) % BS for i, t in enumerate(tkv.tolist())])[:, None]
    g = _gen(6)
    b = DocBuilder()
    kc2, vc2 = b.call(STORE, b.input(torch.randn(B, 1, KH, D, generator=g).half()),
                      b.input(torch.randn(B, 1, KH, D, generator=g).half()), b.input(kc.half(), kind="buffer"),
                      b.input(vc.half(), kind="buffer"), b.input(slots))
    out = b.call(SINKS, b.input(q.half()), kc2, vc2, D ** -0.5, b.input(tkv), b.input(start), b.input(table),
                 b.input(torch.randn(H, generator=g).half(), kind="parameter"), 16)
    pg = b.check(out, kc2, vc2)
    ref = interpret(pg, b.values)
    prog = plan(pg, hw, planner=planner, fallback=False, time_limit_s=30)   # validated inside
    assert prog.stats.planner == planner
    assert compare(run_program(prog, b.values, hw), ref)[1] < 1e-3


# The paged decode step both FMS tests run: batch 2 at KV lengths 21 and 10 (the second
# left-padded by 2), blocks of 16 in an 8-block cache per layer, one new token each.
STEP_BATCH, STEP_BLOCK, STEP_BLOCKS = 2, 16, 8


def _paged_decode_step(layers: int, head_dim: int, dtype, seed: int, attn_name: str):
    """(caches, token ids, the model's keyword arguments) of one paged decode step."""
    g = _gen(seed)
    caches = [(torch.randn(STEP_BLOCKS, STEP_BLOCK, 2, head_dim, generator=g).to(dtype),
               torch.randn(STEP_BLOCKS, STEP_BLOCK, 2, head_dim, generator=g).to(dtype)) for _ in range(layers)]
    table = torch.tensor([[3, 5], [1, 6]])
    tkv, start = torch.tensor([21, 10]), torch.tensor([0, 2])
    last = [t - 1 for t in tkv.tolist()]   # the new token's position in each sequence
    slots = torch.stack([table[i, p // STEP_BLOCK] * STEP_BLOCK + p % STEP_BLOCK for i, p in enumerate(last)])[:, None]
    ids = torch.randint(0, 256, (STEP_BATCH, 1), generator=g)
    kwargs = dict(position_ids=(tkv - 1)[:, None], use_cache=True, attn_name=attn_name, slot_mapping=slots,
                  block_table=table, current_tkv_mask=tkv, left_padded_prompt_mask=start, mask=None)
    return caches, ids, kwargs


@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
def test_fms_llama_paged_decode_step_compiles_strict(dtype):
    """A tiny FMS LLaMA decode step with attn_name="spyre_paged_attn" (the graphs vLLM's
    Spyre plugin sends): strict, nothing on eager; logits and the returned caches equal
    eager's."""
    from fms.models.llama import LLaMA, LLaMAConfig

    torch._dynamo.reset()
    torch.manual_seed(0)
    cfg = LLaMAConfig(src_vocab_size=256, emb_dim=64, nheads=4, kvheads=2, nlayers=2, hidden_grow_factor=2.0,
                      multiple_of=16, max_expected_seq_len=256)
    model = LLaMA(cfg).eval()
    model.reset_parameters()
    model = model.to(dtype)
    caches, ids, kwargs = _paged_decode_step(cfg.nlayers, 16, dtype, 11, "spyre_paged_attn")
    with torch.no_grad():
        want_logits, want_caches = model(ids, past_key_value_states=[(k.clone(), v.clone()) for k, v in caches],
                                         **kwargs)
        compiled = torch.compile(model, backend="sticksat", dynamic=False,
                                 options={"planner": "heuristic", "strict": True})
        got_logits, got_caches = compiled(ids, past_key_value_states=[(k.clone(), v.clone()) for k, v in caches],
                                          **kwargs)
    assert_close(to_numpy(got_logits), to_numpy(want_logits), dtype, "logits")
    for (gk, gv), (wk, wv), (ok, ov) in zip(got_caches, want_caches, caches):
        # the new token's k/v are computed (projection, rotary): equal to rounding; the
        # rest of the cache is moved, so exactly equal
        assert_close(to_numpy(gk), to_numpy(wk), dtype, "key cache")
        assert_close(to_numpy(gv), to_numpy(wv), dtype, "value cache")
        untouched = (to_numpy(wk) == to_numpy(ok)).all(axis=(2, 3))
        assert untouched.sum() == STEP_BLOCKS * STEP_BLOCK - STEP_BATCH
        np.testing.assert_array_equal(to_numpy(gk)[untouched], to_numpy(ok)[untouched])


@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
def test_fms_gpt_oss_paged_sinks_decode_step_compiles_strict(dtype):
    """A tiny FMS gpt-oss decode step with attn_name="spyre_paged_attn_with_sinks": a
    sliding-window layer (window 8 < the 21 and 8 keys) and a full one, sinks, and the MoE
    feed-forward's moe_mm, all on device in strict mode, logits equal to eager's."""
    from fms.models.gpt_oss import GptOss, GptOssConfig

    torch._dynamo.reset()
    torch.manual_seed(0)
    cfg = GptOssConfig(num_experts=4, src_vocab_size=256, emb_dim=64, head_dim=16, nheads=4, num_attention_heads=4,
                       kvheads=2, nlayers=2, sliding_window=8, layer_types=["sliding_attention", "full_attention"])
    cfg.top_k_experts = 2
    model = GptOss(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():   # FMS leaves some parameters uninitialized under random init
            p.normal_(0, 0.1)
    model = model.to(dtype)
    caches, ids, kwargs = _paged_decode_step(cfg.nlayers, 16, dtype, 1, "spyre_paged_attn_with_sinks")
    with torch.no_grad():
        want = model(ids, past_key_value_states=[(k.clone(), v.clone()) for k, v in caches], **kwargs)[0]
        compiled = torch.compile(model, backend="sticksat", dynamic=False,
                                 options={"planner": "heuristic", "strict": True})
        got = compiled(ids, past_key_value_states=[(k.clone(), v.clone()) for k, v in caches], **kwargs)[0]
    assert torch.isfinite(want).all()
    assert_close(to_numpy(got), to_numpy(want), dtype, "gpt-oss logits")
