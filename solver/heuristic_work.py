"""Core work division the torch-spyre way (`work_division.py`), on our loop nests.

Two passes, every op divided by exactly one of them:
1. matmul split enumeration (upstream `cost_model_matmul_division`): for a matmul/bmm with
   one M dim, one K dim and batch dims shared by both operands, every (batch, m, n, k)
   split with product <= cores is priced with upstream's analytic kernel-time formula and
   the cheapest is taken, unless it uses fewer cores than the greedy split would;
2. greedy distribution (upstream `work_distribution` / `multi_dim_iteration_space_split`):
   the output's iteration dims, largest first (stick dims counted in sticks), each take the
   largest divisor of its size that does not exceed the cores still free; then, if cores
   remain and the op reduces, the single reduction dim that splits the most takes them.

Sizes are in split units (`lowering.op_rules.split_units`: whole sticks along a stick
dim), so every split is legal by construction (`lowering.op_rules.check_split`).
"""
from __future__ import annotations

import itertools
import math
from typing import Mapping, Optional

from lowering.op_rules import split_units
from lowering.primitives import DTYPE_BYTES, PrimOp

# Upstream's own fitted constants of its matmul split cost (work_division.py); they are the
# baseline's tuning, not facts about the hardware, so they stay here and not in the target.
COHORT_LIMIT = 8              # cores sharing a broadcast operand before it contends
BATCH_SPLIT_EXPONENT = 1.4    # batch-split penalty ~ b ** this
PSUM_US_PER_ELEM = 1.4e-4     # per output element, per K-split ring reduction hop
TARGET_M_PENALTY_US = 50.0    # tie-break weight when the per-core M under-fills the PT


def largest_divisor_at_most(size: int, max_cores: int) -> int:
    """Largest divisor of `size` not above `max_cores` (upstream `core_split`)."""
    for f in range(max(1, min(size, max_cores)), 0, -1):
        if size % f == 0:
            return f
    return 1


def _units(op: PrimOp, granules: Mapping[int, int]) -> list[int]:
    return [split_units(d.size, granules.get(i, 1)) for i, d in enumerate(op.iter_dims)]


def greedy_split(op: PrimOp, granules: Mapping[int, int], cores: int) -> dict[str, int]:
    units = _units(op, granules)
    out_dims = []
    for d in op.output.dims:
        if d is not None and d not in out_dims:
            out_dims.append(d)
    red_dims = [i for i in range(len(op.iter_dims)) if i not in out_dims]
    if op.body.kind == "reduce" and op.body.fn == "cumsum":
        red_dims = []  # a scan dim is never split across cores
    out_dims.sort(key=lambda i: units[i], reverse=True)  # stable: ties keep loop order
    red_dims.sort(key=lambda i: units[i], reverse=True)
    split: dict[str, int] = {}
    remaining = cores
    for i in out_dims:
        if remaining <= 1:
            break
        f = largest_divisor_at_most(units[i], remaining)
        if f > 1:
            split[op.iter_dims[i].name] = f
            remaining //= f
    if red_dims and remaining > 1:
        best_i, best_f = None, 1
        for i in red_dims:
            f = largest_divisor_at_most(units[i], remaining)
            if f > best_f:
                best_i, best_f = i, f
        if best_i is not None:
            split[op.iter_dims[best_i].name] = best_f
    return split


def matmul_split_cost_us(hw, batch: tuple[int, int], m: tuple[int, int], n: tuple[int, int],
                         k: tuple[int, int], dtype_bytes: int) -> float:
    """Upstream's analytic kernel time (µs) of [B,M,K]@[B,K,N] under a (b, m, n, k) split;
    each argument is (size in elements, split factor). Rates from the hardware file."""
    (B, b), (M, ms), (N, ns), (K, ks) = batch, m, n, k
    cores_used = b * ms * ns * ks
    if cores_used == 0 or cores_used > hw.cores:
        return math.inf
    peak_mac_per_us = hw.pt_peak_mac_per_ns_per_core * 1e3
    m_per_core = M // ms if ms else 1
    pt_passes = max(1.0, m_per_core / hw.pt_rows_per_pass)
    pt_eff = min(1.0, math.sqrt(pt_passes / hw.pt_target_passes))
    compute_us = (B * M * N * K / cores_used) / (peak_mac_per_us * pt_eff)
    moved = (B * M * K + B * K * N + B * M * N) * dtype_bytes
    cohort = max(1.0, max(ms, ns) / COHORT_LIMIT)
    hbm_us = moved / (hw.dram_peak_gbps * 1e3) * cohort
    psum_us = max(0, ks - 1) * (B * M * N) * PSUM_US_PER_ELEM
    if pt_passes >= hw.pt_target_passes:
        target_m_us = 0.0
    else:
        target_m_us = math.log2(hw.pt_target_passes / pt_passes) * TARGET_M_PENALTY_US
    return (compute_us + hbm_us + psum_us + target_m_us) * b ** BATCH_SPLIT_EXPONENT


def _divisors(n: int) -> list[int]:
    return [f for f in range(1, n + 1) if n % f == 0]


def matmul_enumerated_split(op: PrimOp, granules: Mapping[int, int], hw, dtypes: list[str],
                            default: Mapping[str, int]) -> Optional[dict[str, int]]:
    """The cost-model split of a matmul, or None where upstream's planner declines (the op
    is then divided greedily): batch dims not shared by both operands, or extra reductions."""
    body = op.body
    if body.kind != "matmul":
        return None
    x, y = op.inputs[0], op.inputs[1]
    batch = [i for i in range(len(op.iter_dims)) if i not in (body.m, body.n, body.k)]
    if any(op.iter_dims[i].kind == "reduction" for i in batch):
        return None
    if any(i not in x.dims or i not in y.dims for i in batch):
        return None  # a shared (broadcast) weight: upstream declines
    if body.m not in x.dims or body.m in y.dims:
        return None
    units = _units(op, granules)
    eps = {i: granules.get(i, 1) for i in (body.n, body.k)}
    M = op.iter_dims[body.m].size
    n_units, k_units = units[body.n], units[body.k]
    N_e, K_e = n_units * eps[body.n], k_units * eps[body.k]
    sizes = [op.iter_dims[i].size for i in batch]
    B = math.prod(sizes) if sizes else 1
    dbytes = DTYPE_BYTES[dtypes[0]]
    best, best_cost = None, math.inf
    for combo in itertools.product(*[_divisors(s) for s in sizes]) if batch else [()]:
        bp = math.prod(combo) if combo else 1
        if bp > hw.cores:
            continue
        for ms in _divisors(M):
            if bp * ms > hw.cores:
                break
            for ns in _divisors(n_units):
                if bp * ms * ns > hw.cores:
                    break
                for ks in _divisors(k_units):
                    if bp * ms * ns * ks > hw.cores:
                        break
                    c = matmul_split_cost_us(hw, (B, bp), (M, ms), (N_e, ns), (K_e, ks), dbytes)
                    if c < best_cost:
                        best, best_cost = (combo, ms, ns, ks), c
    if best is None:
        return None
    combo, ms, ns, ks = best
    split = {op.iter_dims[i].name: f for i, f in zip(batch, combo)}
    split[op.iter_dims[body.m].name] = ms
    split[op.iter_dims[body.n].name] = ns
    split[op.iter_dims[body.k].name] = ks
    split = {k: v for k, v in split.items() if v > 1}
    # never trade down to fewer cores than the greedy distributor found
    if math.prod(split.values()) < math.prod(default.values()):
        return None
    return split


def divide_work(op: PrimOp, granules: Mapping[int, int], hw, dtypes: list[str]) -> dict[str, int]:
    """The core split torch-spyre's passes give `op` (dtypes: inputs' then output's)."""
    default = greedy_split(op, granules, hw.cores)
    enumerated = matmul_enumerated_split(op, granules, hw, dtypes, default)
    return enumerated if enumerated is not None else default
