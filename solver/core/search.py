"""Anytime search for strategy problems (the IOPDDL contest winners' recipe, in the core):

- presolve (forbidden and dominated strategies), then node merging (`solver.core.merge`):
  followers (a node whose choice is a function of a neighbour's) collapse into groups,
  single-strategy nodes fold into their neighbours' costs; everything below works on groups
  and memory stays exact (each member keeps its live interval: a group's usage is piecewise
  constant over its segments on the compressed timeline);
- starts: every group on its least-peak strategy (feasibility first), and min-sum message
  passing (`solver.core.bp`) under Lagrangian usage penalties per compressed step (several
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

`optimize(problem, time_limit_s, ...)` runs them within the time limit and returns the
best feasible choice found (always checked with `evaluate` on the original problem).
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
from ortools.sat.python import cp_model

from solver.core import (FORBIDDEN_COST, Reduction, StrategyProblem, evaluate, forest_min_sum, local_search,
                         presolve, tree_dp_start)
from solver.core.bp import bfs_order, lagrangian_starts, window_minsum
from solver.core.merge import GroupedProblem, group_problem

INF = float("inf")


def _shared_tables(gp: GroupedProblem) -> tuple:
    G = gp.num_groups
    inc: list[list[tuple[int, np.ndarray]]] = [[] for _ in range(G)]
    inc_e: list[list[int]] = [[] for _ in range(G)]
    for e, ((a, b), t) in enumerate(zip(gp.edges, gp.tables)):
        tf = t.astype(np.float64)
        tf[t >= FORBIDDEN_COST] = INF
        inc[a].append((b, tf))
        inc[b].append((a, tf.T))
        inc_e[a].append(e)
        inc_e[b].append(e)
    cost = []
    for c in gp.cost:
        cf = c.astype(np.float64)
        cf[c >= FORBIDDEN_COST] = INF
        cost.append(cf)
    steps, offs = [], []
    for g in range(G):
        ss, se = gp.seg_start[g], gp.seg_end[g]
        if len(ss):
            steps.append(np.concatenate([np.arange(a, b) for a, b in zip(ss, se)]))
            offs.append(np.concatenate([[0], np.cumsum(se - ss)[:-1]]))
        else:
            steps.append(np.zeros(0, np.int64))
            offs.append(np.zeros(0, np.int64))
    wmin = [W.min(axis=1) if len(W) else np.zeros(0, np.int64) for W in gp.W]
    # all segments of all groups, for "who is live at step t"
    all_g = np.concatenate([np.full(len(x), g) for g, x in enumerate(gp.seg_start)] or [np.zeros(0, int)])
    all_j = np.concatenate([np.arange(len(x)) for x in gp.seg_start] or [np.zeros(0, int)])
    all_s = np.concatenate(gp.seg_start or [np.zeros(0, int)])
    all_e = np.concatenate(gp.seg_end or [np.zeros(0, int)])
    return inc, inc_e, {}, cost, steps, offs, wmin, all_g, all_j, all_s, all_e


class GroupState:
    """A complete group choice with its usage profile on the compressed timeline, for fast
    single-group move evaluation (cost rows against the neighbours' current choices, memory
    as the peak over each of the group's segments)."""

    def __init__(self, gp: GroupedProblem, choice: Sequence[int]):
        self.gp = gp
        # what does not depend on the choice is built once per grouped problem and shared by
        # every state (on S the float tables alone are tens of MB per state)
        shared = getattr(gp, "_state_shared", None)
        if shared is None:
            shared = _shared_tables(gp)
            gp._state_shared = shared  # type: ignore[attr-defined]
        self.inc, self.inc_e, self._reduced, self.cost, self.steps, self.offs, self.Wmin, \
            self.all_g, self.all_j, self.all_s, self.all_e = shared
        self.k = np.array([int(s) for s in choice], dtype=np.int64)
        self.limit = gp.limit
        self.has_limit = gp.limit is not None and gp.tl.n_steps > 0
        self.prof = gp.profile(self.k) if self.has_limit else np.zeros(0, np.int64)
        self.journal: Optional[list[tuple[int, int]]] = None
        self.cur = self.total()  # kept up to date by move()

    def reduced(self, e: int):
        """Edge e's table over its distinct rows and columns: (row class of each strategy of
        the first end, column class of each strategy of the second end, reduced table)."""
        r = self._reduced.get(e)
        if r is None:
            t = self.gp.tables[e]
            rows, inv_r = np.unique(t, axis=0, return_inverse=True)
            cols, inv_c = np.unique(rows, axis=1, return_inverse=True)
            r = (inv_r.reshape(-1), inv_c.reshape(-1), cols)
            self._reduced[e] = r
        return r

    def reduced_terms(self, e: int) -> int:
        return int((self.reduced(e)[2] < FORBIDDEN_COST).sum())

    def copy_choice(self):
        return self.k.copy(), self.prof.copy(), self.cur

    def restore(self, saved) -> None:
        self.k, self.prof, self.cur = saved[0].copy(), saved[1].copy(), saved[2]

    def local_cost(self, g: int) -> np.ndarray:
        c = self.cost[g].copy()
        for o, t in self.inc[g]:
            c += t[:, self.k[o]]
        return c

    def new_peaks(self, g: int) -> np.ndarray:
        """Per strategy of g: the highest usage over g's segments if g took it."""
        W = self.gp.W[g]
        if not len(W):
            return np.zeros(W.shape[1], dtype=np.int64)
        segmax = np.maximum.reduceat(self.prof[self.steps[g]], self.offs[g])
        return ((segmax - W[:, self.k[g]])[:, None] + W).max(axis=0)

    def memory_ok(self, g: int) -> np.ndarray:
        if not self.has_limit or not len(self.gp.W[g]):
            return np.ones(len(self.cost[g]), dtype=bool)
        return self.new_peaks(g) <= self.limit

    def move(self, g: int, s: int) -> None:
        if self.journal is not None:
            self.journal.append((g, int(self.k[g])))
        exact = False
        if s != self.k[g]:
            lc = self.local_cost(g)
            delta = lc[s] - lc[self.k[g]]
            if np.isfinite(delta):
                self.cur += delta
            else:
                exact = True  # into or out of a forbidden state: recount below
        if self.has_limit:
            W = self.gp.W[g]
            if len(W):
                d = W[:, s] - W[:, self.k[g]]
                for j in np.flatnonzero(d):
                    self.prof[self.gp.seg_start[g][j]:self.gp.seg_end[g][j]] += d[j]
        self.k[g] = s
        if exact:
            self.cur = self.total()

    def undo(self, mark: int) -> None:
        """Take back the journal's moves after position `mark`."""
        j, self.journal = self.journal, None
        while len(j) > mark:
            g, s = j.pop()
            self.move(g, s)
        self.journal = j

    def feasible_memory(self) -> bool:
        return not self.has_limit or bool((self.prof <= self.limit).all())

    def total(self) -> float:
        """Cost of the current choice (inf when a forbidden entry is chosen)."""
        c = float(sum(int(self.gp.cost[g][s]) for g, s in enumerate(self.k))
                  + sum(int(t[self.k[a], self.k[b]]) for (a, b), t in zip(self.gp.edges, self.gp.tables)))
        return INF if c >= FORBIDDEN_COST else c

    def descent(self, deadline: float, groups: Optional[Sequence[int]] = None, max_passes: int = 50) -> int:
        """Best-improvement single-group moves that keep memory feasible, until none
        improves (or the deadline). Returns the number of moves made."""
        moves = 0
        order = list(groups) if groups is not None else list(range(self.gp.num_groups))
        dirty = set(order)
        for _ in range(max_passes):
            if not dirty or time.perf_counter() > deadline:
                break
            todo = [g for g in order if g in dirty]
            dirty = set()
            for g in todo:
                if len(self.cost[g]) < 2:
                    continue
                lc = self.local_cost(g)
                lc = np.where(self.memory_ok(g), lc, INF)
                s = int(np.argmin(lc))
                if lc[s] < lc[self.k[g]]:
                    self.move(g, s)
                    moves += 1
                    dirty.update(o for o, _ in self.inc[g])
                    dirty.add(g)
        return moves

    def _rise_ok(self, g: int) -> np.ndarray:
        """Per strategy of g: it raises none of g's segments above the limit."""
        W = self.gp.W[g]
        segmax = np.maximum.reduceat(self.prof[self.steps[g]], self.offs[g])
        rise = W - W[:, self.k[g]][:, None]
        return ~((rise > 0) & ((segmax[:, None] + rise) > self.limit)).any(axis=0)

    def repair(self, deadline: float, tabu: Optional[set] = None) -> bool:
        """Memory repair at the worst step: the usage-reducing moves of the groups live there,
        cheapest cost increase per unit of usage saved first, applied until the step fits (a
        move may not push any of the group's other segments over the limit)."""
        while self.has_limit and time.perf_counter() < deadline:
            over = self.prof - self.limit
            t = int(np.argmax(over))
            if over[t] <= 0:
                return True
            cands = []
            live = np.flatnonzero((self.all_s <= t) & (self.all_e > t))
            for g, j in zip(self.all_g[live], self.all_j[live]):
                g, j = int(g), int(j)
                if (tabu is not None and g in tabu) or self.gp.W[g][j, self.k[g]] <= self.Wmin[g][j]:
                    continue
                W = self.gp.W[g]
                saved = W[j, self.k[g]] - W[j]
                lc = self.local_cost(g)
                ratio = np.where((saved > 0) & self._rise_ok(g) & np.isfinite(lc),
                                 (lc - lc[self.k[g]]) / np.maximum(saved, 1), INF)
                s = int(np.argmin(ratio))
                if ratio[s] < INF:
                    cands.append((float(ratio[s]), g, j, s))
            if not cands:
                return False
            cands.sort()
            moved = False
            for _, g, j, s in cands:
                if self.prof[t] <= self.limit:
                    break
                W = self.gp.W[g]
                if W[j, s] >= W[j, self.k[g]] or not self._rise_ok(g)[s]:
                    continue  # an earlier move changed what this one would do
                self.move(g, s)
                moved = True
            if not moved:
                return False
        return self.feasible_memory()


def kick_search(st: GroupState, deadline: float, rng: random.Random, max_kicks: int = 10**9,
                ball: int = 2, depth: Sequence[int] = (1, 2, 3, 5, 8),
                slack: float = 0.0) -> tuple[int, int]:
    """Ejection chains: move a group (drawn by what it costs now) to its cheapest strategy
    ignoring memory, repair memory elsewhere by the cheapest usage-reducing moves (the
    kicked group tabu), descend around everything that moved, and keep the result when the
    total is no worse; otherwise undo. Returns (kicks tried, kicks that improved)."""
    tried = improved = 0
    best = None  # (k, prof, cost) of the best state while walking on a worse one
    st.journal = []
    cur = st.cur
    while tried < max_kicks and time.perf_counter() < deadline:
        tried += 1
        g = _costly_group(st, rng) if rng.random() < 0.7 else rng.randrange(st.gp.num_groups)
        if len(st.cost[g]) < 2:
            continue
        lc = st.local_cost(g)
        lc[st.k[g]] = INF
        finite = np.flatnonzero(np.isfinite(lc))
        if not len(finite):
            continue
        mark = len(st.journal)
        if rng.random() < 0.5:
            order = finite[np.argsort(lc[finite])]
            s = int(order[min(len(order) - 1, int(rng.random() ** 2 * min(4, len(order))))])
            st.move(g, s)
        else:
            # a chain: g takes a random allowed strategy, then its neighbours (and theirs,
            # up to `depth` steps) their best responses, memory ignored until the repair
            st.move(g, int(finite[rng.randrange(len(finite))]))
            frontier, seen = [g], {g}
            for _ in range(rng.choice(depth)):
                nxt = []
                for x in frontier:
                    for y, _ in st.inc[x]:
                        if y in seen or len(st.cost[y]) < 2:
                            continue
                        seen.add(y)
                        ly = st.local_cost(y)
                        sy = int(np.argmin(ly))
                        if np.isfinite(ly[sy]) and sy != st.k[y]:
                            st.move(y, sy)
                            nxt.append(y)
                frontier = nxt
        ok = st.repair(deadline, tabu={x for x, _ in st.journal[mark:]})
        if ok:
            moved = {x for x, _ in st.journal[mark:]}
            region = _ball(st, list(moved), len(moved) * 4 + 8, rng) if ball else list(moved)
            st.descent(deadline, groups=region, max_passes=3)
            new = st.cur
            if new <= cur and st.feasible_memory():
                if new < cur:
                    improved += 1
                cur = new
                st.journal = []
                continue
            # the kick's end state, to redo after taking a snapshot of the state before it
            redo = [(x, int(st.k[x])) for x in {x for x, _ in st.journal[mark:]}]
            if slack and new <= cur * (1 + slack) and st.feasible_memory():
                # record-to-record travel: a slightly worse state is kept to walk on from,
                # the best one is kept aside
                if best is None:
                    st.undo(mark)
                    best = st.copy_choice()
                    for x, sx in redo:
                        st.move(x, sx)
                cur = new
                st.journal = []
                continue
        st.undo(mark)
        st.journal = st.journal[:mark]
        if best is not None and st.cur < best[2]:
            best = None
    if best is not None and best[2] < st.cur:
        st.restore(best)
    st.journal = None
    return tried, improved


def minsum_window_search(st: GroupState, deadline: float, rng: random.Random,
                         nrng: np.random.Generator, penalty: Optional[np.ndarray]) -> tuple[int, int]:
    """Large moves by message passing: a ball of groups around one drawn by what it costs
    now (30-120 groups) is re-decoded by min-sum with the rest fixed (fixed neighbours as
    costs, usage priced by a scaled copy of the Lagrangian penalties, a little noise), then
    memory is repaired, the surroundings descended, and the result kept when no worse."""
    tried = improved = 0
    while time.perf_counter() < deadline:
        tried += 1
        size = rng.choice((30, 60, 120))
        win = [g for g in _ball(st, [_costly_group(st, rng)], size, rng) if len(st.cost[g]) > 1]
        if not win:
            continue
        scale = rng.choice((0.0, 0.5, 1.0)) if penalty is not None else 0.0
        k = window_minsum(st, win, penalty * scale if scale else None,
                          noise=rng.choice((0.0, 0.02, 0.05)), rng=nrng)
        st.journal = []
        before = st.cur
        for g, s in zip(win, k):
            if s != st.k[g]:
                st.move(g, s)
        ok = st.repair(deadline)
        if ok:
            st.descent(deadline, groups=_ball(st, win, 2 * size, rng), max_passes=3)
        if ok and st.cur <= before and st.feasible_memory():
            improved += int(st.cur < before)
        else:
            st.undo(0)
        st.journal = None
    return tried, improved


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


# -- CP-SAT on a window of groups ------------------------------------------------------------
def window_model(st: GroupState, window: list[int], pair_limit: int):
    """CP-SAT model of the window with every other group fixed at its current strategy;
    returns (model, picks) where picks[i][s] is the boolean of window[i] taking strategy s.
    Objective: the window's cost minus a constant (fixed neighbours fold into group costs)."""
    gp = st.gp
    inw = {g: i for i, g in enumerate(window)}
    model = cp_model.CpModel()
    picks = []
    obj_vars, obj_coefs = [], []
    for g in window:
        vs = [model.NewBoolVar("") for _ in range(len(gp.cost[g]))]
        model.AddExactlyOne(vs)
        picks.append(vs)
    for i, g in enumerate(window):
        c = st.cost[g].copy()
        for o, t in st.inc[g]:
            if o not in inw:
                c += t[:, st.k[o]]
        fin = np.isfinite(c)
        lo = c[fin].min() if fin.any() else 0.0
        for s, v in enumerate(picks[i]):
            if not fin[s]:
                model.Add(v == 0)
            elif c[s] > lo:
                obj_vars.append(v)
                obj_coefs.append(int(c[s] - lo))
    for e, (a, b) in enumerate(gp.edges):
        if a not in inw or b not in inw:
            continue
        ia, ib = inw[a], inw[b]
        t = gp.tables[e]
        forb = t >= FORBIDDEN_COST
        lo = int(t[~forb].min()) if (~forb).any() else 0
        inv_r, inv_c, R = st.reduced(e)
        rforb = R >= FORBIDDEN_COST
        if int((~rforb).sum()) <= pair_limit:
            # pair booleans over the table's distinct rows x distinct columns (strategies
            # with equal rows act alike on this edge: a follower merged into a group keeps
            # its own small table), with marginal equalities to both ends (the tight local
            # polytope)
            z = {}
            rows: list[list] = [[] for _ in range(R.shape[0])]
            cols: list[list] = [[] for _ in range(R.shape[1])]
            for x, y in zip(*np.nonzero(~rforb)):
                var = model.NewBoolVar("")
                rows[x].append(var)
                cols[y].append(var)
                if R[x, y] > lo:
                    obj_vars.append(var)
                    obj_coefs.append(int(R[x, y] - lo))
                z[int(x), int(y)] = var
            ra = [[] for _ in range(R.shape[0])]
            for s_, r in enumerate(inv_r):
                ra[r].append(picks[ia][s_])
            cb = [[] for _ in range(R.shape[1])]
            for s_, c in enumerate(inv_c):
                cb[c].append(picks[ib][s_])
            for x in range(R.shape[0]):
                model.Add(cp_model.LinearExpr.Sum(rows[x]) == cp_model.LinearExpr.Sum(ra[x]))
            for y in range(R.shape[1]):
                model.Add(cp_model.LinearExpr.Sum(cols[y]) == cp_model.LinearExpr.Sum(cb[y]))
            key = (int(inv_r[st.k[a]]), int(inv_c[st.k[b]]))
            if key in z:
                model.AddHint(z[key], True)
        else:
            ka = model.NewIntVar(0, t.shape[0] - 1, "")
            kb = model.NewIntVar(0, t.shape[1] - 1, "")
            model.Add(ka == cp_model.LinearExpr.WeightedSum(picks[ia], list(range(t.shape[0]))))
            model.Add(kb == cp_model.LinearExpr.WeightedSum(picks[ib], list(range(t.shape[1]))))
            idx = model.NewIntVar(0, t.size - 1, "")
            model.Add(idx == cp_model.LinearExpr.WeightedSum([ka, kb], [t.shape[1], 1]))
            vals = np.where(forb, -1, t - lo).reshape(-1)
            allowed = sorted(set(int(v) for v in vals if v >= 0))
            cost = model.NewIntVarFromDomain(cp_model.Domain.FromValues(allowed), "")
            model.AddElement(idx, [int(v) for v in vals], cost)
            obj_vars.append(cost)
            obj_coefs.append(1)
    if st.has_limit:
        _window_memory(st, window, picks, model)
    model.Minimize(cp_model.LinearExpr.WeightedSum(obj_vars, obj_coefs))
    for i, g in enumerate(window):
        for s, v in enumerate(picks[i]):
            model.AddHint(v, s == st.k[g])
    return model, picks


def _window_memory(st: GroupState, window: list[int], picks, model: cp_model.CpModel) -> None:
    """Fixed groups' usage is a per-step background; one row per distinct live signature
    (which segment of which window group is live) with the tightest budget over the steps it
    covers, kept only when the window's highest usages could exceed it."""
    gp = st.gp
    n_steps = gp.tl.n_steps
    diff = np.zeros(n_steps + 1, dtype=np.int64)
    segs = []  # (start, end, window index, segment index)
    for i, g in enumerate(window):
        W = gp.W[g]
        if not len(W):
            continue
        cur = W[:, st.k[g]]
        np.add.at(diff, gp.seg_start[g], cur)
        np.add.at(diff, gp.seg_end[g], -cur)
        for j, (a, b) in enumerate(zip(gp.seg_start[g], gp.seg_end[g])):
            segs.append((int(a), int(b), i, j))
    if not segs:
        return
    bg = st.prof - np.cumsum(diff)[:n_steps]
    pts = sorted({p for a, b, _, _ in segs for p in (a, b)})
    # sweep: live segments between consecutive points
    starts: dict[int, list] = {}
    ends: dict[int, list] = {}
    for sg in segs:
        starts.setdefault(sg[0], []).append(sg)
        ends.setdefault(sg[1], []).append(sg)
    live: dict[tuple[int, int], None] = {}
    rows: dict[tuple, int] = {}
    for p, q in zip(pts[:-1], pts[1:]):
        for sg in ends.get(p, []):
            live.pop((sg[2], sg[3]), None)
        for sg in starts.get(p, []):
            live[(sg[2], sg[3])] = None
        if not live:
            continue
        sig = tuple(sorted(live))
        budget = st.limit - int(bg[p:q].max())
        if sig not in rows or budget < rows[sig]:
            rows[sig] = budget
    for sig, budget in rows.items():
        lows = highs = 0
        for i, j in sig:
            w = gp.W[window[i]][j]
            lows += int(w.min())
            highs += int(w.max())
        if highs <= budget:
            continue
        vs, cs = [], []
        for i, j in sig:
            w = gp.W[window[i]][j]
            m = int(w.min())
            for s in np.flatnonzero(w > m):
                vs.append(picks[i][int(s)])
                cs.append(int(w[s] - m))
        model.Add(cp_model.LinearExpr.WeightedSum(vs, cs) <= budget - lows)


def _ball(st: GroupState, seeds: list[int], size: int, rng: random.Random,
          max_terms: Optional[float] = None) -> list[int]:
    """Breadth-first ball around the seeds: at most `size` groups and (when given) about
    `max_terms` pair terms inside (the model size, not the group count, sets solve time)."""
    seen = set(seeds)
    frontier = list(seeds)
    out = list(seeds)
    terms = 0
    edges = st.gp.edges
    while frontier and len(out) < size:
        nxt = []
        rng.shuffle(frontier)
        for x in frontier:
            for y, _ in st.inc[x]:
                if y in seen:
                    continue
                if max_terms is not None:
                    add = sum(st.reduced_terms(e) for e in st.inc_e[y]
                              if (edges[e][0] if edges[e][1] == y else edges[e][1]) in seen)
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


def _costly_group(st: GroupState, rng: random.Random) -> int:
    """A group drawn with probability proportional to the square root of what it and its
    incident edges cost under the current choice."""
    gp = st.gp
    w = np.array([st.cost[g][st.k[g]] for g in range(gp.num_groups)])
    for (a, b), t in zip(gp.edges, gp.tables):
        c = float(t[st.k[a], st.k[b]])
        w[a] += c / 2
        w[b] += c / 2
    w = np.sqrt(np.maximum(w, 0)) + 1e-9
    return int(min(len(w) - 1, np.searchsorted(np.cumsum(w), rng.random() * w.sum())))


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
             full_pair_limit: int = 400_000, time_share: float = 0.3,
             window_terms: int = 20_000, merge: bool = True, kick_share: float = 0.6,
             kick_batch: float = 2.0, kick_slack: float = 0.01,
             lagrangian_share: float = 0.25, polish_starts: int = 3,
             polish_share: float = 0.15, stagnation: float = 0.12) -> SearchResult:
    """Best feasible choice found within `time_limit_s` (wall clock, all phases)."""
    t_start = time.perf_counter()
    deadline = t_start + time_limit_s
    say = log or (lambda s: None)
    rng = random.Random(seed)
    big = problem.num_nodes > 5000
    red = presolve(problem, prune_dominated=not big, max_rounds=6 if not big else 1)
    gp = group_problem(problem, red, merge_followers=merge)
    say(f"presolve {time.perf_counter() - t_start:.1f}s, {red.num_strategies} strategies kept, "
        f"{gp.num_groups} groups ({gp.merged_followers} followers merged, {gp.folded_single} edges folded)")
    stats: dict = {"presolve_s": round(time.perf_counter() - t_start, 2),
                   "strategies_kept": red.num_strategies, "groups": gp.num_groups,
                   "group_edges": len(gp.edges)}
    best_state, best_cost = None, None
    best_penalty: Optional[np.ndarray] = None  # the Lagrangian penalties of the best start
    n_starts = 0

    def consider(name: str, ch: list[int], budget: float) -> bool:
        nonlocal best_state, best_cost, n_starts
        t_s = time.perf_counter()
        st = GroupState(gp, ch)
        if not st.repair(min(deadline, t_s + budget)):
            say(f"start {name}: memory repair failed")
            return False
        st.descent(min(deadline, time.perf_counter() + budget))
        n_starts += 1
        if best_cost is not None and st.cur >= best_cost:
            return False
        ev = evaluate(problem, gp.expand(st.k))
        say(f"start {name}: {ev.cost if ev.feasible else 'infeasible ' + ev.reason} "
            f"({time.perf_counter() - t_s:.1f}s)")
        if ev.feasible and (best_cost is None or ev.cost < best_cost):
            best_state, best_cost = st, ev.cost
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
        if consider(name, list(st.k), budget):
            best_penalty = pen

    # the feasibility-first start (always memory-feasible when each node alone fits)
    consider("least-peak", least_peak_start(gp), 0.2 * time_limit_s)
    # min-sum message passing under Lagrangian usage penalties (three step sizes), each
    # decoded choice repaired and descended
    lag_deadline = time.perf_counter() + lagrangian_share * time_limit_s
    # trajectories: step sizes, then sweep orders breadth-first from random groups (the
    # decoding order changes which local optimum min-sum lands in: V 2.24-2.36 M)
    configs = [(0.01, None), (0.003, None), (0.03, None)]
    configs += [(0.01, "bfs")] * 20
    for traj, (step, order) in enumerate(configs):
        if time.perf_counter() > lag_deadline:
            break
        if order == "bfs":
            order = bfs_order(gp, rng.randrange(gp.num_groups))
        for k, over, pen in lagrangian_starts(gp, lag_deadline, step=step, order=order):
            if over <= 0.1:  # far over the limit (no penalty yet): a long repair, skipped
                consider_pooled(f"lagrangian {step}", k, 0.05 * time_limit_s, traj, pen)
    if problem.num_nodes <= 2000 and time.perf_counter() < lag_deadline:
        # the core's older local search (ratio repair from the node DP start)
        ls = local_search(problem, red, start=tree_dp_start(problem, red))
        if ls is not None:
            consider("node DP + local_search", gp.contract(ls, red), 0.05 * time_limit_s)
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
        ev = evaluate(problem, gp.expand(st_p.k))
        if ev.feasible and ev.cost < best_cost:
            best_state, best_cost, best_penalty = st_p, ev.cost, pen
        stats["polished"] = [int(x[0]) for x in polished]
        say(f"polished {len(top)} starts: {[int(x[0]) for x in polished]} "
            f"({time.perf_counter() - t_p:.1f}s)")
    stats["start_s"] = round(time.perf_counter() - t_start, 2)
    bound = float(trivial_bound(problem, red))
    if best_state is None:
        return SearchResult(None, None, False, bound, time.perf_counter() - t_start, stats)
    st = best_state
    cur_cost = best_cost
    G = gp.num_groups
    size = min(window, G)
    iters = accepted = 0
    status_counts: dict[str, int] = {}
    terms_cap = float(window_terms)
    pair_terms = sum(st.reduced_terms(e) for e in range(len(gp.tables)))
    use_full = full_share > 0 and pair_terms <= full_pair_limit
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

    def credit(name: str, gain: float, secs: float) -> None:
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
    while time.perf_counter() < lns_deadline - 0.2:
        if cur_cost < kept_cost:
            kept_choice, kept_cost = list(st.k), cur_cost
        if cur_cost < last_cost_seen:
            last_gain = time.perf_counter()
        last_cost_seen = cur_cost
        if alternatives and time.perf_counter() - last_gain > stagnation * time_limit_s:
            st, best_penalty = alternatives.pop(0)
            cur_cost = evaluate(problem, gp.expand(st.k)).cost
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
            ev = evaluate(problem, gp.expand(st.k))
            if not ev.feasible or ev.cost > cur_cost:  # never: moves keep memory, cost exact
                raise AssertionError(f"{choice_arm} search broke the incumbent: {ev.reason or ev.cost}")
            cur_cost = ev.cost
            credit(choice_arm, cost_it - cur_cost, time.perf_counter() - t_it)
            continue
        iters += 1
        if st.has_limit and rng.random() < time_share and len(st.all_s):
            t = rng.randrange(tl.n_steps)
            live = sorted(set(st.all_g[(st.all_s <= t) & (st.all_e > t)].tolist()))
            rng.shuffle(live)
            seeds = live[: max(1, size // 4)] or [rng.randrange(G)]
        elif rng.random() < 0.6:
            seeds = [_costly_group(st, rng)]
        else:
            seeds = [rng.randrange(G)]
        win = _ball(st, seeds, size, rng, max_terms=terms_cap)
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
            st.descent(deadline, groups=_ball(st, win, min(G, 2 * size), rng), max_passes=3)
            ev = evaluate(problem, gp.expand(st.k))
            if ev.feasible and ev.cost <= cur_cost:
                if ev.cost < cur_cost:
                    accepted += 1
                cur_cost = ev.cost
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
    stats.update(kicks=kick_stats[0], kick_improvements=kick_stats[1], kick_s=round(kick_stats[2], 1),
                 minsum_windows=ms_stats[0], minsum_improvements=ms_stats[1], minsum_s=round(ms_stats[2], 1))
    stats.update(lns_status=status_counts, final_terms=int(terms_cap), lns_iterations=iters,
                 lns_improvements=accepted, final_window=size, lns_cost=cur_cost)
    stats["restarts"] = restarts
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
        stats.update(full_status=solver.StatusName(status), full_s=round(time.perf_counter() - t_full, 1))
        say(f"full grouped model: {solver.StatusName(status)}, cost {cur_cost}")
    choice = gp.expand(st.k)
    ev = evaluate(problem, choice)
    return SearchResult(choice, ev.cost, ev.feasible, bound, time.perf_counter() - t_start, stats)
