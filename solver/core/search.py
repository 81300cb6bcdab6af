"""Anytime search for strategy problems (the IOPDDL contest winners' recipe, in the core):

- presolve (forbidden and dominated strategies), then node merging (`solver.core.merge`):
  followers (a node whose choice is a function of a neighbour's) collapse into groups,
  single-strategy nodes fold into their neighbours' costs; everything below works on groups
  and memory stays exact (each member keeps its live interval: a group's usage is piecewise
  constant over its segments on the compressed timeline);
- starts: every group on its least-peak strategy (feasibility first), and min-sum message
  passing (`solver.core.minsum`) under Lagrangian usage penalties per compressed step (several
  trajectories: step sizes, sweep orders); each decode repaired (cheapest cost increase per
  unit of usage saved at the worst step) and descended; the best few trajectories' starts
  are polished by kicks and the search restarts from the next one when it stagnates;
- local search: single-group moves (a group move is a chain move of all its members) with
  incremental cost and memory deltas and a journal to undo, best-improvement descent, and
  kicks (ejection chains: a group to a cheap or random strategy, its neighbours to their
  best responses, memory repaired, kept when no worse; record-to-record travel);
- large-neighbourhood search, two kinds of windows: CP-SAT on a ball of the group graph
  with every group outside fixed (fixed neighbours become costs, fixed usage a per-step
  budget, one memory row per distinct live signature of the window that can bind, tables
  over their distinct rows and columns; the window is capped by the pair terms inside it, a
  cap that adapts to how fast windows solve), and min-sum on a ball with the rest fixed
  (usage priced by the Lagrangian penalties, then repaired); kicks and both windows are
  chosen by their recent gain per second; a result is kept only when no worse;
- the full grouped model (the CP-SAT window builder with every group in the window) hinted
  with the best choice gets the last 80% of the budget when it is small enough (B, G).

`optimize(problem, time_limit_s, started=..., start=...)` runs them on the caller's clock
(`solver.core.clock.PhaseClock`: from `started`, so reading the instance counts): it holds
an answer from the first second (a greedy least-usage choice, or the caller's feasible
start), offers it every state it accepts, and when the deadline passes in any phase answers
with the best one held, evaluated once on the original problem; `stats["phases"]` is the
phase table. On instances over 5,000 nodes min-sum gets half the search's time, one sweep
per round, and repairs even decodes far over the limit (docs/iopddl.md).
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
from ortools.sat.python import cp_model

from solver.core.clock import OutOfTime, PhaseClock
from solver.core.group_state import INF, GroupState, ball, costly_group, shared_tables
from solver.core.kicks import kick_search
from solver.core.merge import GroupedProblem, group_problem
from solver.core.minsum import bfs_order, lagrangian_starts
from solver.core.reduction import Reduction, presolve
from solver.core.problem import FORBIDDEN_COST, StrategyProblem, evaluate
from solver.core.starts import forest_min_sum, local_search, tree_dp_start
from solver.core.windows import minsum_window_search, window_model


def least_peak_start(gp: GroupedProblem) -> list[int]:
    """Each group on the strategy with the lowest usage over its segments (then the
    cheapest): if this exceeds the limit everywhere a node is alone, nothing fits."""
    out = []
    for g in range(gp.num_groups):
        W, c = gp.W[g], gp.cost[g]
        peak = W.max(axis=0) if len(W) else np.zeros(len(c), np.int64)
        tot = W.sum(axis=0) if len(W) else np.zeros(len(c), np.int64)
        order = np.lexsort((c, tot, peak))
        out.append(int(order[0]))
    return out


def group_tree_dp(gp: GroupedProblem) -> list[int]:
    """Optimal on a maximum spanning forest of the group graph (edges ranked by the spread
    of their finite entries), memory ignored."""
    G = gp.num_groups
    weight = []
    for e, t in enumerate(gp.tables):
        fin = t[t < FORBIDDEN_COST]
        weight.append((float(fin.max() - fin.min()) if fin.size else float(FORBIDDEN_COST), e))
    def table(e: int) -> np.ndarray:
        t = gp.tables[e].astype(np.float64)
        t[gp.tables[e] >= FORBIDDEN_COST] = INF
        return t

    def node_cost(x: int) -> np.ndarray:
        c = gp.cost[x].astype(np.float64)
        c[gp.cost[x] >= FORBIDDEN_COST] = INF
        return c
    return forest_min_sum(G, weight, lambda e: gp.edges[e], table, node_cost)


@dataclass
class SearchResult:
    choice: Optional[list[int]]
    cost: Optional[int]
    feasible: bool
    bound: Optional[float]
    seconds: float
    stats: dict = field(default_factory=dict)


def trivial_bound(problem: StrategyProblem, red: Reduction, deadline: Optional[float] = None) -> int:
    """Sum of each node's and each edge's cheapest kept entry: a valid lower bound (past
    `deadline`, the rest of the edges count their cheapest entry, kept or not: still valid)."""
    b = sum(int(problem.node_costs[x][a].min()) for x, a in enumerate(red.alive))
    for e, ((u, v), t) in enumerate(zip(problem.edges, problem.edge_costs)):
        full = len(red.alive[u]) == t.shape[0] and len(red.alive[v]) == t.shape[1]
        if full or (deadline is not None and time.perf_counter() > deadline):
            b += int(t.min())
        else:
            b += int(t[np.ix_(red.alive[u], red.alive[v])].min())
    return b


def least_usage_choice(problem: StrategyProblem) -> list[int]:
    """Greedy in node order (producers first in graph-derived instances): each node takes
    its least-usage strategy (then the cheapest) among those no edge to an already placed
    neighbour forbids. The answer the search holds before presolve; O(nodes + edges)."""
    incident: list[list[tuple[int, bool]]] = [[] for _ in range(problem.num_nodes)]
    for e, (u, v) in enumerate(problem.edges):
        incident[u].append((e, True))
        incident[v].append((e, False))
    out = [-1] * problem.num_nodes
    for n, (c, u) in enumerate(zip(problem.node_costs, problem.node_usages)):
        ok = c < FORBIDDEN_COST
        for e, is_u in incident[n]:
            a, b = problem.edges[e]
            other = out[b] if is_u else out[a]
            if other >= 0:
                t = problem.edge_costs[e]
                allowed = (t[:, other] if is_u else t[other, :]) < FORBIDDEN_COST
                if (ok & allowed).any():
                    ok &= allowed
        idx = np.flatnonzero(ok) if ok.any() else np.arange(len(c))
        out[n] = int(idx[np.lexsort((c[idx], u[idx]))[0]])
    # two placed neighbours may leave a node nothing both allow: re-choose the ends of each
    # forbidden pair against all their neighbours (a few passes)
    for _ in range(3):
        bad = [e for e, ((a, b), t) in enumerate(zip(problem.edges, problem.edge_costs))
               if t[out[a], out[b]] >= FORBIDDEN_COST]
        if not bad:
            break
        for e in bad:
            for n in problem.edges[e][::-1]:
                c, u = problem.node_costs[n], problem.node_usages[n]
                ok = c < FORBIDDEN_COST
                for f, is_u in incident[n]:
                    a, b = problem.edges[f]
                    t = problem.edge_costs[f]
                    ok &= (t[:, out[b]] if is_u else t[out[a], :]) < FORBIDDEN_COST
                if ok.any():
                    idx = np.flatnonzero(ok)
                    out[n] = int(idx[np.lexsort((c[idx], u[idx]))[0]])
                    break
    def n_forbidden(ch: list[int]) -> int:
        return sum(int(t[ch[a], ch[b]] >= FORBIDDEN_COST) for (a, b), t in zip(problem.edges, problem.edge_costs))

    bad_ends = [n for (a, b), t in zip(problem.edges, problem.edge_costs)
                if t[out[a], out[b]] >= FORBIDDEN_COST for n in (b, a)]
    if bad_ends:
        tried = list(out)
        _min_conflicts(problem, incident, tried, bad_ends)
        if n_forbidden(tried) < len(bad_ends) // 2:  # kept only when it leaves fewer forbidden pairs
            out = tried
    return out


def _min_conflicts(problem: StrategyProblem, incident: list[list[tuple[int, bool]]], out: list[int],
                   todo: list[int], max_steps_per_node: int = 50) -> None:
    """Forbidden pairs the re-choosing left (a node both of whose choices some neighbour
    forbids, e.g. one forced by a single-strategy neighbour and one by the greedy choice of
    another): each node taken from `todo` moves to the strategy with the fewest forbidden
    pairs, a pair with a neighbour that has one allowed strategy counting as never fixable
    (then another strategy than its current one, the least usage, the cheapest), and the
    neighbours it now clashes with are taken next. A 65k-node synthetic instance kept one such pair: no answer when reading took the
    whole limit. Bounded: `max_steps_per_node` x the nodes given."""
    fixed = [int((c < FORBIDDEN_COST).sum()) <= 1 for c in problem.node_costs]
    queue = list(todo)
    steps = 0
    while queue and steps < max_steps_per_node * len(todo):
        n = queue.pop(0)
        steps += 1
        c, u = problem.node_costs[n], problem.node_usages[n]
        clash = np.where(c < FORBIDDEN_COST, 0.0, np.inf)
        for f, is_u in incident[n]:
            a, b = problem.edges[f]
            o = b if is_u else a
            if o == n:
                continue
            t = problem.edge_costs[f]
            bad = (t[:, out[b]] if is_u else t[out[a], :]) >= FORBIDDEN_COST
            clash = clash + bad * (1e6 if fixed[o] else 1.0)
        if clash[out[n]] == 0:
            continue
        # among the fewest forbidden pairs, another strategy than the current one (a node
        # that stays passes its clash on to nobody), then the least usage, the cheapest
        cands = np.flatnonzero(clash == clash.min())
        if len(cands) > 1:
            cands = cands[cands != out[n]]
        out[n] = int(cands[np.lexsort((c[cands], u[cands]))[0]])
        for f, is_u in incident[n]:
            a, b = problem.edges[f]
            o = b if is_u else a
            if o != n and problem.edge_costs[f][out[a], out[b]] >= FORBIDDEN_COST and not fixed[o]:
                queue.append(o)


class _Incumbent:
    """The best feasible solution so far, as a group choice of a grouped problem or as an
    original choice; what the search answers with when its time is up."""

    def __init__(self) -> None:
        self.cost: Optional[float] = None
        self._gp: Optional[GroupedProblem] = None
        self._choice: Optional[list[int]] = None

    def offer(self, cost: float, choice: Sequence[int], gp: Optional[GroupedProblem] = None) -> bool:
        if self.cost is not None and cost >= self.cost:
            return False
        self.cost, self._gp, self._choice = cost, gp, [int(x) for x in choice]
        return True

    def choice(self) -> Optional[list[int]]:
        if self._choice is None:
            return None
        return self._gp.expand(self._choice) if self._gp is not None else list(self._choice)


def optimize(problem: StrategyProblem, time_limit_s: float = 60.0, workers: int = 2, seed: int = 1,
             log: Optional[Callable[[str], None]] = None, window: int = 120,
             pair_limit: int = 4096, solve_cap: float = 1.0, full_share: float = 0.8,
             full_pair_limit: int = 400_000, time_share: float = 0.3,
             window_terms: int = 20_000, merge: bool = True, kick_share: float = 0.6,
             kick_batch: float = 2.0, kick_slack: float = 0.01,
             lagrangian_share: float = 0.25, polish_starts: int = 3,
             lagrangian_share_large: float = 0.5, step_patience: int = 5, polish_share: float = 0.15, stagnation: float = 0.12,
             started: Optional[float] = None, start: Optional[Sequence[int]] = None) -> SearchResult:
    """Best feasible choice found within `time_limit_s` of wall clock counted from `started`
    (perf_counter seconds; default now): a caller that read the instance passes the time it
    started, so reading counts too. The answer is the best solution held when the time is
    up, whichever phase was running; `stats["phases"]` says where the time went. `start`: a
    complete choice to begin from; the answer is never worse than it when it is feasible."""
    clock = PhaseClock(time_limit_s, started if started is not None else time.perf_counter())
    if started is not None:
        clock.record("before the search (start-up, reading)", time.perf_counter() - started)
    say = log or (lambda s: None)
    incumbent = _Incumbent()
    stats: dict = {}
    # the answer held before anything else: every node on its least usage
    with clock.phase("least-usage start"):
        safe = least_usage_choice(problem)
        t_e = time.perf_counter()
        ev = evaluate(problem, safe)
        t_eval = time.perf_counter() - t_e
        if ev.feasible:
            incumbent.offer(ev.cost, safe)
        given = None
        if start is not None:
            ev = evaluate(problem, start)
            if ev.feasible:
                given = [int(x) for x in start]
                incumbent.offer(ev.cost, given)
    # kept free at the end: expanding and evaluating the answer, and the caller's own
    # evaluation of it (about one evaluation each), plus 1% of the limit
    clock.reserve_s = min(0.1 * time_limit_s, 0.01 * time_limit_s + 3 * t_eval + 0.05)
    bound = None
    try:
        bound = _search(problem, clock, incumbent, stats, say, workers=workers, seed=seed,
                        window=window, pair_limit=pair_limit, solve_cap=solve_cap,
                        full_share=full_share, full_pair_limit=full_pair_limit,
                        time_share=time_share, window_terms=window_terms, merge=merge,
                        kick_batch=kick_batch, kick_slack=kick_slack,
                        lagrangian_share=lagrangian_share, polish_starts=polish_starts,
                        lagrangian_share_large=lagrangian_share_large, step_patience=step_patience,
                        polish_share=polish_share, stagnation=stagnation, start=given)
    except OutOfTime:
        stats["out_of_time"] = True
        say("out of time: answering with the best solution held")
    with clock.phase("final check"):
        choice = incumbent.choice()
        ev = evaluate(problem, choice) if choice is not None else None
    if ev is not None and not ev.feasible:  # never: every accepted state kept memory
        raise AssertionError(f"the search's answer is infeasible: {ev.reason}")
    if ev is not None and ev.cost != incumbent.cost:
        stats["counted_cost"] = incumbent.cost  # running float sums drifted (never seen)
    stats["phases"] = clock.table()
    if ev is None:
        return SearchResult(None, None, False, bound, clock.elapsed(), stats)
    return SearchResult(choice, ev.cost, ev.feasible, bound, clock.elapsed(), stats)


def _search(problem: StrategyProblem, clock: PhaseClock, incumbent: _Incumbent, stats: dict,
            say: Callable[[str], None], *, workers: int, seed: int, window: int, pair_limit: int,
            solve_cap: float, full_share: float, full_pair_limit: int, time_share: float,
            window_terms: int, merge: bool, kick_batch: float, kick_slack: float,
            lagrangian_share: float, polish_starts: int, polish_share: float,
            lagrangian_share_large: float, step_patience: int,
            stagnation: float, start: Optional[list[int]]) -> Optional[float]:
    """The phases of `optimize`; every solution it accepts is offered to `incumbent`.
    Returns the lower bound (None when the time ran out before it)."""
    deadline = clock.deadline
    t_start = clock.started
    rng = random.Random(seed)
    big = problem.num_nodes > 5000
    with clock.phase("presolve"):
        red = presolve(problem, prune_dominated=not big, max_rounds=6 if not big else 1, deadline=deadline)
    with clock.phase("merge"):
        gp = group_problem(problem, red, merge_followers=merge, deadline=deadline)
    say(f"presolve {time.perf_counter() - t_start:.1f}s, {red.num_strategies} strategies kept, "
        f"{gp.num_groups} groups ({gp.merged_followers} followers merged, {gp.folded_single} edges folded)")
    with clock.phase("state tables"):
        shared_tables(gp, deadline)
    stats.update(presolve_s=round(time.perf_counter() - t_start, 2), strategies_kept=red.num_strategies,
                 groups=gp.num_groups, group_edges=len(gp.edges))
    # the search's shares are of the time left after reading and presolve (on the largest
    # instances those take a third of the limit and more)
    time_limit_s = max(0.0, clock.left())
    best_state, best_cost = None, None
    best_penalty: Optional[np.ndarray] = None  # the Lagrangian penalties of the best start
    n_starts = 0

    def consider(name: str, ch: list[int], budget: float, done: Optional[GroupState] = None) -> bool:
        """A start, repaired and descended (`done`: a state already repaired and descended)."""
        nonlocal best_state, best_cost, n_starts
        t_s = time.perf_counter()
        st = done if done is not None else GroupState(gp, ch)
        if done is None:
            if not st.repair(min(deadline, t_s + budget)):
                say(f"start {name}: memory repair failed")
                return False
            st.descent(min(deadline, time.perf_counter() + budget))
        n_starts += 1
        if best_cost is not None and st.cur >= best_cost:
            return False
        # the state's running cost is the evaluator's (merging keeps costs exact); the final
        # answer is evaluated once (a full evaluation per start is O(nodes + edges))
        feasible = st.feasible_memory() and st.cur < INF
        say(f"start {name}: {int(st.cur) if feasible else 'infeasible'} ({time.perf_counter() - t_s:.1f}s)")
        if feasible:
            best_state, best_cost = st, int(st.cur)
            incumbent.offer(best_cost, st.k, gp)
            return True
        return False

    # the best start of each Lagrangian trajectory: (cost, state, penalties)
    pool: dict[int, tuple[float, GroupState, np.ndarray]] = {}

    def consider_pooled(name: str, ch: list[int], budget: float, traj: int, pen: np.ndarray) -> None:
        nonlocal best_penalty
        t_s = time.perf_counter()
        st = GroupState(gp, ch)
        if not st.repair(min(deadline, t_s + budget)):
            return
        st.descent(min(deadline, time.perf_counter() + budget))
        if traj not in pool or st.cur < pool[traj][0]:
            pool[traj] = (st.cur, st, pen)
        # the pool's state is copied before it moves (polish) and the best state is only
        # read until then: both may hold the same one
        if consider(name, list(st.k), budget, done=st):
            best_penalty = pen

    t_phase = time.perf_counter()
    if start is not None:  # the caller's start (feasible: checked by optimize)
        consider("given", gp.contract(start, red), 0.1 * time_limit_s)
    # the feasibility-first start (always memory-feasible when each node alone fits)
    consider("least-peak", least_peak_start(gp), 0.2 * time_limit_s)
    # min-sum message passing under Lagrangian usage penalties (three step sizes), each
    # decoded choice repaired and descended
    # on large instances min-sum decodes are the best starts by far (40k synthetic: 59.4 G
    # from the first decode against 68.7 G after 21 s of kicks from the least-peak start)
    # and a round takes seconds: half of the search's time
    lag_share = lagrangian_share if not big else max(lagrangian_share, lagrangian_share_large)
    lag_deadline = min(deadline, time.perf_counter() + lag_share * time_limit_s)
    # trajectories: step sizes, then sweep orders breadth-first from random groups (the
    # decoding order changes which local optimum min-sum lands in: V 2.24-2.36 M)
    configs = [(0.01, None), (0.003, None), (0.03, None)]
    configs += [(0.01, "bfs")] * 20
    trajectories: list[tuple] = []  # per trajectory: per-step rounds, per-group rounds, seconds, best start
    for traj, (step, order) in enumerate(configs):
        if time.perf_counter() > lag_deadline:
            break
        if order == "bfs":
            order = bfs_order(gp, rng.randrange(gp.num_groups))
        # on large instances per-step rounds for at most 40% of what is left of the phase,
        # then the per-group penalty factors (on 40k-node instances a round takes seconds:
        # 25 rounds would never reach them)
        switch = time.perf_counter() + 0.4 * max(0.0, lag_deadline - time.perf_counter()) if big else None
        # one sweep per round on large instances: the first decode in half the time (40k
        # synthetic: 59.8 G after 5.6 s against 59.5 G after 10.3 s with three)
        info: dict = {}
        t_traj = time.perf_counter()
        stalled = 0  # per-step decodes since the trajectory's best start last improved
        for k, over, pen in lagrangian_starts(gp, lag_deadline, step=step, order=order, switch_at=switch,
                                              sweeps=1 if big else 3, info=info):
            before = pool[traj][0] if traj in pool else None
            # far over the limit (no penalty yet): a long repair on V (skipped), a second on
            # the 40k synthetic instance (its best start)
            if over <= 0.1 or big:
                consider_pooled(f"lagrangian {step}", k, 0.05 * time_limit_s, traj, pen)
            improved = traj in pool and (before is None or pool[traj][0] < before)
            stalled = 0 if improved else stalled + 1
            # per-step penalties that stopped giving better starts: on to the per-group
            # factors (V's best starts come from them; after a fixed 25 rounds, a loaded
            # machine's run never reached them: 2.13 M against 1.75 M)
            if stalled >= step_patience and not info["group_rounds"]:
                info["switch"] = True
        trajectories.append((info["step_rounds"], info["group_rounds"], round(time.perf_counter() - t_traj, 1),
                             int(pool[traj][0]) if traj in pool else None))
        say(f"trajectory {traj}: {trajectories[-1]}")
    if problem.num_nodes <= 2000 and time.perf_counter() < lag_deadline:
        # the core's older local search (ratio repair from the node DP start)
        ls = local_search(problem, red, start=tree_dp_start(problem, red))
        if ls is not None:
            consider("node DP + local_search", gp.contract(ls, red), 0.05 * time_limit_s)
    clock.record("starts", time.perf_counter() - t_phase)
    stats["trajectories"] = trajectories
    stats["starts"] = n_starts
    stats["start_cost"] = best_cost
    # polish the best starts of the best few trajectories with kicks, go on from the best:
    # from one start the search tends to end in the same basin (V: 2,112,031 twice)
    top = sorted(pool.values(), key=lambda x: x[0])[:polish_starts]
    alternatives: list[tuple[GroupState, np.ndarray]] = []  # polished starts not taken (yet)
    if len(top) > 1:
        t_p = time.perf_counter()
        share = polish_share * time_limit_s / len(top)
        polished = []
        for _, st_p, pen in top:
            st_p = GroupState(gp, list(st_p.k))
            kick_search(st_p, min(deadline, time.perf_counter() + share), rng, slack=kick_slack)
            polished.append((st_p.cur, st_p, pen))
        polished.sort(key=lambda x: x[0])
        c, st_p, pen = polished[0]
        alternatives = [(x[1], x[2]) for x in polished[1:]]
        if st_p.feasible_memory() and st_p.cur < best_cost:
            best_state, best_cost, best_penalty = st_p, int(st_p.cur), pen
            incumbent.offer(best_cost, st_p.k, gp)
        stats["polished"] = [int(x[0]) for x in polished]
        say(f"polished {len(top)} starts: {[int(x[0]) for x in polished]} "
            f"({time.perf_counter() - t_p:.1f}s)")
        clock.record("polish", time.perf_counter() - t_p)
    stats["start_s"] = round(time.perf_counter() - t_start, 2)
    with clock.phase("bound"):
        bound = float(trivial_bound(problem, red, deadline))
    if best_state is None:
        return bound
    st = best_state
    cur_cost = best_cost
    G = gp.num_groups
    size = min(window, G)
    iters = accepted = 0
    status_counts: dict[str, int] = {}
    terms_cap = float(window_terms)
    # the full grouped model only on small instances (counting its pair terms takes a
    # np.unique per edge: 20 s on 40k nodes)
    pair_terms = sum(st.reduced_terms(e) for e in range(len(gp.tables))) if not big else None
    use_full = full_share > 0 and pair_terms is not None and pair_terms <= full_pair_limit
    lns_deadline = deadline - full_share * time_limit_s if use_full else deadline
    stats["pair_terms"] = pair_terms
    tl = gp.tl
    kick_stats = [0, 0, 0.0]  # tried, improved, seconds
    # which of the two (kick batches, CP-SAT windows) runs next: the one with the larger
    # recent gain per second (decayed sums), the other one now and then (`kick_share` is the
    # kick probability while either has been tried fewer than twice)
    arm = {"kick": [0.0, 0.0, 0], "window": [0.0, 0.0, 0], "minsum": [0.0, 0.0, 0]}  # gain, seconds, tries
    nrng = np.random.default_rng(seed)
    ms_stats = [0, 0, 0.0]

    arm_total: dict[str, list[float]] = {k: [0.0, 0.0, 0] for k in arm}  # gain, seconds, tries

    def credit(name: str, gain: float, secs: float) -> None:
        tot = arm_total[name]
        tot[0] += gain
        tot[1] += secs
        tot[2] += 1
        a = arm[name]
        a[0] = 0.7 * a[0] + gain
        a[1] = 0.7 * a[1] + secs
        a[2] += 1

    # restarts: when the incumbent has not improved for `stagnation` x the budget, the
    # search goes on from the next polished start (from one start it tends to end in the
    # same basin: V at 60 s ended at 2,112,031 or 1,681,169 depending on the start taken);
    # the best choice seen is kept aside
    kept_choice, kept_cost = list(st.k), cur_cost
    last_cost_seen = cur_cost
    last_gain = time.perf_counter()
    restarts = 0
    t_phase = time.perf_counter()
    while time.perf_counter() < lns_deadline - 0.2:
        incumbent.offer(cur_cost, st.k, gp)
        if cur_cost < kept_cost:
            kept_choice, kept_cost = list(st.k), cur_cost
        if cur_cost < last_cost_seen:
            last_gain = time.perf_counter()
        last_cost_seen = cur_cost
        if alternatives and time.perf_counter() - last_gain > stagnation * time_limit_s:
            st, best_penalty = alternatives.pop(0)
            cur_cost = int(st.cur)
            last_cost_seen = cur_cost
            last_gain = time.perf_counter()
            restarts += 1
            say(f"restart from a polished start: {cur_cost}")
        untried = [k for k, a in arm.items() if a[2] < 2]
        if untried:
            choice_arm = untried[0]
        elif rng.random() < 0.15:
            choice_arm = rng.choice(list(arm))
        else:
            choice_arm = max(arm, key=lambda k: arm[k][0] / max(arm[k][1], 1e-9))
        t_it, cost_it = time.perf_counter(), cur_cost
        if choice_arm == "window" and lns_deadline - time.perf_counter() < 3.0:
            choice_arm = "kick"  # building a window model can take seconds on large instances
        if choice_arm in ("minsum", "kick"):
            until = min(lns_deadline - 0.1, t_it + kick_batch)
            if choice_arm == "minsum":
                tr, im = minsum_window_search(st, until, rng, nrng, best_penalty)
            else:
                tr, im = kick_search(st, until, rng, slack=kick_slack)
            arm_stats = ms_stats if choice_arm == "minsum" else kick_stats
            arm_stats[0] += tr
            arm_stats[1] += im
            arm_stats[2] += time.perf_counter() - t_it
            if not st.feasible_memory() or st.cur > cur_cost:  # never: moves keep memory, cost exact
                raise AssertionError(f"{choice_arm} search broke the incumbent: {st.cur} > {cur_cost}")
            cur_cost = int(st.cur)
            credit(choice_arm, cost_it - cur_cost, time.perf_counter() - t_it)
            continue
        iters += 1
        if st.has_limit and rng.random() < time_share and len(st.all_s):
            t = rng.randrange(tl.n_steps)
            live = sorted(set(st.all_g[(st.all_s <= t) & (st.all_e > t)].tolist()))
            rng.shuffle(live)
            seeds = live[: max(1, size // 4)] or [rng.randrange(G)]
        elif rng.random() < 0.6:
            seeds = [costly_group(st, rng)]
        else:
            seeds = [rng.randrange(G)]
        win = ball(st, seeds, size, rng, max_terms=terms_cap)
        model, picks = window_model(st, win, pair_limit)
        solver = cp_model.CpSolver()
        prm = solver.parameters
        prm.num_workers = max(1, workers)
        prm.random_seed = rng.randrange(1 << 30)
        prm.max_time_in_seconds = max(0.1, min(solve_cap, lns_deadline - time.perf_counter() - 0.1))
        prm.cp_model_probing_level = 0
        prm.symmetry_level = 0
        status = solver.Solve(model)
        sname = solver.StatusName(status)
        status_counts[sname] = status_counts.get(sname, 0) + 1
        if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            saved = st.copy_choice()
            for i, g in enumerate(win):
                s = next(s for s, v in enumerate(picks[i]) if solver.BooleanValue(v))
                if s != st.k[g]:
                    st.move(g, s)
            st.descent(deadline, groups=ball(st, win, min(G, 2 * size), rng), max_passes=3)
            if st.feasible_memory() and st.cur <= cur_cost:
                if st.cur < cur_cost:
                    accepted += 1
                cur_cost = int(st.cur)
            else:
                st.restore(saved)
            if status == cp_model.OPTIMAL and solver.WallTime() < solve_cap:
                size = min(G, int(size * 1.15) + 1)
                if solver.WallTime() < 0.4 * solve_cap:
                    terms_cap *= 1.1
        else:
            size = max(20, int(size * 0.7))
            terms_cap = max(2000.0, terms_cap * 0.7)
        if status != cp_model.OPTIMAL:
            size = max(20, int(size * 0.85))
        credit("window", cost_it - cur_cost, time.perf_counter() - t_it)
        if iters % 20 == 0:
            say(f"lns {iters}: cost {cur_cost}, window {size}, terms {int(terms_cap)}, "
                f"{time.perf_counter() - t_start:.0f}s")
    incumbent.offer(cur_cost, st.k, gp)
    clock.record("improve", time.perf_counter() - t_phase)
    stats.update(kicks=kick_stats[0], kick_improvements=kick_stats[1], kick_s=round(kick_stats[2], 1),
                 minsum_windows=ms_stats[0], minsum_improvements=ms_stats[1], minsum_s=round(ms_stats[2], 1))
    stats.update(lns_status=status_counts, final_terms=int(terms_cap), lns_iterations=iters,
                 lns_improvements=accepted, final_window=size, lns_cost=cur_cost)
    stats["restarts"] = restarts
    stats["arms"] = {k: [int(v[0]), round(v[1], 1), v[2]] for k, v in arm_total.items()}  # gain, seconds, batches
    if kept_cost < cur_cost:
        st.restore((np.array(kept_choice, dtype=np.int64), gp.profile(kept_choice), float(kept_cost)))
        cur_cost = kept_cost
    if use_full and deadline - time.perf_counter() > 2:
        t_full = time.perf_counter()
        model, picks = window_model(st, list(range(G)), pair_limit)
        solver = cp_model.CpSolver()
        prm = solver.parameters
        prm.num_workers = max(1, workers)
        prm.random_seed = seed
        prm.max_time_in_seconds = max(0.5, deadline - time.perf_counter() - 0.5)
        status = solver.Solve(model)
        if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            cand = [next(s for s, v in enumerate(picks[g]) if solver.BooleanValue(v)) for g in range(G)]
            ev = evaluate(problem, gp.expand(cand))
            if ev.feasible and ev.cost < cur_cost:
                st = GroupState(gp, cand)
                cur_cost = ev.cost
                incumbent.offer(cur_cost, st.k, gp)
        stats.update(full_status=solver.StatusName(status), full_s=round(time.perf_counter() - t_full, 1))
        clock.record("full model", time.perf_counter() - t_full)
        say(f"full grouped model: {solver.StatusName(status)}, cost {cur_cost}")
    return bound
