"""Fewer tiles (the last step of the search, `fewer_tiles`): kernels that underfill the
stream or pay much loop overhead try a half and a quarter of their tile count, pass after
pass while one gains."""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Optional

from target.primitives import PrimGraph
from solver.plan import OpPlan
from solver.spyre.fusion.trial import issues_of, trial

# trials of `fewer_tiles` (two per kernel), and the least a kernel must lose to underfill
# and loop overhead (us) to be tried
RETILE_TRIALS = 8
RETILE_MIN_US = 5.0


def fewer_tiles(pg: PrimGraph, hw, tr: tuple, deadline: Optional[float], trial_s: float,
                limit: int = RETILE_TRIALS) -> tuple:
    """`fewer_tiles_pass` without its note: the trial kept."""
    return fewer_tiles_pass(pg, hw, tr, deadline, trial_s, limit)[0]


def fewer_tiles_pass(pg: PrimGraph, hw, tr: tuple, deadline: Optional[float], trial_s: float,
                     limit: int = RETILE_TRIALS) -> tuple[tuple, list[str]]:
    """Kernels whose members underfill the stream (a small per-core tile: the timing
    model's `underfill_curve`) or pay much loop overhead, with a half and a quarter of
    their tile count, the kernels losing the most to both first, each kept where the whole
    program is valid and faster. The tile counts were chosen per run before merges, re-splits and LX holds
    changed the kernels (and a whole trial at one count for every run may have won), so a
    kernel can be left with more tiles than its pointwise members stream well. Passes
    repeat until one keeps nothing (`limit` counts the trials of all of them). Returns the
    trial kept and a note when the deadline stopped the pass before its last trial."""
    tried = 0
    notes: list[str] = []
    while True:
        before = tr[2].total_us
        tr, tried, stop, cut = _one_pass(pg, hw, tr, deadline, trial_s, limit, tried)
        if cut:
            notes.append(f"fewer tiles: stopped early (time limit) after {tried} trials")
        # a halved kernel may stream better halved again, and one kernel's change moves
        # another's loss: passes repeat until one finds nothing
        if stop or tr[2].total_us >= before:
            return tr, notes


def _one_pass(pg: PrimGraph, hw, tr: tuple, deadline: Optional[float], trial_s: float, limit: int,
              tried: int) -> tuple[tuple, int, bool, bool]:
    """One pass over the kernels, losers first: (the trial kept, trials so far, whether the
    limit or the deadline stopped it, whether it was the deadline)."""
    fused_d, prog, rep = tr
    kernels: dict[int, list] = {}
    for o in rep.ops:
        if o.fused_group is not None:
            kernels.setdefault(o.fused_group, []).append(o)

    def loss(members) -> float:
        out = sum(o.overhead_us for o in members)  # the tile loop's, paid per tile
        for o in members:
            for e in o.effects:
                if e.startswith("underfill x"):
                    eff = float(e.split("x", 1)[1])
                    out += o.memory_us * (1.0 - eff)
        return out
    order = sorted((g for g in kernels if loss(kernels[g]) > RETILE_MIN_US), key=lambda g: -loss(kernels[g]))
    for g in order:
        ids = [o.op_id for o in kernels[g]]
        best = None
        for f in (2, 4):
            if tried >= limit:
                return (fused_d, prog, rep), tried, True, False
            if deadline is not None and time.perf_counter() + 2 * trial_s > deadline:
                return (fused_d, prog, rep), tried, True, True
            ops = dict(fused_d.ops)
            for oid in ids:
                p = ops.get(oid, OpPlan())
                tiles = {k: v // f for k, v in p.temporal_tiles.items()}
                if not tiles or min(tiles.values()) < 2:
                    break
                ops[oid] = replace(p, temporal_tiles=tiles)
            else:
                tried += 1
                # tile buffers are sized per tile: re-placed by the trial
                cand = replace(fused_d, ops=ops, resident={x: r for x, r in fused_d.resident.items()
                                                           if not (r.per_tile and x in _results(pg, ids))})
                out = trial(pg, hw, cand)
                if out is not None and out[2].total_us < (best[2].total_us if best else rep.total_us) \
                        and not issues_of(out, hw):
                    best = out
                continue
            break
        if best is not None:
            fused_d, prog, rep = best
    return (fused_d, prog, rep), tried, False, False


def _results(pg: PrimGraph, ids: list[str]) -> set[str]:
    ops = set(ids)
    return {op.output.tensor for op in pg.ops if op.id in ops}
