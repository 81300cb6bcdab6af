"""Tiny random-weight transformer/CNN models shared by the tests (lowering, backend).

`tiny_models()` returns name -> (model, example_inputs). Weights are random but seeded,
so numerics comparisons are reproducible.
"""
from __future__ import annotations

import torch

TINY_MODEL_NAMES = ("gpt2", "llama", "bert", "vit", "resnet")


def _gpt2():
    from transformers import GPT2Config, GPT2Model

    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64, use_cache=False)
    return GPT2Model(cfg), lambda g: (torch.randint(0, 128, (1, 16), generator=g),)


def _llama():
    from transformers import LlamaConfig, LlamaModel

    cfg = LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, vocab_size=128, use_cache=False)
    return LlamaModel(cfg), lambda g: (torch.randint(0, 128, (1, 16), generator=g),)


def _bert():
    from transformers import BertConfig, BertModel

    cfg = BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                     vocab_size=128, use_cache=False)
    return BertModel(cfg), lambda g: (torch.randint(0, 128, (1, 16), generator=g),)


def _vit():
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                    image_size=32, patch_size=8)
    return ViTModel(cfg), lambda g: (torch.randn(1, 3, 32, 32, generator=g),)


def _resnet():
    from transformers import ResNetConfig, ResNetModel

    cfg = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic")
    return ResNetModel(cfg), lambda g: (torch.randn(1, 3, 32, 32, generator=g),)


_FACTORIES = {"gpt2": _gpt2, "llama": _llama, "bert": _bert, "vit": _vit, "resnet": _resnet}


def tiny_model(name: str, dtype: torch.dtype = torch.float32, seed: int = 0):
    """One tiny model in eval mode with its example inputs (floating inputs cast to dtype)."""
    torch.manual_seed(seed)
    model, make_inputs = _FACTORIES[name]()
    model = model.eval().to(dtype)
    if hasattr(model.config, "return_dict"):
        model.config.return_dict = True
    g = torch.Generator().manual_seed(seed + 1)
    inputs = tuple(t.to(dtype) if t.is_floating_point() else t for t in make_inputs(g))
    return model, inputs


def tiny_models(dtype: torch.dtype = torch.float32, names=TINY_MODEL_NAMES, seed: int = 0) -> dict:
    """name -> (model, example_inputs) for the five tiny test models."""
    return {n: tiny_model(n, dtype, seed) for n in names}


def tiny_primgraph(name: str, dtype: torch.dtype = torch.float32, seed: int = 0):
    """A tiny model captured (backend.capture) and lowered to primitive ops. Lowering covers
    all five models: a GraphError here is a regression, never a reason to skip."""
    from backend.capture import capture
    from lowering import lower_document
    from lowering.graph_format import GraphDocument

    model, inputs = tiny_model(name, dtype, seed)
    return lower_document(GraphDocument.model_validate(capture(model, inputs, name=name)))
