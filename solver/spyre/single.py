"""The single-graph CP-SAT planner: one model for the whole graph, as a pipeline.

`plan_graph` (what the registered entry and the depth step's segments call):
1. op order: chains straight into their consumers (`solver.spyre.schedule.chain_order`);
2. start (`solver.spyre.start.starting_plan`): the hint, repaired or replaced when it does
   not validate in this order;
3. model (`solver.spyre.model.build_model`): strategies and the CP-SAT model; the budget
   from its size and the start's predicted time (`budget.default_budget_s`);
4. local search on the model's objective (`solver.spyre.local_search`), kept when predicted
   faster: the complete hint;
5. solve rounds (`solver.spyre.solve.solve_rounds`), then the solve's plan through the same
   local search once more (kept when predicted faster);
6. the plan to finish: the best solve unless predicted slower than the start;
7. the post-solve steps (`solver.spyre.steps.POST_SOLVE_STEPS`, run by
   `solver.spyre.post_solve.run_steps`), each kept only when valid and simulated faster;
8. stats: predicted time (cost model of the plan as solved, less the steps' simulated
   gain), status, objective, bound, gap, notes;
deterministic mode runs steps 5-7 as draws (`draw_count`, another CP-SAT seed each, the
same model and start) while the solves find a plan, keeps the fastest program and takes
into it the segments other draws run faster (`solver.spyre.draw_crossover`); and last, never predicted slower than the hint as its own planner ordered it
(`start.own_order_plan`): the hint in its own order is returned otherwise, with a note.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Optional

from target.primitives import PrimGraph
from solver.core import gap_of
from solver.events import EventSink
from solver.oracle import checked_program, simulated_us
from solver.plan import PlanDecisions
from solver.spyre import budget, steps
from solver.spyre.cost_model import predict_program_ns
from solver.spyre.draw_crossover import crossover, plan_key
from solver.spyre.fusion.prices import predict_fused_ns
from solver.spyre.fusion import FUSION_TRIALS
from solver.spyre.local_search import local_search
from solver.spyre.model import add_tie_break, build_model
from solver.spyre.post_solve import records_note
from solver.spyre.progress import phase, phase_note
from solver.spyre.schedule import chain_order
from solver.spyre.solve import solve_rounds
from solver.spyre.start import Hint, own_order_plan, starting_plan


def plan_graph(pg: PrimGraph, hw, *, time_limit_s: Optional[float] = None, deterministic: bool = False,
               hint: Hint = None, num_workers: int = 2, keep: int = 4, keep_resident: int = 2,
               max_rounds: int = budget.MAX_ROUNDS, fuse: bool = True, budget_mode: str = "scaled",
               events: Optional[EventSink] = None, seed: int = 1, t0: Optional[float] = None,
               draws: Optional[int] = None) -> PlanDecisions:
    """Plan `pg` as one CP-SAT model (module docstring), never predicted slower than the
    hint as its own planner ordered it: the search starts from the hint in this planner's
    op order, where it can be slower than in the order it was made for, and a short budget
    may not win that back (the 2-layer toy GPT-2: heuristic 26.23 us in source order, the
    plan after a 1 s deterministic search 26.32 us). `t0`: when the caller's time limit
    started (default: now). `seed` and `draws`: see `plan_chain_ordered`."""
    t0 = time.perf_counter() if t0 is None else t0
    # the plan to beat in its own op order, made first so that its time counts against the
    # limit too
    own, name, own_us = own_order_plan(pg, hw, hint)
    d = plan_chain_ordered(pg, hw, time_limit_s=time_limit_s, deterministic=deterministic, hint=hint,
                           num_workers=num_workers, keep=keep, keep_resident=keep_resident,
                           max_rounds=max_rounds, fuse=fuse, budget_mode=budget_mode, events=events, seed=seed,
                           t0=None if deterministic else t0, draws=draws)
    pred_us = d.stats.get("predicted_us")
    if pred_us is None or own_us is None or own_us >= pred_us:
        return d
    stats = dict(d.stats)
    stats.update(predicted_us=own_us, notes=list(d.stats.get("notes", [])) + [
        f"the {name} plan in its own op order is predicted faster ({own_us:.2f} < {pred_us:.2f} us): "
        "returned instead"])
    out = replace(own, planner="cpsat", stats=stats)
    if not out.op_order:
        out.op_order = [op.id for op in pg.ops]
    return out


def plan_chain_ordered(pg: PrimGraph, hw, *, time_limit_s: Optional[float], deterministic: bool,
                       hint: Hint, num_workers: int, keep: int, keep_resident: int, max_rounds: int,
                       fuse: bool, budget_mode: str, events: Optional[EventSink] = None, seed: int = 1,
                       t0: Optional[float] = None, draws: Optional[int] = None) -> PlanDecisions:
    """Plan `pg` in the chain order (module docstring, steps 1-8). `time_limit_s` (default
    `budget.DEFAULT_TIME_LIMIT_S`) caps the wall clock, counted from `t0` (default: now);
    `budget_mode="scaled"` (the default) plans within `budget.default_budget_s` of the
    problem's size under that cap and stops each CP-SAT round once its plan is proven within
    the gap limits; `"fixed"` is the behaviour before 2026-12-01 (the whole limit, only a
    proven optimum stops a round early), kept for comparison
    (benchmarks/bench_compile_time.py). `seed` picks CP-SAT's seeds: in wall-clock mode the
    solve's seed; in deterministic mode the draws' (`draws`, default
    `draw_count`: while the solves find a plan, up to that many solves, each
    with its own seed and post-solve steps, the fastest program kept; draw k of seed s uses
    CP-SAT seed draws x (s - 1) + 1 + k, so no two seeds share a draw)."""
    if budget_mode not in ("scaled", "fixed"):
        raise ValueError(f"budget must be 'scaled' or 'fixed', not {budget_mode!r}")
    t0 = time.perf_counter() if t0 is None else t0
    cap_s = float(time_limit_s) if time_limit_s else budget.DEFAULT_TIME_LIMIT_S
    # the op order is a decision too: each chain runs straight into its consumer, so
    # chains can become fused kernels (solver.spyre.schedule)
    pg = chain_order(pg)
    order = [op.id for op in pg.ops]
    phase(events, "hint", True, "the starting plan")
    hint_d, hint_prog, hint_name, emit_s = starting_plan(pg, hw, hint)
    # plans are compared as the objective prices them: with the tile classes, as the
    # fusion search will run their matmuls (solver.spyre.fusion.prices)
    predict = predict_fused_ns if budget.TILE_CLASSES else predict_program_ns
    hint_ns = predict(hint_prog, hw) if hint_prog is not None else float("inf")
    # the budget's stakes term stays on the untiled prediction (budget.default_budget_s)
    stakes_ns = predict_program_ns(hint_prog, hw) if hint_prog is not None else float("inf")
    phase(events, "hint", False, f"{hint_name}, predicted {hint_ns / 1000:.4g} us")

    phase(events, "strategies", True, f"{len(pg.ops)} ops")
    ctx, strategies, sm = build_model(pg, hw, hint_d, keep=keep, keep_resident=keep_resident)
    n_strategies = sum(len(v) for v in strategies.values())
    phase(events, "strategies", False, f"{n_strategies} strategies over {len(pg.ops)} ops")
    # the wall-clock budget of the whole plan (the model build above included): from the
    # problem's size and stakes, never more than the caller's limit; counts and the cost
    # model's prediction, never a measured time, so a deterministic plan gets the same
    # budget every time
    limit_s = budget.default_budget_s(n_strategies, stakes_ns / 1000.0, cap_s) if budget_mode == "scaled" else cap_s
    gaps = dict(relative_gap_limit=budget.RELATIVE_GAP_LIMIT, absolute_gap_limit=budget.ABSOLUTE_GAP_LIMIT) \
        if budget_mode == "scaled" else {}
    # sharpen the hint by local search on the model's objective (a bounded share of the
    # budget; it stops sooner when no single move improves)
    elapsed = time.perf_counter() - t0
    phase(events, "local search", True, "sharpening the hint")
    if deterministic:  # a pass count, not the wall clock, bounds it
        start_d = local_search(sm, hint_d, None, max_passes=budget.DETERMINISTIC_LOCAL_SEARCH_PASSES,
                               chains=budget.START_CHAIN_MOVES)
    else:
        start_d = local_search(sm, hint_d, t0 + elapsed + budget.LOCAL_SEARCH_SHARE * max(0.0, limit_s - elapsed),
                               max_passes=budget.LOCAL_SEARCH_MAX_PASSES, chains=budget.START_CHAIN_MOVES)
    t_emit = time.perf_counter()
    start_prog, _ = checked_program(pg, hw, start_d)
    # the first emission above paid for warming caches: the faster of the two is the one
    # the phases after the solve will see
    emit_s = min(emit_s, time.perf_counter() - t_emit)
    # time kept once the solver stops (budget.EMIT_RESERVE_FACTOR), and for the post-solve
    # steps (budget.FUSION_SHARE, FUSION_MAX_SHARE, FUSION_TRIAL_EMITS)
    reserve_s = budget.EMIT_RESERVE_FACTOR * emit_s + budget.FINISH_RESERVE_SHARE * limit_s
    fusion_s = min(max(budget.FUSION_TRIAL_EMITS * (FUSION_TRIALS + 2) * emit_s, budget.FUSION_SHARE * limit_s),
                   budget.FUSION_MAX_SHARE * limit_s) if fuse else 0.0
    if start_prog is not None and predict(start_prog, hw) < hint_ns:
        hint_d, hint_prog, hint_ns = start_d, start_prog, predict(start_prog, hw)
        hint_name += " + local search"
    phase(events, "local search", False, f"start predicted {hint_ns / 1000:.4g} us")
    # a hint CP-SAT finds infeasible it repairs by a seeded search of its own: the model
    # gets the hint with the residencies it would reject dropped (the plan kept as the
    # hint to beat is unchanged)
    feasible = sm.feasible_hint(hint_d, ctx.input_sticks)
    sm.add_hint(feasible)
    add_tie_break(sm)   # tied splits resolved alike by every seed (model.add_tie_break)
    sm.m.Minimize(sum(sm.objective_terms))
    seconds = {"build": elapsed, "local search": time.perf_counter() - t0 - elapsed}
    notes = [f"hint: {hint_name}", f"strategies: {n_strategies} over "
             f"{len(pg.ops)} ops, {len(sm.mat)} restickify options, {len(sm.res)} residency candidates",
             "bundles: partition step after the solve (one bundle start per group of overlapping LX "
             "windows, emitter cuts elsewhere)", "objective and bound in microseconds (cost model)",
             f"budget: {limit_s:.1f} s of a {cap_s:g} s limit" + (
                 f" ({budget_mode}; stop at a gap of {budget.RELATIVE_GAP_LIMIT:.1%} or "
                 f"{budget.ABSOLUTE_GAP_LIMIT / 1000:g} us)" if budget_mode == "scaled" else " (fixed)")]

    draw = _Draw(pg=pg, hw=hw, sm=sm, ctx=ctx, strategies=strategies, predict=predict, hint_d=hint_d,
                 hint_prog=hint_prog, hint_ns=hint_ns, limit_s=limit_s, cap_s=cap_s, t0=t0, reserve_s=reserve_s,
                 fusion_s=fusion_s, deterministic=deterministic, num_workers=num_workers, max_rounds=max_rounds,
                 gaps=gaps, fuse=fuse, emit_s=emit_s, events=events)
    # deterministic mode: where a solve stops (unproven, or at one of tied optima) depends on
    # the seed
    # (budget.DETERMINISTIC_DRAWS): more draws, the fastest program kept (`_best_draw`: on a
    # tie the canonically first plan, then the other draws' faster segments consolidated in).
    # Draw k of `seed` uses CP-SAT seed DRAWS x (seed - 1) + 1 + k, so two seeds never share
    # a draw. Wall clock: one draw with CP-SAT seed `seed` (the limit leaves no time for more)
    draws = (draw_count(limit_s) if draws is None else max(1, draws)) if deterministic else 1
    draw.compare = draws > 1
    drawn: list[_Drawn] = []
    for k in range(draws):
        cp_seed = draws * (seed - 1) + 1 + k if deterministic else seed
        if k > 0:   # the same model and start, another seed
            sm.m.ClearHints()
            sm.add_hint(feasible)
        got = draw.run(cp_seed)
        drawn.append(got)
        if draws > 1:
            notes.append(f"draw {k + 1} of {draws} (CP-SAT seed {cp_seed}): {got.status}, "
                         f"simulated {got.final_ns / 1000:.1f} us")
        # nothing found: another seed with the same time finds nothing either. A proven
        # optimum is drawn again: the objective prices ops unfused, and tied optima (or one
        # within the gap limits) fuse to programs apart
        if got.status not in ("FEASIBLE", "OPTIMAL"):
            break
    best = _best_draw(pg, hw, drawn, notes)
    notes.extend(best.notes)
    seconds.update(best.seconds)
    if draws > 1:
        seconds["draws"] = time.perf_counter() - draw.t_start
    chosen, gain_ns, chosen_ns = best.chosen, best.gain_ns, best.chosen_ns
    status, obj, bound, gap_ns = best.status, best.objective, best.bound, best.gap_ns
    notes.append(phase_note(seconds))
    chosen.stats.update(predicted_us=(chosen_ns - gain_ns) / 1000.0, solver_status=status,
                        objective=None if obj is None else obj / 1000.0,
                        bound=None if bound is None else bound / 1000.0,
                        gap=gap_of(gap_ns, bound) if bound is not None and gap_ns is not None else None,
                        solve_seconds=time.perf_counter() - t0, notes=notes)
    # the fusion search may have moved ops next to each other (sibling matmuls in one
    # kernel); its plan was validated and timed in that order
    chosen.op_order = chosen.op_order or order
    return chosen


def _best_draw(pg: PrimGraph, hw, drawn: list["_Drawn"], notes: list[str]) -> "_Drawn":
    """The fastest draw (equal simulated times: the canonically first plan,
    `draw_crossover.plan_key`, whatever the draw order), and with several, the draws'
    segments consolidated into it where they run faster (`draw_crossover.crossover`, kept
    only when the whole simulates faster)."""
    if len(drawn) == 1:
        return drawn[0]
    best = min(drawn, key=lambda g: (g.final_ns, plan_key(g.chosen)))
    merged, x_notes = crossover(pg, hw, [g.chosen for g in drawn])
    notes.extend(x_notes)
    if merged is None or merged.us * 1000.0 >= best.final_ns:
        return best
    stats = dict(best.chosen.stats)
    chosen = replace(merged.decisions, stats=stats)
    # the stat stays "prediction as solved less the steps' gain": the crossover's gain joins it
    return replace(best, chosen=chosen, gain_ns=best.gain_ns + best.final_ns - merged.us * 1000.0,
                   simulated_ns=merged.us * 1000.0)


def draw_count(budget_s: float) -> int:
    """Deterministic draws of a plan whose (scaled) budget is `budget_s`: one per
    `budget.DETERMINISTIC_DRAW_S` seconds, at least one, at most `budget.DETERMINISTIC_DRAWS`."""
    return max(1, min(budget.DETERMINISTIC_DRAWS, int(budget_s // budget.DETERMINISTIC_DRAW_S)))


@dataclass
class _Drawn:
    """One draw's plan after the post-solve steps (`chosen`, its untiled predicted ns before
    them `chosen_ns`, their simulated gain), the solve's status, objective, bound and the
    objective the gap is reported against, its notes and phase seconds."""

    chosen: PlanDecisions
    chosen_ns: float
    gain_ns: float
    status: str
    objective: Optional[float]
    bound: Optional[float]
    gap_ns: Optional[float]
    notes: list
    seconds: dict
    simulated_ns: Optional[float] = None

    @property
    def final_ns(self) -> float:
        return self.chosen_ns - self.gain_ns if self.simulated_ns is None else self.simulated_ns


@dataclass
class _Draw:
    """Steps 5-7 of the pipeline on a built, hinted model, for one CP-SAT seed (`run`)."""

    pg: PrimGraph
    hw: object
    sm: object
    ctx: object
    strategies: dict
    predict: object
    hint_d: PlanDecisions
    hint_prog: object
    hint_ns: float
    limit_s: float
    cap_s: float
    t0: float
    reserve_s: float
    fusion_s: float
    deterministic: bool
    num_workers: int
    max_rounds: int
    gaps: dict
    fuse: bool
    emit_s: float
    events: Optional[EventSink] = None
    compare: bool = False      # simulate each draw's program (when there are draws to compare)
    t_start: float = field(default_factory=time.perf_counter)

    def run(self, seed: int) -> _Drawn:
        pg, hw, sm, predict, deterministic, events = self.pg, self.hw, self.sm, self.predict, self.deterministic, self.events
        t0, limit_s, reserve_s = self.t0, self.limit_s, self.reserve_s
        hint_d, hint_prog, hint_ns = self.hint_d, self.hint_prog, self.hint_ns
        notes: list[str] = []
        seconds: dict = {}
        t_solve = time.perf_counter()
        phase(events, "solve", True, f"budget {limit_s:.1f} s")
        solved = solve_rounds(pg, hw, sm, self.ctx.input_sticks, limit_s=limit_s, cap_s=self.cap_s, t0=t0,
                              keep_s=reserve_s + self.fusion_s, deterministic=deterministic,
                              num_workers=self.num_workers, seed=seed, max_rounds=self.max_rounds, gaps=self.gaps,
                              events=events)
        notes.extend(solved.notes)
        status, obj, bound = solved.status, solved.objective, solved.bound
        best_d, best_prog, best_pred = solved.decisions, solved.program, solved.predicted_ns
        if best_prog is not None and predict is not predict_program_ns:
            best_pred = predict(best_prog, hw)
        seconds["solve"] = time.perf_counter() - t_solve
        phase(events, "solve", False, f"{status}" + (f", gap {gap_of(obj, bound):.2%}" if obj is not None else ""))
        if best_d is not None:
            # the solve's plan through the same local search (single and chain moves): CP-SAT's
            # LNS leaves moves over whole chains unfound in its budget (llama prefill: the solve
            # put the rotary query chain on L, so the GQA regroup copy moves data; a chain move
            # puts it back on E and the copy is an alias); kept when predicted faster
            t_pol = time.perf_counter()
            pol_d = local_search(sm, best_d, None if deterministic else t_pol + budget.LOCAL_SEARCH_SHARE * max(
                0.0, t0 + limit_s - reserve_s - t_pol),
                max_passes=budget.DETERMINISTIC_LOCAL_SEARCH_PASSES if deterministic else budget.LOCAL_SEARCH_MAX_PASSES)
            pol_prog, _ = checked_program(pg, hw, pol_d)
            pol_ns = predict(pol_prog, hw) if pol_prog is not None else float("inf")
            if pol_ns < best_pred:
                notes.append(f"local search after the solve: predicted {best_pred / 1000:.1f} -> {pol_ns / 1000:.1f} us")
                best_d, best_prog, best_pred = pol_d, pol_prog, pol_ns
            seconds["local search after the solve"] = time.perf_counter() - t_pol
        deadline = None if deterministic else t0 + limit_s - reserve_s
        # the plan to finish: the best solve, unless it is predicted slower than the hint
        chosen, chosen_ns, gap_ns = None, hint_ns, hint_ns
        chosen_prog = hint_prog
        if best_prog is not None:
            pred_ns = predict(best_prog, hw)
            if pred_ns <= hint_ns:
                chosen, chosen_ns, gap_ns = best_d, pred_ns, obj
                chosen_prog = best_prog
            else:
                notes.append(f"cpsat plan predicted {pred_ns / 1000:.1f} us > hint {hint_ns / 1000:.1f} us: "
                             "returning the hint")
        else:
            notes.append(f"no valid cpsat plan (status {status}): returning the hint")
        if chosen is None:
            chosen = replace(hint_d, planner="cpsat", stats={})
        t_finish = time.perf_counter()
        phase(events, "fusion", True, "fused kernels and LX relayouts")
        after = steps.post_solve(pg, hw, chosen, deadline=deadline, strategies=self.strategies, fuse=self.fuse,
                                 trial_s=self.emit_s,
                                 events=events, model=sm)
        chosen, gain_ns = after.decisions, after.gain_ns()
        notes.extend(after.notes)
        seconds["fusion and relayouts"] = time.perf_counter() - t_finish
        phase(events, "fusion", False, f"simulated gain {gain_ns / 1000:.4g} us")
        notes.append(records_note(after.records))
        # the stat is the untiled per-op prediction less the steps' simulated gain (which
        # includes what the tile classes priced)
        if predict is not predict_program_ns and chosen_prog is not None:
            chosen_ns = predict_program_ns(chosen_prog, hw)
        # draws are compared by their programs as returned, simulated: the prediction less
        # the steps' gain is not always that (granite prefill, a draw predicted 4205.6 us
        # simulated 4510.1)
        chosen.op_order = chosen.op_order or [op.id for op in pg.ops]
        us = simulated_us(pg, hw, chosen) if self.compare else None
        return _Drawn(chosen, chosen_ns, gain_ns, status, obj, bound, gap_ns, notes, seconds,
                      None if us is None else us * 1000.0)
