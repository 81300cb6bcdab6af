"""Tiny Foundation Model Stack (`ibm-fms`, import name `fms`) models with random weights.

Each family is built from a small config of its own FMS config class (2 layers, width 64,
4 heads, vocabulary 128; nothing downloaded), initialized the way FMS's `get_model`
initializes a model without a checkpoint (`reset_parameters()`), except that parameters
`reset_parameters()` leaves untouched (in ibm-fms 1.13.1: Bamba's mamba layer `A_log`,
`D`, `dt_bias`, `conv1d` and `in_proj`; GptOss's layer norms and expert and router biases;
RoBERTa's classification head; GPTBigCode's tied head) get a seeded normal
initialization instead of whatever memory held.

`FMS_FAMILIES` maps a family to its `FmsCase` (the model builder, inputs(generator) ->
(args, kwargs), a note); `build(family, dtype)` returns the initialized model in `dtype`
and its inputs function.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

VOCAB = 128
SEQ = 16


@dataclass(frozen=True)
class FmsCase:
    family: str
    build: Callable[[], torch.nn.Module]
    inputs: Callable[[torch.Generator], tuple[tuple, dict]]
    note: str = ""


def _text_inputs(g: torch.Generator, batch: int = 1) -> tuple[tuple, dict]:
    return (torch.randint(0, VOCAB, (batch, SEQ), generator=g),), {}


def _reset(model: torch.nn.Module) -> None:
    """FMS's `reset_parameters()`; where it recurses forever (SiglipVisionHeadless calls
    it on `self.modules()`, itself included), each module owning parameters resets its own."""
    try:
        model.reset_parameters()
    except RecursionError:
        for m in model.modules():
            if m._parameters and callable(getattr(m, "reset_parameters", None)):
                try:
                    m.reset_parameters()
                except RecursionError:
                    pass


def init_random(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """What FMS's `get_model` does without a checkpoint (`reset_parameters()`, then
    `post_init()`: tied weights, rotary tables), with every parameter that
    `reset_parameters()` leaves untouched initialized from a seeded normal (std 0.02; 1 +
    that for 1-d scales named like a norm weight) instead of leftover memory."""
    torch.manual_seed(seed)
    with torch.no_grad():
        params = list(model.named_parameters())
        for _, p in params:
            p.fill_(float("nan"))
        _reset(model)
        g = torch.Generator().manual_seed(seed + 1)
        for name, p in params:
            untouched = torch.isnan(p)
            if untouched.any():
                fill = torch.randn(p.shape, generator=g, dtype=torch.float32) * 0.02
                if p.dim() == 1 and ("norm" in name or name.endswith(".weight")):
                    fill += 1.0
                p.copy_(torch.where(untouched, fill.to(p.dtype), p))
        if callable(getattr(model, "post_init", None)):
            model.post_init()
    return model.eval()


def _llama():
    from fms.models.llama import LLaMA, LLaMAConfig

    return LLaMA(LLaMAConfig(src_vocab_size=VOCAB, emb_dim=64, nheads=4, kvheads=2, nlayers=2,
                             hidden_grow_factor=2.0, multiple_of=16, max_expected_seq_len=64))


def _granite_config(**extra):
    from fms.models.granite import GraniteConfig

    return GraniteConfig(src_vocab_size=VOCAB, emb_dim=64, nheads=4, head_dim=16, kvheads=2, nlayers=2,
                         hidden_grow_factor=2.0, multiple_of=16, max_expected_seq_len=64,
                         embedding_multiplier=12.0, logits_scaling=8.0, residual_multiplier=0.22,
                         attention_multiplier=0.0078125, **extra)


def _granite():
    from fms.models.granite import Granite

    return Granite(_granite_config())


def _granite_swa():
    from fms.models.granite_swa import GraniteSWA, GraniteSWAConfig

    return GraniteSWA(GraniteSWAConfig(src_vocab_size=VOCAB, emb_dim=64, nheads=4, head_dim=16, kvheads=2,
                                       nlayers=2, hidden_grow_factor=2.0, multiple_of=16, max_expected_seq_len=64,
                                       pad_id=0, is_swa_layer=[True, False], window_length=8))


def _gpt_bigcode():
    from fms.models.gpt_bigcode import GPTBigCode, GPTBigCodeConfig

    return GPTBigCode(GPTBigCodeConfig(src_vocab_size=VOCAB, emb_dim=64, nheads=4, nlayers=2,
                                       max_expected_seq_len=64, eos_token_id=VOCAB - 1, bos_token_id=VOCAB - 1))


def _mistral():
    from fms.models.mistral import Mistral, MistralConfig

    return Mistral(MistralConfig(src_vocab_size=VOCAB, emb_dim=64, nheads=4, kvheads=2, head_dim=16, nlayers=2,
                                 hidden_grow_factor=2.0, multiple_of=16, max_expected_seq_len=64, sliding_window=8))


def _mixtral():
    from fms.models.mixtral import Mixtral, MixtralConfig

    return Mixtral(MixtralConfig(src_vocab_size=VOCAB, dim=64, nheads=4, kvheads=2, nlayers=2, hidden_dim=128,
                                 num_experts=4, top_k_experts=2, max_expected_seq_len=64))


def _gpt_oss():
    from fms.models.gpt_oss import GptOss, GptOssConfig

    # head_dim 64 and the default context (the real ones): its YaRN rotary asserts enough
    # frequencies between the ramp ends
    config = GptOssConfig(src_vocab_size=VOCAB, emb_dim=64, head_dim=64, num_attention_heads=4, nheads=4,
                          kvheads=2, nlayers=2, num_experts=4, sliding_window=8,
                          layer_types=["sliding_attention", "full_attention"], eos_token_id=VOCAB - 1)
    config.top_k_experts = 2  # a class attribute of GptOssConfig, not a constructor field
    return GptOss(config)


def _bamba():
    from fms.models.bamba import Bamba, BambaConfig

    return Bamba(BambaConfig(src_vocab_size=VOCAB, emb_dim=64, nheads=4, kvheads=2, head_dim=16, nlayers=2,
                             attn_layer_indices=[1], state_size=16, mamba_n_heads=8, n_groups=1, chunk_size=8,
                             hidden_grow_factor=2.0, multiple_of=16, max_expected_seq_len=64))


def _qwen3():
    from fms.models.qwen3 import Qwen3, Qwen3Config

    return Qwen3(Qwen3Config(src_vocab_size=VOCAB, emb_dim=64, nheads=4, kvheads=2, head_dim=16, nlayers=2,
                             hidden_grow_factor=2.0, multiple_of=16, max_expected_seq_len=64))


def _roberta():
    from fms.models.roberta import RoBERTa, RoBERTaConfig

    return RoBERTa(RoBERTaConfig(src_vocab_size=VOCAB, emb_dim=64, nheads=4, nlayers=2, max_pos=64, p_dropout=0.0))


def _roberta_inputs(g: torch.Generator) -> tuple[tuple, dict]:
    ids = torch.randint(3, VOCAB, (1, SEQ), generator=g)  # 1 is the pad id
    return (ids,), {"attn_name": "sdpa_bidirectional"}


def _siglip_config():
    from fms.models.siglip_vision import SiglipVisionConfig

    return SiglipVisionConfig(hidden_size=64, intermediate_size=128, nlayers=2, nheads=4, image_size=32,
                              patch_size=8)


def _siglip():
    from fms.models.siglip_vision import SiglipVision

    return SiglipVision(_siglip_config())


def _image_inputs(g: torch.Generator) -> tuple[tuple, dict]:
    return (torch.randn(1, 3, 32, 32, generator=g),), {}


def _llava_next():
    from fms.models.llava_next import LlavaNext, LlavaNextConfig

    return LlavaNext(LlavaNextConfig(vision_config=_siglip_config(), text_config=_granite_config(pad_id=0),
                                     image_token_index=VOCAB - 1, vision_feature_layer=[-1],
                                     image_grid_pinpoints=[[32, 32], [32, 64]]))


def _llava_inputs(g: torch.Generator) -> tuple[tuple, dict]:
    # the language model on text embeddings (FMS computes them, and merges image features,
    # in prepare_inputs_for_generation before the forward pass)
    return (torch.randn(1, SEQ, 64, generator=g),), {}


FMS_FAMILIES: dict[str, FmsCase] = {c.family: c for c in (
    FmsCase("llama", _llama, _text_inputs),
    FmsCase("granite", _granite, _text_inputs),
    FmsCase("granite_swa", _granite_swa, _text_inputs, "sliding window 8 on layer 0"),
    FmsCase("gpt_bigcode", _gpt_bigcode, _text_inputs),
    FmsCase("mistral", _mistral, _text_inputs, "sliding window 8"),
    FmsCase("mixtral", _mixtral, _text_inputs, "4 experts, top-2"),
    FmsCase("gpt_oss", _gpt_oss, _text_inputs, "4 experts, top-2, sliding/full layers, sinks"),
    FmsCase("bamba", _bamba, _text_inputs, "mamba2 layer + attention layer"),
    FmsCase("qwen3", _qwen3, _text_inputs),
    FmsCase("roberta", _roberta, _roberta_inputs, "bidirectional"),
    FmsCase("siglip", _siglip, _image_inputs, "32x32 image, 8x8 patches"),
    FmsCase("llava_next", _llava_next, _llava_inputs, "language model on merged embeddings"),
)}


def build(family: str, dtype: torch.dtype = torch.float32, seed: int = 0) -> tuple[torch.nn.Module, Any]:
    case = FMS_FAMILIES[family]
    torch.manual_seed(seed)
    model = init_random(case.build(), seed)
    return model.to(dtype), case.inputs
