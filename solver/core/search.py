"""Anytime search for strategy problems (the IOPDDL contest winners' recipe, in the core):

- feasibility-first start: every node on its least-usage kept strategy satisfies memory
  whenever anything does; cost is then improved only by moves that keep memory feasible;
- local search: single-node moves with incremental cost (the node's row against its
  neighbours' current choices) and memory deltas (the usage profile on the compressed
  timeline), best-improvement descent (simulated annealing with random single-node moves
  was tried on V and gained under 1%: most random moves are forbidden or break memory);
- large-neighbourhood search: CP-SAT on windows of the graph (a breadth-first ball around a
  random node or one drawn by what it costs now, sometimes grown from the nodes live at a
  random time), every node outside
  fixed; fixed neighbours become node costs, fixed nodes' usage the per-step memory budget,
  memory rows only over the distinct live sets of the window that could bind; a window
  is bounded by the pair terms inside it, a cap that adapts to how fast windows solve;
- the full model (`solve`, CP-SAT's own LNS on the tight pair formulation) hinted with the
  LNS result gets the last 80% of the budget when it is small enough to build quickly.

`optimize(problem, time_limit_s, ...)` runs them within the time limit and returns the
best feasible choice found (always checked with `evaluate`).
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
from ortools.sat.python import cp_model

from solver.core import (FORBIDDEN_COST, Reduction, SolveOptions, StrategyProblem, Timeline,
                         evaluate, local_search, presolve, solve, tree_dp_start)


class LocalState:
    """A complete choice with its usage profile on the compressed timeline, for fast
    single-node move evaluation. Choices are original strategy indices."""

    def __init__(self, problem: StrategyProblem, red: Reduction, choice: Sequence[int]):
        self.p = problem
        self.red = red
        self.alive = red.alive
        n = problem.num_nodes
        self.incident: list[list[tuple[int, bool, int]]] = [[] for _ in range(n)]
        for e, (u, v) in enumerate(problem.edges):
            self.incident[u].append((e, True, v))
            self.incident[v].append((e, False, u))
        # per node, per incident edge: the table restricted to kept strategies of the node
        # (rows) against all strategies of the other end, as float to add up fast
        self.rows: list[list[np.ndarray]] = []
        for x in range(n):
            a = self.alive[x]
            rs = []
            for e, is_u, _ in self.incident[x]:
                t = problem.edge_costs[e]
                rs.append((t[a, :] if is_u else t[:, a].T).astype(np.float64))
            self.rows.append(rs)
        self.ncost = [problem.node_costs[x][self.alive[x]].astype(np.float64) for x in range(n)]
        self.use = [problem.node_usages[x][self.alive[x]].astype(np.int64) for x in range(n)]
        self.tl = red.timeline or Timeline.build(problem.intervals)
        self.limit = problem.usage_limit
        self.has_limit = self.limit is not None and self.tl.n_steps > 0
        # k[x]: index into alive[x] of the current choice
        pos = [{int(s): i for i, s in enumerate(a)} for a in self.alive]
        self.k = np.array([pos[x][int(red.replaced_by[x][int(s)])] for x, s in enumerate(choice)])
        self.prof = self.tl.profile(np.array([int(self.use[x][self.k[x]]) for x in range(n)])) \
            if self.has_limit else np.zeros(0, dtype=np.int64)

    def choice(self) -> list[int]:
        return [int(self.alive[x][self.k[x]]) for x in range(self.p.num_nodes)]

    def local_cost(self, x: int) -> np.ndarray:
        c = self.ncost[x].copy()
        for (e, _, y), r in zip(self.incident[x], self.rows[x]):
            c += r[:, int(self.alive[y][self.k[y]])]
        return c

    def memory_ok(self, x: int) -> np.ndarray:
        """Which strategies of x keep every step within the limit (given the others)."""
        if not self.has_limit or self.tl.end[x] <= self.tl.start[x]:
            return np.ones(len(self.alive[x]), dtype=bool)
        peak = int(self.prof[self.tl.start[x]:self.tl.end[x]].max())
        return peak + (self.use[x] - self.use[x][self.k[x]]) <= self.limit

    def move(self, x: int, k: int) -> None:
        d = int(self.use[x][k] - self.use[x][self.k[x]])
        if self.has_limit and d:
            self.prof[self.tl.start[x]:self.tl.end[x]] += d
        self.k[x] = k

    def feasible_memory(self) -> bool:
        return not self.has_limit or bool((self.prof <= self.limit).all())

    def descent(self, deadline: float, nodes: Optional[Sequence[int]] = None, max_passes: int = 50) -> int:
        """Best-improvement single-node moves that keep memory feasible, until none
        improves (or the deadline). Returns the number of moves made."""
        moves = 0
        order = list(nodes) if nodes is not None else range(self.p.num_nodes)
        dirty = set(order)
        for _ in range(max_passes):
            if not dirty or time.perf_counter() > deadline:
                break
            todo = [x for x in order if x in dirty]
            dirty = set()
            for x in todo:
                if len(self.alive[x]) < 2:
                    continue
                lc = self.local_cost(x)
                ok = self.memory_ok(x)
                lc = np.where(ok, lc, np.inf)
                k = int(np.argmin(lc))
                if lc[k] < lc[self.k[x]]:
                    self.move(x, k)
                    moves += 1
                    dirty.update(y for _, _, y in self.incident[x])
                    dirty.add(x)
        return moves


def feasibility_first_start(problem: StrategyProblem, red: Reduction) -> list[int]:
    """Each node on its least-usage kept strategy (the cheapest among those): if this
    exceeds the limit, nothing fits."""
    out = []
    for x, a in enumerate(red.alive):
        u = problem.node_usages[x][a]
        c = problem.node_costs[x][a]
        cand = np.flatnonzero(u == u.min())
        out.append(int(a[cand[int(np.argmin(c[cand]))]]))
    return out


def _repair(state: LocalState, deadline: float) -> bool:
    """Memory repair by the cheapest usage-reducing moves at the worst step."""
    tl = state.tl
    while state.has_limit and time.perf_counter() < deadline:
        over = state.prof - state.limit
        t = int(np.argmax(over))
        if over[t] <= 0:
            return True
        best = None
        for x in np.flatnonzero((tl.start <= t) & (tl.end > t)):
            saved = state.use[x][state.k[x]] - state.use[x]
            if not (saved > 0).any():
                continue
            lc = state.local_cost(int(x))
            ratio = np.where(saved > 0, (lc - lc[state.k[x]]) / np.maximum(saved, 1), np.inf)
            k = int(np.argmin(ratio))
            if best is None or ratio[k] < best[0]:
                best = (ratio[k], int(x), k)
        if best is None:
            return False
        state.move(best[1], best[2])
    return state.feasible_memory()


# -- LNS -----------------------------------------------------------------------------------
def _window_model(state: LocalState, window: list[int], pair_limit: int):
    """CP-SAT model of the window with everything else fixed; returns (model, picks, base)
    where picks[i][k] is the boolean of window[i] taking its k-th kept strategy."""
    p, alive = state.p, state.alive
    inw = {x: i for i, x in enumerate(window)}
    model = cp_model.CpModel()
    picks = []
    obj_vars, obj_coefs = [], []
    for x in window:
        vs = [model.NewBoolVar("") for _ in alive[x]]
        model.AddExactlyOne(vs)
        picks.append(vs)
    const = 0.0
    for i, x in enumerate(window):
        c = state.ncost[x].copy()
        for (e, is_u, y), r in zip(state.incident[x], state.rows[x]):
            if y in inw:
                continue
            c += r[:, int(alive[y][state.k[y]])]
        lo = c.min()
        const += lo
        for k, v in enumerate(picks[i]):
            if c[k] >= FORBIDDEN_COST:
                model.Add(v == 0)
            elif c[k] > lo:
                obj_vars.append(v)
                obj_coefs.append(int(c[k] - lo))
    seen = set()
    for x in window:
        for e, is_u, y in state.incident[x]:
            if y not in inw or e in seen:
                continue
            seen.add(e)
            u, v = p.edges[e]
            iu, iv = inw[u], inw[v]
            t = p.edge_costs[e][np.ix_(alive[u], alive[v])]
            forb = t >= FORBIDDEN_COST
            lo = int(t[~forb].min()) if (~forb).any() else 0
            const += lo
            if t.size <= pair_limit:
                # pair booleans with marginal equalities to both ends (tight local polytope)
                z = {}
                for a in range(t.shape[0]):
                    for b in range(t.shape[1]):
                        if not forb[a, b]:
                            var = model.NewBoolVar("")
                            z[a, b] = var
                            model.AddHint(var, a == state.k[u] and b == state.k[v])
                            if t[a, b] > lo:
                                obj_vars.append(var)
                                obj_coefs.append(int(t[a, b] - lo))
                for a in range(t.shape[0]):
                    model.Add(cp_model.LinearExpr.Sum([z[a, b] for b in range(t.shape[1]) if (a, b) in z])
                              == picks[iu][a])
                for b in range(t.shape[1]):
                    model.Add(cp_model.LinearExpr.Sum([z[a, b] for a in range(t.shape[0]) if (a, b) in z])
                              == picks[iv][b])
            else:
                ku = model.NewIntVar(0, t.shape[0] - 1, "")
                kv = model.NewIntVar(0, t.shape[1] - 1, "")
                model.Add(ku == cp_model.LinearExpr.WeightedSum(picks[iu], list(range(t.shape[0]))))
                model.Add(kv == cp_model.LinearExpr.WeightedSum(picks[iv], list(range(t.shape[1]))))
                flat = cp_model.LinearExpr.WeightedSum([ku, kv], [t.shape[1], 1])
                idx = model.NewIntVar(0, t.size - 1, "")
                model.Add(idx == flat)
                vals = np.where(forb, -1, t - lo).reshape(-1)
                allowed = sorted(set(int(v) for v in vals if v >= 0))
                cost = model.NewIntVarFromDomain(cp_model.Domain.FromValues(allowed), "")
                model.AddElement(idx, [int(v) for v in vals], cost)
                obj_vars.append(cost)
                obj_coefs.append(1)
    # memory: fixed nodes' usage is a per-step background; one row per distinct live set of
    # the window, with the tightest budget over the steps it covers, kept if it can bind
    if state.has_limit:
        tl = state.tl
        ws = np.array([tl.start[x] for x in window])
        we = np.array([tl.end[x] for x in window])
        cur = np.array([state.use[x][state.k[x]] for x in window])
        bg = state.prof.copy()
        diff = np.zeros(tl.n_steps + 1, dtype=np.int64)
        np.add.at(diff, ws, cur)
        np.add.at(diff, we, -cur)
        bg -= np.cumsum(diff)[: tl.n_steps]
        pts = np.unique(np.concatenate([ws[we > ws], we[we > ws]]))
        if len(pts) > 1:
            rows: dict[tuple, int] = {}
            for j in range(len(pts) - 1):
                t0 = pts[j]
                live = tuple(np.flatnonzero((ws <= t0) & (we > t0)).tolist())
                if not live:
                    continue
                seg_top = int(bg[t0:pts[j + 1]].max())
                budget = state.limit - seg_top
                if live not in rows or budget < rows[live]:
                    rows[live] = budget
            for live, budget in rows.items():
                lows = sum(int(state.use[window[i]].min()) for i in live)
                highs = sum(int(state.use[window[i]].max()) for i in live)
                if highs <= budget:
                    continue
                vs, cs = [], []
                for i in live:
                    u = state.use[window[i]]
                    m = int(u.min())
                    for k, v in enumerate(picks[i]):
                        if u[k] > m:
                            vs.append(v)
                            cs.append(int(u[k] - m))
                model.Add(cp_model.LinearExpr.WeightedSum(vs, cs) <= budget - lows)
    model.Minimize(cp_model.LinearExpr.WeightedSum(obj_vars, obj_coefs))
    for i, x in enumerate(window):
        for k, v in enumerate(picks[i]):
            model.AddHint(v, k == state.k[x])
    return model, picks


def _ball(state: LocalState, seed_nodes: list[int], size: int, rng: random.Random,
          max_terms: Optional[int] = None) -> list[int]:
    """Breadth-first ball around the seeds: at most `size` nodes and (when given) about
    `max_terms` pair terms inside (the model size, not the node count, sets solve time)."""
    seen = set(seed_nodes)
    frontier = list(seed_nodes)
    out = list(seed_nodes)
    terms = 0
    nalive = [len(a) for a in state.alive] if max_terms is not None else None
    while frontier and len(out) < size:
        nxt = []
        rng.shuffle(frontier)
        for x in frontier:
            for _, _, y in state.incident[x]:
                if y not in seen:
                    if max_terms is not None:
                        add = sum(nalive[y] * nalive[z] for _, _, z in state.incident[y] if z in seen)
                        if terms + add > max_terms and len(out) > 1:
                            continue
                        terms += add
                    seen.add(y)
                    out.append(y)
                    nxt.append(y)
                    if len(out) >= size:
                        return out
        frontier = nxt
    return out


def _costly_node(state: LocalState, rng: random.Random) -> int:
    """A node drawn with probability proportional to the square root of what it and its
    incident edges cost under the current choice."""
    p = state.p
    ch = [int(state.alive[x][state.k[x]]) for x in range(p.num_nodes)]
    w = np.array([float(p.node_costs[x][ch[x]]) for x in range(p.num_nodes)])
    for (u, v), t in zip(p.edges, p.edge_costs):
        c = float(t[ch[u], ch[v]])
        w[u] += c / 2
        w[v] += c / 2
    w = np.sqrt(np.maximum(w, 0)) + 1e-9
    return int(np.searchsorted(np.cumsum(w), rng.random() * w.sum()))


@dataclass
class SearchResult:
    choice: Optional[list[int]]
    cost: Optional[int]
    feasible: bool
    bound: Optional[float]
    seconds: float
    stats: dict = field(default_factory=dict)


def trivial_bound(problem: StrategyProblem, red: Reduction) -> int:
    """Sum of each node's and each edge's cheapest kept entry: a valid lower bound."""
    b = sum(int(problem.node_costs[x][a].min()) for x, a in enumerate(red.alive))
    for (u, v), t in zip(problem.edges, problem.edge_costs):
        sub = t[np.ix_(red.alive[u], red.alive[v])]
        b += int(sub.min())
    return b


def optimize(problem: StrategyProblem, time_limit_s: float = 60.0, workers: int = 2, seed: int = 1,
             log: Optional[Callable[[str], None]] = None, window: int = 120,
             pair_limit: int = 4096, solve_cap: float = 1.0, full_share: float = 0.8,
             full_pair_limit: int = 400_000,
             window_presolve: bool = True, time_share: float = 0.3,
             window_terms: int = 20_000) -> SearchResult:
    """Best feasible choice found within `time_limit_s` (wall clock, all phases)."""
    t_start = time.perf_counter()
    deadline = t_start + time_limit_s
    say = log or (lambda s: None)
    rng = random.Random(seed)
    big = problem.num_nodes > 5000
    red = presolve(problem, prune_dominated=not big, max_rounds=6 if not big else 1)
    say(f"presolve {time.perf_counter() - t_start:.1f}s, {red.num_strategies} strategies kept")
    stats: dict = {"presolve_s": round(time.perf_counter() - t_start, 2),
                   "strategies_kept": red.num_strategies}
    starts = [("least-usage", feasibility_first_start(problem, red))]
    dp = tree_dp_start(problem, red)
    starts.append(("spanning-forest DP", dp))
    if problem.num_nodes <= 2000:
        # the core's older local search (ratio repair from the DP start): slower, kept
        # for small instances where it sometimes lands closer
        ls = local_search(problem, red, start=dp)
        if ls is not None:
            starts.append(("DP + local_search", ls))
    best_state, best_cost = None, None
    for name, ch in starts:
        st = LocalState(problem, red, ch)
        if not _repair(st, deadline):
            say(f"start {name}: memory repair failed")
            continue
        st.descent(min(deadline, time.perf_counter() + 0.05 * time_limit_s))
        ev = evaluate(problem, st.choice())
        say(f"start {name}: {ev.cost if ev.feasible else 'infeasible ' + ev.reason}")
        if ev.feasible and (best_cost is None or ev.cost < best_cost):
            best_state, best_cost = st, ev.cost
    stats["start_cost"] = best_cost
    stats["start_s"] = round(time.perf_counter() - t_start, 2)
    bound = float(trivial_bound(problem, red))
    if best_state is None:
        return SearchResult(None, None, False, bound, time.perf_counter() - t_start, stats)
    st = best_state
    cur_cost = best_cost
    n = problem.num_nodes
    size = min(window, n)
    iters = accepted = 0
    status_counts: dict[str, int] = {}
    terms_cap = float(window_terms)
    tl = st.tl
    # the full model (CP-SAT's own LNS on the tight pair formulation, hinted with the best
    # choice) gets the last part of the budget when it is small enough to build quickly
    pair_terms = 0
    for (u, v), t in zip(problem.edges, problem.edge_costs):
        size_uv = len(red.alive[u]) * len(red.alive[v])
        pair_terms += size_uv if size_uv <= 2048 else len(red.alive[u]) + len(red.alive[v])
    use_full = full_share > 0 and pair_terms <= full_pair_limit
    lns_deadline = deadline - full_share * time_limit_s if use_full else deadline
    stats["pair_terms"] = pair_terms
    while time.perf_counter() < lns_deadline - 0.2:
        iters += 1
        if st.has_limit and rng.random() < time_share and tl.n_steps:
            t = rng.randrange(tl.n_steps)
            live = np.flatnonzero((tl.start <= t) & (tl.end > t)).tolist()
            rng.shuffle(live)
            seeds = live[: max(1, size // 4)] or [rng.randrange(n)]
        elif rng.random() < 0.6:
            # around an edge or node paying much now (sampled by cost): where gains are
            seeds = [_costly_node(st, rng)]
        else:
            seeds = [rng.randrange(n)]
        win = _ball(st, seeds, size, rng, max_terms=int(terms_cap))
        model, picks = _window_model(st, win, pair_limit)
        solver = cp_model.CpSolver()
        prm = solver.parameters
        prm.num_workers = max(1, workers)
        prm.random_seed = rng.randrange(1 << 30)
        prm.max_time_in_seconds = max(0.1, min(solve_cap, lns_deadline - time.perf_counter() - 0.1))
        prm.cp_model_probing_level = 0
        prm.symmetry_level = 0
        prm.cp_model_presolve = window_presolve
        status = solver.Solve(model)
        sname = solver.StatusName(status)
        status_counts[sname] = status_counts.get(sname, 0) + 1
        if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            old = st.k.copy()
            oldprof = st.prof.copy()
            for i, x in enumerate(win):
                k = next(k for k, v in enumerate(picks[i]) if solver.BooleanValue(v))
                if k != st.k[x]:
                    st.move(x, k)
            st.descent(deadline, nodes=_ball(st, win, min(n, 2 * size), rng), max_passes=3)
            ev = evaluate(problem, st.choice())
            if ev.feasible and ev.cost <= cur_cost:
                if ev.cost < cur_cost:
                    accepted += 1
                cur_cost = ev.cost
            else:
                st.k, st.prof = old, oldprof
            if status == cp_model.OPTIMAL and solver.WallTime() < solve_cap:
                size = min(n, int(size * 1.15) + 1)
                if solver.WallTime() < 0.4 * solve_cap:
                    terms_cap *= 1.1
        else:
            size = max(20, int(size * 0.7))
            terms_cap = max(2000.0, terms_cap * 0.7)
        if status != cp_model.OPTIMAL:
            size = max(20, int(size * 0.85))
        if iters % 20 == 0:
            say(f"lns {iters}: cost {cur_cost}, window {size}, {time.perf_counter() - t_start:.0f}s")
    stats.update(lns_status=status_counts, final_terms=int(terms_cap), lns_iterations=iters, lns_improvements=accepted, final_window=size, lns_cost=cur_cost)
    choice = st.choice()
    if use_full and deadline - time.perf_counter() > 2:
        t_full = time.perf_counter()
        left = deadline - t_full
        # building the model takes time too: roughly 1 s per 100k pair terms
        cap = max(1.0, left - 1.0 - pair_terms / 100_000)
        sol = solve(problem, SolveOptions(time_limit_s=cap, num_workers=workers, seed=seed),
                    hint=choice, reduction=red)
        if sol.bound is not None:
            bound = max(bound, float(sol.bound))
        if sol.choice is not None and sol.cost is not None and sol.cost < cur_cost:
            choice, cur_cost = list(sol.choice), sol.cost
        stats.update(full_cost=sol.cost, full_s=round(time.perf_counter() - t_full, 1))
        say(f"full model: {sol.cost} ({sol.status}), bound {sol.bound}")
    ev = evaluate(problem, choice)
    return SearchResult(choice, ev.cost, ev.feasible, bound, time.perf_counter() - t_start, stats)
