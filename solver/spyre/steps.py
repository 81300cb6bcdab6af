"""The post-solve steps of the CP-SAT planner, declared once, in order (`POST_SOLVE_STEPS`).

Each step implements `solver.spyre.post_solve.Step` (name, budget share and reserve,
`applies`, `run`); `post_solve` runs the list through `post_solve.run_steps`, which accepts a
step's plan only when it is valid and simulates faster and records what each step did.
In order:
1. `FusionSearch`: fused coarse-tiled kernels (`solver.spyre.fusion.fuse_tiled_groups`),
   searched from the plan as solved and from it with matmuls re-split for tiling;
2. `ResplitUnfused`: ops left outside every kernel back on their cheapest split;
3. `SplitKStep`: matmuls that read a held result split-K (`solver.spyre.split_k_hold`);
4. `HoldAfterSplitK`: results held in LX once more after a split-K reader moved;
5. `FewerTiles`: the one last fewer-tiles pass over kernels that underfill;
6. `SplitKRunnerUp`: the split-K step's fastest slower variant, judged after the same pass;
7. `FusionRunnerUp`: the fusion search's other start through steps 2-6 (`AFTER_FUSION`);
8. `OneCoreRegions`: regions of small ops on one core, their intermediates (restickified
   copies too) held in LX (`solver.spyre.one_core_regions`);
9. `LxRelayouts`: restickifies as on-chip relayouts (`solver.spyre.relayout`).
Steps 1-7 apply only when the planner fuses (`fuse=True`). To add a step: write a class with
the four attributes and two methods, and put an instance where it belongs in
`POST_SOLVE_STEPS` (docs/planner.md "Adding a post-solve step").
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Optional

from target.op_rules import default_choice
from target.primitives import PrimGraph
from target.geometry import parsed_prim
from target.superdsc import LxMemory, fused_group_key
from simulator.timing import time_program
from solver.events import EventSink
from solver.oracle import checked_program, simulated_us
from solver.plan import OpPlan, PlanDecisions
from solver.spyre import budget
from solver.spyre.fusion import fuse_tiled_groups, resplit_for_tiling
from solver.spyre.local_search import local_search
from solver.spyre.fusion.hold import hold_in_lx
from solver.spyre.fusion.retile import fewer_tiles_pass
from solver.spyre.fusion.trial import issues_of
from solver.spyre.post_solve import Outcome, PostSolveState, StepRecord, run_steps
from solver.spyre.one_core_regions import regions_on_one_core, small_regions
from solver.spyre.relayout import add_lx_relayouts, relayout_candidates
from solver.spyre.split_k_hold import hold_for_split_k, split_k_candidates
from solver.spyre.strategies import Strategy


# The fusion search's other start is taken through the steps after it when its fused time
# is within this factor of the kept one's: split-K after the search gained 9-14% on the
# encoders (GPT-2's re-split start 348.3 -> 314.1 us, BERT's 327.6 -> 280.7).
RUNNER_UP_MARGIN = 1.15


class FusionSearch:
    """Fused coarse-tiled kernels where the timing model runs them faster. The search runs
    from two starts: the plan as solved, and the same plan with its matmuls re-split for
    tiling (`resplit_for_tiling`; a split-K matmul joins no kernel). The faster result is
    kept (a tie keeps the plan as solved). When both exist the re-split start goes first: on
    every layer graph where it moved a matmul it won, by 10-20% (deterministic compiles of
    2026-12-01: gpt2 470.0 -> 366.9 us, granite prefill 4939.0 -> 4445.9, llama prefill
    5295.4 -> 4435.1), so a deadline that leaves time for one search only spends it there.
    Its own last fewer-tiles pass is left out: `FewerTiles` runs once, on the plan kept
    (per search it cost 0.3-0.5 s for 8-18 us on the prefill layers).

    With the solve's model at hand the re-split start is re-aligned first (`realigned`):
    the moved matmuls' neighbours take their slicing where the model's objective gains, so
    the residencies the re-split dropped come back. Without it the start depended on where
    the solve had left those neighbours: BERT's solve of 2026-12-05 put the attention on
    rows, the scores moved to heads x rows alone lost the held softmax and query, and the
    plan as solved won at 338.6 us, where a solve that had left them on heads fused to
    276.5."""

    name = "fusion search"
    share = 1.0
    reserve = 0.0
    min_trials = 0

    def applies(self, state: PostSolveState) -> bool:
        return state.fuse

    def run(self, state: PostSolveState) -> Optional[Outcome]:
        pg, hw, d, deadline = state.pg, state.hw, state.decisions, state.deadline
        alt = resplit_for_tiling(pg, d, state.strategies)
        if alt is not None and state.model is not None:
            alt = (realigned(state.model, alt[0], alt[1], deadline), alt[1])
        starts = [(d, None)] if alt is None else [(alt[0], alt[1]), (d, None)]
        res, res_moved, base_us = None, None, None
        log: list[str] = []
        first_s = 0.0
        results = []
        for k, (start, moved) in enumerate(starts):
            # a second search cut short by the deadline has never won (it stops before its
            # later steps), and the time it took is what the split-K step and the last
            # fewer-tiles pass after it need: it starts only when the time left covers what
            # the first search took
            if k > 0 and deadline is not None and time.perf_counter() + first_s >= deadline:
                log.append("fusion: no time left for the " + ("plan as solved" if moved is None else "re-split plan"))
                break
            t_search = time.perf_counter()
            got = fuse_tiled_groups(pg, hw, start, deadline=deadline, reorder=True, end_with_fewer_tiles=False)
            first_s = first_s or time.perf_counter() - t_search
            if got is None:
                continue
            if moved is None:
                base_us = got.base_us
            results.append(got)
            if res is None or got.fused_us < res.fused_us or (got.fused_us == res.fused_us and moved is None):
                res, res_moved = got, moved
        if res is None:   # the plan as solved does not emit to a valid program
            return Outcome(log=log, facts={"fusion_failed": True})
        log.extend(res.notes)
        notes = []
        if res_moved is not None:
            notes.append(f"fusion kept the start with {len(res_moved)} matmuls re-split for tiling "
                         f"({', '.join(res_moved[:4])}{', ...' if len(res_moved) > 4 else ''})")
            if base_us is None:   # the plan as solved was not searched: timed here
                base_us = simulated_us(pg, hw, d)
                base_us = res.base_us if base_us is None else base_us
        else:
            base_us = res.base_us
        facts = {"fused_kernels": res.groups}
        others = [r for r in results if r is not res and r.fused_us <= RUNNER_UP_MARGIN * res.fused_us]
        if others:
            facts["fusion_runner_up"] = others[0]
        return Outcome(res.decisions, res.fused_us, notes=notes, log=log, before_us=base_us,
                       program=res.program, facts=facts)


def realigned(sm, d: PlanDecisions, moved: list[str], deadline: Optional[float] = None) -> PlanDecisions:
    """The re-split plan `d` with its neighbours re-aligned on the model's objective: the
    local search (`budget.DETERMINISTIC_LOCAL_SEARCH_PASSES` passes) over the ops within
    `REALIGN_HOPS` tensors of the `moved` ones, which keep their new splits.
    `resplit_for_tiling` drops the residencies of what the moved ops read and write; the
    search gives them back where the neighbours can take the moved ops' slicing (BERT's
    scores split by heads: the scaled query, its permute and the softmax then slice alike
    and stay in LX, as a solve that put the scores there itself left them). `deadline`
    (perf_counter seconds, None: deterministic) stops the search early."""
    near = set(moved)
    frontier = set(moved)
    for _ in range(REALIGN_HOPS):
        tensors = {a.tensor for o in frontier for a in sm.ops[o].inputs} | {sm.ops[o].output.tensor for o in frontier}
        nxt = {sm.producer[t].id for t in tensors if t in sm.producer}
        nxt |= {r for t in tensors for r, _ in sm.readers.get(t, ())}
        frontier = nxt - near
        near |= nxt
    return local_search(sm, d, deadline, max_passes=budget.DETERMINISTIC_LOCAL_SEARCH_PASSES,
                        movable=frozenset(near - set(moved)))


# How far from the re-split matmuls the re-alignment moves ops: BERT's scores reach the
# query projection's bias add through the scaling and the head permute.
REALIGN_HOPS = 4


class ResplitUnfused:
    """Fusion gives a chain one core split and keeps its results on chip, so an LX residency
    the solve chose a neighbour's split for may be gone. Each op outside a fused kernel whose
    operands all live in device memory takes its cheapest strategy of the same stick choice
    (cost model, everything in device memory); the simulator judges the result once."""

    name = "resplit unfused"
    share = 1.0
    reserve = 0.0
    min_trials = 0

    def applies(self, state: PostSolveState) -> bool:
        return state.accepted("fusion search") and bool(state.facts.get("fused_kernels")) and state.program is not None

    def run(self, state: PostSolveState) -> Optional[Outcome]:
        pg, hw, d, program = state.pg, state.hw, state.decisions, state.program
        tmap = program.tensor_map()
        producer_of = {op.id: op for op in pg.ops}
        ops = dict(d.ops)
        changed = 0
        for o in program.ops:
            if (o.kind != "compute" or o.alias or o.prim is None or o.id not in state.strategies
                    or fused_group_key(o) is not None):
                continue
            prim = parsed_prim(o.prim)
            if any(isinstance(tmap[n].memory, LxMemory) for n in [a.tensor for a in prim.inputs] + [prim.output.tensor]):
                continue
            cur = d.ops.get(o.id, OpPlan())
            stick = cur.stick or default_choice(producer_of[o.id])
            split = {k: v for k, v in cur.core_split.items() if v > 1}
            cands = [s for s in state.strategies[o.id] if not s.alias and s.stick == stick]
            now = next((s for s in cands if s.core_split == split), None)
            if now is None or not cands:
                continue
            best = min(cands, key=lambda s: s.cost_ns(hw))
            if best.cost_ns(hw) < now.cost_ns(hw):
                ops[o.id] = replace(cur, core_split=dict(best.core_split), core_slices=None)
                changed += 1
        if not changed:
            return None
        out = replace(d, ops=ops)
        prog, _ = checked_program(pg, hw, out)
        if prog is None:
            return None
        us = time_program(prog, hw).total_us
        return Outcome(out, us, program=prog,
                       notes=[f"resplit after fusion: {changed} ops, simulated {state.us:.1f} -> {us:.1f} us"])


class SplitKStep:
    """Matmul readers moved to split-K over results held in LX (`split_k_hold`); when none is
    faster, its fastest valid variant is handed on (fact `split_k_runner_up`)."""

    name = "split-K"
    share = 1.0
    reserve = budget.SPLIT_K_SHARE
    min_trials = 0

    def applies(self, state: PostSolveState) -> bool:
        return state.fuse and not state.facts.get("fusion_failed") and bool(split_k_candidates(state.pg))

    def run(self, state: PostSolveState) -> Optional[Outcome]:
        prog = state.checked()
        if prog is None or state.us is None:
            return None
        got = hold_for_split_k(state.pg, state.hw, state.decisions, prog, state.us, state.deadline)
        log = ["split-K: stopped early (time limit)"] if got.cut else []
        if got.best is None:
            return Outcome(log=log, facts={"split_k_runner_up": got.runner_up})
        return Outcome(got.best[0], got.us, notes=got.notes, log=log, program=got.best[1])


class HoldAfterSplitK:
    """The split-K reader left the kernel it headed, so a result that kernel's members could
    not follow may be held now (granite prefill: the residual sum, read by the next norm and
    by the final add, which was a member of the down projection's kernel); half the time
    left, the rest for the fewer-tiles pass after it (worth more on the prefill layers:
    80-240 us)."""

    name = "hold after split-K"
    share = budget.HOLD_AFTER_SPLIT_K_SHARE
    reserve = 0.0
    min_trials = budget.STEP_MIN_TRIALS

    def applies(self, state: PostSolveState) -> bool:
        return state.accepted("split-K")

    def run(self, state: PostSolveState) -> Optional[Outcome]:
        tr = state.current_trial()
        if tr is None:
            return None
        again = hold_in_lx(state.pg, state.hw, tr, state.deadline, state.trial_s)
        return Outcome(again[0], again[2].total_us, trial=again,
                       notes=[f"held in LX after split-K: simulated {tr[2].total_us:.1f} -> {again[2].total_us:.1f} us"])


class FewerTiles:
    """The steps since the fusion search changed kernels (re-splits, LX holds, split-K readers
    loading from device memory): kernels that underfill at their tile count retry fewer
    tiles (the one fewer-tiles pass of the pipeline: the searches leave theirs out)."""

    name = "fewer tiles"
    share = 1.0
    reserve = 0.0
    min_trials = budget.STEP_MIN_TRIALS

    def applies(self, state: PostSolveState) -> bool:
        return state.fuse and not state.facts.get("fusion_failed")

    def run(self, state: PostSolveState) -> Optional[Outcome]:
        tr = state.current_trial()
        if tr is None:
            return None
        retiled, log = fewer_tiles_pass(state.pg, state.hw, tr, state.deadline, state.trial_s,
                                        limit=budget.FINAL_RETILE_TRIALS)
        return Outcome(retiled[0], retiled[2].total_us, log=log, trial=retiled,
                       notes=[f"fewer tiles at the end: simulated {state.us:.1f} -> {retiled[2].total_us:.1f} us"])


class SplitKRunnerUp:
    """A split-K variant slower than the plan as it stood, judged after the same fewer-tiles
    pass (llama prefill, one solved plan: the variant 3943.6 us against the plan's 3908.1,
    after the pass 3803.9 against 3899.1)."""

    name = "split-K runner-up"
    share = 1.0
    reserve = 0.0
    min_trials = budget.STEP_MIN_TRIALS

    def applies(self, state: PostSolveState) -> bool:
        return state.fuse and state.facts.get("split_k_runner_up") is not None and not state.facts.get("fusion_failed")

    def run(self, state: PostSolveState) -> Optional[Outcome]:
        if state.current_trial() is None:
            return None
        runner_up = state.facts["split_k_runner_up"]
        alt, log = fewer_tiles_pass(state.pg, state.hw, runner_up, state.deadline, state.trial_s,
                                    limit=budget.FINAL_RETILE_TRIALS)
        if issues_of(alt, state.hw):
            return Outcome(log=log)
        return Outcome(alt[0], alt[2].total_us, log=log, trial=alt, notes=[
            f"split-K over a held result after fewer tiles: simulated {state.us:.1f} -> "
            f"{alt[2].total_us:.1f} us ({runner_up[2].total_us:.1f} before the pass)"])


class FusionRunnerUp:
    """The fusion search's other start (fact `fusion_runner_up`: its fused plan, within
    `RUNNER_UP_MARGIN` of the one kept) through the same steps the kept one went through
    (`AFTER_FUSION`: re-split, split-K, holds, fewer tiles), proposed when it ends faster.
    The search ranks its starts as fused, and a later step can turn the ranking: GPT-2's
    re-split start fused to 348.3 us against the plan as solved's 323.1, and split-K over
    its held GELU output then took it to 314.1, where the plan as solved ended at 320.2."""

    name = "fusion runner-up"
    share = 1.0
    reserve = 0.0
    min_trials = budget.STEP_MIN_TRIALS

    def applies(self, state: PostSolveState) -> bool:
        return state.fuse and state.facts.get("fusion_runner_up") is not None

    def run(self, state: PostSolveState) -> Optional[Outcome]:
        other = state.facts["fusion_runner_up"]
        sub = PostSolveState(state.pg, state.hw, other.decisions, state.strategies, plan_deadline=state.deadline,
                             fuse=True, us=other.fused_us, start_us=other.fused_us, program=other.program,
                             trial_s=state.trial_s, model=state.model,
                             facts={"fused_kernels": other.groups})
        sub.records.append(StepRecord("fusion search", "accepted", 0.0, other.base_us, other.fused_us))
        run_steps(AFTER_FUSION, sub)
        if sub.us is None:
            return Outcome(log=sub.notes)
        return Outcome(sub.decisions, sub.us, log=sub.notes, program=sub.program, notes=[
            f"fusion runner-up through the same steps: simulated {other.fused_us:.1f} -> {sub.us:.1f} us "
            f"(the kept start ended at {state.us:.1f})"])


class _WholeProgramTrials:
    """A step that tries changes on the whole checked program (`improve`) when the program
    has candidates for them (`has_candidates`), keeping what validates and simulates
    faster; `improve` returns a `post_solve.Improved`."""

    share = 1.0
    reserve = 0.0
    min_trials = 0

    def applies(self, state: PostSolveState) -> bool:
        return True

    def run(self, state: PostSolveState) -> Optional[Outcome]:
        prog = state.checked()
        if prog is None or not self.has_candidates(state.pg, prog):
            return None
        got = self.improve(state.pg, state.hw, state.decisions, prog, state.deadline)
        return Outcome(got.decisions, got.us, log=got.notes, before_us=got.base_us, program=got.program)


class OneCoreRegions(_WholeProgramTrials):
    """Regions of small ops (and their restickifies) on one core with every intermediate
    held in LX, where that validates and simulates faster (`solver.spyre.one_core_regions`)."""

    name = "one-core regions"
    has_candidates = staticmethod(small_regions)
    improve = staticmethod(regions_on_one_core)


class LxRelayouts(_WholeProgramTrials):
    """Restickifies turned into on-chip LX relayouts where that validates and simulates
    faster (`solver.spyre.relayout`)."""

    name = "lx relayouts"
    has_candidates = staticmethod(relayout_candidates)
    improve = staticmethod(add_lx_relayouts)


# The steps after the fusion search that change kernels (the fusion runner-up goes through
# them too).
AFTER_FUSION = (
    ResplitUnfused(),
    SplitKStep(),
    HoldAfterSplitK(),
    FewerTiles(),
    SplitKRunnerUp(),
)
# The post-solve steps, in the order they run: the one declaration of the pipeline after
# the solve (module docstring).
POST_SOLVE_STEPS = (FusionSearch(),) + AFTER_FUSION + (
    FusionRunnerUp(),
    OneCoreRegions(),
    LxRelayouts(),
)


def post_solve(pg: PrimGraph, hw, d: PlanDecisions, *, deadline: Optional[float],
               strategies: dict[str, list[Strategy]], fuse: bool = True, trial_s: float = 0.0,
               steps=None, events: Optional[EventSink] = None, model=None) -> PostSolveState:
    """Run the post-solve steps (`POST_SOLVE_STEPS` unless `steps` is given) on the solved
    plan `d`; the state they leave has the plan (`decisions`), its simulated gain
    (`gain_ns()`), the notes and a record per step. `trial_s`: the seconds one emit +
    validation of the plan took (the time gates' unit until a step measures one). `events`:
    an optional progress sink (a `StepFinished` per step that ran). `model`: the solve's
    `SpyreModel` (the re-split start is re-aligned on its objective, `FusionSearch`)."""
    state = PostSolveState(pg, hw, d, strategies, plan_deadline=deadline, fuse=fuse, trial_s=trial_s,
                           events=events, model=model)
    return run_steps(POST_SOLVE_STEPS if steps is None else steps, state)
