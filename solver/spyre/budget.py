"""The CP-SAT planner's budget table: every time share, limit and search bound of the
pipeline in one place, each with what it trades (`TABLE`, rendered in docs/planner.md).

Code reads a knob as `budget.NAME` at call time (never a copy taken at import), so a test
or a benchmark that sets `budget.NAME` changes what the planner does. Measurements behind a
value are in the comment above it (2-core benchmark machine unless said); when a knob moves,
re-measure what its entry says it trades and update the comment.

Knobs of the fusion search's own steps (tile counts, trial limits of holds and fewer-tiles
passes) live with those steps in `solver.spyre.fusion`: they bound one step's search, not
the planner's time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

# -- the whole plan's budget (`default_budget_s`) ---------------------------------------------
# The wall-clock cap when the caller gives none. It is a cap, not the time a plan takes:
# the budget is `default_budget_s` of the problem's size under it, each CP-SAT round stops
# once its plan is proven within the gap limits, and every phase after it stops when it
# has nothing left to try.
DEFAULT_TIME_LIMIT_S = 10.0
# The budget scales with the problem (`default_budget_s`): with its size, BUDGET_BASE_S +
# BUDGET_PER_STRATEGY_S x the strategies of the built model, and with its stakes, at most
# BUDGET_RUNS runs of the starting plan (a plan predicted at 45 us cannot win more than that
# per run); never under BUDGET_MIN_S, never over the caller's limit. Measured 2026-12-01
# (docs/benchmarks.md "Compile time vs model size"): the layer graphs (500-1100 strategies,
# starting plans 0.8-14 ms in the calibrated timing model) keep improving for most of a 10 s
# solve, and a budget of 6-8.5 s made bert, gpt2 and ViT 2-8% slower, so they get the whole
# default limit (the gap limits still end the decode layers' solves early); the 2-layer toy
# models (1100-1700 strategies, starting plans about 45 us) get the minimum. The stakes term
# depends on the timing model's scale: recheck BUDGET_RUNS when that moves (ViT's 839 us
# start needs >= 12,000 runs for the whole 10 s).
BUDGET_BASE_S = 1.0
BUDGET_PER_STRATEGY_S = 0.02
BUDGET_RUNS = 20_000
BUDGET_MIN_S = 1.0

# -- the CP-SAT solve (`solver.spyre.solve`) --------------------------------------------------
# A CP-SAT round stops once objective - bound <= max(RELATIVE_GAP_LIMIT x objective,
# ABSOLUTE_GAP_LIMIT) (objective units: ns; 32 ns is one op's whole idle-core tie-break).
# CP-SAT reports such a stop as OPTIMAL; the plan's `gap` says what was left.
RELATIVE_GAP_LIMIT = 0.005
ABSOLUTE_GAP_LIMIT = 32.0
# Deterministic mode stops on CP-SAT's deterministic clock; on the 2-core benchmark machine
# one wall second of a 2-worker solve is about this many deterministic units (measured).
DETERMINISTIC_PER_SECOND = 0.15
# Deterministic mode: nothing measured may shape the solve, so the wall limit is only a
# safety net at this many times the caller's limit. At 3x it shaped plans on a loaded
# machine (2026-12-05, 2 cores at load 12: llama31_8b_prefill512's draws stopped at 30 s
# wall after 0.45-0.57 of their 0.75 deterministic units, so seed 1's plan changed with
# the load); a round the net stops says so in its note.
DETERMINISTIC_WALL_FACTOR = 10.0
# Deterministic mode: the plan a solve stops at depends on CP-SAT's seed (unproven, or one
# of tied optima), and the fusion search turns those plans into programs far apart
# (llama31_8b_prefill512, 10 s, 2026-12-05: seeds 1-8 fused to 4188-4977 us, 18.8%; the
# 62-op Llama block's proven optimum fused to 4488.3 us, the best of four seeds' optima to
# 4144.6; neither the objective nor the tile-class price ranks them as fused). So up to
# DETERMINISTIC_DRAWS draws (another seed each, the same model and start, each its own
# solve, local search and post-solve steps) run and the fastest program is kept: the best
# of four draws of those eight seeds was 4188.3 and 4229.7 us (1.0%). Each draw costs a
# solve and a fusion search: the deterministic wall grows about that many times, so a plan
# gets one draw per DETERMINISTIC_DRAW_S seconds of its budget (counts only: the budget is a
# function of the model's size), four at the default 10 s limit, one below 5 s.
DETERMINISTIC_DRAWS = 4
DETERMINISTIC_DRAW_S = 2.5
# A second, lexicographic objective (`model.add_tie_break`): this many ns per halving of an
# op's output stick dim by its core split, so tied splits (a matmul's m8 x n4 and m4 x n8)
# resolve the same way in every seed's solve, rows first. 0: off.
STICK_SPLIT_TIE_NS = 1
# Solve rounds (the first, then repair rounds after lazy bundle no-goods): the first round
# gets FIRST_ROUND_SHARE of what is left (the last round all of it), a round never less than
# MIN_ROUND_S, and no repair round starts (wall clock) with less than MIN_ROUND_SHARE of the
# budget left.
MAX_ROUNDS = 4
FIRST_ROUND_SHARE = 0.7
MIN_ROUND_S = 0.3
MIN_ROUND_SHARE = 0.05

# -- the start and the local search (`solver.spyre.start`, `solver.spyre.local_search`) -----
# Rounds of dropping the LX residencies the validator names before a hint loses them all.
HINT_REPAIR_ROUNDS = 3
# Shares of the budget: the local search that sharpens the hint (of what is left after the
# model build; it stops sooner when no single move improves) and the fusion search after
# the solve (at least). Measured 2026-11-29 (10 s): local search 0.05 instead of 0.15 gave
# slower plans on 3 of 4 layer graphs; fusion 0.4 instead of 0.3 ran out of time less often
# but, over four runs each of llama and granite prefill, gave slower plans (geomean
# 7393/7359 us against 6992/6918: the solve rounds get too little time).
LOCAL_SEARCH_SHARE = 0.15
# Passes of the local search: its bound in deterministic mode (no wall clock), and its cap
# in wall-clock mode (where the deadline usually stops it first).
DETERMINISTIC_LOCAL_SEARCH_PASSES = 3
LOCAL_SEARCH_MAX_PASSES = 50
# Chain moves (solver.spyre.chain_moves) in the local search that sharpens the hint; the
# local search after the solve always has them. Measured 2026-12-01 (deterministic layer
# suite, docs/solver.md "The model"): the final plans with them in the start and without
# differ only where CP-SAT's search from the other hint ends elsewhere: bert 391.6 (with)
# vs 389.9 us (without) at b748c48 and 359.6 vs 346.0 us at 48cb05f, granite decode
# 2896.8 vs 2897.6 us at both; the other seven layer graphs identical.
START_CHAIN_MOVES = True

# -- what is kept back from the solve for the steps after it (`solver.spyre.single`) ---------
# Time to keep once the solver stops: emitting and validating the result, and planners.plan()
# emitting and validating it once more before it returns: EMIT_RESERVE_FACTOR emits +
# validations (measured on the starting plan) plus FINISH_RESERVE_SHARE of the budget (a
# fused plan with tile buffers emits and validates slower than the hint).
EMIT_RESERVE_FACTOR = 2.5
FINISH_RESERVE_SHARE = 0.03
# A plan transferred from another size of the graph (solver.spyre.transfer) is kept when it
# stands against the heuristic baseline's plan of its size about as well as its source did
# against the baseline's plan of the source's size: simulated / baseline at most
# TRANSFER_RATIO_GROWTH times the source's; a worse one is solved instead (from the
# transferred plan as hint).
TRANSFER_RATIO_GROWTH = 1.05
# The fusion search after the solve (solver.spyre.fusion): one trial per split variant and per
# further tile count, the final one and the resplit after it, each about FUSION_TRIAL_EMITS
# times an emit + validation (two emits, a validation or two for the tile buffers, a
# simulation; measured on the layer graphs), and at least FUSION_SHARE of the budget: fusion
# gains more than the solver's last seconds do (layer graphs: 10-20% vs a few %). Reserved
# for the first search (the plan as solved) and capped at FUSION_MAX_SHARE, so a slow emit on
# a loaded machine cannot starve the solve; the second search (matmuls re-split for tiling)
# runs in whatever time is left.
FUSION_TRIAL_EMITS = 4
FUSION_SHARE = 0.3
FUSION_MAX_SHARE = 0.5
# On: the CP-SAT objective prices each matmul strategy the fusion search can K-tile at the
# least of its untiled and K-tiled times (`solver.spyre.fusion.prices`: its tile class), so
# the solve ranks a matmul's splits as the fused program runs them. Off by default: on the
# layer graphs (2026-12-05, judge 551c359, deterministic seed 1) it made gpt2 358.2 -> 458.6
# us and ViT 396.2 -> 456.5 and did not narrow the prefill layers' seed spread (llama seeds
# 1-4 off: 4339.4-4967.0 us; granite on: 4181.4-5091.1); docs/solver.md "Tile classes".
TILE_CLASSES = False
# On: an intermediate a pointwise/reduce/matmul op hands to pointwise/reduce readers inside
# one consecutive run of such ops (a fused kernel of the search) may be "held" in the model
# at one tile's LX (its per-core box / HANDOFF_TILES, the search's middle tile count), on
# one core count, so the objective prices the chain's on-chip reads as the fused kernel runs
# them; the read-back keeps it whole only where it fits (`SpyreModel.lx_bytes`). Off by
# default: on the judge of 1f6d2d1 (2026-12-05, deterministic, prefill seeds 1-4), with
# TILE_CLASSES, it brought the objective of the plan handed to fusion from 1.75-2.3x to
# 1.2-1.3x the fused time, but the fused plans were no faster (llama prefill mean 4644.5 ->
# 4748.6 us, granite 4418.9 -> 4397.2) and bert, gpt2 and ViT slower at seed 1 (338.6 ->
# 378.1, 333.4 -> 346.2, 262.6 -> 376.9); alone (28a3e76) slower on the prefill layers too;
# docs/results/solver-history.md "Fusion-aware objective".
FUSED_HANDOFFS = False
HANDOFF_TILES = 8

# -- the post-solve steps (`solver.spyre.steps`) ----------------------------------------------
# Of the time left when fusion starts, the share kept for the split-K step after it when the
# graph has candidates (`split_k_hold.split_k_candidates`): at a 10 s limit the fusion search
# ran to the deadline on mistral prefill and the step (about 2 s there, worth 58-232 us on the
# prefill layers) never ran (2026-12-01).
SPLIT_K_SHARE = 0.3
# Of the time left after the split-K step, the share `hold_in_lx` may use before the last
# fewer-tiles pass (a 10 s layers run on a machine 1.6x slower than usual, 2026-12-02: the
# hold took all of it, granite prefill 4356.2 us with no fewer-tiles pass).
HOLD_AFTER_SPLIT_K_SHARE = 0.5
# Trials of the last fewer-tiles pass (two per kernel): llama prefill at 10 s, the plan after
# the split-K step: 8 trials 3905.6 -> 3903.1 us, 16 -> 3846.1, 40 -> 3831.6 (1.2 s).
FINAL_RETILE_TRIALS = 40
# A step that re-times the whole plan a few times starts only when the time left covers this
# many emit + validate + time trials of the current plan.
STEP_MIN_TRIALS = 3

# -- the depth step (`solver.spyre.depth`) -----------------------------------------------------
# A block shorter than this is not worth a representative solve (the seams would dominate).
MIN_BLOCK_OPS = 8
# How many candidate periods `find_repeats` checks (the most frequent distances first).
MAX_PERIODS = 256
# The repeated path is taken when the copies cover at least this share of the graph's ops
# and there are at least MIN_COPIES of them (two copies are one model twice a layer's size:
# the whole-graph solve handles that, and sees the one seam).
MIN_COVERAGE = 0.5
MIN_COPIES = 3
# Graphs without a repeated block and more ops than this are planned in windows.
WINDOWS_ABOVE_OPS = 300
# What follows the solves scales with the whole graph: emitting, validating and simulating
# the composed plan, and `planners.plan()` emitting, validating and bounding it once more.
# In deterministic mode the reserve for it comes from counts only: RESERVE_BASE_S +
# RESERVE_S_PER_OP per op. In wall-clock mode it follows this machine's speed right now:
# the whole graph's hint is emitted and simulated first (its time is needed anyway), and
# what follows the solves is about RESERVE_POST_FACTOR times that (two emits, two
# validations, one simulation and the lower bound of a program of the same size; measured
# 2026-12-01 on the 32-layer Llama, 1995 ops, 2 shared cores: hint emit + simulate 0.6 s,
# what followed 3.1 s at load 1; 1.4 s and 4.3-5.0 s at load 2.5), never below
# RESERVE_FLOOR_S_PER_OP per op.
RESERVE_S_PER_OP = 0.002
RESERVE_FLOOR_S_PER_OP = 0.001
RESERVE_POST_FACTOR = 5.0
RESERVE_BASE_S = 0.3
# Of what is left for solving, what does not repeat gets its share of the op decisions the
# solves make (the representative decides `copies` times its ops), at most 1 -
# REPRESENTATIVE_SHARE; a share below MIN_WINDOW_S goes to the representative. (By ops
# alone, 26 + 19 ops around 31 copies of 62 took 35% of the time for 2% of the decisions:
# the 32-layer Llama at 10 s gave its prologue a 1.5 s solve and the copy 3.6 s.)
REPRESENTATIVE_SHARE = 0.65
# In wall-clock mode the representative's CP-SAT pipeline is given this share of its
# seconds (windows get SEGMENT_LIMIT_SHARE): it stops its fusion search at its own deadline,
# and what follows it is in the reserve above.
REPRESENTATIVE_LIMIT_SHARE = 0.95
# The representative decides `copies` times its ops, and the fusion search's result varies
# with the CP-SAT optimum it starts from (deterministic, 62-op Llama block, 4 s each: seeds
# 1-4 gave 4282.5, 4737.1, 4576.6, 4704.5 us): while its share lasts it is solved again
# with another seed, up to REPRESENTATIVE_MAX_DRAWS times, and the fastest is kept. Wall
# clock: another draw when what is left is at least REPRESENTATIVE_DRAW_FACTOR times the
# mean draw so far (there, with three draws at 30 s, 138.7 -> 133.6 ms, 2026-12-01);
# deterministic: the representative's pipeline makes its draws as for a graph of its own
# (DETERMINISTIC_DRAWS, DETERMINISTIC_DRAW_S), so a copy is drawn as often as the one-layer
# plan it is compared with.
REPRESENTATIVE_MAX_DRAWS = 4
REPRESENTATIVE_DRAW_FACTOR = 1.2
# The hybrid (segments the hint runs faster take its decisions) is tried only when those
# segments add up to this share of the composed plan's time.
HYBRID_MIN_GAIN = 0.002
# Windows along the op order: at most WINDOW_OPS ops each, consecutive windows overlapping by
# OVERLAP_OPS (an op in the overlap is decided by the later window, which sees what it feeds).
WINDOW_OPS = 120
OVERLAP_OPS = 16
# In wall-clock mode a window's CP-SAT pipeline gets this share of the window's seconds:
# the pipeline overruns a short limit (its model build and the checks after its deadline:
# 5-15% at 10 s, up to 60% at 3 s on a loaded 2-core machine).
SEGMENT_LIMIT_SHARE = 0.8
# Below this many seconds a window is not worth a CP-SAT solve (hint, strategies, local
# search and fusion alone take about that on a 50-op window): its heuristic plan is kept.
MIN_WINDOW_S = 1.5
# A graph planned in windows: the first pass over its windows gets WINDOWED_FIRST_SHARE of
# the time left, the large-neighbourhood search over the whole plan WINDOWED_LNS_SHARE.
WINDOWED_FIRST_SHARE = 0.6
WINDOWED_LNS_SHARE = 0.4


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


@dataclass(frozen=True)
class Knob:
    """One entry of the table: the constant's name, where it acts, and what it trades."""

    name: str
    acts_in: str
    trades: str


TABLE: tuple[Knob, ...] = (
    Knob("TRANSFER_RATIO_GROWTH", "cpsat_planner._transferred",
         "how much worse than its source, against the baseline heuristic's plan, a transferred plan may be "
         "before the planner solves instead: compile time of a new shape against its plan's quality"),
    Knob("DEFAULT_TIME_LIMIT_S", "budget.default_budget_s",
         "the cap when the caller gives no limit: plan quality of large graphs against compile latency"),
    Knob("BUDGET_BASE_S", "budget.default_budget_s",
         "the fixed part of a plan's budget: small graphs' plan quality against their compile time"),
    Knob("BUDGET_PER_STRATEGY_S", "budget.default_budget_s",
         "budget per strategy of the model: large models' plan quality against compile time"),
    Knob("BUDGET_RUNS", "budget.default_budget_s",
         "caps the budget at this many runs of the starting plan: compile time against the runtime it can win"),
    Knob("BUDGET_MIN_S", "budget.default_budget_s",
         "the least budget: a floor under fast plans' search against their compile time"),
    Knob("RELATIVE_GAP_LIMIT", "solve.solve_rounds",
         "a round stops once proven within this share of optimal: solve time against the last fraction of cost"),
    Knob("ABSOLUTE_GAP_LIMIT", "solve.solve_rounds",
         "the same in ns (one op's tie-break): solve time on tiny graphs against ties"),
    Knob("DETERMINISTIC_PER_SECOND", "solve.solve_rounds",
         "deterministic units per wall second: a deterministic solve's length against its quality"),
    Knob("DETERMINISTIC_DRAWS", "single.draw_count",
         "deterministic draws (seeds) while a solve finds a plan, the fastest program kept: stability against wall"),
    Knob("DETERMINISTIC_DRAW_S", "single.draw_count",
         "budget seconds per deterministic draw: more draws against the deterministic wall"),
    Knob("STICK_SPLIT_TIE_NS", "model.add_tie_break",
         "ns per halving of an op's stick dim in the objective: tied splits resolved alike in every seed's solve "
         "(rows before sticks) against overriding differences of a few ns"),
    Knob("DETERMINISTIC_WALL_FACTOR", "solve.solve_rounds",
         "wall safety net of a deterministic solve (x the limit): never shapes a plan, only caps a runaway"),
    Knob("MAX_ROUNDS", "solve.solve_rounds",
         "solve rounds after lazy bundle no-goods: a valid plan with more LX residencies against solve time"),
    Knob("FIRST_ROUND_SHARE", "solve.solve_rounds",
         "the first round's share of the solve time: its quality against time for repair rounds"),
    Knob("MIN_ROUND_S", "solve.solve_rounds", "the shortest round: a round that can find anything against overrun"),
    Knob("MIN_ROUND_SHARE", "solve.solve_rounds",
         "no repair round below this share left (wall clock): another round against overrunning the budget"),
    Knob("HINT_REPAIR_ROUNDS", "start.hint_repaired",
         "rounds of dropping named residencies of a hint: keeping more of a stored plan against emit time"),
    Knob("LOCAL_SEARCH_SHARE", "single.plan_chain_ordered",
         "share of the budget for sharpening the hint (and polishing the solve): a better start against solve time"),
    Knob("DETERMINISTIC_LOCAL_SEARCH_PASSES", "single.plan_chain_ordered",
         "passes of a deterministic local search: a better start against time"),
    Knob("LOCAL_SEARCH_MAX_PASSES", "single.plan_chain_ordered", "cap on wall-clock local search passes"),
    Knob("START_CHAIN_MOVES", "single.plan_chain_ordered",
         "chain moves in the start's local search: another start for CP-SAT (neither wins everywhere)"),
    Knob("EMIT_RESERVE_FACTOR", "single.plan_chain_ordered",
         "emits kept after the solve for checking and returning the plan: overrun against solve time"),
    Knob("FINISH_RESERVE_SHARE", "single.plan_chain_ordered",
         "share of the budget kept for a slower final emit: overrun against solve time"),
    Knob("FUSION_TRIAL_EMITS", "single.plan_chain_ordered",
         "emits per fusion trial in the fusion reserve: fusion finishing against solve time"),
    Knob("FUSION_SHARE", "single.plan_chain_ordered",
         "least share of the budget kept for the post-solve steps: fusion gains against solve gains"),
    Knob("FUSION_MAX_SHARE", "single.plan_chain_ordered",
         "most share kept for the post-solve steps: a slow machine's emits cannot starve the solve"),
    Knob("TILE_CLASSES", "model.build_model",
         "matmuls priced at their K-tiled time in the objective: the solve's ranking matches the fused program's, against pricing time"),
    Knob("FUSED_HANDOFFS", "model.SpyreModel",
         "chains priced with their members' results handed on chip (a fused kernel's tile buffers): the objective nearer the fused program's time, against a model that may hold what fusion does not form (measured: no faster plans)"),
    Knob("HANDOFF_TILES", "model.SpyreModel.lx_bytes",
         "tiles a fused hand-off's LX is charged at: more hand-offs fit the model against over-promising LX"),
    Knob("SPLIT_K_SHARE", "steps.FusionSearch",
         "time left kept for the split-K step when it applies: split-K gains against fusion search"),
    Knob("HOLD_AFTER_SPLIT_K_SHARE", "steps.HoldAfterSplitK",
         "share of the time left the hold after split-K may use: holds against the last fewer-tiles pass"),
    Knob("FINAL_RETILE_TRIALS", "steps.FewerTiles",
         "trials of the last fewer-tiles pass: underfilling kernels repaired against time"),
    Knob("STEP_MIN_TRIALS", "steps (runner gate)",
         "whole-plan trials the time left must cover before a re-timing step starts: trying against overrun"),
    Knob("MIN_BLOCK_OPS", "depth.blocks.find_repeats",
         "shortest repeated block: reuse of a solve against seams dominating"),
    Knob("MAX_PERIODS", "depth.blocks.find_repeats", "candidate periods checked: finding a block against scan time"),
    Knob("MIN_COVERAGE", "depth.step.plan_whole",
         "share of ops the copies must cover: a smaller model against the hint's plan for the rest"),
    Knob("MIN_COPIES", "depth.step.plan_whole",
         "fewest copies for the repeated path: one model per block against one whole-graph model"),
    Knob("WINDOWS_ABOVE_OPS", "depth.step.plan_whole",
         "graphs above this many ops are planned in windows: bounded model size against seams"),
    Knob("RESERVE_S_PER_OP", "depth.repeats.reserve_s",
         "deterministic reserve per op for composing and checking: overrun against solve time"),
    Knob("RESERVE_FLOOR_S_PER_OP", "depth.repeats.reserve_s", "least wall-clock reserve per op"),
    Knob("RESERVE_POST_FACTOR", "depth.repeats.reserve_s",
         "wall-clock reserve as multiples of the hint's emit + simulate: overrun against solve time"),
    Knob("RESERVE_BASE_S", "depth.repeats.reserve_s", "fixed part of the depth step's reserve"),
    Knob("REPRESENTATIVE_SHARE", "depth.repeats.plan_depth",
         "least share of the solve time for the repeated block: its quality against the prologue/epilogue's"),
    Knob("REPRESENTATIVE_LIMIT_SHARE", "depth.repeats.plan_depth",
         "share of its seconds the representative's pipeline is given (wall clock): its quality against overrun"),
    Knob("REPRESENTATIVE_MAX_DRAWS", "depth.repeats.plan_depth",
         "most CP-SAT seeds tried for the block (wall clock): a luckier optimum against time per draw"),
    Knob("REPRESENTATIVE_DRAW_FACTOR", "depth.repeats.plan_depth",
         "another draw when this many mean draws are left (wall clock): more draws against overrun"),
    Knob("HYBRID_MIN_GAIN", "depth.repeats.hybrid",
         "least share the hint's faster segments must win before a whole-graph check: gain against check time"),
    Knob("WINDOW_OPS", "depth.windows.plan_windows", "ops per window: model size and time against seams"),
    Knob("OVERLAP_OPS", "depth.windows.plan_windows",
         "ops two windows share: seam quality against solving ops twice"),
    Knob("SEGMENT_LIMIT_SHARE", "depth.segments.solve_segment",
         "share of its seconds a window's pipeline is given (wall clock): quality against overrun"),
    Knob("MIN_WINDOW_S", "depth.segments.solve_segment",
         "below this a segment keeps its heuristic plan: a solve against its fixed overhead"),
    Knob("WINDOWED_FIRST_SHARE", "depth.windows.plan_windowed",
         "share of a windowed plan's time for the first pass: a complete plan against its LNS"),
    Knob("WINDOWED_LNS_SHARE", "depth.windows.plan_windowed",
         "share for the LNS over window boundaries: seam repair against the first pass"),
)
