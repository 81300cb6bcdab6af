"""Continuous batching with FMS's paged KV cache, driven the way vLLM's Spyre plugin drives
it (its continuous-batching model runner), for the test and the benchmark.

`continuous_batching(model, requests, ...)` serves `requests` (a prompt, a number of new
tokens, the engine step it arrives at) with one KV cache of fixed-size blocks
(`[num_blocks, 64, kv_heads, head_dim]` per layer, `attn_name="spyre_paged_attn"`):

- one engine step is either the prefill of one arrived request (batch 1; vLLM Spyre
  prefills one sequence at a time) or one decode step of every running request; an
  arrived request is prefilled as soon as the batch has room (`max_batch`), before the
  next decode step (the plugin's scheduler adds limits on the batch's total tokens, which
  a small cache here never reaches: running out of blocks raises);
  a request that has its tokens leaves the batch and its blocks return to the pool, so
  the decode batch grows and shrinks between steps;
- the batch shares one `tkv` (the position after the longest sequence): a prefill is
  left-padded to line up with it and right-padded to a block boundary, a prompt longer
  than `tkv` moves `tkv` up by whole blocks (the running sequences get that much more left
  padding), and whole blocks of left padding common to all sequences are dropped before
  each step;
- block 0 is the padding block: block tables are left-padded with it to one rectangle;
- inputs are marked as the plugin marks them (`torch._dynamo.mark_dynamic` /
  `mark_static`): prefill batch static and sequence dynamic; decode batch dynamic and the
  block table's width dynamic. So a compiled model sees a handful of graph shapes: one per
  prefill length (a multiple of 64) and one per (batch size, block-table width).

The prefill returns the last 64 positions' logits (`last_n_tokens=64`) and the token is
read before the right padding; a decode step returns one position per sequence.

Greedy decoding. `run.tokens[r]` are request r's new tokens, `run.logits[r]` the logits each
came from (float32), so a compiled run can be compared with the eager CPU fp32 run token by
token (aiu-fms-testing-utils' validation level 0) and by their level-1 metrics
(`level_1_metrics`).
"""
from __future__ import annotations

import contextlib
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import torch

import backend

BLOCK_SIZE = 64          # vLLM Spyre's KV cache block (SpyrePlatform.get_block_size())
ATTN_NAME = "spyre_paged_attn"


@dataclass(frozen=True)
class Request:
    prompt: torch.Tensor     # 1-d token ids
    max_tokens: int          # new tokens to generate (the prefill's included)
    arrival: int = 0         # the engine step from which it may be scheduled


@dataclass
class _Running:
    index: int
    request: Request
    blocks: list[int]
    left_padding: int
    tokens: list[int] = field(default_factory=list)

    @property
    def computed(self) -> int:
        """Tokens in the KV cache: the prompt and every generated token but the last."""
        return len(self.request.prompt) + len(self.tokens) - 1


@dataclass
class Step:
    kind: str                # "prefill" or "decode"
    batch: int               # sequences in the step
    shape: tuple             # (input length, block-table width) of the model call
    latency_us: Optional[float] = None   # simulated time of the step's program (compiled runs)


@dataclass
class PagedRun:
    tokens: list[list[int]]              # per request, its generated tokens
    logits: list[list[torch.Tensor]]     # per request, per token, the (vocab,) float32 logits
    steps: list[Step]
    seconds: float
    coverage: Optional[Any] = None       # backend.CoverageReport of the graphs compiled in the run

    @property
    def decode_steps(self) -> int:
        return sum(s.kind == "decode" for s in self.steps)

    @property
    def batch_sizes(self) -> list[int]:
        return [s.batch for s in self.steps if s.kind == "decode"]


@contextlib.contextmanager
def paged_dynamo_settings() -> Iterator[None]:
    """The Dynamo settings the paged path runs with: automatic dynamic shapes (the plugin
    marks its dims) and size-oblivious backed sizes, so a marked dim of size 1 stays
    symbolic (aiu-fms-testing-utils sets `backed_size_oblivious` for paged attention); a
    cache size limit above the number of shapes."""
    from torch.fx.experimental import _config as fx_config

    cfg = torch._dynamo.config
    names = ("dynamic_shapes", "automatic_dynamic_shapes", "cache_size_limit", "accumulated_cache_size_limit")
    saved = {n: getattr(cfg, n) for n in names if hasattr(cfg, n)}
    saved_oblivious = fx_config.backed_size_oblivious
    try:
        cfg.dynamic_shapes = True
        cfg.automatic_dynamic_shapes = True
        cfg.cache_size_limit = max(cfg.cache_size_limit, 256)
        if hasattr(cfg, "accumulated_cache_size_limit"):
            cfg.accumulated_cache_size_limit = max(cfg.accumulated_cache_size_limit, 1024)
        fx_config.backed_size_oblivious = True
        yield
    finally:
        for n, v in saved.items():
            setattr(cfg, n, v)
        fx_config.backed_size_oblivious = saved_oblivious


def granite(max_len: int = 256, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The FMS zoo's tiny Granite (tests/fms_zoo.py) with room for `max_len` positions
    (its rotary table), so prompts can span several 64-token blocks."""
    import dataclasses

    from fms.models.granite import Granite

    from tests.fms_zoo import _granite_config, init_random

    torch.manual_seed(seed)
    model = init_random(Granite(dataclasses.replace(_granite_config(), max_expected_seq_len=max_len)), seed)
    return model.to(dtype).eval()


def _kv_shape(model: Any) -> tuple[int, int, int]:
    cfg = model.config
    kvheads = getattr(cfg, "kvheads", 0) or cfg.nheads
    if getattr(cfg, "multiquery_attn", False):
        kvheads = 1
    head_dim = getattr(cfg, "head_dim", None) or cfg.emb_dim // cfg.nheads
    return cfg.nlayers, kvheads, head_dim


def _dtype(model: Any) -> torch.dtype:
    return next(model.parameters()).dtype


def _prefill_inputs(prompt: torch.Tensor, left: int, right: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids, positions and additive mask of one prompt padded on the left to `left` tokens
    (FMS's pad_input_ids) and on the right to `right` tokens (pads at position 0, seeing
    only the right pads up to themselves, as the plugin pads)."""
    from fms.utils.generation import pad_input_ids

    ids, padding = pad_input_ids([prompt], min_pad_length=left)
    pos, mask = padding["position_ids"], padding["mask"]
    extra = right - ids.shape[1]
    if extra > 0:
        ids = torch.cat([ids, torch.zeros(1, extra, dtype=ids.dtype)], dim=1)
        pos = torch.cat([pos, torch.zeros(1, extra, dtype=pos.dtype)], dim=1)
        mask = torch.nn.functional.pad(mask, (0, extra, 0, extra), value=-torch.inf)
        causal = torch.zeros(extra, extra).masked_fill(~torch.ones(extra, extra, dtype=torch.bool).tril(), -torch.inf)
        mask[:, -extra:, -extra:] = causal
    return ids, pos, mask.unsqueeze(1).contiguous()


class _Engine:
    def __init__(self, model: Any, num_blocks: int, seed: int):
        self.model = model
        layers, kvheads, head_dim = _kv_shape(model)
        dtype = _dtype(model)
        self.caches = [(torch.zeros(num_blocks, BLOCK_SIZE, kvheads, head_dim, dtype=dtype),
                        torch.zeros(num_blocks, BLOCK_SIZE, kvheads, head_dim, dtype=dtype)) for _ in range(layers)]
        free = list(range(1, num_blocks))      # block 0 pads block tables
        random.Random(seed).shuffle(free)      # not contiguous, as after a while of serving
        self.free = free
        self.tkv = 0
        self.running: list[_Running] = []

    def _allocate(self, n: int) -> list[int]:
        if n > len(self.free):
            raise RuntimeError(f"KV cache out of blocks ({n} wanted, {len(self.free)} free)")
        got, self.free = self.free[:n], self.free[n:]
        return got

    def _call(self, ids, **kwargs):
        logits, self.caches = self.model(ids, past_key_value_states=self.caches, use_cache=True, attn_name=ATTN_NAME,
                                         **kwargs)
        return logits

    def reduce_left_padding(self) -> None:
        if not self.running:
            return
        offset = min(r.left_padding for r in self.running) // BLOCK_SIZE * BLOCK_SIZE
        for r in self.running:
            r.left_padding -= offset
        self.tkv -= offset

    def prefill(self, index: int, request: Request) -> tuple[Step, torch.Tensor]:
        prompt_len = len(request.prompt)
        new_batch = not self.running
        if not new_batch and prompt_len > self.tkv:
            offset = math.ceil((prompt_len - self.tkv) / BLOCK_SIZE) * BLOCK_SIZE
            self.tkv += offset
            for r in self.running:
                r.left_padding += offset
        right_tkv = math.ceil((prompt_len if new_batch else self.tkv) / BLOCK_SIZE) * BLOCK_SIZE
        if new_batch:
            self.tkv = right_tkv
        left_padding = self.tkv - prompt_len
        pad_blocks = left_padding // BLOCK_SIZE        # whole blocks of left padding are not computed
        right_tkv -= pad_blocks * BLOCK_SIZE
        left_tkv = self.tkv - pad_blocks * BLOCK_SIZE
        blocks = self._allocate(right_tkv // BLOCK_SIZE)
        slots = (torch.arange(BLOCK_SIZE).repeat(len(blocks))
                 + torch.tensor(blocks).repeat_interleave(BLOCK_SIZE) * BLOCK_SIZE)[None, :]
        ids, pos, mask = _prefill_inputs(request.prompt, left_tkv, right_tkv)
        pads_right = right_tkv - left_tkv
        for t in (ids, pos, slots):
            torch._dynamo.mark_static(t, 0)
            torch._dynamo.mark_dynamic(t, 1)
        torch._dynamo.mark_static(mask, 0)
        torch._dynamo.mark_dynamic(mask, 2)
        torch._dynamo.mark_dynamic(mask, 3)
        logits = self._call(ids, position_ids=pos, mask=mask, last_n_tokens=BLOCK_SIZE, slot_mapping=slots,
                            current_tkv_mask=None, left_padded_prompt_mask=None, block_table=None)
        row = logits[0, -pads_right - 1].float()
        self.running.append(_Running(index, request, blocks, left_padding))
        return Step("prefill", 1, (ids.shape[1], 0)), row

    def decode(self) -> tuple[Step, torch.Tensor]:
        if self.tkv % BLOCK_SIZE == 0:      # the new token starts a block
            for r in self.running:
                r.blocks += self._allocate(1)
        width = max(len(r.blocks) for r in self.running)
        table = torch.tensor([[0] * (width - len(r.blocks)) + r.blocks for r in self.running])
        slots = torch.tensor([[r.blocks[-1] * BLOCK_SIZE + self.tkv % BLOCK_SIZE] for r in self.running])
        ids = torch.tensor([[r.tokens[-1]] for r in self.running])
        pos = torch.tensor([[r.computed] for r in self.running])
        start = torch.tensor([r.left_padding for r in self.running])
        self.tkv += 1
        tkv = torch.full((len(self.running),), self.tkv, dtype=torch.int64)
        for t in (ids, table, slots, pos, tkv, start):
            torch._dynamo.mark_dynamic(t, 0)
        for t in (ids, slots, pos):
            torch._dynamo.mark_static(t, 1)
        torch._dynamo.mark_dynamic(table, 1)
        logits = self._call(ids, position_ids=pos, mask=None, last_n_tokens=1, slot_mapping=slots,
                            current_tkv_mask=tkv, left_padded_prompt_mask=start, block_table=table)
        return Step("decode", len(self.running), (1, width)), logits[:, -1].float()

    def finish(self) -> None:
        done = [r for r in self.running if len(r.tokens) >= r.request.max_tokens]
        for r in done:
            self.free += r.blocks
        self.running = [r for r in self.running if r not in done]


def continuous_batching(model: Any, requests: list[Request], num_blocks: int = 32, max_batch: int = 4,
                        seed: int = 0, golden: Optional[list[list[int]]] = None) -> PagedRun:
    """Serve `requests` greedily (see the module docstring): `model` is the eager model (the
    CPU reference) or a compiled one. `golden`: per request the tokens to feed back instead
    of the argmax (aiu-fms-testing-utils' GoldenTokenHook: a run whose tokens diverge from
    the reference's still yields logits comparable position by position); `tokens` are then
    still the argmax of each step."""
    import fms.utils.spyre.paged  # noqa: F401  registers spyre_paged_attn and its ops

    from backend.region import last_run_info

    engine = _Engine(model, num_blocks, seed)
    tokens: list[list[int]] = [[] for _ in requests]
    logits: list[list[torch.Tensor]] = [[] for _ in requests]
    waiting = list(range(len(requests)))
    steps: list[Step] = []
    clock = 0
    with paged_dynamo_settings(), torch.no_grad(), backend.track_coverage() as cov:
        started = time.perf_counter()
        while waiting or engine.running:
            engine.reduce_left_padding()
            arrived = [i for i in waiting if requests[i].arrival <= clock]
            if arrived and len(engine.running) < max_batch:
                i = arrived[0]
                waiting.remove(i)
                step, rows = engine.prefill(i, requests[i])
                rows, order = rows[None], [engine.running[-1]]
            elif engine.running:
                step, rows = engine.decode()
                order = list(engine.running)
            else:
                clock += 1
                continue
            info = last_run_info()
            step.latency_us = info.latency_us if info is not None else None
            steps.append(step)
            for r, row in zip(order, rows):
                tokens[r.index].append(int(row.argmax()))
                r.tokens.append(golden[r.index][len(r.tokens)] if golden is not None else tokens[r.index][-1])
                logits[r.index].append(row.clone())
            engine.finish()
            clock += 1
        seconds = time.perf_counter() - started
    return PagedRun(tokens, logits, steps, seconds, cov if cov.graphs else None)


def level_1_metrics(run: PagedRun, reference: PagedRun, top_k: int = 20) -> list[tuple[int, int, tuple[float, float]]]:
    """aiu-fms-testing-utils' validation level 1 (`capture_level_1_metrics` over the top
    `top_k` reference logits): per request and token, the cross entropy of the reference
    logits against the tested softmax, and the mean absolute difference of the two softmaxes."""
    from aiu_fms_testing_utils.testing.validation import capture_level_1_metrics, top_k_loss_calculator

    def ce_and_mean_diff(ref: torch.Tensor, test: torch.Tensor) -> tuple[float, float]:
        p_ref, p_test = ref.softmax(dim=1).float(), test.softmax(dim=1).float()
        ce = torch.nn.functional.cross_entropy(ref.float(), p_test)
        return float(ce), float((p_ref - p_test).abs().mean())

    ref = [[t[None] for t in seq] for seq in reference.logits]
    test = [[t[None] for t in seq] for seq in run.logits]
    return capture_level_1_metrics(ref, test, top_k_loss_calculator(top_k, ce_and_mean_diff))
