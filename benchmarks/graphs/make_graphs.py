"""Regenerate every benchmark graph document (run from the repo root):

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/graphs/make_graphs.py [--suite NAME]

Each graph is one transformer layer (or one matmul) at real size, captured with
`backend.capture.capture` on fake tensors: the layer is instantiated under a
FakeTensorMode (CPU fake tensors: shapes and dtypes only) from a hand-written transformers
config (public numbers, no hub download, no weights), so nothing is allocated and nothing is
downloaded. fp16 throughout. Fake CPU tensors rather than the meta device, because on meta
SDPA dispatches to its math decomposition, while a real CPU model (what the torch backend
captures) keeps `aten._scaled_dot_product_flash_attention_for_cpu`.

Layout: benchmarks/graphs/<suite>/<name>.json (gzipped as .json.gz when large). The
service-side `sticksat bench` only reads these files; it never captures.

Suites:
- layers: one decoder layer of Llama-3.1-8B, Granite-3.3-8B and Mistral-7B-v0.3 in prefill
  (512 tokens) and decode (1 new token against a 2048-token KV cache); one encoder layer of
  BERT-base (512 tokens) and ViT-B/16 (224x224 image: 197 tokens); one GPT-2 block (512 tokens).
- sweep: matmul/bmm shapes over batch sizes: linear layers [M,4096]x[4096,N] for decode-
  to prefill-sized M, attention-shaped bmm over batch (heads) counts.
- tiny: the same layer kinds at toy sizes, for fast tests of the bench command.
- depth: whole stacks at full depth (issue 14): Llama-3.1-8B decoder stacks of 1, 2, 4, 8,
  16 and 32 layers over a 512-token prefill (one rotary table shared by every layer, as
  LlamaModel does), the 32-layer stack decoding one token against a 2048-token KV cache per
  layer, GPT-2 small (embeddings, 12 blocks, final norm; 512 tokens) and BERT-base
  (embeddings, 12 encoder layers, no pooler; 512 tokens).
- serving: one Granite-3.3-8B layer at the shapes a vLLM Spyre deployment compiles at
  warmup: prefill of 512, 1024, 2048 and 4096 tokens; decode of one token per sequence at
  batch 1, 4, 8, 16 and 32 against KV caches of 1024-8192 tokens (benchmarks/bench_serving.py).
- irregular: whole models without one repeated block: a T5-base encoder-decoder (12+12),
  a ViT-B/16 encoder feeding a GPT-2 decoder's cross-attention (12+12), and Qwen1.5-MoE-A2.7B
  shapes with dense and sparse layers alternating (24 layers, from token embeddings).
- moe: the sparse mixture-of-experts block of Mixtral-8x7B (hidden 4096, expert FFN 14336,
  8 experts, top-2; router, routing, grouped expert matmuls, scatter back) over a 512-token
  prefill and one decode token, with transformers' default `grouped_mm` experts.
"""
from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import sys
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from backend.capture import capture  # noqa: E402

OUT_DIR = Path(__file__).resolve().parent
DTYPE = torch.float16
GZIP_ABOVE_BYTES = 256 * 1024


def _input(*shape: int) -> torch.Tensor:
    """An input tensor: created inside `fake_fp16()`, so it is a fake (unallocated) tensor."""
    return torch.empty(*shape, dtype=DTYPE)


@contextlib.contextmanager
def fake_fp16():
    """Build models and inputs as fake CPU tensors with fp16 parameters (no allocation)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    previous = torch.get_default_dtype()
    torch.set_default_dtype(DTYPE)
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            yield
    finally:
        torch.set_default_dtype(previous)


# -- hand-written configs (public model cards / config.json numbers) -----------------------
def llama31_8b_config(**overrides):
    from transformers import LlamaConfig

    kw = dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
              intermediate_size=14336, rms_norm_eps=1e-5, num_hidden_layers=1, vocab_size=128256,
              max_position_embeddings=131072, hidden_act="silu",
              rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192})
    kw.update(overrides)
    return LlamaConfig(**kw)


def granite33_8b_config(**overrides):
    from transformers import GraniteConfig

    kw = dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, intermediate_size=12800,
              rms_norm_eps=1e-5, num_hidden_layers=1, vocab_size=49159, max_position_embeddings=131072,
              hidden_act="silu", attention_multiplier=0.0078125, residual_multiplier=0.22,
              embedding_multiplier=12.0, logits_scaling=16.0,
              rope_parameters={"rope_type": "default", "rope_theta": 10000000.0})
    kw.update(overrides)
    return GraniteConfig(**kw)


def mistral7b_v03_config(**overrides):
    from transformers import MistralConfig

    kw = dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
              intermediate_size=14336, rms_norm_eps=1e-5, num_hidden_layers=1, vocab_size=32768,
              max_position_embeddings=32768, hidden_act="silu", sliding_window=None,
              rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    kw.update(overrides)
    return MistralConfig(**kw)


_DECODERS = {
    "llama": ("transformers.models.llama.modeling_llama", "Llama"),
    "granite": ("transformers.models.granite.modeling_granite", "Granite"),
    "mistral": ("transformers.models.mistral.modeling_mistral", "Mistral"),
}


def _decoder_classes(family: str):
    import importlib

    module_name, prefix = _DECODERS[family]
    mod = importlib.import_module(module_name)
    return getattr(mod, f"{prefix}DecoderLayer"), getattr(mod, f"{prefix}RotaryEmbedding")


class DecoderPrefill(torch.nn.Module):
    """One decoder layer over a full prompt: causal self-attention, rotary positions."""

    def __init__(self, family: str, cfg):
        super().__init__()
        layer_cls, rotary_cls = _decoder_classes(family)
        cfg._attn_implementation = "sdpa"
        self.layer = layer_cls(cfg, layer_idx=0)
        self.rotary = rotary_cls(cfg)

    def forward(self, hidden_states):
        positions = torch.arange(hidden_states.shape[1], device=hidden_states.device)[None]
        pe = self.rotary(hidden_states, positions)
        out = self.layer(hidden_states, attention_mask=None, position_ids=positions, position_embeddings=pe)
        return out[0] if isinstance(out, tuple) else out


class DecoderDecode(torch.nn.Module):
    """One decoder layer for one new token against a KV cache passed as graph inputs.

    The cache layer is filled with the inputs directly (not through `update`, which would
    concatenate onto an empty tensor); the layer then appends the new token's k/v with
    torch.cat exactly as transformers' DynamicCache does in eager decode."""

    def __init__(self, family: str, cfg):
        super().__init__()
        layer_cls, rotary_cls = _decoder_classes(family)
        cfg._attn_implementation = "sdpa"
        self.cfg = cfg
        self.layer = layer_cls(cfg, layer_idx=0)
        self.rotary = rotary_cls(cfg)

    def forward(self, hidden_states, past_key, past_value):
        from transformers.cache_utils import DynamicCache

        past = past_key.shape[2]
        positions = torch.arange(past, past + hidden_states.shape[1], device=hidden_states.device)[None]
        pe = self.rotary(hidden_states, positions)
        cache = DynamicCache(config=self.cfg)
        layer_cache = cache.layers[0]
        layer_cache.dtype, layer_cache.device = past_key.dtype, past_key.device
        layer_cache.keys, layer_cache.values = past_key, past_value
        layer_cache.is_initialized = True
        out = self.layer(hidden_states, attention_mask=None, position_ids=positions, past_key_values=cache,
                         position_embeddings=pe, use_cache=True)
        return out[0] if isinstance(out, tuple) else out


class EncoderLayer(torch.nn.Module):
    def __init__(self, layer: torch.nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, hidden_states):
        out = self.layer(hidden_states)
        return out[0] if isinstance(out, tuple) else out


class Linear(torch.nn.Module):
    def __init__(self, k: int, n: int):
        super().__init__()
        self.proj = torch.nn.Linear(k, n, bias=False)

    def forward(self, x):
        return self.proj(x)


class Bmm(torch.nn.Module):
    def forward(self, a, b):
        return torch.bmm(a, b)


def _decoder_prefill(family: str, cfg_fn: Callable, seq: int, **cfg_kw):
    def build():
        cfg = cfg_fn(**cfg_kw)
        model = DecoderPrefill(family, cfg).eval()
        return model, (_input(1, seq, cfg.hidden_size),)
    return build


def _decoder_decode(family: str, cfg_fn: Callable, past: int, batch: int = 1, **cfg_kw):
    def build():
        cfg = cfg_fn(**cfg_kw)
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        model = DecoderDecode(family, cfg).eval()
        kv = (batch, cfg.num_key_value_heads, past, head_dim)
        return model, (_input(batch, 1, cfg.hidden_size), _input(*kv), _input(*kv))
    return build


def _bert(seq: int, **cfg_kw):
    def build():
        from transformers import BertConfig
        from transformers.models.bert.modeling_bert import BertLayer

        kw = dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072, hidden_act="gelu",
                  layer_norm_eps=1e-12, num_hidden_layers=1, max_position_embeddings=512)
        kw.update(cfg_kw)
        cfg = BertConfig(**kw)
        cfg._attn_implementation = "sdpa"
        model = EncoderLayer(BertLayer(cfg)).eval()
        return model, (_input(1, seq, cfg.hidden_size),)
    return build


def _vit(image: int, patch: int, **cfg_kw):
    def build():
        from transformers import ViTConfig
        from transformers.models.vit.modeling_vit import ViTLayer

        kw = dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072, hidden_act="gelu",
                  layer_norm_eps=1e-12, num_hidden_layers=1, image_size=image, patch_size=patch)
        kw.update(cfg_kw)
        cfg = ViTConfig(**kw)
        cfg._attn_implementation = "sdpa"
        tokens = (image // patch) ** 2 + 1  # patches + [CLS]
        model = EncoderLayer(ViTLayer(cfg)).eval()
        return model, (_input(1, tokens, cfg.hidden_size),)
    return build


def _gpt2(seq: int, **cfg_kw):
    def build():
        from transformers import GPT2Config
        from transformers.models.gpt2.modeling_gpt2 import GPT2Block

        kw = dict(n_embd=768, n_head=12, n_inner=3072, n_layer=1, n_positions=1024,
                  layer_norm_epsilon=1e-5, activation_function="gelu_new")
        kw.update(cfg_kw)
        cfg = GPT2Config(**kw)
        cfg._attn_implementation = "sdpa"
        model = EncoderLayer(GPT2Block(cfg, layer_idx=0)).eval()
        return model, (_input(1, seq, cfg.n_embd),)
    return build


class DecoderStackPrefill(torch.nn.Module):
    """`n` decoder layers over a full prompt, one rotary table shared by all (LlamaModel's
    layer loop without embeddings, final norm and head)."""

    def __init__(self, family: str, cfg, n: int):
        super().__init__()
        layer_cls, rotary_cls = _decoder_classes(family)
        cfg._attn_implementation = "sdpa"
        self.layers = torch.nn.ModuleList(layer_cls(cfg, layer_idx=i) for i in range(n))
        self.rotary = rotary_cls(cfg)

    def forward(self, hidden_states):
        positions = torch.arange(hidden_states.shape[1], device=hidden_states.device)[None]
        pe = self.rotary(hidden_states, positions)
        for layer in self.layers:
            out = layer(hidden_states, attention_mask=None, position_ids=positions, position_embeddings=pe)
            hidden_states = out[0] if isinstance(out, tuple) else out
        return hidden_states


class DecoderStackDecode(torch.nn.Module):
    """`n` decoder layers for one new token, each against its own KV cache (graph inputs
    past_key_i, past_value_i, filled as `DecoderDecode` does)."""

    def __init__(self, family: str, cfg, n: int):
        super().__init__()
        layer_cls, rotary_cls = _decoder_classes(family)
        cfg._attn_implementation = "sdpa"
        cfg.num_hidden_layers = n
        self.cfg = cfg
        self.layers = torch.nn.ModuleList(layer_cls(cfg, layer_idx=i) for i in range(n))
        self.rotary = rotary_cls(cfg)

    def forward(self, hidden_states, *past):
        from transformers.cache_utils import DynamicCache

        n_past = past[0].shape[2]
        positions = torch.arange(n_past, n_past + hidden_states.shape[1], device=hidden_states.device)[None]
        pe = self.rotary(hidden_states, positions)
        cache = DynamicCache(config=self.cfg)
        for i, layer_cache in enumerate(cache.layers):
            layer_cache.dtype, layer_cache.device = past[2 * i].dtype, past[2 * i].device
            layer_cache.keys, layer_cache.values = past[2 * i], past[2 * i + 1]
            layer_cache.is_initialized = True
        for layer in self.layers:
            out = layer(hidden_states, attention_mask=None, position_ids=positions, past_key_values=cache,
                        position_embeddings=pe, use_cache=True)
            hidden_states = out[0] if isinstance(out, tuple) else out
        return hidden_states


class LastHidden(torch.nn.Module):
    """A transformers base model returning only its last hidden state."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).last_hidden_state


def _stack_prefill(family: str, cfg_fn: Callable, n: int, seq: int, **cfg_kw):
    def build():
        cfg = cfg_fn(num_hidden_layers=n, **cfg_kw)
        model = DecoderStackPrefill(family, cfg, n).eval()
        return model, (_input(1, seq, cfg.hidden_size),)
    return build


def _stack_decode(family: str, cfg_fn: Callable, n: int, past: int, **cfg_kw):
    def build():
        cfg = cfg_fn(num_hidden_layers=n, **cfg_kw)
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        model = DecoderStackDecode(family, cfg, n).eval()
        kv = (1, cfg.num_key_value_heads, past, head_dim)
        return model, (_input(1, 1, cfg.hidden_size), *(_input(*kv) for _ in range(2 * n)))
    return build


def _ids_input(seq: int) -> torch.Tensor:
    return torch.zeros(1, seq, dtype=torch.long)


def _gpt2_model(n: int, seq: int, **cfg_kw):
    def build():
        from transformers import GPT2Config, GPT2Model

        kw = dict(n_embd=768, n_head=12, n_inner=3072, n_layer=n, n_positions=1024, vocab_size=50257,
                  layer_norm_epsilon=1e-5, activation_function="gelu_new", use_cache=False)
        kw.update(cfg_kw)
        cfg = GPT2Config(**kw)
        cfg._attn_implementation = "sdpa"
        return LastHidden(GPT2Model(cfg)).eval(), (_ids_input(seq),)
    return build


def _bert_model(n: int, seq: int, **cfg_kw):
    def build():
        from transformers import BertConfig, BertModel

        kw = dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072, hidden_act="gelu",
                  layer_norm_eps=1e-12, num_hidden_layers=n, max_position_embeddings=512, vocab_size=30522)
        kw.update(cfg_kw)
        cfg = BertConfig(**kw)
        cfg._attn_implementation = "sdpa"
        return LastHidden(BertModel(cfg, add_pooling_layer=False)).eval(), (_ids_input(seq),)
    return build


def mixtral_8x7b_config(**overrides):
    from transformers import MixtralConfig

    kw = dict(hidden_size=4096, intermediate_size=14336, num_local_experts=8, num_experts_per_tok=2,
              num_attention_heads=32, num_key_value_heads=8, rms_norm_eps=1e-5, num_hidden_layers=1,
              vocab_size=32000, max_position_embeddings=32768, hidden_act="silu", router_jitter_noise=0.0)
    kw.update(overrides)
    return MixtralConfig(**kw)


def _moe_block(tokens: int, **cfg_kw):
    def build():
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

        cfg = mixtral_8x7b_config(**cfg_kw)
        cfg._experts_implementation = "grouped_mm"   # MixtralModel's default (a bare block has none)
        model = EncoderLayer(MixtralSparseMoeBlock(cfg)).eval()
        return model, (_input(1, tokens, cfg.hidden_size),)
    return build


def _linear(m: int, k: int, n: int):
    def build():
        model = Linear(k, n).eval()
        return model, (_input(m, k),)
    return build


def _bmm(b: int, m: int, k: int, n: int):
    def build():
        return Bmm().eval(), (_input(b, m, k), _input(b, k, n))
    return build


class LastHiddenFromEmbeddings(LastHidden):
    """A transformers base model from token embeddings to its last hidden state."""

    def forward(self, inputs_embeds):
        return self.model(inputs_embeds=inputs_embeds).last_hidden_state


class EncoderDecoderLastHidden(LastHidden):
    """An encoder-decoder base model (source ids, target ids) -> the decoder's last hidden state."""

    def forward(self, input_ids, decoder_input_ids):
        return self.model(input_ids=input_ids, decoder_input_ids=decoder_input_ids,
                          use_cache=False).last_hidden_state


class ImageToText(LastHidden):
    """A vision encoder-decoder (pixels, text ids) -> the decoder's last hidden state: the
    ViT encoder's output feeds every decoder layer's cross-attention."""

    def forward(self, pixel_values, decoder_input_ids):
        enc = self.model.encoder(pixel_values=pixel_values).last_hidden_state
        out = self.model.decoder.transformer(input_ids=decoder_input_ids, encoder_hidden_states=enc,
                                             use_cache=False)
        return out.last_hidden_state


def _t5(layers: int, src: int, tgt: int, **cfg_kw):
    """T5-base's shapes (d_model 768, 12 heads of 64, FFN 3072, relative position buckets):
    `layers` encoder and `layers` decoder layers, a `src`-token source, a `tgt`-token target."""
    def build():
        from transformers import T5Config, T5Model

        kw = dict(d_model=768, d_kv=64, d_ff=3072, num_layers=layers, num_decoder_layers=layers, num_heads=12,
                  relative_attention_num_buckets=32, relative_attention_max_distance=128, vocab_size=32128,
                  feed_forward_proj="relu", layer_norm_epsilon=1e-6)
        kw.update(cfg_kw)
        cfg = T5Config(**kw)
        cfg._attn_implementation = "sdpa"
        return EncoderDecoderLastHidden(T5Model(cfg)).eval(), (_ids_input(src), _ids_input(tgt))
    return build


def _vit_gpt2(image: int, patch: int, tgt: int, **cfg_kw):
    """An image-captioning vision encoder-decoder: ViT-B/16 (12 layers, 768) feeding a GPT-2
    small decoder (12 layers, 768) whose every block cross-attends to the image tokens."""
    def build():
        from transformers import GPT2Config, ViTConfig, VisionEncoderDecoderConfig, VisionEncoderDecoderModel

        enc = ViTConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                        image_size=image, patch_size=patch, hidden_act="gelu", layer_norm_eps=1e-12)
        dec = GPT2Config(n_embd=768, n_head=12, n_inner=3072, n_layer=12, n_positions=1024, vocab_size=50257,
                         layer_norm_epsilon=1e-5, activation_function="gelu_new", use_cache=False,
                         add_cross_attention=True, is_decoder=True, **cfg_kw)
        from transformers.initialization import no_init_weights

        cfg = VisionEncoderDecoderConfig.from_encoder_decoder_configs(enc, dec)
        for c in (cfg, cfg.encoder, cfg.decoder):
            c._attn_implementation = "sdpa"
        with no_init_weights():   # ViT's truncated-normal init reads values, which fake tensors lack
            model = VisionEncoderDecoderModel(cfg)
        return ImageToText(model).eval(), (_input(1, 3, image, image), _ids_input(tgt))
    return build


def _qwen2_moe_alternating(layers: int, seq: int, **cfg_kw):
    """Qwen1.5-MoE-A2.7B's shapes (hidden 2048, 60 experts of FFN 1408, top-4, a shared
    expert of FFN 5632) with every second layer dense (`decoder_sparse_step=2`, dense FFN
    5632): sparse and dense layers alternate."""
    def build():
        from transformers import Qwen2MoeConfig, Qwen2MoeModel

        kw = dict(hidden_size=2048, num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=16,
                  intermediate_size=5632, moe_intermediate_size=1408, shared_expert_intermediate_size=5632,
                  num_experts=60, num_experts_per_tok=4, decoder_sparse_step=2, vocab_size=151936,
                  max_position_embeddings=8192, rms_norm_eps=1e-6, norm_topk_prob=False)
        kw.update(cfg_kw)
        cfg = Qwen2MoeConfig(**kw)
        cfg._attn_implementation = "sdpa"
        cfg._experts_implementation = "grouped_mm"
        # from embeddings, as the depth stacks: the 151936 x 2048 token table (622 MB) is past
        # the per-core span limit for a gather (docs/benchmarks.md "Suite irregular")
        return LastHiddenFromEmbeddings(Qwen2MoeModel(cfg)).eval(), (_input(1, seq, cfg.hidden_size),)
    return build


_TINY_DEC = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 intermediate_size=128, vocab_size=128, max_position_embeddings=256,
                 rope_parameters={"rope_type": "default", "rope_theta": 500000.0})

SUITES: dict[str, dict[str, Callable]] = {
    "layers": {
        "llama31_8b_prefill512": _decoder_prefill("llama", llama31_8b_config, 512),
        "llama31_8b_decode2048": _decoder_decode("llama", llama31_8b_config, 2048),
        "granite33_8b_prefill512": _decoder_prefill("granite", granite33_8b_config, 512),
        "granite33_8b_decode2048": _decoder_decode("granite", granite33_8b_config, 2048),
        "mistral7b_prefill512": _decoder_prefill("mistral", mistral7b_v03_config, 512),
        "mistral7b_decode2048": _decoder_decode("mistral", mistral7b_v03_config, 2048),
        "bert_base_layer512": _bert(512),
        "vit_b16_layer197": _vit(224, 16),
        "gpt2_block512": _gpt2(512),
    },
    "sweep": {
        **{f"linear_m{m}_k4096_n{n}": _linear(m, 4096, n)
           for m in (1, 4, 16, 128, 512) for n in (4096, 14336)},
        **{f"bmm_qk_b{b}_m512_k128_n512": _bmm(b, 512, 128, 512) for b in (1, 8, 32)},
        **{f"bmm_pv_b{b}_m512_k512_n128": _bmm(b, 512, 512, 128) for b in (1, 8, 32)},
    },
    "tiny": {
        "llama_tiny_prefill16": _decoder_prefill("llama", llama31_8b_config, 16, **_TINY_DEC),
        "llama_tiny_decode32": _decoder_decode("llama", llama31_8b_config, 32, **_TINY_DEC),
        "gpt2_tiny_block16": _gpt2(16, n_embd=64, n_head=4, n_inner=128, n_positions=64),
        "bert_tiny_layer16": _bert(16, hidden_size=64, num_attention_heads=4, intermediate_size=128),
        "linear_tiny_m16_k64_n128": _linear(16, 64, 128),
        "bmm_tiny_b4_m32_k64_n32": _bmm(4, 32, 64, 32),
    },
    "depth": {
        **{f"llama31_8b_x{n}_prefill512": _stack_prefill("llama", llama31_8b_config, n, 512)
           for n in (1, 2, 4, 8, 16, 32)},
        "llama31_8b_x32_decode2048": _stack_decode("llama", llama31_8b_config, 32, 2048),
        "gpt2_small_x12_seq512": _gpt2_model(12, 512),
        "bert_base_x12_seq512": _bert_model(12, 512),
    },
    "moe": {
        "mixtral8x7b_moe_prefill512": _moe_block(512),
        "mixtral8x7b_moe_decode1": _moe_block(1),
    },
    # What a vLLM Spyre deployment of Granite-3.3-8B compiles at warmup: prefill of 512 to
    # 4096 tokens, and decode at batch 1-32 against KV caches of 1k-8k tokens (one layer each).
    "serving": {
        **{f"granite33_8b_prefill{seq}": _decoder_prefill("granite", granite33_8b_config, seq)
           for seq in (512, 1024, 2048, 4096)},
        **{f"granite33_8b_decode_b{b}_kv{kv}": _decoder_decode("granite", granite33_8b_config, kv, batch=b)
           for b in (1, 4, 8, 16, 32) for kv in (1024, 2048, 4096, 8192)},
    },
    "irregular": {
        "t5_base_12x12_src512_tgt128": _t5(12, 512, 128),
        "vit_b16_gpt2_12x12_img224_tgt64": _vit_gpt2(224, 16, 64),
        "qwen15_moe_a27b_x24_alt_prefill512": _qwen2_moe_alternating(24, 512),
    },
}


def write_document(doc: dict, suite: str, name: str) -> Path:
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    out = OUT_DIR / suite
    out.mkdir(parents=True, exist_ok=True)
    for stale in (out / f"{name}.json", out / f"{name}.json.gz"):
        stale.unlink(missing_ok=True)
    if len(text) > GZIP_ABOVE_BYTES:
        path = out / f"{name}.json.gz"
        # mtime=0: regenerating an unchanged graph gives byte-identical files.
        with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as fh:
            fh.write(text.encode())
    else:
        path = out / f"{name}.json"
        path.write_text(text)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", choices=sorted(SUITES), action="append",
                    help="suite(s) to regenerate (default: all)")
    ap.add_argument("--only", help="regenerate only graphs whose name contains this")
    args = ap.parse_args(argv)
    for suite in args.suite or sorted(SUITES):
        for name, build in SUITES[suite].items():
            if args.only and args.only not in name:
                continue
            with fake_fp16():
                model, inputs = build()
            doc = capture(model, inputs, name=name)
            path = write_document(doc, suite, name)
            print(f"{suite}/{name}: {len(doc['nodes'])} nodes -> {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
