"""Node merging for strategy problems: followers and single-strategy nodes.

A node b *follows* a neighbour a when, over the kept strategies, every strategy of a allows
exactly one strategy of b on their edge (all other entries forbidden): b's choice is a
function f of a's. Such a b is merged into a: the group's strategies are a's, b's node cost
and the edge entry become part of the group's cost, b's other edges are re-indexed through f
and summed with any edge the group already has to the same neighbour. Merging repeats on the
group graph (a group can follow another group), so chains of followers collapse into one
group. A node (or group) with a single strategy folds each of its edges into its neighbour's
cost and keeps only its (constant) memory usage.

Memory stays exact: every member keeps its own live interval. A group's usage on the
compressed timeline is piecewise constant over its *segments* (the pieces between its
members' interval end points); `GroupedProblem.seg_*` and `W[g]` (segments x strategies)
describe it, so a group move changes the usage profile segment by segment.

`GroupedProblem.expand(choice)` maps one strategy per group back to one original strategy
per node; its cost under the original evaluator equals `cost_of(choice)` (tested).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from solver.core.clock import check_deadline
from solver.core.reduction import Reduction
from solver.core.problem import FORBIDDEN_COST, StrategyProblem
from solver.core.timeline import Timeline

F = FORBIDDEN_COST


def _sat(x: np.ndarray) -> np.ndarray:
    return np.minimum(x, F)


@dataclass
class GroupedProblem:
    problem: StrategyProblem
    members: list[np.ndarray]          # original node ids of each group (root first)
    maps: list[np.ndarray]             # (members, K_g): original strategy of each member
    cost: list[np.ndarray]             # (K_g,) int64: member node costs + internal edges
    edges: list[tuple[int, int]]       # group edges (a < b)
    tables: list[np.ndarray]           # (K_a, K_b) int64, >= F forbidden
    group_of: np.ndarray               # original node -> group
    tl: Timeline                       # compressed timeline of the original intervals
    seg_start: list[np.ndarray]        # per group: its segments on the compressed timeline
    seg_end: list[np.ndarray]
    W: list[np.ndarray]                # per group: (segments, K_g) usage of live members
    limit: Optional[int]
    merged_followers: int = 0
    folded_single: int = 0

    @property
    def num_groups(self) -> int:
        return len(self.cost)

    def sizes(self) -> np.ndarray:
        return np.array([len(c) for c in self.cost])

    def expand(self, choice: Sequence[int]) -> list[int]:
        out = [0] * len(self.group_of)
        for g, s in enumerate(choice):
            col = self.maps[g][:, int(s)]
            for m, x in zip(self.members[g], col):
                out[int(m)] = int(x)
        return out

    def contract(self, original: Sequence[int], red: Reduction) -> list[int]:
        """A group choice from an original one: each group takes the strategy whose root
        strategy matches the (kept) root choice; the closest one otherwise."""
        out = []
        for g in range(self.num_groups):
            root = int(self.members[g][0])
            s = int(red.replaced_by[root][int(original[root])])
            hits = np.flatnonzero(self.maps[g][0] == s)
            if len(hits) == 0:
                # the root strategy was pruned during merging: take the cheapest
                hits = [int(np.argmin(self.cost[g]))]
            if len(hits) > 1:
                # several group strategies share the root's (cannot happen for a root, kept
                # for safety): pick the one agreeing with most members
                agree = [(self.maps[g][:, h] == np.array([original[int(m)] for m in self.members[g]])).sum()
                         for h in hits]
                hits = [hits[int(np.argmax(agree))]]
            out.append(int(hits[0]))
        return out

    def cost_of(self, choice: Sequence[int]) -> int:
        c = sum(int(self.cost[g][int(s)]) for g, s in enumerate(choice))
        for (a, b), t in zip(self.edges, self.tables):
            c += int(t[int(choice[a]), int(choice[b])])
        return c

    def profile(self, choice: Sequence[int]) -> np.ndarray:
        """Usage at every compressed step under a group choice (exact int64)."""
        flat = getattr(self, "_flat_segments", None)
        if flat is None:
            # every segment of every group: its group, steps, and where its row starts in
            # the concatenated usage tables (a Python step per group was 57 ms on S)
            sizes = np.array([W.size for W in self.W], dtype=np.int64)
            woff = np.cumsum(sizes) - sizes
            seg_g = np.concatenate([np.full(len(x), g, dtype=np.int64) for g, x in enumerate(self.seg_start)]
                                   or [np.zeros(0, np.int64)])
            seg_j = np.concatenate([np.arange(len(x), dtype=np.int64) for x in self.seg_start] or [np.zeros(0, np.int64)])
            K = np.array([W.shape[1] for W in self.W], dtype=np.int64)
            flat = self._flat_segments = (
                seg_g, woff[seg_g] + seg_j * K[seg_g],
                np.concatenate([np.asarray(x, np.int64) for x in self.seg_start] or [np.zeros(0, np.int64)]),
                np.concatenate([np.asarray(x, np.int64) for x in self.seg_end] or [np.zeros(0, np.int64)]),
                np.concatenate([W.ravel() for W in self.W] or [np.zeros(0, np.int64)]).astype(np.int64))
        seg_g, row, s_start, s_end, wflat = flat
        k = np.asarray(choice, dtype=np.int64)
        w = wflat[row + k[seg_g]]
        diff = np.zeros(self.tl.n_steps + 1, dtype=np.int64)
        np.add.at(diff, s_start, w)
        np.add.at(diff, s_end, -w)
        return np.cumsum(diff)[: self.tl.n_steps]


def group_problem(problem: StrategyProblem, red: Reduction, merge_followers: bool = True,
                  max_members: int = 4096, deadline: Optional[float] = None) -> GroupedProblem:
    """Merge followers and fold single-strategy nodes over the kept strategies of `red`.
    `deadline` (perf_counter seconds): raise OutOfTime once it has passed."""
    n = problem.num_nodes
    alive = red.alive
    members: dict[int, list[int]] = {x: [x] for x in range(n)}
    maps: dict[int, np.ndarray] = {x: alive[x][None, :].astype(np.int64) for x in range(n)}
    cost: dict[int, np.ndarray] = {x: problem.node_costs[x][alive[x]].astype(np.int64) for x in range(n)}
    E: dict[tuple[int, int], np.ndarray] = {}
    adj: dict[int, set[int]] = {x: set() for x in range(n)}

    # per table: does it forbid anything (tables that do not cannot prune a strategy;
    # most do not, and checking them on every prune dominated merging on 40k nodes)
    forbids: dict[tuple[int, int], bool] = {}
    # dirty[a]: neighbours whose table with a changed since a's rows were last checked
    # against it (a created or summed table, or strategies of the neighbour removed); a
    # prune checks only those (a hub of S with 830 neighbours was re-checked against all of
    # them after every follower merged into it: 12 of 16 s of merging)
    dirty: dict[int, set[int]] = {}

    def add_edge(a: int, b: int, t: np.ndarray) -> None:
        if a > b:
            a, b, t = b, a, t.T
        key = (a, b)
        if key in E:
            E[key] = _sat(E[key] + t)
        else:
            E[key] = np.ascontiguousarray(t)
        forbids[key] = bool((E[key] >= F).any())
        adj[a].add(b)
        adj[b].add(a)
        dirty.setdefault(a, set()).add(b)
        dirty.setdefault(b, set()).add(a)

    def oriented(a: int, b: int) -> np.ndarray:
        return E[(a, b)] if a < b else E[(b, a)].T

    def pop_edge(a: int, b: int) -> np.ndarray:
        t = oriented(a, b)
        del E[(min(a, b), max(a, b))], forbids[(min(a, b), max(a, b))]
        adj[a].discard(b)
        adj[b].discard(a)
        return t

    for e, (u, v) in enumerate(problem.edges):
        if u == v:
            t = problem.edge_costs[e][np.ix_(alive[u], alive[u])]
            cost[u] = _sat(cost[u] + np.diagonal(t))
            continue
        t = problem.edge_costs[e]
        if len(alive[u]) < t.shape[0] or len(alive[v]) < t.shape[1]:
            t = t[np.ix_(alive[u], alive[v])]
        add_edge(u, v, t)  # the problem's own table when nothing was removed (never written to)

    queue: list[tuple[int, int]] = list(E.keys())
    merged = folded = 0

    def restrict(a: int, keep: np.ndarray) -> None:
        """Drop strategies of group a (and the matching rows of its tables)."""
        maps[a] = maps[a][:, keep]
        cost[a] = cost[a][keep]
        for c in list(adj[a]):
            if a < c:
                E[(a, c)] = E[(a, c)][keep, :]
            else:
                E[(c, a)] = E[(c, a)][:, keep]
            key = (min(a, c), max(a, c))
            forbids[key] = forbids[key] and bool((E[key] >= F).any())
            queue.append((min(a, c), max(a, c)))
            dirty.setdefault(c, set()).add(a)  # c's rows lost entries of this table

    def prune(start: int) -> None:
        todo = [start]
        while todo:
            a = todo.pop()
            if a not in cost:
                continue
            keep = cost[a] < F
            for c in dirty.pop(a, ()):
                if c in adj[a] and forbids[(min(a, c), max(a, c))]:
                    keep &= (oriented(a, c) < F).any(axis=1)
            if not keep.all():
                if not keep.any():
                    raise ValueError(f"node {members[a][0]}: every strategy is forbidden after merging")
                restrict(a, keep)
                todo.extend(adj[a])

    for a in list(cost):
        check_deadline(deadline)
        prune(a)
    while queue:
        check_deadline(deadline)
        key = queue.pop()
        if key not in E:
            continue
        a, b = key
        t = E[key]
        if t.shape[0] == 1 or t.shape[1] == 1:
            # a single-strategy end: the table is a cost of the other end
            if t.shape[1] == 1:
                cost[a] = _sat(cost[a] + pop_edge(a, b)[:, 0])
                prune(a)
            else:
                cost[b] = _sat(cost[b] + pop_edge(b, a)[:, 0])
                prune(b)
            folded += 1
            continue
        if not merge_followers or not forbids[key]:
            continue  # a table without forbidden entries makes no follower (two strategies each)
        fin = t < F
        if (fin.sum(axis=1) == 1).all() and len(members[a]) + len(members[b]) <= max_members:
            leader, follower, f = a, b, np.argmax(fin, axis=1)
        elif (fin.sum(axis=0) == 1).all() and len(members[a]) + len(members[b]) <= max_members:
            leader, follower, f = b, a, np.argmax(fin, axis=0)
        else:
            continue
        tab = pop_edge(leader, follower)  # (K_leader, K_follower)
        idx = np.arange(len(f))
        cost[leader] = _sat(cost[leader] + cost[follower][f] + tab[idx, f])
        members[leader].extend(members[follower])
        maps[leader] = np.vstack([maps[leader], maps[follower][:, f]])
        for c in list(adj[follower]):
            tc = pop_edge(follower, c)[f, :]
            add_edge(leader, c, tc)
            queue.append((min(leader, c), max(leader, c)))
        del members[follower], maps[follower], cost[follower], adj[follower]
        dirty.pop(follower, None)
        merged += 1
        prune(leader)
    # renumber the live groups
    ids = sorted(cost)
    index = {g: i for i, g in enumerate(ids)}
    group_of = np.zeros(n, dtype=np.int64)
    for g in ids:
        for m in members[g]:
            group_of[m] = index[g]
    edges, tables = [], []
    for (a, b), t in E.items():
        edges.append((index[a], index[b]))
        tables.append(t)
    tl = red.timeline or Timeline.build(problem.intervals)
    seg_start, seg_end, W = [], [], []
    for g in ids:
        check_deadline(deadline)
        ms = np.array(members[g])
        s, e = tl.start[ms], tl.end[ms]
        live = e > s
        if not live.any():
            seg_start.append(np.zeros(0, np.int64))
            seg_end.append(np.zeros(0, np.int64))
            W.append(np.zeros((0, len(cost[g])), np.int64))
            continue
        use = np.stack([problem.node_usages[int(m)][maps[g][i]] for i, m in enumerate(ms)])
        s, e, use = s[live], e[live], use[live]
        pts = np.unique(np.concatenate([s, e]))
        lo, hi = pts[:-1], pts[1:]
        # usage per segment by running sums over the members' start and end points
        # (O((segments + members) x strategies); a segments x members cover matrix was
        # quadratic in a long follower chain)
        i_s, i_e = np.searchsorted(pts, s), np.searchsorted(pts, e)
        diff = np.zeros((len(pts), use.shape[1]), dtype=np.int64)
        np.add.at(diff, i_s, use)
        np.add.at(diff, i_e, -use)
        count = np.zeros(len(pts), dtype=np.int64)
        np.add.at(count, i_s, 1)
        np.add.at(count, i_e, -1)
        keep = np.cumsum(count)[:-1] > 0
        seg_start.append(lo[keep])
        seg_end.append(hi[keep])
        W.append(np.cumsum(diff, axis=0)[:-1][keep])
    return GroupedProblem(problem, [np.array(members[g]) for g in ids], [maps[g] for g in ids],
                          [cost[g] for g in ids], edges, tables, group_of, tl, seg_start, seg_end,
                          W, problem.usage_limit, merged, folded)
