"""The static-batching serving loop as FMS drives it, for the test and the benchmark.

`static_batching(model, prompts, new_tokens, dynamo=...)` pads the prompts into one batch
(`fms.utils.generation.pad_input_ids`: left padding, an additive causal mask, position
ids), then runs `fms.utils.generation.generate` greedily with the sdpa KV cache
(`use_cache=True, contiguous_cache=True`, `attn_name="sdpa_causal"`, `last_n_tokens=1`),
the settings of `aiu-fms-testing-utils`' inference script for `--attention_type sdpa`:
the prefill, then one decode step per further token, each step's cache one longer.

`dynamo` selects how Dynamo sees the growing sizes:
- "static": what the Spyre scripts set without `--compile_dynamic`
  (`torch._dynamo.config.dynamic_shapes = False`, `automatic_dynamic_shapes = False`,
  `assume_static_by_default = True`, `dynamic=False`): Dynamo recompiles each step;
- "mark_dynamic": FMS's default (`dynamic_shapes = True`): generate marks the KV cache's
  sequence dim dynamic after each step and Dynamo's automatic dynamic shapes make the
  mask's and positions' sizes symbolic on the next recompile, so the decode steps share one
  symbolic Dynamo graph that the backend specializes per KV length.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import torch

import backend


@dataclass
class ServingRun:
    tokens: torch.Tensor                 # (batch, prompt + new tokens)
    seconds: float                       # wall time of the whole generate call
    coverage: Optional[Any] = None       # backend.CoverageReport of the graphs compiled in the run
    dynamo_graphs: int = 0               # graphs Dynamo handed the backend
    programs: int = 0                    # static programs compiled (one per graph or per specialized shape)
    compile_seconds: float = 0.0         # sum of the programs' compile times
    logits: list = field(default_factory=list)  # each step's last-position logits (batch, vocab), float32
    step_latency_us: list = field(default_factory=list)  # each step's simulated time (compiled runs)


@contextlib.contextmanager
def dynamo_settings(mode: str) -> Iterator[None]:
    cfg = torch._dynamo.config
    names = ("dynamic_shapes", "automatic_dynamic_shapes", "assume_static_by_default", "cache_size_limit",
             "accumulated_cache_size_limit")
    saved = {n: getattr(cfg, n) for n in names if hasattr(cfg, n)}
    try:
        cfg.cache_size_limit = max(cfg.cache_size_limit, 256)
        if hasattr(cfg, "accumulated_cache_size_limit"):
            cfg.accumulated_cache_size_limit = max(cfg.accumulated_cache_size_limit, 1024)
        if mode == "static":
            cfg.dynamic_shapes = False
            cfg.automatic_dynamic_shapes = False
            cfg.assume_static_by_default = True
        elif mode == "mark_dynamic":
            cfg.dynamic_shapes = True
            cfg.automatic_dynamic_shapes = True
        else:
            raise ValueError(f"dynamo mode {mode!r}: 'static' or 'mark_dynamic'")
        yield
    finally:
        for n, v in saved.items():
            setattr(cfg, n, v)


def batch_prompts(prompts: list[torch.Tensor]) -> tuple[torch.Tensor, dict]:
    from fms.utils.generation import pad_input_ids

    ids, padding = pad_input_ids(prompts, min_pad_length=0)
    return ids, padding


def compile_for_serving(model: Any, options: Optional[dict] = None) -> Any:
    """The model as a Spyre user compiles it, with the sticksat backend (Dynamo reset first)."""
    torch._dynamo.reset()
    return torch.compile(model, backend="sticksat", dynamic=False, options=options or {})


def static_batching(model: Any, prompts: list[torch.Tensor], new_tokens: int, dynamo: Optional[str] = None) -> ServingRun:
    """Greedy generation of `new_tokens` tokens (the prefill's plus `new_tokens - 1`
    decode steps) by `model` (eager: the CPU reference; or `compile_for_serving(model)`)
    under the Dynamo mode `dynamo` ("static" when None)."""
    from fms.utils.generation import generate

    ids, padding = batch_prompts(prompts)
    kwargs = {**padding, "attn_name": "sdpa_causal", "last_n_tokens": 1}
    run_model = model
    mode = dynamo or "static"
    from backend.region import last_run_info

    logits: list = []
    latencies: list = []

    def keep_logits(position, step_logits, next_val, step_kwargs):
        logits.append(step_logits.detach().float().clone())
        info = last_run_info()  # the step's graph is one region: its simulated time
        latencies.append(info.latency_us if info is not None else None)
        return next_val, step_kwargs

    with dynamo_settings(mode), torch.no_grad(), backend.track_coverage() as cov:
        started = time.perf_counter()
        tokens = generate(run_model, ids, max_seq_len=ids.shape[1] + new_tokens, max_new_tokens=new_tokens,
                          use_cache=True, do_sample=False, contiguous_cache=True, extra_kwargs=kwargs,
                          post_iteration_hook=keep_logits)
        seconds = time.perf_counter() - started
    if not cov.graphs:
        return ServingRun(tokens, seconds, cov, logits=logits)
    frames = {(g.code, g.compile_id) for g in cov.graphs}
    return ServingRun(tokens, seconds, cov, dynamo_graphs=len(frames), programs=len(cov.graphs),
                      compile_seconds=cov.compile_seconds, logits=logits, step_latency_us=latencies)


def max_logit_error(run: ServingRun, reference: ServingRun) -> float:
    """max over steps of max |logits - reference| / max |reference| (the per-step logits
    generate hands its post-iteration hook)."""
    return max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(run.logits, reference.logits))
