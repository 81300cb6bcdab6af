"""Runs back on their own best choice (a step of the search, `runs_on_their_best`).

Stage 1 and 2 of the search find, per run, the split variant and tile count that were
fastest for that run; the combination then keeps the faster of all per-run choices
together and the fastest whole trial (one variant and one tile count for every run). When
the whole trial wins, every run takes its variant, including runs that were much faster on
their own choice (the layer graphs, 2026-12-02: the attention output projection's kernel
with the residual add and the next norm, m16 x n2 at 32 tiles in a whole trial, 411 + 236
us, against m8 x n4 at 16 tiles, 272 + 55 us, its own best; 300-370 us of a prefill
layer's run-to-run spread). This step puts such runs back on their own choice one at a
time, those the trial says lose the most first, each kept only where the whole program is
valid and faster.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Optional

from target.primitives import PrimGraph
from solver.plan import OpPlan, PlanDecisions
from solver.spyre.fusion.runs import span_us, with_tiles
from solver.spyre.fusion.trial import issues_of, trial
from solver.spyre.fusion.variants import Variant

# runs tried, and the least (us) a run must lose against its own best to be tried
REVISIT_TRIALS = 4
REVISIT_MIN_US = 5.0


def runs_on_their_best(pg: PrimGraph, hw, tr: tuple, runs: list[list[str]], best: list[tuple[float, int, dict]],
                       variants: list[Variant], deadline: Optional[float], trial_s: float,
                       limit: int = REVISIT_TRIALS) -> tuple:
    """`tr` (decisions, program, report) with runs put back on their own fastest choice
    (`best[i]` = (us, variant index, tiles of the run's ops); -1: as planned, not moved)
    where that makes the whole program valid and faster."""
    produced = {op.id: op.output.tensor for op in pg.ops}
    todo = []
    for run, (us, vi, tiles) in zip(runs, best):
        if vi < 0 or not tiles or _already(tr[0], run, variants[vi].decisions, tiles):
            continue
        loss = span_us(tr[2], run) - us
        if loss > REVISIT_MIN_US:
            todo.append((loss, run, variants[vi], tiles))
    todo.sort(key=lambda x: -x[0])
    for _, run, variant, tiles in todo[:limit]:
        if deadline is not None and time.perf_counter() + trial_s > deadline:
            break
        got = _on_choice(pg, hw, tr[0], run, variant, tiles, produced)
        if got is not None and got[2].total_us < tr[2].total_us:
            tr = got
    return tr


def _already(d: PlanDecisions, run: list[str], chosen: PlanDecisions, tiles: dict) -> bool:
    def split(p: Optional[OpPlan]) -> dict:
        return {} if p is None else {k: v for k, v in p.core_split.items() if v > 1}
    return all(split(d.ops.get(o)) == split(chosen.ops.get(o)) and
               dict(d.ops.get(o, OpPlan()).temporal_tiles) == dict(tiles.get(o, {})) for o in run)


def _on_choice(pg: PrimGraph, hw, d: PlanDecisions, run: list[str], variant: Variant, tiles: dict,
               produced: dict[str, str]) -> Optional[tuple]:
    """One trial: the run's ops on the variant's splits at `tiles`, the residencies the
    variant dropped for the run and the run's tile buffers (placed again by the trial)
    gone; residencies the validator then names are dropped once more. A valid trial, or
    None."""
    ops = dict(d.ops)
    for o in run:
        src = variant.decisions.ops.get(o)
        if src is None:
            continue
        cur = ops.get(o, OpPlan())
        moved = {k: v for k, v in cur.core_split.items() if v > 1} != {k: v for k, v in src.core_split.items() if v > 1}
        ops[o] = replace(cur, core_split=dict(src.core_split), temporal_tiles=dict(tiles.get(o, {})),
                         core_slices=None if moved else cur.core_slices)
    resident = dict(d.resident)
    for t in variant.dropped_resident.get(run[0], ()):
        resident.pop(t, None)
    for o in run:
        r = resident.get(produced.get(o, ""))
        if r is not None and r.per_tile:
            resident.pop(produced[o])
    cand = with_tiles(replace(d, ops=ops, resident=resident), {o: tiles[o] for o in run if o in tiles}, [run], hw, pg)
    for _ in range(2):
        got = trial(pg, hw, cand)
        if got is None:
            return None
        issues = issues_of(got, hw)
        if not issues:
            return got
        named = {i.tensor for i in issues if getattr(i, "tensor", None) in cand.resident}
        if not named:
            return None
        cand = replace(cand, resident={t: r for t, r in cand.resident.items() if t not in named})
    return None
