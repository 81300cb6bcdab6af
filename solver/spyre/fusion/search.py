"""The fusion search (`fuse_tiled_groups`): a visible pipeline of the steps in this package.

Over the runs of the emitted plan (`runs.find_runs`: consecutive tileable graph ops on one
core count; a matmul only heads a run, and one whose reduction dim is split across cores
joins none, since its partial sums are combined after the loop):
1. split variants (`variants.split_variants`): alternatives to the planned core splits
   under which a run's members read each other's results on chip; the planner's bundle
   cuts inside runs go. A member reading an earlier member's result is tiled along the dim
   that walks the same tensor dim as its producer's tiles (`runs.assign_tiles`), so its
   tile j needs what the producer wrote in tile j.
2. stage 1 (`_Search.pick_splits`): one whole-program trial per variant at the middle tile
   count (a high one for a run a matmul heads); each run keeps the variant that is fastest
   for it (or the plan as it was).
3. stage 3 (`_Search.pick_k_tiles`): every run's heading matmul (or reduce op) tiled along
   its reduction dim instead, a kernel of its own (its result is complete only after its
   last tile), the rest of the run tiled as a kernel after it: one trial per split
   variant, then one per tile count on the splits chosen; a K tile re-reads no operand
   where a row or column tile re-reads the other operand, so a prefill-sized projection
   runs fastest that way (512x4096x4096 on m4 x n8: 447 us untiled, 329 us at 16 K
   tiles). Then stage 2 (`_Search.pick_tile_counts`): on the splits stage 1 chose, one
   trial per other tile count. Each run keeps the fastest of all stages (stage 3 runs
   before stage 2: it gains the most on a prefill layer, and a deadline cuts the last).
4. the combination (`_Search.combination`): each tiled run starts a bundle, so adjacent
   runs never merge by accident (`runs.with_tiles`); runs the validator names in an
   invalid combination go back to as planned (`_runs_named`).
5. the steps on the kept trial, in the order `_steps_after_combination` lists them, each
   returning it or a valid, faster one: adjacent runs merged into one kernel
   (`merge.merge_adjacent`: e.g. a gated MLP's gate and up projections, loading their
   common input once); with `reorder`, matmuls reading one tensor (query, key and value
   projections) moved next to each other in the op order and merged the same way
   (`merge.merge_siblings`); results still handed from a kernel to later ops through
   device memory held whole in LX (`hold.hold_in_lx`); runs put back on their own fastest
   choice where the kept trial gave them another (`revisit.runs_on_their_best`; after the
   merges and holds, which gain more when a deadline cuts the steps short); kernels that
   underfill the stream with fewer tiles (`retile.fewer_tiles`).
Every trial emits, adds the tile buffers the validator accepts and simulates
(`trial.trial`); runs are separated by ops outside any kernel, so their times add up
independently. The combination of the per-run choices is emitted, validated and simulated
once more; per-run choices interact (a changed split moves residencies and bundle cuts next
to the run), so the fastest valid whole trial is kept too, and the faster of the two is
kept only if it is faster than the plan the pass started from. Nothing here is keyed on op
names or shapes.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Optional

from target.primitives import PrimGraph
from target.superdsc import Program
from simulator.timing import time_program
from simulator.timing_report import TimingReport
from solver.emit import emit_program
from solver.oracle import valid_program
from solver.plan import PlanDecisions
from solver.spyre.fusion import hold, merge, retile, revisit
from solver.spyre.fusion.runs import (OwnCores, assign_tiles, find_runs, reduction_tile_dims, span_us,
                                      tile_dims, with_tiles, without_run_cuts)
from solver.spyre.fusion.trial import issues_of, trial
from solver.spyre.fusion.variants import SPLIT_VARIANTS, Variant, split_variants

TILE_COUNTS = (2, 4, 8, 16, 32, 64)
# whole-program trials of one search: each variant at the middle tile count, then the rest,
# then each count with the heading matmuls K-tiled
FUSION_TRIALS = 1 + len(SPLIT_VARIANTS) + 2 * len(TILE_COUNTS) - 1
# times an invalid combination of per-run choices is retried with the runs it names as planned
REPAIR_ROUNDS = 2


@dataclass
class FusionResult:
    decisions: PlanDecisions
    program: Program
    report: TimingReport
    base_us: float                # simulated time of the plan before this pass
    fused_us: float               # simulated time of the returned plan
    groups: int = 0               # runs given temporal tiles
    notes: list[str] = field(default_factory=list)


def fuse_tiled_groups(pg: PrimGraph, hw, d: PlanDecisions, deadline: Optional[float] = None,
                      tile_counts=TILE_COUNTS, align=SPLIT_VARIANTS, reorder: bool = False,
                      end_with_fewer_tiles: bool = True) -> Optional[FusionResult]:
    """`d` with fused kernels on the runs of ops where the simulator times them faster: per
    run a common core split (`align` alternatives to the planned splits), a tile count and
    tile buffers for the kernel's own results. None when `d` does not emit to a valid
    program. Stops trying at `deadline` (perf_counter seconds); the result is always a
    validated program no slower (simulated) than `d`'s.

    `reorder`: also try moving matmuls that read one tensor next to each other in the op
    order and merging them into one kernel (`merge.merge_siblings`); the result's `op_order`
    is then the order its program was validated and timed in, so a caller that passes True
    must keep that order (not reset it to the graph's).

    `end_with_fewer_tiles`: the last step is the fewer-tiles pass (`retile.fewer_tiles`); a
    caller that runs its own on the plan it finally keeps passes False."""
    base_prog = valid_program(pg, hw, d)
    if base_prog is None:
        return None
    base_rep = time_program(base_prog, hw)
    result = FusionResult(d, base_prog, base_rep, base_rep.total_us, base_rep.total_us)
    runs = find_runs(base_prog, tile_dims(base_prog, hw), {op.id for op in pg.ops})
    if not runs:
        return result
    variants = split_variants(pg, hw, d, base_prog, runs, align)                  # 1.
    search = _Search(pg, hw, runs, deadline, base_rep)
    search.pick_splits(variants, base_prog, tile_counts)                          # 2.
    # K tiles before the other tile counts: on a prefill layer they gain the most, and a
    # deadline cuts the last stage
    search.pick_k_tiles(d, variants, tile_counts)                                 # 3.
    search.pick_tile_counts(d, variants, tile_counts)
    if search.out_of_time:
        result.notes.append("fusion: stopped early (time limit)")
    tr = search.combination(d, variants, base_rep)                                # 4.
    if tr is None:
        return result
    for step in _steps_after_combination(runs, reorder, search.best, variants,
                                         end_with_fewer_tiles):                   # 5.
        tr = step(pg, hw, tr, deadline, search.longest)
    fused_d, prog, rep = tr
    groups = len({o.fused_group for o in rep.ops if o.fused_group is not None})
    buffers = sum(1 for t in prog.tensors if getattr(t.memory, "per_tile", False))
    result.decisions, result.program, result.report = fused_d, prog, rep
    result.fused_us, result.groups = rep.total_us, groups
    result.notes.append(f"fusion: {groups} fused kernels with {buffers} tile buffers, simulated "
                        f"{base_rep.total_us:.1f} -> {rep.total_us:.1f} us")
    return result


def _steps_after_combination(runs: list[list[str]], reorder: bool, best: list[tuple[float, int, dict]],
                             variants: list[Variant], end_with_fewer_tiles: bool = True) -> list:
    """The steps run on the kept trial, in order: each takes (pg, hw, (decisions, program,
    report), deadline, the slowest trial's seconds) and returns that trial or a valid,
    faster one."""
    steps = [lambda pg, hw, tr, deadline, trial_s: merge.merge_adjacent(pg, hw, tr, runs, deadline, trial_s)]
    if reorder:
        steps.append(merge.merge_siblings)
    steps += [hold.hold_in_lx, lambda pg, hw, tr, deadline, trial_s: revisit.runs_on_their_best(
                 pg, hw, tr, runs, best, variants, deadline, trial_s)]
    if end_with_fewer_tiles:
        steps.append(retile.fewer_tiles)
    return steps


class _Search:
    """What the trials of one search share: per run the fastest choice so far, the fastest
    valid whole trial, the slowest trial (the time the next one, the final and the resplit
    need), and whether the deadline cut a stage short."""

    def __init__(self, pg: PrimGraph, hw, runs: list[list[str]], deadline: Optional[float],
                 base_rep: TimingReport):
        self.pg, self.hw, self.runs, self.deadline = pg, hw, runs, deadline
        # per run: (simulated us, variant index, tiles of the run's ops); -1: as planned
        self.best: list[tuple[float, int, dict]] = [(span_us(base_rep, r), -1, {}) for r in runs]
        # per-run choices interact (a changed split moves residencies and bundle cuts next
        # to the run), so the fastest valid whole trial is kept too, in case it beats the
        # combination
        self.whole_us: float = base_rep.total_us
        self.whole: Optional[tuple] = None
        self.longest = 0.0
        self.out_of_time = False
        self.matmul_headed: list[bool] = [False] * len(runs)   # per run: judged at the high count
        self._setups: dict[int, tuple] = {}

    def trials(self, v: PlanDecisions, counts, vi_of_run) -> None:
        """One whole-program trial per tile count; each run keeps what is fastest for it."""
        runs = self.runs
        setup = self._k_setup(v)
        if setup is None:
            return
        _, tileable, own = setup
        for t in counts:
            per_count = t if isinstance(t, tuple) else (t,) * len(runs)
            per_run = [assign_tiles(r, tileable, ti, own.prims, own) for r, ti in zip(runs, per_count)]
            self._trial_per_run(v, per_run, vi_of_run)
            if self.out_of_time:
                return

    def pick_splits(self, variants: list[Variant], base_prog: Program, tile_counts) -> None:
        """Stage 1: which split each run takes, judged at a middle tile count, or a high one
        for a run a matmul heads (a large matmul's slices double-buffer only in small tiles:
        at the middle count every variant of its run would lose to the plan as it was)."""
        t_mid, t_high = _middle_and_high(tile_counts)
        heads = {o.id: o.opfunc == "matmul" for o in base_prog.ops}
        self.matmul_headed = [bool(heads.get(r[0])) for r in self.runs]
        judge = (tuple(t_high if mm else t_mid for mm in self.matmul_headed),)
        for vi, v in enumerate(variants):
            self.trials(v.decisions, judge, lambda i, vi=vi: vi)

    def pick_tile_counts(self, d: PlanDecisions, variants: list[Variant], tile_counts) -> None:
        """Stage 2: the tile count of each run, on the split stage 1 chose for it."""
        chosen = [max(0, vi) for _, vi, _ in self.best]
        mixed = _combine(d, variants, self.runs, [(0.0, vi, {}) for vi in chosen], self.hw,
                         keep_untouched=False)
        t_mid, t_high = _middle_and_high(tile_counts)
        # nearest counts first: when time runs out, the untried ones are the least likely to win
        rest = sorted((t for t in tile_counts if t != t_mid),
                      key=lambda t: abs(t.bit_length() - t_mid.bit_length()))
        # a run a matmul heads was judged at the high count in stage 1, not the middle one:
        # it tries the middle count first and skips the high one (same number of trials)
        if any(self.matmul_headed) and t_high != t_mid:
            rest_mm = [t_mid] + [t for t in rest if t != t_high]
            rest = [tuple(m if is_mm else t for is_mm in self.matmul_headed) for t, m in zip(rest, rest_mm)]
        self.trials(mixed, rest, lambda i: chosen[i])

    def pick_k_tiles(self, d: PlanDecisions, variants: list[Variant], tile_counts) -> None:
        """Stage 3: runs headed by an op that can be tiled along a reduction dim
        (`reduction_tile_dims`: a matmul or reduce op whose reduction no core split divides),
        the head K-tiled as a kernel of its own and the rest of the run tiled as a kernel
        after it (`with_tiles` cuts after a K-tiled op). First one trial per split variant
        (heads at the high count, the rest at the middle one), each run keeping the variant
        fastest for it; then on those splits one trial per tile count for heads and rests
        alike, the head keeping the count its own time is least at and the rest the count
        its span is least at (two kernels: they add up). A run takes the combination where
        the two times together beat its fastest choice so far."""
        runs = self.runs
        t_mid, t_high = _middle_and_high(tile_counts)
        setups = [self._k_setup(v.decisions) for v in variants]
        if not any(s is not None and any(r[0] in s[0] for r in runs) for s in setups):
            return
        # per run: (head us, rest us, variant, tiles) of its fastest variant
        first: list[Optional[tuple]] = [None] * len(runs)
        for vi, v in enumerate(variants):
            if setups[vi] is None:
                continue
            per_run = [self._k_tiles(r, setups[vi], t_high, t_mid) for r in runs]
            tr = self._trial_per_run(v.decisions, per_run, None)
            if tr is None:
                continue
            for i, (r, a) in enumerate(zip(runs, per_run)):
                if a and (first[i] is None or span_us(tr[2], r) < first[i][0] + first[i][1]):
                    first[i] = (span_us(tr[2], r[:1]), _rest_us(tr[2], r), vi, a)
            if self.out_of_time:
                break
        chosen = [f[2] if f is not None else max(0, b[1]) for f, b in zip(first, self.best)]
        if all(f is None for f in first):
            return
        mixed = _combine(d, variants, runs, [(0.0, vi, {}) for vi in chosen], self.hw, keep_untouched=False)
        setup = self._k_setup(mixed)
        if setup is None:
            return
        head_best = [(f[0], {r[0]: f[3][r[0]]}) if f is not None else None for f, r in zip(first, runs)]
        rest_best = [(f[1], {o: x for o, x in f[3].items() if o != r[0]}) if f is not None else None
                     for f, r in zip(first, runs)]
        for t in sorted(tile_counts, reverse=True):
            if self.out_of_time:
                break
            per_run = [self._k_tiles(r, setup, t, t) if f is not None else {} for f, r in zip(first, runs)]
            tr = self._trial_per_run(mixed, per_run, None)
            if tr is None:
                continue
            for i, (r, a) in enumerate(zip(runs, per_run)):
                if not a:
                    continue
                if r[0] in a and span_us(tr[2], r[:1]) < head_best[i][0]:
                    head_best[i] = (span_us(tr[2], r[:1]), {r[0]: a[r[0]]})
                rest = {o: x for o, x in a.items() if o != r[0]}
                if len(r) > 1 and _rest_us(tr[2], r) < rest_best[i][0]:
                    rest_best[i] = (_rest_us(tr[2], r), rest)
        for i, r in enumerate(runs):
            if head_best[i] is None:
                continue
            us = head_best[i][0] + rest_best[i][0]
            if us < self.best[i][0]:
                self.best[i] = (us, chosen[i], {**head_best[i][1], **rest_best[i][1]})

    def _k_setup(self, v: PlanDecisions) -> Optional[tuple]:
        """(reduction tile dims, parallel tile dims, own-core reads) of `v`'s program, None
        when it does not emit; kept per plan (stages 1 and 3 try the same variants)."""
        if id(v) in self._setups:
            return self._setups[id(v)][1]
        try:
            prog = emit_program(self.pg, self.hw, v)
        except ValueError:
            got = None
        else:
            got = reduction_tile_dims(prog, self.hw), tile_dims(prog, self.hw), OwnCores(prog, self.hw)
        self._setups[id(v)] = (v, got)   # the plan is kept so its id stays its own
        return got

    @staticmethod
    def _k_tiles(run: list[str], setup: tuple, t_head: int, t_rest: int) -> dict:
        """The run's head tiled t_head times along its reduction dim (at most the tiles it
        can take there) and the rest at t_rest; {} when the head takes no K tiles."""
        k_dims, tileable, own = setup
        opts = k_dims.get(run[0], [])
        if not opts:
            return {}
        name, units = opts[0]
        t = max((c for c in (t_head, t_head // 2, t_head // 4) if 2 <= c <= units), default=None)
        if t is None:
            return {}
        out = {run[0]: {name: t}}
        out.update(assign_tiles(run[1:], tileable, t_rest, own.prims, own))
        return out

    def _trial_per_run(self, v: PlanDecisions, per_run: list[dict], vi_of_run) -> Optional[tuple]:
        """One whole-program trial of `v` with `per_run` tiles (returned); with `vi_of_run`
        each run keeps what is fastest for it."""
        pg, hw, runs, deadline = self.pg, self.hw, self.runs, self.deadline
        if not any(per_run):
            return None
        if deadline is not None and time.perf_counter() + 3 * self.longest > deadline:
            self.out_of_time = True
            return None
        started = time.perf_counter()
        tr = trial(pg, hw, with_tiles(v, {k: x for a in per_run for k, x in a.items()}, runs, hw, pg))
        self.longest = max(self.longest, time.perf_counter() - started)
        if tr is None:
            return None
        if tr[2].total_us < self.whole_us and not issues_of(tr, hw):
            self.whole_us, self.whole = tr[2].total_us, tr
        if vi_of_run is not None:
            for i, (r, a) in enumerate(zip(runs, per_run)):
                us = span_us(tr[2], r)
                if a and vi_of_run(i) is not None and us < self.best[i][0]:
                    self.best[i] = (us, vi_of_run(i), a)
        return tr

    def combination(self, d: PlanDecisions, variants: list[Variant], base_rep: TimingReport
                    ) -> Optional[tuple]:
        """The faster of the combined per-run choices (when valid) and the fastest valid
        whole trial; None when neither beats the plan the search started from. The per-run
        choices were each judged in trials that may have been invalid elsewhere, so their
        combination may be too: the runs the validator names go back to as planned, a few
        times, before the combination is given up."""
        pg, hw, runs = self.pg, self.hw, self.runs
        chosen_tr = self.whole
        best = self.best
        base_span = [(span_us(base_rep, r), -1, {}) for r in runs]
        for _ in range(REPAIR_ROUNDS + 1):
            combined = _combine(d, variants, runs, best, hw, pg=pg)
            tr = trial(pg, hw, combined) if combined is not None else None
            if tr is None:
                break
            issues = issues_of(tr, hw)
            if not issues:
                if tr[2].total_us < self.whole_us:
                    chosen_tr = tr
                break
            named = _runs_named(pg, runs, issues)
            if not named or all(best[i][1] < 0 for i in named) or (
                    self.deadline is not None and time.perf_counter() + self.longest > self.deadline):
                break
            best = [base_span[i] if i in named else b for i, b in enumerate(best)]
        return chosen_tr


def _rest_us(rep: TimingReport, run: list[str]) -> float:
    """What the run's ops after its head cost in a trial (0 for a lone head)."""
    return span_us(rep, run[1:]) if len(run) > 1 else 0.0


def _middle_and_high(tile_counts) -> tuple[int, int]:
    """The middle tile count (stage 1's, and the one stage 2 skips) and the high one
    (stage 1's for a run a matmul heads)."""
    counts = sorted(tile_counts)
    return counts[(len(counts) - 1) // 2], counts[max(0, len(counts) - 2)]


def _combine(d: PlanDecisions, variants: list[Variant], runs: list[list[str]],
             best: list[tuple[float, int, dict]], hw, keep_untouched: bool = True,
             pg: Optional[PrimGraph] = None) -> Optional[PlanDecisions]:
    """The plan with each run's best choice; None when every run is best as planned."""
    if keep_untouched and all(vi < 0 for _, vi, _ in best):
        return None
    ops = dict(d.ops)
    resident = dict(d.resident)
    tiles: dict[str, dict[str, int]] = {}
    for run, (_, vi, a) in zip(runs, best):
        if vi < 0:
            continue
        v = variants[vi]
        for oid in v.changed.get(run[0], ()):
            ops[oid] = v.decisions.ops[oid]
        for t in v.dropped_resident.get(run[0], ()):
            resident.pop(t, None)
        tiles.update(a)
    cut_runs = [r for r, (_, vi, _) in zip(runs, best) if vi >= 0]
    out = replace(without_run_cuts(d, cut_runs), ops=ops, resident=resident)
    return with_tiles(out, tiles, runs, hw, pg)


def _runs_named(pg: PrimGraph, runs: list[list[str]], issues) -> set[int]:
    """Indices of the runs an op or tensor of the validator's issues belongs to (an op of
    the run, or a tensor one of its ops reads or writes)."""
    touches: dict[str, set[str]] = {}
    for op in pg.ops:
        for t in [a.tensor for a in op.inputs] + [op.output.tensor]:
            touches.setdefault(t, set()).add(op.id)
    named: set[int] = set()
    for i, run in enumerate(runs):
        members = set(run)
        for issue in issues:
            tensor = (issue.tensor or "").split("@stick")[0]
            if issue.op in members or members & touches.get(tensor, set()):
                named.add(i)
    return named
