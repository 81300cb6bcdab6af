"""The co-optimizer's objective terms, after torch-spyre's `_inductor/cost_model.py` as the
co-optimizing allocator hands it to CP-SAT (PR #3810, "Integrate cost model with ILP solver").

Per kernel upstream predicts

    T   = compute + mem - overlap_gamma * min(compute, mem)      (overlap_gamma = 0.46 for the solver)
    mem = (R + W) / BW_PEAK + alpha * min(R, W)

- R, W: device-memory bytes read and written, each tensor argument counted once at its
  device (stick-padded) size, times `1 - is_lx` (an LX-resident argument moves no device
  memory traffic; a graph boundary transfer is always charged);
- BW_PEAK: the one-directional device-memory bandwidth (~150 GB/s upstream; here
  `hw.dram_oneway_gbps`), alpha the read/write turnaround (`hw.dram_turnaround_ns_per_byte`,
  whose source is that same term);
- compute: nonzero only for matmul / bmm, priced (#3810: `use_bundled_cost_model=False`) by
  the compute and split-shape part of `work_division._matmul_split_cost` called with
  `include_hbm=False`: the operand traffic term is dropped because `mem` already charges
  it, LX-aware. Every other op is bandwidth only: its core division changes its price only
  through what it lets stay in LX.

Upstream scores one estimated fused bundle at a time (inputs deduplicated inside it); our
programs have no fusion before the emitter, so every op is its own bundle here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional

from target.primitives import DTYPE_BYTES, PrimOp
from solver.baseline.work_division import matmul_axes, matmul_execution_us, matmul_preferences_us

# PR #3810: "A value of 0.46 is sent to the solver, so that the solver minimizes both
# compute and memory" (1.0 would make the kernel time max(compute, mem)).
OVERLAP_GAMMA = 0.46


@dataclass(frozen=True)
class MatmulReading:
    """(batch, M, N, K) of a matmul loop nest as the cost model reads it: iteration-dim
    indices, and whether the right operand is a shared weight."""

    batch: tuple[int, ...]
    m: Optional[int]
    n: int
    k: int
    shared_weight: bool


def matmul_reading(op: PrimOp) -> Optional[MatmulReading]:
    """The chooser's reading (`work_division.matmul_axes`) where it has one; else (a decode
    matmul, M = 1) N and K from the body and every other output dim a batch dim."""
    if op.body.kind != "matmul" or len(op.inputs) < 2:
        return None
    axes = matmul_axes(op)
    if axes is not None:
        return MatmulReading(axes.batch, axes.m, axes.n, axes.k, axes.shared_weight)
    n, k = op.body.n, op.body.k
    rows = tuple(d for d in dict.fromkeys(op.output.dims) if d is not None and d != n and d != k)
    shared = not any(d in op.inputs[1].dims for d in rows)
    return MatmulReading(rows, None, n, k, shared)


def matmul_compute_us(hw, op: PrimOp, reading: MatmulReading, split: Mapping[str, int],
                      dtype: str) -> float:
    """`_matmul_split_cost(..., include_hbm=False)`: the execution estimate without its
    operand-traffic term, plus the additive ranking preferences (both from
    solver.baseline.work_division, which has the formula and its constants)."""
    dims = op.iter_dims

    def size_split(i: Optional[int]) -> tuple[int, int]:
        if i is None:
            return 1, 1
        return dims[i].size, split.get(dims[i].name, 1)

    B = math.prod(dims[i].size for i in reading.batch) if reading.batch else 1
    b = math.prod(split.get(dims[i].name, 1) for i in reading.batch) if reading.batch else 1
    axes = ((B, b), size_split(reading.m), size_split(reading.n), size_split(reading.k))
    execution = matmul_execution_us(hw, *axes, DTYPE_BYTES[dtype], reading.shared_weight, include_hbm=False)
    return execution + matmul_preferences_us(hw, *axes, reading.shared_weight, has_m=reading.m is not None)


def op_compute_us(hw, op: PrimOp, split: Mapping[str, int], dtypes: list[str]) -> float:
    """The cost model's compute term of `op` under `split` (0 for every non-matmul op)."""
    reading = matmul_reading(op)
    if reading is None:
        return 0.0
    return matmul_compute_us(hw, op, reading, split, dtypes[0])


def bytes_ns(hw, nbytes: int) -> float:
    """Device-memory time of `nbytes` at the cost model's peak (one-directional) rate."""
    return nbytes / hw.dram_oneway_gbps


def mem_ns(hw, read_bytes: int, write_bytes: int) -> float:
    return (read_bytes + write_bytes) / hw.dram_oneway_gbps \
        + hw.dram_turnaround_ns_per_byte * min(read_bytes, write_bytes)


def kernel_ns(compute_ns: float, memory_ns: float, gamma: float = OVERLAP_GAMMA) -> float:
    return compute_ns + memory_ns - gamma * min(compute_ns, memory_ns)


def dtype_bytes(dtype: str) -> int:
    return DTYPE_BYTES[dtype]
