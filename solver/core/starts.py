"""Starts on the original nodes (a complete starting point for a CP-SAT hint): min-sum DP
on a maximum spanning forest (memory ignored), and a local search (memory repair, then best
single-node moves) from it or from a greedy start."""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

from solver.core.reduction import Reduction
from solver.core.problem import FORBIDDEN_COST, StrategyProblem, evaluate
from solver.core.timeline import Timeline


def tree_dp_start(problem: StrategyProblem, reduction: Reduction) -> list[int]:
    """A starting choice that is optimal on a spanning forest of the edge graph, memory
    ignored: keep the edges whose tables vary most (a maximum spanning forest by cost
    range), then min-sum dynamic programming from the leaves up. Off-tree edges and the
    usage limit are left to the local search that follows."""
    n_nodes = problem.num_nodes
    alive = reduction.alive
    big = float(FORBIDDEN_COST)
    weight = []
    for e, ((u, v), t) in enumerate(zip(problem.edges, problem.edge_costs)):
        sub = t[np.ix_(alive[u], alive[v])].astype(np.float64)
        finite = sub[sub < big]
        weight.append((float(finite.max() - finite.min()) if finite.size else big, e))
    k = forest_min_sum(n_nodes, weight, lambda e: problem.edges[e],
                       lambda e: problem.edge_costs[e][np.ix_(alive[problem.edges[e][0]],
                                                              alive[problem.edges[e][1]])].astype(np.float64),
                       lambda x: problem.node_costs[x][alive[x]].astype(np.float64))
    return [int(alive[x][k[x]]) for x in range(n_nodes)]


def forest_min_sum(n: int, weights: Sequence[tuple[float, int]], ends: Callable[[int], tuple[int, int]],
                   table: Callable[[int], np.ndarray], node_cost: Callable[[int], np.ndarray]) -> list[int]:
    """Per node, the index into `node_cost(x)` of a choice that is optimal on a maximum
    spanning forest of the edges (`weights`: (weight, edge) pairs; Kruskal on them, heaviest
    first), memory ignored: min-sum dynamic programming from the leaves up, then the best
    choices from each root down. `table(e)` is edge e's cost matrix [strategy of its first
    end, strategy of its second]."""
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x
    adj: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    for _, e in sorted(weights, reverse=True):
        u, v = ends(e)
        ru, rv = find(u), find(v)
        if ru != rv:
            parent[ru] = rv
            adj[u].append((v, e))
            adj[v].append((u, e))
    choice = [0] * n
    seen = [False] * n
    for root in range(n):
        if seen[root]:
            continue
        order, par = [], {root: (-1, -1)}
        stack = [root]
        seen[root] = True
        while stack:
            x = stack.pop()
            order.append(x)
            for y, e in adj[x]:
                if not seen[y]:
                    seen[y] = True
                    par[y] = (x, e)
                    stack.append(y)
        cost = {x: node_cost(x) for x in order}
        best_child: dict[int, np.ndarray] = {}
        for x in reversed(order):
            p, e = par[x]
            if p < 0:
                continue
            t = table(e)
            t = t if ends(e)[0] == p else t.T
            m = t + cost[x][None, :]  # [parent strategy, child strategy]
            best_child[x] = np.argmin(m, axis=1)
            cost[p] = cost[p] + m.min(axis=1)
        k = {root: int(np.argmin(cost[root]))}
        for x in order:
            p, _ = par[x]
            if p >= 0:
                k[x] = int(best_child[x][k[p]])
            choice[x] = k[x]
    return choice


def local_search(problem: StrategyProblem, reduction: Reduction,
                 start: Optional[Sequence[int]] = None, max_passes: int = 30) -> Optional[list[int]]:
    """Iterated best single-node moves under the memory rows: start from `start` (or each
    node's cheapest kept strategy), repair memory by the cheapest usage-reducing moves, then
    move nodes to their best strategy given their neighbours until no move improves.
    Returns a feasible choice or None. CP-SAT gets it as a complete hint."""
    n_nodes = problem.num_nodes
    alive = reduction.alive
    big = FORBIDDEN_COST
    incident: list[list[tuple[int, bool]]] = [[] for _ in range(n_nodes)]
    for e, (u, v) in enumerate(problem.edges):
        incident[u].append((e, True))
        incident[v].append((e, False))
    tl = reduction.timeline or Timeline.build(problem.intervals)
    has_limit = problem.usage_limit is not None and tl.n_steps > 0
    if start is not None:
        choice = [int(reduction.replaced_by[n][int(s)]) for n, s in enumerate(start)]
    else:
        # greedy in node order (producers first in graph-derived instances): each node takes
        # the strategy cheapest with respect to its already placed neighbours
        choice = [-1] * n_nodes
        for n, a in enumerate(alive):
            c = problem.node_costs[n][a].astype(np.float64)
            for e, is_u in incident[n]:
                u, v = problem.edges[e]
                other = v if is_u else u
                if choice[other] < 0:
                    continue
                t = problem.edge_costs[e]
                c = c + (t[a, choice[v]] if is_u else t[choice[u], a])
            choice[n] = int(a[int(np.argmin(c))])

    def local_cost(n: int) -> np.ndarray:
        """Cost of each kept strategy of n given the neighbours' current choices."""
        a = alive[n]
        c = problem.node_costs[n][a].astype(np.float64)
        for e, is_u in incident[n]:
            u, v = problem.edges[e]
            t = problem.edge_costs[e]
            c = c + (t[a, choice[v]] if is_u else t[choice[u], a])
        return c

    limit = problem.usage_limit if problem.usage_limit is not None else 0
    prof = tl.profile(np.array([int(problem.node_usages[n][choice[n]]) for n in range(n_nodes)])) \
        if has_limit else np.zeros(0, dtype=np.int64)

    def move(n: int, s: int) -> None:
        delta = int(problem.node_usages[n][s] - problem.node_usages[n][choice[n]])
        if has_limit and delta:
            prof[tl.start[n]:tl.end[n]] += delta
        choice[n] = s

    # memory repair: while some step is over, take the move with the least cost increase
    # per byte saved among the nodes live at the worst step
    for _ in range(10 * n_nodes):
        if not has_limit or (prof <= limit).all():
            break
        worst = int(np.argmax(prof - limit))
        best = None
        for n in np.flatnonzero((tl.start <= worst) & (tl.end > worst)):
            a = alive[n]
            saved = problem.node_usages[n][choice[n]] - problem.node_usages[n][a]
            if not (saved > 0).any():
                continue
            lc = local_cost(n)
            here = lc[list(a).index(choice[n])]
            ratio = np.where(saved > 0, (lc - here) / np.maximum(saved, 1), np.inf)
            k = int(np.argmin(ratio))
            if best is None or ratio[k] < best[0]:
                best = (ratio[k], int(n), int(a[k]))
        if best is None:
            return None
        move(best[1], best[2])
    if has_limit and not (prof <= limit).all():
        return None
    for _ in range(max_passes):
        improved = False
        for n in range(n_nodes):
            a = alive[n]
            if len(a) < 2:
                continue
            lc = local_cost(n)
            cur_k = list(a).index(choice[n])
            if has_limit and tl.end[n] > tl.start[n]:
                delta = problem.node_usages[n][a] - problem.node_usages[n][choice[n]]
                peak = prof[tl.start[n]:tl.end[n]].max()
                lc = np.where(peak + delta <= limit, lc, np.inf)
            k = int(np.argmin(lc))
            if lc[k] < lc[cur_k]:
                move(n, int(a[k]))
                improved = True
        if not improved:
            break
    ev = evaluate(problem, choice)
    return choice if ev.feasible and ev.cost is not None and ev.cost < big else None


def best_start(problem: StrategyProblem, reduction: Reduction) -> Optional[list[int]]:
    """The better feasible result of the local search from its greedy start and from the
    spanning-forest DP start (None when neither repairs memory)."""
    found = []
    for start in (None, tree_dp_start(problem, reduction)):
        c = local_search(problem, reduction, start=start)
        if c is not None:
            found.append((evaluate(problem, c).cost, c))
    return min(found)[1] if found else None
