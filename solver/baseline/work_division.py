"""Core work division the torch-spyre way (`work_division.py`), on our loop nests.

Two passes, every op divided by exactly one of them:
1. matmul split chooser (upstream `_cost_model_divide_op` / `_cost_model_matmul_planner`,
   on by default since the planner flag was dropped): for a matmul/bmm with one output
   stick dim N, one reduction dim K and at least one row dim of size > 1, every
   (batch, m, n, k) split with product <= cores is ranked by upstream's
   `_matmul_split_cost` (an execution estimate plus additive ranking preferences, as of
   PR #2829 and its follow-ups up to #4616) and the cheapest is taken, unless it uses
   fewer cores than the greedy split would;
2. greedy distribution (upstream `work_distribution` / `multi_dim_iteration_space_split`):
   the output's iteration dims, largest first (stick dims counted in sticks), each take the
   largest divisor of its size that does not exceed the cores still free; then, if cores
   remain and the op reduces, the single reduction dim that splits the most takes them.

Sizes are in split units (`target.op_rules.split_units`: whole sticks along a stick
dim), so every split is legal by construction (`target.op_rules.check_split`).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Mapping, Optional

from target.op_rules import split_units
from target.primitives import DTYPE_BYTES, PrimOp, index_iter_dims

# Upstream's own tuning of its matmul split chooser (torch_spyre/_inductor/work_division.py,
# the constants above `_matmul_execution_cost`). They rank splits; they are not facts about
# the hardware, so they stay here and not in the target. The hardware rates the formula
# uses (PT peak MACs per core, PT rows per pass, peak device-memory bandwidth) are read
# from `target.hardware`.
TARGET_PT_PASSES = 5               # per-core M of this many PT passes keeps the pipeline full
TARGET_M_TIE_PASSES = 4            # M lanes wanted: M // (this * rows per pass)
PT_EFFICIENCY_EXPONENT = 0.25      # short-M compute derate (target_rows / m_tile) ** this
COHORT_LIMIT = 8                   # cores sharing one operand load before it contends
COHORT_PENALTY_EXPONENT = 0.75     # bandwidth derate (sharers / limit) ** this past the limit
PSUM_US_PER_CORE_ELEM_SHARED = 1.0e-3   # per K-split hop, per output element of a core's tile
PSUM_US_PER_CORE_ELEM_BMM = 1.0e-4
M_LANE_UNDERUSE_US = 10.0          # per log2 step of M lanes below the target
M_TILE_UNDERFILL_ROWS = 16         # rows per core below this pay PT startup ...
M_TILE_UNDERFILL_US = 30.0         # ... this much per log2 step
TARGET_N_TILE_ELEMS = 512          # per-core N wider than this loses schedule efficiency ...
WIDE_N_TILE_US = 25.0              # ... this much per log2 step
CORE_UNDERUSE_US = 150.0           # per log2 step of cores left idle (soft, replaces a hard rule)
BMM_BATCH_SPLIT_US = 10.0          # true BMM: per log2 step of the batch split
LARGE_M_TILE_SHAPE_US = 20.0       # true BMM: splitting a narrow N when K >> N
SHARED_DOWN_N_SPLIT_US = 10.0      # shared weight: splitting N when K >> N
SHARED_NARROW_OUTPUT_REF = TARGET_N_TILE_ELEMS * COHORT_LIMIT
SHARED_N_TILE_TARGET = TARGET_N_TILE_ELEMS // 4


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
    scan = op.body.kind == "reduce" and op.body.fn == "cumsum"
    out_dims = []
    for d in op.output.dims:
        # a scan dim is never split across cores, though a cumsum writes along it
        if d is not None and d not in out_dims and not (scan and op.iter_dims[d].kind == "reduction"):
            out_dims.append(d)
    # a scatter's row dims are never split either: which of two rows naming one position
    # lands last is their order (target.op_rules)
    rows = index_iter_dims(op)
    red_dims = [] if scan else [i for i in range(len(op.iter_dims)) if i not in out_dims and i not in rows]
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


def _pt_efficiency_inverse(m_tile: float, rows_per_pass: int) -> float:
    full = rows_per_pass * TARGET_PT_PASSES
    if m_tile >= full:
        return 1.0
    if m_tile <= rows_per_pass:
        return TARGET_PT_PASSES ** PT_EFFICIENCY_EXPONENT
    return (full / m_tile) ** PT_EFFICIENCY_EXPONENT


def matmul_execution_us(hw, batch: tuple[int, int], m: tuple[int, int], n: tuple[int, int],
                        k: tuple[int, int], dtype_bytes: int, shared_weight: bool = False,
                        include_hbm: bool = True) -> float:
    """Upstream's `_matmul_execution_cost`: estimated kernel time (µs) of [B,M,K]@[B,K,N]
    under a (b, m, n, k) split; each argument is (size in elements, split factor).
    - compute: MACs per core over the PT peak, derated when a core's M tile is shorter than
      TARGET_PT_PASSES passes; doubled when K is split (PR #4616: the backend runs an op
      with a cross-core reduction on one of a core's two corelets);
    - operand traffic at peak bandwidth, derated by (sharers / COHORT_LIMIT) ** 0.75 where
      more than COHORT_LIMIT cores share a load (sharers: max(m, n) for a shared weight,
      n for a true BMM); a shared weight is loaded once, not once per batch;
    - partial sums: (k - 1) hops of each core's output tile.
    `include_hbm=False` leaves the traffic term out (upstream's `include_hbm`, as the
    co-optimizer's objective uses it)."""
    (B, b), (M, ms), (N, ns), (K, ks) = batch, m, n, k
    cores_used = b * ms * ns * ks
    if cores_used == 0 or cores_used > hw.cores:
        return math.inf
    peak_mac_per_us = hw.pt_peak_mac_per_ns_per_core * 1e3
    m_tile = M // ms if ms else 1
    compute_us = _pt_efficiency_inverse(m_tile, hw.pt_rows_per_pass) * (B * M * N * K / cores_used) / peak_mac_per_us
    if ks > 1:
        compute_us *= 2
    weight_batches = 1 if shared_weight else B
    moved = (B * M * K + weight_batches * K * N + B * M * N) * dtype_bytes
    sharers = max(ms, ns) if shared_weight else ns
    cohort = max(1.0, (sharers / COHORT_LIMIT) ** COHORT_PENALTY_EXPONENT)
    hbm_us = moved / (hw.dram_peak_gbps * 1e3) * cohort if include_hbm else 0.0
    psum_coeff = PSUM_US_PER_CORE_ELEM_SHARED if shared_weight else PSUM_US_PER_CORE_ELEM_BMM
    psum_us = max(0, ks - 1) * (B * M * N) / (b * ms * ns) * psum_coeff
    return compute_us + hbm_us + psum_us


def matmul_split_cost_us(hw, batch: tuple[int, int], m: tuple[int, int], n: tuple[int, int],
                         k: tuple[int, int], dtype_bytes: int, shared_weight: bool = False) -> float:
    """Upstream's `_matmul_split_cost`: the execution estimate plus its additive ranking
    preferences (`matmul_preferences_us`)."""
    execution = matmul_execution_us(hw, batch, m, n, k, dtype_bytes, shared_weight)
    if execution == math.inf:
        return execution
    return execution + matmul_preferences_us(hw, batch, m, n, k, shared_weight)


def matmul_preferences_us(hw, batch: tuple[int, int], m: tuple[int, int], n: tuple[int, int],
                          k: tuple[int, int], shared_weight: bool = False, has_m: bool = True) -> float:
    """The additive ranking preferences of upstream's `_matmul_split_cost` (µs): M lanes
    under the target, M tiles under 16 rows, per-core N over 512, splitting a narrow N
    when K >> N, idle cores, a true BMM's batch split. `has_m=False`: the loop nest has
    no M dim (no lane term)."""
    (_, b), (M, ms), (N, ns), (K, ks) = batch, m, n, k
    cores_used = b * ms * ns * ks
    m_tile = M // ms if ms else 1
    n_tile = N // ns if ns else N
    rows = hw.pt_rows_per_pass
    target_m = max(rows // 2, min(hw.cores // 2, max(1, M // (TARGET_M_TIE_PASSES * rows))))
    m_lane = max(0.0, math.log2(target_m / ms)) * M_LANE_UNDERUSE_US if has_m else 0.0
    m_underfill = max(0.0, math.log2(M_TILE_UNDERFILL_ROWS / max(1, m_tile))) * M_TILE_UNDERFILL_US
    wide_n = max(0.0, math.log2(max(1, n_tile) / TARGET_N_TILE_ELEMS)) * WIDE_N_TILE_US
    filled = 1.0 if m_tile >= M_TILE_UNDERFILL_ROWS else 0.0
    k_over_n = max(0.0, math.log2(max(1, K) / max(1, N)))
    if shared_weight:
        shape = (filled * max(0.0, math.log2(SHARED_NARROW_OUTPUT_REF / max(1, N)))
                 * max(0.0, math.log2(max(1, n_tile) / SHARED_N_TILE_TARGET)) * LARGE_M_TILE_SHAPE_US / 4
                 + k_over_n * math.log2(ns) * SHARED_DOWN_N_SPLIT_US)
        batch_split = 0.0
    else:
        shape = filled * k_over_n * math.log2(ns) * LARGE_M_TILE_SHAPE_US
        batch_split = math.log2(b) * BMM_BATCH_SPLIT_US
    core_underuse = max(0.0, math.log2(hw.cores / cores_used)) * CORE_UNDERUSE_US
    return m_lane + m_underfill + wide_n + shape + core_underuse + batch_split


def _divisors(n: int) -> list[int]:
    return [f for f in range(1, n + 1) if n % f == 0]


@dataclass(frozen=True)
class MatmulAxes:
    """How upstream's chooser reads a matmul loop nest (`_cost_model_matmul_planner`)."""

    batch: tuple[int, ...]     # iteration-dim indices
    m: int
    n: int
    k: int
    shared_weight: bool        # the right operand is loaded once (a weight), not per batch


def matmul_axes(op: PrimOp) -> Optional[MatmulAxes]:
    """The (batch, M, N, K) reading of `op`, or None where upstream's chooser declines.

    Upstream squeezes size-1 dims out of the iteration space, takes N as the output's stick
    dim and K as the single reduction dim, and M among the output's other (row) dims as the
    one only the left operand indexes; when several row dims are indexed by one operand
    only (a weight broadcast over batch dims, e.g. [B,S,K] @ [K,N]), M is the innermost of
    them and the weight counts as shared; with no batch dim left the weight is shared too.
    No row dim of size > 1 (a decode matmul with M = 1) or no M candidate (a true BMM whose
    M is 1): declined, the greedy pass divides it."""
    body = op.body
    if body.kind != "matmul" or len(op.inputs) < 2:
        return None
    x, y = op.inputs[0].dims, op.inputs[1].dims
    real = [i for i, d in enumerate(op.iter_dims) if d.size > 1]
    reductions = [i for i in real if i not in op.output.dims]
    if body.n not in real or reductions != [body.k]:
        return None
    rows = [d for d in op.output.dims if d is not None and d in real and d != body.n]
    candidates = [d for d in rows if (d in x) != (d in y)]
    if not candidates:
        return None
    if len(candidates) == 1:
        m, shared = candidates[0], False
    else:
        m, shared = candidates[-1], True   # innermost: nearest the output's stick dim
    batch = tuple(d for d in rows if d != m)
    return MatmulAxes(batch, m, body.n, body.k, shared or not batch)


def matmul_enumerated_split(op: PrimOp, granules: Mapping[int, int], hw, dtypes: list[str],
                            default: Mapping[str, int]) -> Optional[dict[str, int]]:
    """The cost-model split of a matmul, or None where upstream's chooser declines (the op
    is then divided greedily): see `matmul_axes`, and a cheapest split on fewer cores than
    the greedy one (upstream: "never trade down to fewer cores than the default")."""
    axes = matmul_axes(op)
    if axes is None:
        return None
    units = _units(op, granules)
    sizes = [op.iter_dims[i].size for i in axes.batch]
    B = math.prod(sizes) if sizes else 1
    M = op.iter_dims[axes.m].size
    n_units, k_units = units[axes.n], units[axes.k]
    N_e, K_e = n_units * granules.get(axes.n, 1), k_units * granules.get(axes.k, 1)
    dbytes = DTYPE_BYTES[dtypes[0]]
    best, best_cost = None, math.inf
    for combo in itertools.product(*[_divisors(s) for s in sizes]):
        bp = math.prod(combo)
        if bp > hw.cores:
            continue
        for ms in _divisors(units[axes.m]):
            if bp * ms > hw.cores:
                break
            for ns in _divisors(n_units):
                if bp * ms * ns > hw.cores:
                    break
                for ks in _divisors(k_units):
                    if bp * ms * ns * ks > hw.cores:
                        break
                    c = matmul_split_cost_us(hw, (B, bp), (M, ms), (N_e, ns), (K_e, ks), dbytes,
                                             axes.shared_weight)
                    if c < best_cost:
                        best, best_cost = (combo, ms, ns, ks), c
    if best is None:
        return None
    combo, ms, ns, ks = best
    split = {op.iter_dims[i].name: f for i, f in zip(axes.batch, combo)}
    split[op.iter_dims[axes.m].name] = ms
    split[op.iter_dims[axes.n].name] = ns
    split[op.iter_dims[axes.k].name] = ks
    split = {k: v for k, v in split.items() if v > 1}
    if math.prod(split.values()) < math.prod(default.values()):
        return None
    return split


def divide_work(op: PrimOp, granules: Mapping[int, int], hw, dtypes: list[str]) -> dict[str, int]:
    """The core split torch-spyre's passes give `op` (dtypes: inputs' then output's)."""
    default = greedy_split(op, granules, hw.cores)
    enumerated = matmul_enumerated_split(op, granules, hw, dtypes, default)
    return enumerated if enumerated is not None else default
