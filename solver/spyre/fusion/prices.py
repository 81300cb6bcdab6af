"""Tile classes in the CP-SAT objective (`with_tile_classes`): each strategy of an op the
fusion search will tile along its reduction dim is priced as the search will run it.

The CP-SAT model prices every op untiled and the fusion search tiles afterwards, so the
model ranked a matmul's splits by their untiled times while the program runs them K-tiled
(stage 3 of `search`: a K tile re-reads no operand, and its loads overlap the array's
compute; 512x4096x4096 on m4 x n8 simulates 447 us untiled, 329 us at 16 K tiles). Splits
that tie untiled are far apart once tiled and the other way round, so the solve's optimum
said little about the fused program, and which of its tied optima the solver returned
decided the result. Here each such strategy's price, for every residency combination the
model uses, is the least of its untiled price and its price at the K tile counts the
search tries (`K_TILE_COUNTS`, those its per-core K slice can take) — the timing model's
own per-op analysis (`cost_model.op_cost_parts` with temporal tiles), so the planner and
the simulator still share one home for op timing. The strategies' decisions are unchanged
(no tiles: the search places them, with the bundle cuts and LX they need); only the prices
the model, the local search and the objective see are.

A combination with the result in LX keeps the untiled price (a K-tiled result is a partial sum
until the kernel's last tile: no member of a kernel can read it on chip).
What it does not price: the partial sums' LX (the one-op program leaves all LX free, so a
K-tiled price assumes they fit; the search finds out), and fused kernels of pointwise
chains (their members' on-chip reads: the model's residency terms are the nearest it has).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from target.op_rules import split_units
from target.geometry import core_ranges, op_granules, reduction_split
from target.superdsc import Program
from solver.spyre.cost_model import OpCostParts, OpView, op_cost_parts, op_time, program_op_views
from solver.spyre.strategies import Strategy

# the K tile counts a strategy is priced at (the search tries these and smaller ones; the
# small counts rarely win for an op large enough to gain)
K_TILE_COUNTS = (8, 16, 32, 64)


def with_tile_classes(strategies: dict[str, list[Strategy]], hw) -> dict[str, list[Strategy]]:
    """`strategies` with each matmul strategy the search can K-tile priced at the least of
    its untiled and K-tiled times (module docstring); identical strategies of repeated
    blocks are priced once."""
    cache: dict[int, Strategy] = {}
    out: dict[str, list[Strategy]] = {}
    for oid, ss in strategies.items():
        row = []
        for s in ss:
            if id(s) not in cache:
                cache[id(s)] = _tiled(s, hw)
            row.append(cache[id(s)])
        out[oid] = row
    return out


def predict_fused_ns(program: Program, hw) -> float:
    """`cost_model.predict_program_ns` with every untiled matmul the search can K-tile at
    its tile class: the prediction the CP-SAT objective makes of the program (the planner
    compares its start, its solve and their polished forms by it)."""
    total = 0.0
    for o, view, in_lx, out_lx in program_op_views(program):
        ns = op_time(view, in_lx, out_lx, hw, o.prim).total_ns
        opt = None if o.temporal_tiles or o.alias or out_lx else _k_options(view, o.core_split, hw)
        if opt is not None:
            for t in K_TILE_COUNTS:
                if t > opt[1]:
                    break
                ns = min(ns, op_time(view, in_lx, out_lx, hw, o.prim, tiles={opt[0]: t}).total_ns)
        total += ns
    return total


def k_tile_options(s: Strategy, hw) -> Optional[tuple[str, int]]:
    """(reduction dim, the most tiles each core's slice takes there) of a matmul strategy
    the search can K-tile, else None."""
    if s.view is None or s.alias or s.reduction_split:
        return None
    return _k_options(s.view, s.core_split, hw, s.core_ranges)


def _k_options(v: OpView, core_split, hw, ranges: Optional[dict] = None) -> Optional[tuple[str, int]]:
    prim = v.prim
    if prim.body.kind != "matmul":
        return None
    split = {k: f for k, f in core_split.items() if f > 1}
    if reduction_split(prim, split):
        return None
    gran = op_granules(prim, v.layouts, v.dtypes, hw.stick_bytes)
    ranges = ranges or core_ranges(prim, split, v.core_slices or None, gran)
    best = None
    for i, d in enumerate(prim.iter_dims):
        if d.kind != "reduction":
            continue
        units = min(split_units(r[i][1] - r[i][0], gran.get(i, 1)) for r in ranges.values())
        if units >= 2 and (best is None or units > best[1]):
            best = (d.name, units)
    return best


def _tiled(s: Strategy, hw) -> Strategy:
    """`s` priced at its fastest K tile count where that beats untiled, per residency
    combination (the count is chosen on the all-device-memory combination)."""
    opt = k_tile_options(s, hw)
    if opt is None:
        return s
    name, units = opt
    base = s.parts.base
    best_t, best_ns = None, base.total_ns
    for t in K_TILE_COUNTS:
        if t > units:
            break
        c = op_cost_parts(s.view, hw, None, tiles={name: t}).base
        if c.total_ns < best_ns:
            best_t, best_ns = t, c.total_ns
    if best_t is None:
        return s
    tiled = op_cost_parts(s.view, hw, s.may_reside or None, tiles={name: best_t})
    combos: dict = {}
    for key, c in s.parts.combos.items():
        # with its result held in LX the matmul keeps its untiled price: a K-tiled result is
        # a partial sum until the last tile, so no kernel member can take it on chip
        # (`SpyreModel.handoffs`), and a whole residency beside the partial sums is rarely
        # what the search can give it
        k = None if key[-1] else tiled.combos.get(key)
        combos[key] = k if k is not None and k.total_ns < c.total_ns else c
    return dataclasses.replace(s, parts=OpCostParts(combos))
