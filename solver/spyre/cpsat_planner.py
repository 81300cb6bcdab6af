"""The CP-SAT planner: stick dims, restickify placement, core split and LX residency chosen
jointly in one model, objective = predicted total time (integer ns, `solver.spyre.cost_model`).

Model (DESIGN.md "Solver"):
- `pick[o][k]`: op o runs strategy k of `solver.spyre.strategies.op_strategies` (stick choice x
  core split, pruned); exactly one per op.
- `lay[t][l]`: tensor t is sticked on dim l: fixed by its producer's pick; a weight
  (parameter, buffer, constant) chooses freely (laid out once at load time); a user input
  arrives sticked on its last dim.
- `mat[t][l]`: t is also materialized sticked on l by ONE restickify through device memory,
  paid once however many consumers read it; every strategy that reads t on l needs
  `lay[t][l] or mat[t][l]`.
- `res[t]`: an intermediate stays in LX from its producer to its last reader. Allowed only
  when every reader's strategy reads each core's slice from the one that core wrote (same
  layout, per-core box inside the written box: `strategies.compatible_residency`), the
  producer does not split a reduction dim, no restickify reads it (the model prices
  restickifies through device memory; `solver.spyre.relayout` tries on-chip relayouts after the
  solve), and the ops of its live window reference at most the bundle limit of
  device-memory tensors (the tensors resident there do not count).
- LX addresses per core in whole sticks: an optional interval over op steps x an optional
  interval over [addr, addr + size) per resident tensor, `AddNoOverlap2D`, so capacity and
  fragmentation are both real. Size = the producer strategy's per-core box.
- time[o] >= the priced time (`solver.spyre.cost_model`: the timing model's own per-op analysis)
  of the picked strategy under the residency combination of its operands that holds (one
  enforced constraint per strategy x combination).
- objective = sum time[o] + ring combine / loop overhead + restickify times, + 1 ns per
  idle core per op as a tie-break toward splits on more cores.
Bundles: chosen by a partition step after the solve: each group of overlapping resident
windows starts a bundle; the emitter cuts elsewhere at the external-tensor limit. A group
whose bundle still breaks the limit gets a no-good (not all of these together) and the
model is solved again, warm-started.

Fused coarse-tiled groups: after the solve, `solver.spyre.fusion` gives temporal tiles to runs of
consecutive compute ops wherever the timing model runs them faster as one fused kernel
(and drops planner bundle cuts inside such runs when that is faster still); it is priced by
whole-program simulation and kept only when faster; then `solver.spyre.relayout` turns
restickifies into on-chip LX relayouts where that validates and simulates faster. The
returned plan's `predicted_us` is the cost-model sum minus those simulated gains.

Start: the heuristic plan (H5b's torch-spyre baseline; a stored program when re-optimizing;
the naive plan if the hint is invalid), improved by best-single-move local search on the
model's own objective (weight layouts, per-op strategies; residencies a move breaks are
dropped and bundle windows repaired) and by moves relabelling whole stick-connected chains
(`solver.spyre.chain_moves`), given to CP-SAT as a complete hint. The solve's plan goes
through the same local search once more (kept when predicted faster). CP-SAT's presolve
is off for this model (seconds of wall time for almost no reduction). A solution whose
bundles break the limit is repaired (those residencies dropped) and kept if it is the best
valid one so far. Always: a time budget that covers strategy pricing, the local search
and the search after the solve, scaled to the problem under the caller's limit
(`default_budget_s`: the model's strategy count and the starting plan's predicted time),
CP-SAT rounds that stop once proven within the gap limits (`RELATIVE_GAP_LIMIT`,
`ABSOLUTE_GAP_LIMIT`), a deterministic mode (local search bounded by passes, CP-SAT by
deterministic time only, one sequential worker, fixed seed, canonical first-fit LX
addresses), the best valid plan when time runs out, and the returned plan is never predicted slower than its hint, in
this planner's op order or in the one the hint was made for (the hint is returned
otherwise, with a note).
"""
from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Optional, Union

from ortools.sat.python import cp_model

from target.op_rules import default_choice, matching_choice, outermost_split, restickify_prim, split_granules
from target.primitives import PrimGraph
from target.geometry import parsed_prim
from target.superdsc import LxMemory, Program, fused_group_key
from simulator.timing import time_program
from simulator.validate import validate_program
from solver.core import SolveOptions, gap_of, solver_parameters
from solver.events import EventSink, Incumbent, PhaseFinished, PhaseStarted, emit
from solver.spyre.cost_model import OpView, op_time, predict_program_ns, to_units
from solver.emit import emit_program
from solver.spyre.fusion import FUSION_TRIALS, fuse_tiled_groups, resplit_for_tiling
from solver.spyre.fusion.hold import hold_in_lx
from solver.spyre.fusion.retile import fewer_tiles
from solver.spyre.fusion.trial import issues_of, trial as fusion_trial
from solver.plan import OpPlan, PlanDecisions, Residency
from solver.spyre.schedule import chain_order
from solver.planners import register
from solver.spyre.relayout import add_lx_relayouts, relayout_candidates
from solver.spyre.split_k_hold import hold_for_split_k, split_k_candidates
from solver.spyre.strategies import GraphContext, Strategy, align_strategies, compatible_residency, op_strategies

# The wall-clock cap when the caller gives none. It is a cap, not the time a plan takes:
# the budget is `default_budget_s` of the problem's size under it, each CP-SAT round stops
# once its plan is proven within the gap limits, and every phase after it stops when it
# has nothing left to try.
DEFAULT_TIME_LIMIT_S = 10.0
# The budget scales with the problem (`default_budget_s`): with its size, BUDGET_BASE_S +
# BUDGET_PER_STRATEGY_S x the strategies of the built model, and with its stakes, at most
# BUDGET_RUNS runs of the starting plan (a plan predicted at 45 us cannot win more than that
# per run); never under BUDGET_MIN_S, never over the caller's limit. Measured 2026-12-01
# (2-core machine, docs/benchmarks.md "Compile time vs model size"): the layer graphs
# (500-1100 strategies, starting plans 0.8-14 ms in the calibrated timing model) keep
# improving for most of a 10 s solve, and a budget of 6-8.5 s made bert, gpt2 and ViT 2-8%
# slower, so they get the whole default limit (the gap limits still end the decode layers'
# solves early); the 2-layer toy models (1100-1700 strategies, starting plans about 45 us)
# get the minimum. The stakes term depends on the timing model's scale: recheck
# BUDGET_RUNS when that moves (ViT's 839 us start needs >= 12,000 runs for the whole 10 s).
BUDGET_BASE_S = 1.0
BUDGET_PER_STRATEGY_S = 0.02
BUDGET_RUNS = 20_000
BUDGET_MIN_S = 1.0
# A CP-SAT round stops once objective - bound <= max(RELATIVE_GAP_LIMIT x objective,
# ABSOLUTE_GAP_LIMIT) (objective units: ns; 32 ns is one op's whole idle-core tie-break).
# CP-SAT reports such a stop as OPTIMAL; the plan's `gap` says what was left.
RELATIVE_GAP_LIMIT = 0.005
ABSOLUTE_GAP_LIMIT = 32.0
# Deterministic mode stops on CP-SAT's deterministic clock; on the 2-core benchmark machine
# one wall second of a 2-worker solve is about this many deterministic units (measured).
DETERMINISTIC_PER_SECOND = 0.15
# Shares of the budget: the local search that sharpens the hint (of what is left after the
# model build; it stops sooner when no single move improves) and the fusion search after
# the solve (at least). Measured 2026-11-29 (2-core machine, 10 s): local search 0.05
# instead of 0.15 gave slower plans on 3 of 4 layer graphs; fusion 0.4 instead of 0.3 ran
# out of time less often but, over four runs each of llama and granite prefill, gave
# slower plans (geomean 7393/7359 us against 6992/6918: the solve rounds get too little time).
LOCAL_SEARCH_SHARE = 0.15
# Chain moves (solver.spyre.chain_moves) in the local search that sharpens the hint; the
# local search after the solve always has them. Measured 2026-12-01 (deterministic layer
# suite, docs/solver.md "The model"): the final plans with them in the start and without
# differ only where CP-SAT's search from the other hint ends elsewhere: bert 391.6 (with)
# vs 389.9 us (without) at b748c48 and 359.6 vs 346.0 us at 48cb05f, granite decode
# 2896.8 vs 2897.6 us at both; the other seven layer graphs identical.
START_CHAIN_MOVES = True
FUSION_SHARE = 0.3
FUSION_MAX_SHARE = 0.5
_BUNDLE_CODES = frozenset({"bundle_limit", "lx_cross_bundle"})


def default_budget_s(n_strategies: int, start_us: Optional[float] = None,
                     cap_s: Optional[float] = None) -> float:
    """Wall-clock budget of one plan (model build, local search, solve rounds, fusion and
    relayout search) whose model has `n_strategies` strategies and whose starting plan is
    predicted at `start_us` (None: unknown), never more than `cap_s` (the caller's time
    limit; `DEFAULT_TIME_LIMIT_S` when None). A function of counts and cost-model numbers
    only, never of a measured time: a deterministic plan gets the same budget every run."""
    cap = DEFAULT_TIME_LIMIT_S if cap_s is None else float(cap_s)
    want = BUDGET_BASE_S + BUDGET_PER_STRATEGY_S * max(0, n_strategies)
    if start_us is not None and math.isfinite(start_us):
        want = min(want, BUDGET_RUNS * start_us * 1e-6)
    return min(cap, max(BUDGET_MIN_S, want))


# -- hint -------------------------------------------------------------------------------------
def decisions_from_program(pg: PrimGraph, program: Program) -> PlanDecisions:
    """Read a program's decisions back as the solve sees a plan (stick choices, splits,
    explicit core slices, aliases, whole-tensor LX residencies): a stored plan used as a
    warm start. Temporal tiles and tile buffers are left out: they are the fusion search's,
    which runs again after the solve (a tile buffer read as a whole residency holds one
    tile of a tensor no untiled op fits in)."""
    tmap = program.tensor_map()
    ops = {o.id: o for o in program.ops}
    d = PlanDecisions(planner=program.stats.planner)
    produced = {op.output.tensor for op in pg.ops}
    for t in pg.tensors:
        if t not in produced and t in tmap:
            d.input_sticks[t] = tmap[t].layout.stick_dim
    for op in pg.ops:
        o = ops.get(op.id)
        if o is None:
            continue
        in_sticks = []
        for a, src in zip(op.inputs, o.prim["inputs"] if o.prim else []):
            in_sticks.append(tmap[src["tensor"]].layout.stick_dim if src["tensor"] in tmap else None)
        ch = matching_choice(op, in_sticks, tmap[op.output.tensor].layout.stick_dim)
        slices = [(c.core, dict(c.slice)) for c in o.core_slices] if o.core_slices else None
        d.ops[op.id] = OpPlan(stick=ch, core_split={k: v for k, v in o.core_split.items() if v > 1},
                              core_slices=slices, alias=o.alias)
    for t in tmap.values():
        if isinstance(t.memory, LxMemory) and not t.memory.per_tile and t.id in pg.tensors:
            d.resident[t.id] = Residency(t.memory.lx_address, t.memory.size_per_core)
    return d


# rounds of dropping the LX residencies the validator names before a hint loses them all
HINT_REPAIR_ROUNDS = 3


def _hint_repaired(pg: PrimGraph, hw, d: PlanDecisions, issues: list) -> tuple[PlanDecisions, Optional[Program]]:
    """A hint that does not validate in this planner's op order, with the LX residencies the
    validator names dropped (`HINT_REPAIR_ROUNDS` rounds), then with none: a stored plan's
    sticks and splits are a better start than the naive plan even where its residencies do
    not hold in this order or without its fused kernels. (decisions, program or None)."""
    for _ in range(HINT_REPAIR_ROUNDS):
        named = {getattr(i, "tensor", None) for i in issues} & set(d.resident)
        if not named:
            break
        d = replace(d, resident={t: r for t, r in d.resident.items() if t not in named})
        prog, issues = _program_or_none(pg, hw, d)
        if prog is not None:
            return d, prog
    d = replace(d, resident={})
    return d, _program_or_none(pg, hw, d)[0]


def _hint_decisions(pg: PrimGraph, hw, hint) -> tuple[PlanDecisions, str]:
    if isinstance(hint, PlanDecisions):
        return hint, hint.planner
    if isinstance(hint, Program):
        return decisions_from_program(pg, hint), f"stored {hint.stats.planner} program"
    try:
        from solver.baseline.passes import plan_heuristic
        return plan_heuristic(pg, hw), "heuristic"
    except ImportError:
        from solver.naive import plan_naive
        return plan_naive(pg, hw), "naive"


def _starting_plan(pg: PrimGraph, hw, hint) -> tuple[PlanDecisions, Optional[Program], str, float]:
    """The search's start in this planner's op order: (decisions, their program, a name for
    the notes, seconds the first emit + validation took). The hint (`_hint_decisions`)
    without the residencies that do not validate in this order (`_hint_repaired`); for a
    stored program, the default start when that is predicted faster or the stored
    decisions do not validate; the naive plan when nothing else does."""
    hint_d, hint_name = _hint_decisions(pg, hw, hint)
    hint_d = replace(hint_d, op_order=[])  # the hint runs in this planner's order
    t_emit = time.perf_counter()
    hint_prog, hint_issues = _program_or_none(pg, hw, hint_d)
    emit_s = time.perf_counter() - t_emit
    if hint_prog is None and hint_d.resident:
        hint_d, hint_prog = _hint_repaired(pg, hw, hint_d, hint_issues)
        if hint_prog is not None:
            hint_name += " (without the LX residencies that do not validate in this op order)"
    if isinstance(hint, Program):
        # a stored plan's decisions without its fused kernels are priced untiled like any
        # start, and the default start competes: a fused program's splits are chosen for
        # its tiles (llama prefill, deterministic: from the stored plan's decisions 3990.8
        # us, from the default start 3843.0)
        default_d, default_name = _hint_decisions(pg, hw, None)
        default_prog, _ = _program_or_none(pg, hw, default_d)
        if default_prog is not None and hint_prog is None:
            return default_d, default_prog, f"{default_name} (the {hint_name} did not validate)", emit_s
        if default_prog is not None and predict_program_ns(default_prog, hw) < predict_program_ns(hint_prog, hw):
            return default_d, default_prog, f"{default_name} (predicted faster than the {hint_name})", emit_s
    if hint_prog is None:
        # an invalid hint is not a starting point: fall back to the naive plan
        from solver.naive import plan_naive
        hint_d, hint_name = plan_naive(pg, hw), f"naive (the {hint_name} hint was invalid)"
        hint_prog, _ = _program_or_none(pg, hw, hint_d)
    return hint_d, hint_prog, hint_name, emit_s


def _program_or_none(pg: PrimGraph, hw, d: PlanDecisions) -> tuple[Optional[Program], list]:
    try:
        program = emit_program(pg, hw, d)
    except ValueError as exc:
        return None, [str(exc)]
    issues = validate_program(program, hw)
    return (program if not issues else None), issues


# -- the model ----------------------------------------------------------------------------------
class SpyreModel:
    def __init__(self, pg: PrimGraph, hw, ctx: GraphContext, strategies: dict[str, list[Strategy]]):
        self.pg, self.hw, self.ctx, self.S = pg, hw, ctx, strategies
        self.m = cp_model.CpModel()
        self.index = {op.id: k for k, op in enumerate(pg.ops)}
        self.producer = {op.output.tensor: op for op in pg.ops}
        self.readers: dict[str, list[tuple[str, int]]] = {}
        for op in pg.ops:
            for i, a in enumerate(op.inputs):
                self.readers.setdefault(a.tensor, []).append((op.id, i))
        self.pick: dict[str, list] = {}
        self.lay: dict[str, dict] = {}
        self.mat: dict[tuple[str, Optional[int]], cp_model.IntVar] = {}
        self.mat_cost: dict[tuple[str, Optional[int]], int] = {}
        self.res: dict[str, cp_model.IntVar] = {}
        self.addr: dict[str, cp_model.IntVar] = {}
        self.size: dict[str, cp_model.IntVar] = {}
        self.yend: dict[str, cp_model.IntVar] = {}
        self.time: dict[str, cp_model.IntVar] = {}
        self.combos: dict[str, tuple] = {}
        self.objective_terms: list = []
        self._build()

    # layout literal: a var, or a Python bool for graph inputs
    def lay_lit(self, t: str, stick):
        if t in self.lay:
            return self.lay[t].get(stick, False)
        return self.ctx.input_sticks.get(t) == stick

    def _build(self) -> None:
        m, hw, ctx = self.m, self.hw, self.ctx
        stick_bytes = hw.stick_bytes
        cap_sticks = hw.lx_capacity_bytes // stick_bytes
        outputs = set(self.pg.outputs)
        for t in sorted(ctx.free_inputs):
            self.lay[t] = {s: m.NewBoolVar(f"lay[{t}][{s}]") for s in ctx.possible_sticks[t]}
            m.AddExactlyOne(self.lay[t].values())
        for op in self.pg.ops:
            vs = [m.NewBoolVar(f"pick[{op.id}][{k}]") for k in range(len(self.S[op.id]))]
            m.AddExactlyOne(vs)
            self.pick[op.id] = vs
            t = op.output.tensor
            self.lay[t] = {}
            for stick in ctx.possible_sticks[t]:
                lv = m.NewBoolVar(f"lay[{t}][{stick}]")
                m.Add(lv == sum(v for v, s in zip(vs, self.S[op.id]) if s.out_stick == stick))
                self.lay[t][stick] = lv
            # ANY operands whose layout would change this strategy's split granules
            for v, s in zip(vs, self.S[op.id]):
                for i, bad in s.any_forbidden.items():
                    src = op.inputs[i].tensor
                    for stick in bad:
                        lit = self.lay_lit(src, stick)
                        if lit is True:
                            m.Add(v == 0)
                        elif lit is not False:
                            m.AddBoolOr([v.Not(), lit.Not()])
        # restickify: one per (tensor, stick dim), shared by every reader that needs it
        for op in self.pg.ops:
            for i, a in enumerate(op.inputs):
                t = a.tensor
                by_stick: dict = {}
                for v, s in zip(self.pick[op.id], self.S[op.id]):
                    want = s.input_sticks[i]
                    if want is not None:
                        by_stick.setdefault(want, []).append(v)
                for stick, vs in by_stick.items():
                    lit = self.lay_lit(t, stick)
                    if lit is True:
                        continue
                    key = (t, stick)
                    if key not in self.mat:
                        self.mat[key] = m.NewBoolVar(f"mat[{t}][{stick}]")
                        self.mat_cost[key] = self._restick_cost(t, stick)
                        self.objective_terms.append(self.mat_cost[key] * self.mat[key])
                    rhs = [self.mat[key]] + ([lit] if lit is not False else [])
                    m.Add(sum(vs) <= sum(rhs))
        # residency candidates
        for t, readers in self.readers.items():
            p = self.producer.get(t)
            if p is None or t in outputs or not readers:
                continue
            S_p = self.S[p.id]
            ok = [k for k, s in enumerate(S_p) if not s.reduction_split and not s.alias
                  and s.out_lx_bytes <= hw.lx_capacity_bytes]
            if not ok:
                continue
            if any(all(s.alias for s in self.S[o]) for o, _ in readers):
                continue
            r = m.NewBoolVar(f"res[{t}]")
            self.res[t] = r
            for k, (v, s) in enumerate(zip(self.pick[p.id], S_p)):
                if k not in ok:
                    m.AddBoolOr([r.Not(), v.Not()])
            for (key, mv) in self.mat.items():
                if key[0] == t:
                    m.AddImplication(r, mv.Not())
            for o, slot in readers:
                for k in ok:
                    compat = [v for v, s in zip(self.pick[o], self.S[o])
                              if compatible_residency(S_p[k], s, slot)]
                    m.AddBoolOr([r.Not(), self.pick[p.id][k].Not()] + compat)
            sticks = [s.out_lx_bytes // stick_bytes for s in S_p]
            size = m.NewIntVar(0, max(sticks), f"size[{t}]")
            m.Add(size == sum(n * v for n, v in zip(sticks, self.pick[p.id])))
            addr = m.NewIntVar(0, cap_sticks, f"addr[{t}]")
            yend = m.NewIntVar(0, cap_sticks + max(sticks), f"yend[{t}]")
            m.Add(yend <= cap_sticks).OnlyEnforceIf(r)
            self.size[t], self.addr[t], self.yend[t] = size, addr, yend
        xs, ys = [], []
        for t, r in self.res.items():
            start = self.index[self.producer[t].id]
            last = max(self.index[o] for o, _ in self.readers[t])
            xs.append(m.NewOptionalFixedSizeIntervalVar(start, last - start + 1, r, f"x[{t}]"))
            ys.append(m.NewOptionalIntervalVar(self.addr[t], self.size[t], self.yend[t], r, f"y[{t}]"))
        if xs:
            m.AddNoOverlap2D(xs, ys)
        self._bundle_constraints()
        # op times
        for op in self.pg.ops:
            S_o = self.S[op.id]
            vs = self.pick[op.id]
            n_in = len(op.inputs)
            free = []
            for a in list(op.inputs) + [op.output]:
                if a.tensor in self.res and a.tensor not in free:
                    free.append(a.tensor)
            names = [a.tensor for a in op.inputs] + [op.output.tensor]
            combos = []
            for mask in range(1 << len(free)):
                on = {t for j, t in enumerate(free) if mask >> j & 1}
                lits = [self.res[t] if t in on else self.res[t].Not() for t in free]
                combos.append((tuple(t in on for t in names), lits))
            body = [[to_units(s.parts.cost(key[:-1], key[-1]).body_ns) for key, _ in combos] for s in S_o]
            extra = [to_units(s.parts.base.extra_ns) for s in S_o]
            tv = m.NewIntVar(0, max(max(b) for b in body), f"time[{op.id}]")
            self.time[op.id] = tv
            self.combos[op.id] = (names, combos, body)
            # exact time of the picked strategy under the residency combination that holds,
            # plus the weakest combination as an always-valid bound (helps the LP)
            m.Add(tv >= sum(min(b) * v for b, v in zip(body, vs)))
            if len(combos) > 1:
                for k, v in enumerate(vs):
                    for j, (_, lits) in enumerate(combos):
                        if body[k][j] > min(body[k]):
                            m.Add(tv >= body[k][j]).OnlyEnforceIf([v] + lits)
            else:
                m.Add(tv >= sum(b[0] * v for b, v in zip(body, vs)))
            self.objective_terms.append(tv)
            if any(extra):
                self.objective_terms.append(sum(c * v for c, v in zip(extra, vs)))
            # ties go to the strategy leaving fewer cores idle (1 ns a core): the solve prices
            # ops one by one, and only ops on one core count can later share a fused kernel
            idle = [max(0, self.hw.cores - math.prod(s.core_split.values())) for s in S_o]
            if any(idle):
                self.objective_terms.append(sum(c * v for c, v in zip(idle, vs)))

    def _restick_cost(self, t: str, stick) -> int:
        """Restickify of t onto `stick` through device memory, split as the emitter does by
        default (outermost dim evenly)."""
        hw, ctx = self.hw, self.ctx
        rid = f"{t}@restick"
        src_stick = ctx.possible_sticks[t][0]
        prim = restickify_prim(f"restick:{rid}", t, rid, ctx.shapes[t])
        gran = split_granules(prim, [src_stick], stick, [ctx.dtypes[t]] * 2, hw.stick_bytes)
        split = outermost_split(prim, gran, hw.cores)
        shapes = {t: ctx.shapes[t], rid: ctx.shapes[t]}
        dtypes = {t: ctx.dtypes[t], rid: ctx.dtypes[t]}
        layouts = {t: ctx.layout(t, src_stick), rid: ctx.layout(t, stick)}
        view = OpView(prim, "restickify", shapes, dtypes, layouts, split, [])
        return to_units(op_time(view, (False,), False, hw).total_ns)

    def window(self, t: str) -> tuple[int, int]:
        """Op-index span [producer, last reader] of a residency candidate."""
        return (self.index[self.producer[t].id], max(self.index[o] for o, _ in self.readers[t]))

    def _span_limit(self, a: int, b: int, when_t: list[str]) -> None:
        """If all tensors of `when_t` stay resident, ops a..b form (part of) one bundle: the
        device-memory tensors they reference stay within the bundle limit (a resident
        tensor does not count; a restickified copy of any of them counts, conservatively)."""
        limit = self.hw.bundle_tensor_limit
        refs: set[str] = set()
        for k in range(a, b + 1):
            op = self.pg.ops[k]
            refs.update(x.tensor for x in op.inputs)
            refs.add(op.output.tensor)
        mats = [key for key in self.mat if key[0] in refs]
        cands = [u for u in refs if u in self.res]
        fixed = len(refs) - len(cands)
        self.span_checks.append((tuple(when_t), fixed, tuple(cands), tuple(mats)))
        when = [self.res[t] for t in when_t]
        if fixed > limit:
            self.m.AddBoolOr([w.Not() for w in when])
        else:
            terms = [self.mat[key] for key in mats] + [1 - self.res[u] for u in cands]
            self.m.Add(sum(terms) <= limit - fixed).OnlyEnforceIf(when)

    def repair_spans(self, resident: dict, needed: set) -> dict:
        """Drop residencies until every bundle-window constraint holds (dropping one can
        push another window over the limit, so this iterates)."""
        resident = dict(resident)
        limit = self.hw.bundle_tensor_limit
        changed = True
        while changed:
            changed = False
            for when_t, fixed, cands, mats in self.span_checks:
                if all(t in resident for t in when_t):
                    n = fixed + sum(1 for u in cands if u not in resident) + sum(1 for k in mats if k in needed)
                    if n > limit:
                        for t in when_t:
                            resident.pop(t, None)
                        changed = True
        return resident

    def spans_ok(self, resident: set[str], needed: set) -> bool:
        """The bundle-window constraints of the model, checked for an assignment."""
        limit = self.hw.bundle_tensor_limit
        for when_t, fixed, cands, mats in self.span_checks:
            if all(t in resident for t in when_t):
                n = fixed + sum(1 for u in cands if u not in resident) + sum(1 for k in mats if k in needed)
                if n > limit:
                    return False
        return True

    def _bundle_constraints(self) -> None:
        """Every resident window, and every two overlapping ones (they share a bundle), fit
        the bundle limit; longer chains are checked after the solve (lazy no-goods)."""
        self.span_checks: list[tuple] = []
        spans = sorted((self.window(t), t) for t in self.res)
        for i, ((a, b), t) in enumerate(spans):
            self._span_limit(a, b, [t])
            for (c, d), u in spans[i + 1:]:
                if c > b:
                    break
                self._span_limit(min(a, c), max(b, d), [t, u])

    # -- hint and read-back ------------------------------------------------------------------
    def strategy_index(self, op_id: str, plan: OpPlan) -> Optional[int]:
        op = self.pg.ops[self.index[op_id]]
        ch = plan.stick or default_choice(op)
        split = {k: v for k, v in plan.core_split.items() if v > 1}
        for k, s in enumerate(self.S[op_id]):
            if s.stick == ch and s.core_split == split and s.alias == plan.alias:
                return k
        return None

    def add_hint(self, d: PlanDecisions) -> None:
        m, hw = self.m, self.hw
        chosen: dict[str, int] = {}
        for op in self.pg.ops:
            k = self.strategy_index(op.id, d.ops.get(op.id, OpPlan()))
            if k is None:
                k = 0
            chosen[op.id] = k
            for j, v in enumerate(self.pick[op.id]):
                m.AddHint(v, j == k)
            for stick, lv in self.lay[op.output.tensor].items():
                m.AddHint(lv, self.S[op.id][k].out_stick == stick)
        out_stick = {op.output.tensor: self.S[op.id][chosen[op.id]].out_stick for op in self.pg.ops}
        for t in sorted(self.ctx.free_inputs):  # hint order steers the search: keep it fixed
            have = d.input_sticks.get(t, self.ctx.input_sticks.get(t))
            out_stick[t] = have
            for s, v in self.lay[t].items():
                m.AddHint(v, s == have)
        needed = set()
        for op in self.pg.ops:
            s = self.S[op.id][chosen[op.id]]
            for i, a in enumerate(op.inputs):
                want = s.input_sticks[i]
                have = out_stick.get(a.tensor, self.ctx.input_sticks.get(a.tensor))
                if want is not None and want != have:
                    needed.add((a.tensor, want))
        for key, v in self.mat.items():
            m.AddHint(v, key in needed)
        resident = {t for t in d.resident if t in self.res}
        for t, r in self.res.items():
            on = t in resident
            m.AddHint(r, on)
            p = self.producer[t].id
            sz = self.S[p][chosen[p]].out_lx_bytes // hw.stick_bytes
            addr = d.resident[t].lx_address // hw.stick_bytes if on else 0
            m.AddHint(self.size[t], sz)
            m.AddHint(self.addr[t], addr)
            m.AddHint(self.yend[t], addr + sz)
        for op in self.pg.ops:
            s = self.S[op.id][chosen[op.id]]
            names, combos, body = self.combos[op.id]
            key = tuple(t in resident for t in names)
            j = next((j for j, (k, _) in enumerate(combos) if k == key), 0)
            m.AddHint(self.time[op.id], body[chosen[op.id]][j])

    def objective_of(self, picks: dict[str, int], resident: set[str],
                     input_sticks: Optional[dict] = None) -> float:
        """The model's objective (ns) for an assignment: per op the priced time of its
        strategy under its residency combination, plus every restickify it needs."""
        total = 0.0
        out_stick = {op.output.tensor: self.S[op.id][picks[op.id]].out_stick for op in self.pg.ops}
        out_stick.update(input_sticks or {})
        needed = set()
        for op in self.pg.ops:
            k = picks[op.id]
            names, combos, body = self.combos[op.id]
            key = tuple(t in resident for t in names)
            j = next((j for j, (kk, _) in enumerate(combos) if kk == key), 0)
            total += body[k][j] + to_units(self.S[op.id][k].parts.base.extra_ns)
            for i, a in enumerate(op.inputs):
                want = self.S[op.id][k].input_sticks[i]
                have = out_stick.get(a.tensor, self.ctx.input_sticks.get(a.tensor))
                if want is not None and want != have:
                    needed.add((a.tensor, want))
        return total + sum(self.restick_cost(*key) for key in needed)

    def residency_ok(self, t: str, picks: dict[str, int], size_per_core: Optional[int] = None) -> bool:
        """Can t stay resident under these picks (slicing, no split reduction, fits its
        reserved size)?"""
        sp = self.S[self.producer[t].id][picks[self.producer[t].id]]
        if sp.reduction_split or sp.alias:
            return False
        if size_per_core is not None and sp.out_lx_bytes > size_per_core:
            return False
        return all(compatible_residency(sp, self.S[o][picks[o]], slot) for o, slot in self.readers[t])

    def needed_resticks(self, picks: dict[str, int], input_sticks: dict) -> set:
        out_stick = {op.output.tensor: self.S[op.id][picks[op.id]].out_stick for op in self.pg.ops}
        out_stick.update(input_sticks)
        needed = set()
        for op in self.pg.ops:
            s = self.S[op.id][picks[op.id]]
            for i, a in enumerate(op.inputs):
                want = s.input_sticks[i]
                if want is not None and want != out_stick.get(a.tensor, self.ctx.input_sticks.get(a.tensor)):
                    needed.add((a.tensor, want))
        return needed

    def restick_cost(self, t: str, stick) -> int:
        """Price of the restickify of t onto `stick` (the model's, or priced once on demand)."""
        key = (t, stick)
        if key not in self.mat_cost:
            self.mat_cost[key] = self._restick_cost(t, stick)
        return self.mat_cost[key]

    def local_search(self, d: PlanDecisions, deadline: Optional[float], max_passes: int = 50,
                     chains: bool = True) -> PlanDecisions:
        """Best single moves on the model's own objective until none improves or the
        deadline: a weight's stick dim, or one op's strategy (residencies the move breaks
        are dropped; the bundle-window constraints must keep holding); then, each pass, the
        best improving chain move (`chains`: a stick-connected run of ops relabelled
        together, `solver.spyre.chain_moves`), priced the same way. The result is a better
        complete hint for CP-SAT.

        Moves are priced incrementally (exact: the objective is integer nanoseconds): a
        move re-prices only the ops touching a tensor whose residency it changes and the
        restickifies of the tensors the moved op reads and writes. Same moves, same order,
        same result as `objective_of` on every trial, without its pass over the graph."""
        ops = {op.id: op for op in self.pg.ops}
        picks = {op.id: (self.strategy_index(op.id, d.ops.get(op.id, OpPlan())) or 0) for op in self.pg.ops}
        inputs = {t: d.input_sticks.get(t, self.ctx.input_sticks.get(t)) for t in sorted(self.ctx.free_inputs)}
        resident = {t: r for t, r in d.resident.items() if t in self.res}
        touching: dict[str, list[str]] = {}
        ops_of: dict[str, set[str]] = {}  # tensor -> ops reading or writing it
        for op in self.pg.ops:
            touching[op.id] = [a.tensor for a in op.inputs] + [op.output.tensor]
            for t in touching[op.id]:
                ops_of.setdefault(t, set()).add(op.id)
        extra = {o: [to_units(s.parts.base.extra_ns) for s in S] for o, S in self.S.items()}
        combo_index = {o: {key: j for j, (key, _) in reversed(list(enumerate(c[1])))} for o, c in self.combos.items()}

        def op_cost(o: str, k: int, res: dict) -> int:
            names, _, body = self.combos[o]
            j = combo_index[o].get(tuple(t in res for t in names), 0)
            return body[k][j] + extra[o][k]

        def have(t: str, pk: dict, ins: dict):
            p = self.producer.get(t)
            if p is not None:
                return self.S[p.id][pk[p.id]].out_stick
            return ins[t] if t in ins else self.ctx.input_sticks.get(t)

        def needs(t: str, pk: dict, ins: dict) -> frozenset:
            h = have(t, pk, ins)
            out = set()
            for o, i in self.readers.get(t, ()):
                want = self.S[o][pk[o]].input_sticks[i]
                if want is not None and want != h:
                    out.add((t, want))
            return frozenset(out)

        def restick(keys) -> int:
            return sum(self.restick_cost(*key) for key in keys)

        need = {t: needs(t, picks, inputs) for t in self.readers}
        cost = {o: op_cost(o, picks[o], resident) for o in ops}
        best = sum(cost.values()) + sum(restick(v) for v in need.values())

        def all_needed(changed: dict) -> set:
            out = set()
            for t, v in need.items():
                out.update(changed.get(t, v))
            return out

        def out_of_time() -> bool:
            return deadline is not None and time.perf_counter() > deadline
        def try_move(trial: dict, moved_ops, trial_inputs: dict, moved_inputs):
            """(objective, residencies, op costs, restickify needs) after the move, or
            (None, ...) when it breaks a bundle window or an ANY operand's forbidden
            stick dims (`chain_moves.any_operands_ok`). Re-prices only the ops touching a
            tensor whose residency it changes and the restickifies of the tensors the moved
            ops and weights touch."""
            if not any_operands_ok(self, trial, trial_inputs, moved_ops, moved_inputs):
                return None, None, None, None
            touched = {t for o in moved_ops for t in touching[o]}
            res2 = {t: r for t, r in resident.items()
                    if t not in touched or self.residency_ok(t, trial, r.size_per_core)}
            new_need = {t: needs(t, trial, trial_inputs) for t in touched | set(moved_inputs) if t in need}
            needed = None
            if len(res2) < len(resident):
                needed = all_needed(new_need)
                res2 = self.repair_spans(res2, needed)
            moved = set(moved_ops)
            for t in resident:
                if t not in res2:
                    moved |= ops_of.get(t, set())
            new_cost = {o: op_cost(o, trial[o], res2) for o in moved}
            val = (best + sum(c - cost[o] for o, c in new_cost.items())
                   + sum(restick(v) - restick(need[u]) for u, v in new_need.items()))
            if val < best and self.spans_ok(set(res2), needed if needed is not None else all_needed(new_need)):
                return val, res2, new_cost, new_need
            return None, None, None, None

        from solver.spyre.chain_moves import ChainMoves, any_operands_ok
        moves = ChainMoves(self) if chains else None
        improved = True
        passes = 0
        while improved and passes < max_passes and not out_of_time():
            improved = False
            passes += 1
            for t in sorted(self.ctx.free_inputs):
                for s in self.ctx.possible_sticks[t]:
                    if s == inputs[t]:
                        continue
                    trial = dict(inputs, **{t: s})
                    new_need = {t: needs(t, picks, trial)} if t in need else {}
                    val = best + sum(restick(v) - restick(need[u]) for u, v in new_need.items())
                    if val < best and self.spans_ok(set(resident), all_needed(new_need)) and \
                            any_operands_ok(self, picks, trial, (), (t,)):
                        best, inputs, improved = val, trial, True
                        need.update(new_need)
            for op in self.pg.ops:
                if out_of_time():
                    break
                for k in range(len(self.S[op.id])):
                    if k == picks[op.id]:
                        continue
                    trial = dict(picks)
                    trial[op.id] = k
                    val, res2, new_cost, new_need = try_move(trial, (op.id,), inputs, ())
                    if val is not None and val < best:
                        best, picks, resident, improved = val, trial, res2, True
                        cost.update(new_cost)
                        need.update(new_need)
            if moves is None or out_of_time():
                continue
            found = None
            for mv in moves.moves(picks, inputs, resident):
                if out_of_time():
                    break
                trial = dict(picks, **dict(mv.picks))
                trial_inputs = dict(inputs, **dict(mv.inputs))
                val, res2, new_cost, new_need = try_move(trial, [o for o, _ in mv.picks], trial_inputs,
                                                         [t for t, _ in mv.inputs])
                if val is not None and val < (best if found is None else found[0]):
                    found = (val, trial, trial_inputs, res2, new_cost, new_need)
            if found is not None:
                best, picks, inputs, resident, new_cost, new_need = found
                improved = True
                cost.update(new_cost)
                need.update(new_need)
        out = self.decisions_of(picks, resident, dict(self.ctx.input_sticks, **inputs))
        return out

    def decisions_of(self, picks: dict[str, int], resident: dict[str, Residency],
                     input_sticks: dict) -> PlanDecisions:
        d = PlanDecisions(planner="cpsat", input_sticks=dict(input_sticks))
        for op in self.pg.ops:
            s = self.S[op.id][picks[op.id]]
            d.ops[op.id] = OpPlan(stick=s.stick, core_split=dict(s.core_split),
                                  temporal_tiles=dict(s.temporal_tiles), alias=s.alias)
        d.resident = dict(resident)
        d.bundle_starts = self.bundle_starts(set(resident))
        return d

    def decisions(self, solver: cp_model.CpSolver, input_sticks: dict) -> PlanDecisions:
        hw = self.hw
        d = PlanDecisions(planner="cpsat", input_sticks=dict(input_sticks))
        for t in sorted(self.ctx.free_inputs):
            d.input_sticks[t] = next(s for s, v in self.lay[t].items() if solver.BooleanValue(v))
        for op in self.pg.ops:
            k = next(j for j, v in enumerate(self.pick[op.id]) if solver.BooleanValue(v))
            s = self.S[op.id][k]
            d.ops[op.id] = OpPlan(stick=s.stick, core_split=dict(s.core_split),
                                  temporal_tiles=dict(s.temporal_tiles), alias=s.alias)
        for t, r in self.res.items():
            if solver.BooleanValue(r):
                d.resident[t] = Residency(lx_address=solver.Value(self.addr[t]) * hw.stick_bytes,
                                          size_per_core=solver.Value(self.size[t]) * hw.stick_bytes)
        d.resident = self.canonical_addresses(d.resident)
        d.bundle_starts = self.bundle_starts(set(d.resident))
        return d

    def canonical_addresses(self, resident: dict[str, Residency]) -> dict[str, Residency]:
        """Re-place the chosen buffers first-fit (windows in order, then by name): the
        solver's addresses are one of many equivalent packings, and this one does not depend
        on which the search met first. Keeps the solver's packing when first-fit fails."""
        cap = self.hw.lx_capacity_bytes
        placed: list[tuple[int, int, int, int]] = []
        out: dict[str, Residency] = {}
        for t in sorted(resident, key=lambda t: (self.window(t), t)):
            a, b = self.window(t)
            size = resident[t].size_per_core
            addr = 0
            for s0, e0, ad, sz in sorted(placed, key=lambda x: x[2]):
                if s0 <= b and a <= e0 and addr < ad + sz and ad < addr + size:
                    addr = ad + sz
            if addr + size > cap:
                return resident
            placed.append((a, b, addr, size))
            out[t] = Residency(addr, size)
        return out

    def windows(self, resident: set[str]) -> list[tuple[int, int, list[str]]]:
        """Groups of overlapping resident live windows, as (first op, last op, tensors)."""
        spans = sorted((*self.window(t), t) for t in resident)
        groups: list[tuple[int, int, list[str]]] = []
        for a, b, t in spans:
            if groups and a <= groups[-1][1]:
                ga, gb, ts = groups[-1]
                groups[-1] = (ga, max(gb, b), ts + [t])
            else:
                groups.append((a, b, [t]))
        return groups

    def bundle_starts(self, resident: set[str]) -> list[str]:
        return [self.pg.ops[a].id for a, _, _ in self.windows(resident)]


def build_model(pg: PrimGraph, hw, hint_d: PlanDecisions, keep: int = 4,
                keep_resident: int = 2) -> tuple[GraphContext, dict[str, list[Strategy]], SpyreModel]:
    """Strategy space and CP-SAT model of a graph. The hint's and the naive plan's
    strategies are always in the space, so the model's optimum is never worse than either."""
    from solver.naive import plan_naive
    ctx = GraphContext.build(pg, hw, hint_d.input_sticks)
    naive_d = plan_naive(pg, hw)
    strategies = {}
    for op in pg.ops:
        req = []
        for src in (hint_d, naive_d):
            p = src.ops.get(op.id, OpPlan())
            req.append((p.stick or default_choice(op), {k: v for k, v in p.core_split.items() if v > 1},
                        {}, p.alias))
        strategies[op.id] = op_strategies(op, ctx, keep=keep, keep_resident=keep_resident, required=req)
    strategies = align_strategies(pg, ctx, strategies)
    return ctx, strategies, SpyreModel(pg, hw, ctx, strategies)


def _repair_bundles(pg: PrimGraph, hw, sm: "SpyreModel", d: PlanDecisions, max_steps: int = 8):
    """Emit and validate; while the only problems are bundles over the external-tensor
    limit, drop the residencies of the LX window groups inside the offending bundles.
    Returns (decisions, program or None, dropped groups, last issues)."""
    order = {o.id: k for k, o in enumerate(pg.ops)}
    groups: list[list[str]] = []
    issues: list = []
    for _ in range(max_steps):
        prog, issues = _program_or_none(pg, hw, d)
        if prog is not None:
            return d, prog, groups, []
        bundle_issues = [i for i in issues if getattr(i, "code", "") in _BUNDLE_CODES]
        if not bundle_issues or len(bundle_issues) != len(issues):
            return d, None, groups, issues
        program = emit_program(pg, hw, d)
        bad_ops = set()
        for b in program.bundles:
            if len(b.external_tensors) > hw.bundle_tensor_limit or any(
                    i.code == "lx_cross_bundle" and i.op in b.ops for i in bundle_issues):
                bad_ops.update(order[o] for o in b.ops if o in order)
        bad = [ts for a, b, ts in sm.windows(set(d.resident)) if any(a <= k <= b for k in bad_ops)]
        if not bad:
            return d, None, groups, issues
        groups.extend(bad)
        resident = {t: r for t, r in d.resident.items() if not any(t in ts for ts in bad)}
        d = replace(d, resident=resident, bundle_starts=sm.bundle_starts(set(resident)))
    return d, None, groups, issues


# Of the time left when fusion starts, the share kept for the split-K step after it when the
# graph has candidates (`split_k_hold.split_k_candidates`): at a 10 s limit the fusion search
# ran to the deadline on mistral prefill and the step (about 2 s there, worth 58-232 us on the
# prefill layers) never ran (2026-12-01 23:20 UTC).
SPLIT_K_SHARE = 0.3
# Of the time left after the split-K step, the share `hold_in_lx` may use before the last
# fewer-tiles pass (a 10 s layers run on a machine 1.6x slower than usual, 2026-12-02 01:42
# UTC: the hold took all of it, granite prefill 4356.2 us with no fewer-tiles pass).
HOLD_AFTER_SPLIT_K_SHARE = 0.5
# Trials of the last fewer-tiles pass (two per kernel): llama prefill at 10 s, the plan after
# the split-K step: 8 trials 3905.6 -> 3903.1 us, 16 -> 3846.1, 40 -> 3831.6 (1.2 s).
FINAL_RETILE_TRIALS = 40


def _fuse(pg: PrimGraph, hw, d: PlanDecisions, notes: list, deadline: Optional[float],
          strategies: dict[str, list[Strategy]], enabled: bool = True) -> tuple[PlanDecisions, float]:
    """The final plan with fused coarse-tiled groups where the timing model finds them faster
    (`solver.spyre.fusion`), then `_resplit_unfused`, then split-K readers of held results
    (`solver.spyre.split_k_hold`; when one moved, `hold_in_lx` once more), then a last
    fewer-tiles pass, and the simulated gain in ns (the per-op cost
    model the objective sums does not see fused groups, so the gain is taken from the
    simulation).

    The search runs from two starts: the plan as solved, and the same plan with its matmuls
    re-split for tiling (`resplit_for_tiling`; a split-K matmul joins no kernel). The faster
    result is kept (a tie keeps the plan as solved). When both exist the re-split start goes
    first: on every layer graph where it moved a matmul it won, by 10-20% (deterministic
    compiles of 2026-12-01: gpt2 470.0 -> 366.9 us, granite prefill 4939.0 -> 4445.9, llama
    prefill 5295.4 -> 4435.1), so a deadline that leaves time for one search only spends it
    there."""
    if not enabled:
        return d, 0.0
    alt = resplit_for_tiling(pg, d, strategies)
    starts = [(d, None)] if alt is None else [(alt[0], alt[1]), (d, None)]
    res, res_moved, base_us = None, None, None
    fusion_deadline = deadline
    if deadline is not None and split_k_candidates(pg):
        fusion_deadline = deadline - SPLIT_K_SHARE * max(0.0, deadline - time.perf_counter())
    first_s = 0.0
    for k, (start, moved) in enumerate(starts):
        # a second search cut short by the deadline has never won (it stops before its
        # later steps), and the time it took is what the split-K step and the last
        # fewer-tiles pass after it need: it starts only when the time left covers what
        # the first search took
        if k > 0 and fusion_deadline is not None and time.perf_counter() + first_s >= fusion_deadline:
            notes.append("fusion: no time left for the " + ("plan as solved" if moved is None else "re-split plan"))
            break
        t_search = time.perf_counter()
        # the fewer-tiles pass runs once, on the plan kept (below: more trials than the
        # search's own, after the split-K step changed kernels); per search it cost 0.3-0.5 s
        # for 8-18 us on the prefill layers
        got = fuse_tiled_groups(pg, hw, start, deadline=fusion_deadline, reorder=True,
                                end_with_fewer_tiles=False)
        first_s = first_s or time.perf_counter() - t_search
        if got is None:
            continue
        if moved is None:
            base_us = got.base_us
        if res is None or got.fused_us < res.fused_us or (got.fused_us == res.fused_us and moved is None):
            res, res_moved = got, moved
    if res is None:
        return d, 0.0
    notes.extend(res.notes)
    if res_moved is not None:
        notes.append(f"fusion kept the start with {len(res_moved)} matmuls re-split for tiling "
                     f"({', '.join(res_moved[:4])}{', ...' if len(res_moved) > 4 else ''})")
        if base_us is None:   # the plan as solved was not searched: timed here
            prog, _ = _program_or_none(pg, hw, d)
            base_us = time_program(prog, hw).total_us if prog is not None else res.base_us
        res.base_us = base_us   # the gain is counted from the plan as solved
    fused_d, fused_us = res.decisions, res.fused_us
    if res.groups and (deadline is None or time.perf_counter() < deadline):
        again = _resplit_unfused(pg, hw, fused_d, res.program, strategies)
        if again is not None and again[1] < fused_us:
            notes.append(f"resplit after fusion: {again[2]} ops, simulated {fused_us:.1f} -> {again[1]:.1f} us")
            fused_d, fused_us = again[0], again[1]
    emit_s = 0.0   # one emit + validation of the fused plan: what a trial here costs, about
    held = None
    runner_up: list = []   # the split-K step's fastest variant when none was faster
    if deadline is None or time.perf_counter() < deadline:
        t_emit = time.perf_counter()
        prog, _ = _program_or_none(pg, hw, fused_d)
        emit_s = time.perf_counter() - t_emit
        held = hold_for_split_k(pg, hw, fused_d, prog, fused_us, deadline, notes,
                                runner_up) if prog is not None else None
        if held is not None:
            fused_d, fused_us = held[0], held[1]
            notes.extend(held[2])
    # (a trial emits, places tile buffers, validates and times: about three of those)
    if deadline is None or time.perf_counter() + 3 * emit_s < deadline:
        # the steps since the search changed kernels (re-splits, LX holds, split-K readers
        # loading from device memory): kernels that underfill at their tile count retry
        # fewer tiles (the one fewer-tiles pass of the pipeline: the searches leave it out)
        t_trial = time.perf_counter()
        tr = fusion_trial(pg, hw, fused_d)
        if tr is not None and not issues_of(tr, hw):
            trial_s = time.perf_counter() - t_trial
            if held is not None:
                # the split-K reader left the kernel it headed, so a result that kernel's
                # members could not follow may be held now (granite prefill: the residual
                # sum, read by the next norm and by the final add, which was a member of
                # the down projection's kernel); half the time left, the rest for the
                # fewer-tiles pass below (worth more on the prefill layers: 80-240 us)
                hold_deadline = None if deadline is None else \
                    time.perf_counter() + HOLD_AFTER_SPLIT_K_SHARE * max(0.0, deadline - time.perf_counter())
                again = hold_in_lx(pg, hw, tr, hold_deadline, trial_s)
                if again[2].total_us < tr[2].total_us:
                    notes.append(f"held in LX after split-K: simulated {tr[2].total_us:.1f} -> {again[2].total_us:.1f} us")
                    tr = again
                    fused_d, fused_us = again[0], again[2].total_us
            retiled = fewer_tiles(pg, hw, tr, deadline, trial_s, limit=FINAL_RETILE_TRIALS, cut_notes=notes)
            if retiled[2].total_us < fused_us:
                notes.append(f"fewer tiles at the end: simulated {fused_us:.1f} -> {retiled[2].total_us:.1f} us")
                fused_d, fused_us = retiled[0], retiled[2].total_us
            if runner_up and (deadline is None or time.perf_counter() + 3 * trial_s < deadline):
                # a split-K variant slower than the plan as it stood, judged after the same
                # pass (llama prefill, one solved plan: the variant 3943.6 us against the
                # plan's 3908.1, after the pass 3803.9 against 3899.1)
                alt = fewer_tiles(pg, hw, runner_up[0], deadline, trial_s, limit=FINAL_RETILE_TRIALS, cut_notes=notes)
                if alt[2].total_us < fused_us and not issues_of(alt, hw):
                    notes.append(f"split-K over a held result after fewer tiles: simulated {fused_us:.1f} -> "
                                 f"{alt[2].total_us:.1f} us ({runner_up[0][2].total_us:.1f} before the pass)")
                    fused_d, fused_us = alt[0], alt[2].total_us
    return fused_d, max(0.0, (res.base_us - fused_us) * 1000.0)


def _finish(pg: PrimGraph, hw, d: PlanDecisions, notes: list, deadline: Optional[float],
            strategies: dict[str, list[Strategy]], fuse: bool) -> tuple[PlanDecisions, float]:
    """The steps after the solve, each judged by simulation: fused kernels (`_fuse`), then
    restickifies as on-chip LX relayouts (`solver.spyre.relayout`). Returns the plan and the
    simulated gain in ns."""
    d, gain_ns = _fuse(pg, hw, d, notes, deadline, strategies, fuse)
    if deadline is not None and time.perf_counter() > deadline:
        return d, gain_ns
    prog, _ = _program_or_none(pg, hw, d)
    if prog is not None and relayout_candidates(pg, prog):
        d, _, more, gain_us = add_lx_relayouts(pg, hw, d, prog, deadline)
        notes.extend(more)
        gain_ns += gain_us * 1000.0
    return d, gain_ns


def _resplit_unfused(pg: PrimGraph, hw, d: PlanDecisions, program: Program,
                     strategies: dict[str, list[Strategy]]) -> Optional[tuple[PlanDecisions, float, int]]:
    """Fusion gives a chain one core split and keeps its results on chip, so an LX residency
    the solve chose a neighbour's split for may be gone. Each op outside a fused kernel whose
    operands all live in device memory takes its cheapest strategy of the same stick choice
    (cost model, everything in device memory); the simulator judges the result once.
    Returns (decisions, simulated us, ops changed), or None when nothing changes or the
    result does not validate."""
    tmap = program.tensor_map()
    producer_of = {op.id: op for op in pg.ops}
    ops = dict(d.ops)
    changed = 0
    for o in program.ops:
        if (o.kind != "compute" or o.alias or o.prim is None or o.id not in strategies
                or fused_group_key(o) is not None):
            continue
        prim = parsed_prim(o.prim)
        if any(isinstance(tmap[n].memory, LxMemory) for n in [a.tensor for a in prim.inputs] + [prim.output.tensor]):
            continue
        cur = d.ops.get(o.id, OpPlan())
        stick = cur.stick or default_choice(producer_of[o.id])
        split = {k: v for k, v in cur.core_split.items() if v > 1}
        cands = [s for s in strategies[o.id] if not s.alias and s.stick == stick]
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
    prog, _ = _program_or_none(pg, hw, out)
    if prog is None:
        return None
    return out, time_program(prog, hw).total_us, changed


# -- entry point ---------------------------------------------------------------------------------
def plan_cpsat(pg: PrimGraph, hw, *, time_limit_s: Optional[float] = None, deterministic: bool = False,
               hint: Union[PlanDecisions, Program, None] = None, num_workers: int = 2,
               keep: int = 4, keep_resident: int = 2, max_rounds: int = 4, fuse: bool = True,
               budget: str = "scaled", events: Optional[EventSink] = None, depth: bool = True,
               seed: int = 1, **_ignored) -> PlanDecisions:
    """Plan `pg`: first the depth step (`depth`, solver.spyre.repeats.plan_whole): a graph
    made of repeated blocks is planned by solving one block and reusing its plan, a large
    irregular one in windows (docs/depth.md); otherwise `_plan_chain_ordered`, never
    predicted slower than the hint as its own planner ordered it: the search starts from the hint in this planner's op order
    (`schedule.chain_order`), where it can be slower than in the order it was made for, and
    a short budget may not win that back (the 2-layer toy GPT-2: heuristic 26.23 us in
    source order, the plan after a 1 s deterministic search 26.32 us).
    `events`: an optional progress sink (solver.events): phases, and each improving
    incumbent and bound of the CP-SAT solve; it never changes the plan. `seed`: CP-SAT's
    random seed (another seed, another of the model's optima, which fusion may turn into a
    faster program)."""
    t0 = time.perf_counter()
    if depth and budget == "scaled":
        from solver.spyre.repeats import plan_whole

        _phase(events, "repeats", True, "repeated structure and windows")
        # a stored program (re-optimization) is the hint as its decisions
        hint_d = decisions_from_program(pg, hint) if isinstance(hint, Program) else hint
        d = plan_whole(pg, hw, time_limit_s=time_limit_s, deterministic=deterministic, t0=t0, hint_d=hint_d)
        _phase(events, "repeats", False, "not taken" if d is None else d.stats["notes"][0])
        if d is not None:
            return d
    # the plan to beat in its own op order, made first so that its time counts against the
    # limit too (like the depth step's look for repeats above)
    own, name, own_us = None, None, None
    if not isinstance(hint, Program):
        if hint is None:
            try:
                from solver.baseline.passes import plan_heuristic
                own, name = plan_heuristic(pg, hw), "heuristic"
            except ImportError:
                pass
        else:
            own, name = hint, hint.planner
    if own is not None:
        prog, _ = _program_or_none(pg, hw, own)
        own_us = predict_program_ns(prog, hw) / 1000.0 if prog is not None else None
    d = _plan_chain_ordered(pg, hw, time_limit_s=time_limit_s, deterministic=deterministic, hint=hint,
                            num_workers=num_workers, keep=keep, keep_resident=keep_resident,
                            max_rounds=max_rounds, fuse=fuse, budget=budget, events=events, seed=seed,
                            t0=None if deterministic else t0)
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


def _plan_chain_ordered(pg: PrimGraph, hw, *, time_limit_s: Optional[float], deterministic: bool,
                        hint: Union[PlanDecisions, Program, None], num_workers: int, keep: int,
                        keep_resident: int, max_rounds: int, fuse: bool, budget: str,
                        events: Optional[EventSink] = None, seed: int = 1,
                        t0: Optional[float] = None) -> PlanDecisions:
    """Plan `pg`. `time_limit_s` (default `DEFAULT_TIME_LIMIT_S`) caps the wall clock, counted
    from `t0` (default: now; the caller's start when steps before this one used some of it);
    `budget="scaled"` (the default) plans within `default_budget_s` of the problem's size
    under that cap and stops each CP-SAT round once its plan is proven within the gap
    limits; `budget="fixed"` is the behaviour before 2026-12-01 (the whole limit, only a
    proven optimum stops a round early), kept for comparison (benchmarks/bench_compile_time.py)."""
    if budget not in ("scaled", "fixed"):
        raise ValueError(f"budget must be 'scaled' or 'fixed', not {budget!r}")
    t0 = time.perf_counter() if t0 is None else t0
    cap_s = float(time_limit_s) if time_limit_s else DEFAULT_TIME_LIMIT_S
    # the op order is a decision too: each chain runs straight into its consumer, so
    # chains can become fused kernels (solver.spyre.schedule)
    pg = chain_order(pg)
    order = [op.id for op in pg.ops]
    _phase(events, "hint", True, "the starting plan")
    hint_d, hint_prog, hint_name, emit_s = _starting_plan(pg, hw, hint)
    hint_ns = predict_program_ns(hint_prog, hw) if hint_prog is not None else float("inf")
    _phase(events, "hint", False, f"{hint_name}, predicted {hint_ns / 1000:.4g} us")

    _phase(events, "strategies", True, f"{len(pg.ops)} ops")
    ctx, strategies, sm = build_model(pg, hw, hint_d, keep=keep, keep_resident=keep_resident)
    n_strategies = sum(len(v) for v in strategies.values())
    _phase(events, "strategies", False, f"{n_strategies} strategies over {len(pg.ops)} ops")
    # the wall-clock budget of the whole plan (the model build above included): from the
    # problem's size and stakes, never more than the caller's limit; counts and the cost
    # model's prediction, never a measured time, so a deterministic plan gets the same
    # budget every time
    limit_s = default_budget_s(n_strategies, hint_ns / 1000.0, cap_s) if budget == "scaled" else cap_s
    gaps = dict(relative_gap_limit=RELATIVE_GAP_LIMIT, absolute_gap_limit=ABSOLUTE_GAP_LIMIT) \
        if budget == "scaled" else {}
    # sharpen the hint by local search on the model's objective (a bounded share of the
    # budget; it stops sooner when no single move improves)
    elapsed = time.perf_counter() - t0
    _phase(events, "local search", True, "sharpening the hint")
    if deterministic:  # a pass count, not the wall clock, bounds it
        start_d = sm.local_search(hint_d, None, max_passes=3, chains=START_CHAIN_MOVES)
    else:
        start_d = sm.local_search(hint_d, t0 + elapsed + LOCAL_SEARCH_SHARE * max(0.0, limit_s - elapsed),
                                  chains=START_CHAIN_MOVES)
    t_emit = time.perf_counter()
    start_prog, _ = _program_or_none(pg, hw, start_d)
    # the first emission above paid for warming caches: the faster of the two is the one
    # the phases after the solve will see
    emit_s = min(emit_s, time.perf_counter() - t_emit)
    # time to keep once the solver stops: emitting and validating the result here, and
    # planners.plan() emitting and validating it once more before it returns (a fused plan
    # with tile buffers emits and validates slower than the hint: 3% of the limit more)
    reserve_s = 2.5 * emit_s + 0.03 * limit_s
    # and for the fusion search after it (solver.spyre.fusion): one trial per split variant and per
    # further tile count, the final one and the resplit after it, each about four times an
    # emit + validation (two emits, a validation or two for the tile buffers, a simulation;
    # measured on the layer graphs), and at least FUSION_SHARE of the limit: fusion gains
    # more than the solver's last seconds do (layer graphs: 10-20% vs a few %).
    # Reserved for the first search (the plan as solved) and capped at FUSION_MAX_SHARE, so a
    # slow emit on a loaded machine cannot starve the solve; the second search (matmuls
    # re-split for tiling) runs in whatever time is left.
    fusion_s = min(max(4 * (FUSION_TRIALS + 2) * emit_s, FUSION_SHARE * limit_s),
                   FUSION_MAX_SHARE * limit_s) if fuse else 0.0
    if start_prog is not None and predict_program_ns(start_prog, hw) < hint_ns:
        hint_d, hint_prog, hint_ns = start_d, start_prog, predict_program_ns(start_prog, hw)
        hint_name += " + local search"
    _phase(events, "local search", False, f"start predicted {hint_ns / 1000:.4g} us")
    sm.add_hint(hint_d)
    objective = sum(sm.objective_terms)
    sm.m.Minimize(objective)
    phase = {"build": elapsed, "local search": time.perf_counter() - t0 - elapsed}
    notes = [f"hint: {hint_name}", f"strategies: {n_strategies} over "
             f"{len(pg.ops)} ops, {len(sm.mat)} restickify options, {len(sm.res)} residency candidates",
             "bundles: partition step after the solve (one bundle start per group of overlapping LX "
             "windows, emitter cuts elsewhere)", "objective and bound in microseconds (cost model)",
             f"budget: {limit_s:.1f} s of a {cap_s:g} s limit" + (
                 f" ({budget}; stop at a gap of {RELATIVE_GAP_LIMIT:.1%} or {ABSOLUTE_GAP_LIMIT / 1000:g} us)"
                 if budget == "scaled" else " (fixed)")]

    t_solve = time.perf_counter()
    _phase(events, "solve", True, f"budget {limit_s:.1f} s")
    best_d, best_prog, best_pred, status, obj, bound = None, None, float("inf"), "UNKNOWN", None, None
    for round_ in range(max_rounds):
        remaining = limit_s - (time.perf_counter() - t0) - reserve_s - fusion_s
        if round_ > 0 and remaining < 0.05 * limit_s and not deterministic:
            break
        # the first round gets most of the budget; repair rounds (lazy no-goods) the rest
        round_s = max(0.3, remaining * (0.7 if round_ + 1 < max_rounds else 1.0))
        if deterministic:
            # nothing measured on the wall clock may shape a deterministic solve: the
            # deterministic time (a share of the budget) stops it; the wall limit is only a
            # safety net, at 3x the caller's limit as before budgets scaled
            round_s = cap_s
        opts = SolveOptions(time_limit_s=round_s, num_workers=num_workers, deterministic=deterministic, seed=seed,
                            # deterministic: a fixed share of the limit, never the wall clock
                            deterministic_time=DETERMINISTIC_PER_SECOND * limit_s / (round_ + 2),
                            deterministic_wall_factor=3.0, **gaps)
        solver = solver_parameters(opts)
        # CP-SAT's presolve spends seconds of wall time on this model for almost no
        # reduction (measured on a 143-op graph: 3.3 s, model 2447 -> 2021 variables); the
        # complete hint and LNS do better with that time
        solver.parameters.cp_model_presolve = False
        if events is not None:
            progress = _ProgressCallback(events, round_, t_solve)
            solver.best_bound_callback = progress.on_bound
            st = solver.Solve(sm.m, progress)
        else:
            st = solver.Solve(sm.m)
        status = solver.StatusName(st)
        if st in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            obj, bound = solver.ObjectiveValue(), solver.BestObjectiveBound()
            gap_note = f", gap {gap_of(obj, bound):.2%}"
        else:
            gap_note = ""
        notes.append(f"round {round_}: {status} after {solver.WallTime():.1f} s "
                     f"(deterministic time {solver.deterministic_time:.2f}{gap_note})")
        if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            break
        d = sm.decisions(solver, ctx.input_sticks)
        d, prog, groups, issues = _repair_bundles(pg, hw, sm, d)
        if prog is not None:
            pred = predict_program_ns(prog, hw)
            if best_prog is None or pred < best_pred:
                best_d, best_prog, best_pred = d, prog, pred
        if not groups:
            if prog is None:
                notes.append("cpsat plan failed validation: " + "; ".join(
                    f"{getattr(i, 'code', '')}: {getattr(i, 'message', i)}" for i in issues[:3]))
            break
        # lazy no-goods: each group of windows whose bundle broke the limit cannot all stay
        # resident together; the next round starts from the repaired solution
        notes.append(f"round {round_}: {len(groups)} LX window groups over the bundle limit "
                     "(no-goods added, repaired solution kept)")
        for ts in groups:
            sm.m.AddBoolOr([sm.res[t].Not() for t in ts])
        sm.m.ClearHints()
        sm.add_hint(d)
    phase["solve"] = time.perf_counter() - t_solve
    _phase(events, "solve", False, f"{status}" + (f", gap {gap_of(obj, bound):.2%}" if obj is not None else ""))
    if best_d is not None:
        # the solve's plan through the same local search (single and chain moves): CP-SAT's
        # LNS leaves moves over whole chains unfound in its budget (llama prefill: the solve
        # put the rotary query chain on L, so the GQA regroup copy moves data; a chain move
        # puts it back on E and the copy is an alias); kept when predicted faster
        t_pol = time.perf_counter()
        pol_d = sm.local_search(best_d, None if deterministic else t_pol + LOCAL_SEARCH_SHARE * max(
            0.0, t0 + limit_s - reserve_s - t_pol), max_passes=3 if deterministic else 50)
        pol_prog, _ = _program_or_none(pg, hw, pol_d)
        pol_ns = predict_program_ns(pol_prog, hw) if pol_prog is not None else float("inf")
        if pol_ns < best_pred:
            notes.append(f"local search after the solve: predicted {best_pred / 1000:.1f} -> {pol_ns / 1000:.1f} us")
            best_d, best_prog, best_pred = pol_d, pol_prog, pol_ns
        phase["local search after the solve"] = time.perf_counter() - t_pol
    deadline = None if deterministic else t0 + limit_s - reserve_s
    # the plan to finish: the best solve, unless it is predicted slower than the hint
    chosen, chosen_ns, gap_ns = None, hint_ns, hint_ns
    if best_prog is not None:
        pred_ns = predict_program_ns(best_prog, hw)
        if pred_ns <= hint_ns:
            chosen, chosen_ns, gap_ns = best_d, pred_ns, obj
        else:
            notes.append(f"cpsat plan predicted {pred_ns / 1000:.1f} us > hint {hint_ns / 1000:.1f} us: "
                         "returning the hint")
    else:
        notes.append(f"no valid cpsat plan (status {status}): returning the hint")
    if chosen is None:
        chosen = replace(hint_d, planner="cpsat", stats={})
    t_finish = time.perf_counter()
    _phase(events, "fusion", True, "fused kernels and LX relayouts")
    chosen, gain_ns = _finish(pg, hw, chosen, notes, deadline, strategies, fuse)
    phase["fusion and relayouts"] = time.perf_counter() - t_finish
    _phase(events, "fusion", False, f"simulated gain {gain_ns / 1000:.4g} us")
    notes.append(_phase_note(phase))
    chosen.stats.update(predicted_us=(chosen_ns - gain_ns) / 1000.0, solver_status=status,
                        objective=None if obj is None else obj / 1000.0,
                        bound=None if bound is None else bound / 1000.0,
                        gap=gap_of(gap_ns, bound) if bound is not None and gap_ns is not None else None,
                        solve_seconds=time.perf_counter() - t0, notes=notes)
    # the fusion search may have moved ops next to each other (sibling matmuls in one
    # kernel); its plan was validated and timed in that order
    chosen.op_order = chosen.op_order or order
    return chosen


# -- progress events (solver.events): only emitted when the caller passes a sink ---------------
_PHASE_T0: dict[tuple[int, str], float] = {}


def _phase(events: Optional[EventSink], name: str, start: bool, detail: str = "") -> None:
    if events is None:
        return
    key = (id(events), name)
    if start:
        _PHASE_T0[key] = time.perf_counter()
        emit(events, lambda: PhaseStarted("cpsat", name, detail))
    else:
        t0 = _PHASE_T0.pop(key, time.perf_counter())
        emit(events, lambda: PhaseFinished("cpsat", name, time.perf_counter() - t0, detail))


class _ProgressCallback(cp_model.CpSolverSolutionCallback):
    """Emits an `Incumbent` for each improving solution and each better proven bound of one
    CP-SAT round (objective and bound in us of the cost model)."""

    def __init__(self, events: EventSink, round_: int, t0: float):
        super().__init__()
        self.events, self.round, self.t0 = events, round_, t0
        self.objective: Optional[float] = None
        self.bound: Optional[float] = None
        self.solutions = 0

    def _emit(self) -> None:
        obj, bound = self.objective, self.bound
        emit(self.events, lambda: Incumbent(
            "cpsat", self.round, time.perf_counter() - self.t0,
            None if obj is None else obj / 1000.0, None if bound is None else bound / 1000.0,
            gap_of(obj, bound), self.solutions))

    def on_solution_callback(self) -> None:
        self.solutions += 1
        self.objective = self.ObjectiveValue()
        bound = self.BestObjectiveBound()
        if self.bound is None or bound > self.bound:
            self.bound = bound
        self._emit()

    def on_bound(self, bound: float) -> None:
        if self.bound is None or bound > self.bound:
            self.bound = bound
            self._emit()


def _phase_note(phase: dict[str, float]) -> str:
    return "time: " + ", ".join(f"{k} {v:.2f} s" for k, v in phase.items())


register("cpsat", plan_cpsat)
