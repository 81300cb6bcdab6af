"""Split-K readers of held results: a matmul that reads, split along its reduction dim, exactly
the slices each core of the previous kernel wrote, so that result never goes to device memory.

The fusion search hands results between kernels through device memory, or holds them whole
in LX where the reader takes each core's own slice (`tile_buffers.add_whole_residencies`).
A matmul whose input is a wide intermediate (the gated MLP's product, `[tokens, ffn]`) reads
it along K: a reader split only over M and N needs every core's K range, which no single
producer core holds, so the result is written out and read back. Split the reader over
(the producer's row split) x (the producer's column split, now the reader's K) instead and
each core multiplies what it made itself; the partial sums are combined over the ring into
device memory (`hw.ring_combine_ns`), which for one `[rows, N]` output costs far less than
writing and re-reading the whole `[rows, K]` input. What makes it pay in the timing model:
- the reader is temporally tiled along N so its weight stream double-buffers (a split-K
  matmul joins no fused kernel, it runs as a kernel of its own);
- the held result takes LX the producing kernel's double buffering used, so that kernel is
  retried at more (smaller) tiles, on its own split and on neighbouring ones (a reader with
  more rows per core needs less PSUM).
Every variant is emitted, validated and timed; the fastest valid one is kept if it beats the
plan (the planner then retries kernels that underfill at their tile counts: the split-K
result's readers load it from device memory now). Nothing here is keyed on op names or
shapes (llama prefill, 2026-12-01: the down projection m8 x k4 in 64 N tiles reading the
gated product held in LX, the gate/up kernel at twice its tiles: 4279.7 -> 4047.2 us on one
solved plan before the later steps).
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field, replace
from typing import Optional

from target.primitives import PrimGraph, PrimOp
from target.superdsc import HbmMemory, Program
from solver.oracle import valid_program
from solver.plan import PlanDecisions
from solver.spyre.fusion.split_maps import factored_split, nearby_factors, result_split, split_through
from solver.spyre.fusion.trial import issues_of, trial
from solver.spyre.tile_buffers import add_whole_residencies, kernel_numbers

_READER_TILES = (64, 32, 16, 8)     # tried along the reader's N, most first (double buffering)
_KERNEL_TILE_SCALES = (1, 2, 4)     # the producing kernel's tile counts x this (room for the held result)
FACTOR_MOVES = 2                    # how far from its split the producing kernel may move (`split_maps.nearby_factors`)


def _reader_split(producer: PrimOp, p_split: dict[str, int], reader: PrimOp, held: str) -> Optional[dict[str, int]]:
    """The reader's split under which each core reads the box of the held tensor that the
    same producer core wrote (`split_maps.split_through`), when it splits the reduction dim
    (otherwise it is not split-K, and the fusion search's own hold step covers it)."""
    out = split_through(producer, p_split, reader, held)
    return out if out is not None and reader.iter_dims[reader.body.k].name in out else None


def _free_dim(reader: PrimOp, slot: int) -> Optional[str]:
    """The reader's parallel dim the held input does not index (a matmul's N for x): tiling
    it streams the other operand in pieces and leaves the held input whole."""
    indexed = {d for d in reader.inputs[slot].dims if d is not None}
    for i, d in enumerate(reader.iter_dims):
        if d.kind == "parallel" and i not in indexed and i in reader.output.dims:
            return d.name
    return None


def _kernel_members(program: Program, op_id: str) -> list[str]:
    kernel = kernel_numbers(program)
    index = {o.id: k for k, o in enumerate(program.ops)}
    k = index.get(op_id)
    if k is None or k not in kernel:
        return [op_id]
    return [program.ops[i].id for i, n in kernel.items() if n == kernel[k]]


def split_k_candidates(pg: PrimGraph) -> list[tuple[PrimOp, int]]:
    """(matmul, input slot) pairs this step may move: the input is an intermediate made by a
    compute op (not a copy), read by that matmul only, not a graph output, and indexed by the
    matmul's reduction dim; the matmul has a parallel dim the input does not index (to tile).
    A static scan of the graph: the planner reserves time for the step only when some exist."""
    producer_of = {op.output.tensor: op for op in pg.ops}
    readers: dict[str, list[str]] = {}
    for op in pg.ops:
        for a in op.inputs:
            readers.setdefault(a.tensor, []).append(op.id)
    outputs = set(pg.outputs)
    out = []
    for reader in pg.ops:
        if reader.body.kind != "matmul":
            continue
        for slot, acc in enumerate(reader.inputs):
            prod = producer_of.get(acc.tensor)
            if (prod is None or prod.body.kind in ("copy", "gather", "fill") or acc.tensor in outputs
                    or readers.get(acc.tensor) != [reader.id] or reader.body.k not in acc.dims
                    or _free_dim(reader, slot) is None):
                continue
            out.append((reader, slot))
    return out


@dataclass
class SplitK:
    """What `hold_for_split_k` found: the faster plan's trial (decisions, program, report)
    and notes, or None; when nothing was faster, the fastest valid variant's trial
    (`runner_up`: the producing kernel it re-tiled at more tiles may underfill, which the
    planner's last fewer-tiles pass repairs, so the planner judges it again after that
    pass); `cut`: the deadline stopped the step before it tried every variant."""

    best: Optional[tuple] = None
    notes: list[str] = field(default_factory=list)
    runner_up: Optional[tuple] = None
    cut: bool = False

    @property
    def us(self) -> Optional[float]:
        return None if self.best is None else self.best[2].total_us


def hold_for_split_k(pg: PrimGraph, hw, d: PlanDecisions, program: Program, current_us: float,
                     deadline: Optional[float] = None) -> SplitK:
    """`d` with matmul readers moved to split-K over results held in LX (module docstring),
    one reader at a time, each change kept only when the whole program simulates faster
    than `current_us` (`SplitK`)."""
    producer_of = {op.output.tensor: op for op in pg.ops}
    best, notes = None, []
    fastest = None   # the fastest valid variant of any reader, faster than the plan or not
    timing = {"try_s": 0.0}   # the slowest try so far: none is started that would end past the deadline
    for reader, slot in split_k_candidates(pg):
        if deadline is not None and time.perf_counter() > deadline:
            timing["cut"] = True
            break
        t = reader.inputs[slot].tensor
        prod = producer_of[t]
        cur_d, cur_prog, cur_us = (d, program, current_us) if best is None else \
            (best[0], best[1], best[2].total_us)
        decl = cur_prog.tensor_map().get(t)
        if (decl is None or not isinstance(decl.memory, HbmMemory) or decl.memory.alias_of
                or prod.id not in cur_d.ops):
            continue
        found, closest = _best_variant(pg, hw, cur_d, cur_prog, reader, prod, t, _free_dim(reader, slot),
                                       cur_us, deadline, timing)
        if closest is not None and (fastest is None or closest[2].total_us < fastest[2].total_us):
            fastest = closest
        if found is not None:
            best = found
            notes.append(f"split-K over a held result: {reader.id} split {found[0].ops[reader.id].core_split} "
                         f"reads {t} from LX, simulated {cur_us:.1f} -> {found[2].total_us:.1f} us")
    cut = bool(timing.get("cut"))
    if best is None:
        return SplitK(runner_up=fastest, cut=cut)
    return SplitK(best=best, notes=notes, cut=cut)


def _nontrivial_dims(shape) -> list[int]:
    return [j for j, n in enumerate(shape) if n != 1]


def _kernel_splits(pg: PrimGraph, members: list[str], producer: PrimOp, held: str,
                   factors: list[int]) -> Optional[dict[str, dict[str, int]]]:
    """Each kernel member's core split when the held tensor's non-unit dims are split by
    `factors`: the producer's split writing those slices, carried to every member writing a
    result of the same shape (`split_maps.result_split`; reduction dims stay whole). None
    when some member's result has another shape (the kernel cannot follow)."""
    p_split = factored_split(producer, pg.tensors[held].shape, factors)
    if p_split is None:
        return None
    by_id = {op.id: op for op in pg.ops}
    shapes = {t.id: tuple(t.shape) for t in pg.tensors.values()}
    out: dict[str, dict[str, int]] = {}
    for m in members:
        split = p_split if m == producer.id else (
            result_split(producer, p_split, by_id[m], shapes) if m in by_id else None)
        if split is None:
            return None
        out[m] = split
    return out


def _psum_fits(pg: PrimGraph, hw, reader: PrimOp, r_split: dict[str, int], held: str) -> bool:
    """A split-K core keeps its whole partial output box in LX until the combine (the timing
    model's PSUM rule: what does not fit beside the resident buffers spills through device
    memory, many times over): skip splits whose partials cannot fit beside the held result."""
    out_elems = 1
    for d in reader.output.dims:
        if d is not None:
            dim = reader.iter_dims[d]
            out_elems *= -(-dim.size // r_split.get(dim.name, 1))
    cores = 1
    for f in r_split.values():
        cores *= f
    held_bytes = pg.tensors[held].nbytes / max(1, cores)
    return out_elems * hw.psum_bytes_per_element + held_bytes <= hw.lx_bytes_per_core


def _best_variant(pg: PrimGraph, hw, d: PlanDecisions, program: Program, reader: PrimOp, prod: PrimOp,
                  t: str, free: str, best_us: float, deadline: Optional[float], timing: dict):
    """(the fastest valid variant for one reader under `best_us` or None, the fastest valid
    variant or None), each a trial (plan, program, timing report): the producing kernel on
    each factor option, at each tile scale, the reader on the matching split-K split at the
    most N tiles that validate."""
    members = _kernel_members(program, prod.id)
    p_split = {k: v for k, v in d.ops[prod.id].core_split.items() if v > 1}
    out_dims = [prod.output.dims[j] for j in _nontrivial_dims(pg.tensors[t].shape)]
    current = [p_split.get(prod.iter_dims[i].name, 1) if i is not None else 1 for i in out_dims]
    best = fastest = None
    # the held tensor's split factors and those up to FACTOR_MOVES moves away (a split reading
    # more rows per core needs less PSUM; and the fusion search can leave the producing
    # kernel two moves from the split split-K pays on: mistral prefill, a gate/up kernel at
    # m2 x n16 where m8 x n4 with the down projection at m8 x k4 ends 3890.9 -> 3808.2 us)
    for factors in nearby_factors(current, FACTOR_MOVES):
        splits = _kernel_splits(pg, members, prod, t, factors)
        if splits is None:
            continue
        r_split = _reader_split(prod, splits[prod.id], reader, t)
        if r_split is None or not _psum_fits(pg, hw, reader, r_split, t):
            continue
        for scale in _KERNEL_TILE_SCALES:
            # probed at the fewest reader tiles (an invalid variant costs one emit), then
            # at the most that validate: fewer only add loop overhead. A try is not started
            # when the slowest one so far would end past the deadline.
            if deadline is not None and time.perf_counter() + timing["try_s"] > deadline:
                timing["cut"] = True
                return best, fastest
            t_try = time.perf_counter()
            got = _try(pg, hw, d, members, splits, scale, reader, r_split, free, _READER_TILES[-1], t)
            timing["try_s"] = max(timing["try_s"], time.perf_counter() - t_try)
            if got is None:
                continue
            for tiles in _READER_TILES[:-1]:
                if deadline is not None and time.perf_counter() + timing["try_s"] > deadline:
                    timing["cut"] = True
                    break
                t_try = time.perf_counter()
                more = _try(pg, hw, d, members, splits, scale, reader, r_split, free, tiles, t)
                timing["try_s"] = max(timing["try_s"], time.perf_counter() - t_try)
                if more is not None:
                    got = more
                    break
            if issues_of(got, hw):
                continue
            if fastest is None or got[2].total_us < fastest[2].total_us:
                fastest = got
            if got[2].total_us < best_us and (best is None or got[2].total_us < best[2].total_us):
                best = got
    return best, fastest


def _next_op(pg: PrimGraph, d: PlanDecisions, op_id: str) -> Optional[str]:
    order = d.op_order or [op.id for op in pg.ops]
    k = order.index(op_id)
    return order[k + 1] if k + 1 < len(order) else None


def _try(pg: PrimGraph, hw, d: PlanDecisions, members: list[str], splits: dict[str, dict[str, int]], scale: int,
         reader: PrimOp, r_split: dict[str, int], free: str, tiles: int, t: str):
    """One variant, emitted and validated: the producing kernel re-split, the reader split-K
    and tiled along `free`, `t` held whole in LX, the kernel's tile buffers placed again
    (`fusion.trial.trial`). (plan, program, simulated us), or None when it is not valid."""
    variant = copy.deepcopy(d)
    for m in members:
        plan = variant.op(m)
        tt = {k: v * scale for k, v in plan.temporal_tiles.items()} if scale > 1 else dict(plan.temporal_tiles)
        moved = splits[m] != {k: v for k, v in plan.core_split.items() if v > 1}
        variant.ops[m] = replace(plan, core_split=dict(splits[m]), temporal_tiles=tt,
                                 core_slices=None if moved else plan.core_slices)
    produced = {op.id: op.output.tensor for op in pg.ops}
    for m in members:
        r = variant.resident.get(produced[m])
        if r is not None and r.per_tile:
            variant.resident.pop(produced[m])
    # an input a re-split member reads from LX, written there by an earlier kernel on the
    # member's old split, is no longer where the member's cores look (lx_slice_mismatch):
    # it goes through device memory in the variant
    made_here = {produced[m] for m in members}
    by_id = {op.id: op for op in pg.ops}
    for m in members:
        if splits[m] != {k: v for k, v in d.ops[m].core_split.items() if v > 1} and m in by_id:
            for a in by_id[m].inputs:
                if a.tensor not in made_here:
                    variant.resident.pop(a.tensor, None)
    variant.ops[reader.id] = replace(variant.op(reader.id), core_split=dict(r_split), temporal_tiles={free: tiles},
                                     core_slices=None)
    # a split reduction's output is combined into device memory; it joins no kernel
    variant.resident.pop(reader.output.tensor, None)
    variant.resident.pop(t, None)
    if hw.lx_persists_across_bundles:
        # the program makes one kernel of ANY consecutive ops with equal tile and core
        # counts (`fused_group_key`): a reader at the producing kernel's tile count would
        # join it and read other cores' parts mid-loop (kernel_tile_order). A bundle
        # boundary on each side keeps it a kernel of its own (free in the timing model;
        # the held result stays in LX across it)
        variant.bundle_starts = list(variant.bundle_starts) + [
            o for o in (reader.id, _next_op(pg, variant, reader.id)) if o is not None and o not in variant.bundle_starts]
    base = valid_program(pg, hw, variant)
    if base is None:
        return None
    held = add_whole_residencies(pg, hw, variant, base, only={t})
    if held is None or t not in held.buffers:
        return None
    return trial(pg, hw, held.decisions)
