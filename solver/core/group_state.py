"""A complete choice over the groups of a merged problem with its usage profile, for fast
single-group moves (incremental cost and memory deltas, a journal to undo), best-improvement
descent and memory repair; and the neighbourhoods the moves draw from (`ball`,
`costly_group`)."""
from __future__ import annotations

import random
import time
from typing import Optional, Sequence

import numpy as np

from solver.core.clock import check_deadline
from solver.core.merge import GroupedProblem
from solver.core.problem import FORBIDDEN_COST

INF = float("inf")


def shared_tables(gp: GroupedProblem, deadline: Optional[float] = None) -> tuple:
    """What every GroupState of `gp` shares (float tables, incidence, segment steps), built
    once and cached on `gp`; OutOfTime past `deadline`."""
    cached = getattr(gp, "_state_shared", None)
    if cached is not None:
        return cached
    G = gp.num_groups
    inc: list[list[tuple[int, np.ndarray]]] = [[] for _ in range(G)]
    inc_e: list[list[int]] = [[] for _ in range(G)]
    ftables: list[np.ndarray] = []
    for e, ((a, b), t) in enumerate(zip(gp.edges, gp.tables)):
        if e % 256 == 0:
            check_deadline(deadline)
        tf = t.astype(np.float64)
        tf[t >= FORBIDDEN_COST] = INF
        ftables.append(tf)
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
    # ftables[e]: edge e's float table (inf forbidden), the one copy min-sum uses too
    shared = (inc, inc_e, {}, cost, steps, offs, wmin, all_g, all_j, all_s, all_e, ftables)
    gp._state_shared = shared  # type: ignore[attr-defined]
    return shared


class GroupState:
    """A complete group choice with its usage profile on the compressed timeline, for fast
    single-group move evaluation (cost rows against the neighbours' current choices, memory
    as the peak over each of the group's segments)."""

    def __init__(self, gp: GroupedProblem, choice: Sequence[int]):
        self.gp = gp
        # what does not depend on the choice is built once per grouped problem and shared by
        # every state (on S the float tables alone are tens of MB per state)
        shared = shared_tables(gp)
        self.inc, self.inc_e, self._reduced, self.cost, self.steps, self.offs, self.Wmin, \
            self.all_g, self.all_j, self.all_s, self.all_e = shared[:11]
        self.k = np.array([int(s) for s in choice], dtype=np.int64)
        self.limit = gp.limit
        self.has_limit = gp.limit is not None and gp.tl.n_steps > 0
        self.prof = gp.profile(self.k) if self.has_limit else np.zeros(0, np.int64)
        self.journal: Optional[list[tuple[int, int]]] = None
        # kept up to date by move(): the cost (inf while a forbidden entry is chosen) from
        # the finite terms' sum and the count of forbidden ones
        self.finite, self.n_forbidden = self._count()
        self.cur = INF if self.n_forbidden else self.finite

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
        return self.k.copy(), self.prof.copy(), self.cur, self.finite, self.n_forbidden

    def restore(self, saved) -> None:
        """Back to a `copy_choice` (or to a (choice, profile, cost) triple: recounted)."""
        self.k, self.prof = saved[0].copy(), saved[1].copy()
        if len(saved) == 5:
            self.cur, self.finite, self.n_forbidden = saved[2], saved[3], saved[4]
        else:
            self.finite, self.n_forbidden = self._count()
            self.cur = INF if self.n_forbidden else self.finite

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

    def _terms(self, g: int, s: int) -> tuple[float, int]:
        """What g on strategy s contributes against its neighbours' current strategies: the
        sum of the finite terms and the number of forbidden ones."""
        c = self.cost[g][s]
        fin, bad = (0.0, 1) if c == INF else (float(c), 0)
        for o, t in self.inc[g]:
            x = t[s, self.k[o]]
            if x == INF:
                bad += 1
            else:
                fin += x
        return fin, bad

    def move(self, g: int, s: int) -> None:
        if self.journal is not None:
            self.journal.append((g, int(self.k[g])))
        if s != self.k[g]:
            lc = self.local_cost(g)
            delta = lc[s] - lc[self.k[g]]
            if np.isfinite(delta) and not self.n_forbidden:
                self.cur += delta
                self.finite += delta
            else:
                # into or out of a forbidden state: count forbidden terms, sum finite ones
                # (a recount of every edge cost O(edges) per move on 40k-node instances)
                f0, b0 = self._terms(g, int(self.k[g]))
                f1, b1 = self._terms(g, s)
                self.finite += f1 - f0
                self.n_forbidden += b1 - b0
                self.cur = INF if self.n_forbidden else self.finite
        if self.has_limit:
            W = self.gp.W[g]
            if len(W):
                d = W[:, s] - W[:, self.k[g]]
                for j in np.flatnonzero(d):
                    self.prof[self.gp.seg_start[g][j]:self.gp.seg_end[g][j]] += d[j]
        self.k[g] = s

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
        return INF if self._count()[1] else self._count()[0]

    def _count(self) -> tuple[float, int]:
        """The finite terms' sum and the number of forbidden terms of the current choice."""
        k = self.k
        fin, bad = 0.0, 0
        for g, s in enumerate(k):
            c = int(self.gp.cost[g][s])
            if c >= FORBIDDEN_COST:
                bad += 1
            else:
                fin += c
        for (a, b), t in zip(self.gp.edges, self.gp.tables):
            c = int(t[k[a], k[b]])
            if c >= FORBIDDEN_COST:
                bad += 1
            else:
                fin += c
        return fin, bad

    def descent(self, deadline: float, groups: Optional[Sequence[int]] = None, max_passes: int = 50) -> int:
        """Best-improvement single-group moves that keep memory feasible, until none
        improves (or the deadline). Returns the number of moves made."""
        moves = 0
        fits = self.feasible_memory()  # kept: every move below keeps memory feasible
        order = list(groups) if groups is not None else list(range(self.gp.num_groups))
        dirty = set(order)
        for _ in range(max_passes):
            if not dirty or time.perf_counter() > deadline:
                break
            todo = [g for g in order if g in dirty]
            dirty = set()
            for i, g in enumerate(todo):
                if len(self.cost[g]) < 2:
                    continue
                if i % 64 == 0 and time.perf_counter() > deadline:
                    return moves
                lc = self.local_cost(g)
                if not (lc < lc[self.k[g]]).any():
                    continue  # no cheaper strategy: the memory check (the costly part) is moot
                s = int(np.argmin(lc))
                W = self.gp.W[g]
                # from a feasible state a move that raises no segment stays feasible; only
                # a rising one needs the peaks over g's segments
                if not (fits and (not len(W) or (W[:, s] <= W[:, self.k[g]]).all())):
                    lc = np.where(self.memory_ok(g), lc, INF)
                    s = int(np.argmin(lc))
                if lc[s] < lc[self.k[g]]:
                    self.move(g, s)
                    moves += 1
                    dirty.update(o for o, _ in self.inc[g])
                    dirty.add(g)
        return moves

    def group_weights(self) -> np.ndarray:
        """Per group: its own cost plus half of each incident edge's, under the current
        choice (forbidden entries count 1e18). Kept between calls and updated only where the
        choice changed since (a recount was O(groups + edges) Python steps per draw: 27 ms
        on S, a quarter of a kick)."""
        gp = self.gp
        cache = getattr(self, "_weights", None)
        if cache is None:
            E = len(gp.edges)
            ends = np.array(gp.edges, dtype=np.int64).reshape(E, 2)
            node = np.array([min(float(c[s]), FORBIDDEN_COST) for c, s in zip(self.cost, self.k)])
            edge = np.array([float(t[self.k[a], self.k[b]]) for (a, b), t in zip(gp.edges, gp.tables)])
            cache = self._weights = [self.k.copy(), node, edge, ends]
        seen_k, node, edge, ends = cache
        changed = np.flatnonzero(seen_k != self.k)
        if len(changed):
            touched = set()
            for g in changed.tolist():
                node[g] = min(float(self.cost[g][self.k[g]]), FORBIDDEN_COST)
                touched.update(self.inc_e[g])
            for e in touched:
                a, b = gp.edges[e]
                edge[e] = float(gp.tables[e][self.k[a], self.k[b]])
            seen_k[changed] = self.k[changed]
        G = gp.num_groups
        half = edge / 2
        return node + np.bincount(ends[:, 0], half, G) + np.bincount(ends[:, 1], half, G)

    def _rise_ok(self, g: int) -> np.ndarray:
        """Per strategy of g: it raises none of g's segments above the limit."""
        W = self.gp.W[g]
        rise = W - W[:, self.k[g]][:, None]
        up = rise > 0
        if not up.any():  # no strategy raises a segment: the peaks (the costly part) are moot
            return np.ones(W.shape[1], dtype=bool)
        segmax = np.maximum.reduceat(self.prof[self.steps[g]], self.offs[g])
        return ~(up & ((segmax[:, None] + rise) > self.limit)).any(axis=0)

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


def ball(st: GroupState, seeds: list[int], size: int, rng: random.Random,
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


def costly_group(st: GroupState, rng: random.Random) -> int:
    """A group drawn with probability proportional to the square root of what it and its
    incident edges cost under the current choice."""
    w = st.group_weights()
    w = np.sqrt(np.maximum(w, 0)) + 1e-9
    return int(min(len(w) - 1, np.searchsorted(np.cumsum(w), rng.random() * w.sum())))
