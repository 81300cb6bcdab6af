"""Sequence-length bucketing: a handful of static programs serve every prompt length.

Graph format v1 is static, and `torch.compile(..., dynamic=False)` compiles one graph per
input shape. A serving loop sees many prompt lengths; `bucketed(compiled_model)` pads the
sequence dim of `input_ids` (with `pad_token_id`) and of `attention_mask` (with 0) up to the
next configured bucket, calls the model, and cuts every output tensor whose sequence dim
has the bucket's length back to the real length. So each bucket compiles once (and its
program is cached in the store like any other), whatever lengths arrive.

Padding goes at the end and is masked, so the real positions' results are those of the
unpadded call for a model that honours `attention_mask`: a causal decoder never lets a
real position see a later one, and a bidirectional encoder masks the padded keys. A model
without an attention mask input would see the padding: `bucketed` refuses it (it needs
`attention_mask` among the call's keyword arguments, or passes `mask_required=False`
explicitly). Lengths above the largest bucket are refused with a clear error rather than
compiled one shape at a time.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

DEFAULT_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048)


class BucketError(ValueError):
    """The call cannot be bucketed (no mask, a length past the largest bucket, ...)."""


@dataclass
class Bucketed:
    model: Callable
    buckets: tuple[int, ...] = DEFAULT_BUCKETS
    pad_token_id: int = 0
    seq_dim: int = 1
    mask_required: bool = True
    # bucket -> calls served, for the caller's own accounting (and the tests)
    calls: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        b = tuple(sorted({int(x) for x in self.buckets}))
        if not b or b[0] < 1:
            raise BucketError(f"buckets must be positive lengths, got {self.buckets!r}")
        self.buckets = b

    def bucket_for(self, length: int) -> int:
        i = bisect.bisect_left(self.buckets, length)
        if i == len(self.buckets):
            raise BucketError(f"sequence length {length} is above the largest bucket {self.buckets[-1]}; "
                              f"add a bucket or shorten the input")
        return self.buckets[i]

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: Any):
        if attention_mask is None:
            if self.mask_required:
                raise BucketError("bucketing pads the sequence, so the model must get an attention_mask "
                                  "(pass one, or mask_required=False if padding cannot change the real outputs)")
            attention_mask = None
        length = input_ids.shape[self.seq_dim]
        bucket = self.bucket_for(length)
        pad = bucket - length
        ids = _pad(input_ids, self.seq_dim, pad, self.pad_token_id)
        if attention_mask is not None:
            kwargs["attention_mask"] = _pad(attention_mask, self.seq_dim, pad, 0)
        self.calls[bucket] = self.calls.get(bucket, 0) + 1
        out = self.model(ids, **kwargs)
        return _cut(out, self.seq_dim, bucket, length) if pad else out


def bucketed(model: Callable, buckets: Sequence[int] = DEFAULT_BUCKETS, pad_token_id: int = 0,
             seq_dim: int = 1, mask_required: bool = True) -> Bucketed:
    """`model` (usually `torch.compile(m, backend="sticksat", dynamic=False)`) called with
    the sequence padded to the next bucket; see the module docstring."""
    return Bucketed(model, tuple(buckets), pad_token_id, seq_dim, mask_required)


def _pad(t: torch.Tensor, dim: int, pad: int, value: int) -> torch.Tensor:
    if pad == 0:
        return t
    shape = list(t.shape)
    shape[dim] = pad
    return torch.cat([t, torch.full(shape, value, dtype=t.dtype, device=t.device)], dim=dim)


def _cut(out: Any, dim: int, bucket: int, length: int) -> Any:
    """Every tensor in `out` whose `dim` has the bucket's length, cut to `length`."""
    if isinstance(out, torch.Tensor):
        if out.dim() > dim and out.shape[dim] == bucket:
            return out.narrow(dim, 0, length)
        return out
    if isinstance(out, tuple) and hasattr(out, "_fields"):  # namedtuple
        return type(out)(*(_cut(x, dim, bucket, length) for x in out))
    if isinstance(out, (list, tuple)):
        return type(out)(_cut(x, dim, bucket, length) for x in out)
    if isinstance(out, dict):  # transformers' ModelOutput is a dict subclass
        for k in list(out.keys()):
            out[k] = _cut(out[k], dim, bucket, length)
        return out
    return out
