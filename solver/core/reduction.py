"""Presolve of a strategy problem: forbidden and dominated strategies removed (iterated to
a fixpoint), the compressed steps where the usage limit may bind, and (while small) one
memory row per maximal live set that can bind."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from solver.core.clock import check_deadline
from solver.core.problem import FORBIDDEN_COST, StrategyProblem
from solver.core.timeline import Timeline, maximal_live_sets

# Up to this many (node, live set) memberships, memory is one explicit row per maximal live
# set; beyond it (28k-node instances have tens of millions) a running-sum chain.
ROW_MEMBERSHIP_LIMIT = 2_000_000



@dataclass
class Reduction:
    """What survives presolve. alive[n] lists original strategy indices kept;
    replaced_by[n][s] maps every original strategy to a kept one that is no worse."""

    alive: list[np.ndarray]
    replaced_by: list[np.ndarray]
    memory_rows: list[list[int]]  # node lists of the maximal live sets that may bind
    removed_forbidden: int = 0
    removed_dominated: int = 0
    timeline: Optional["Timeline"] = None
    binding: Optional[np.ndarray] = None   # per compressed step: the limit may bind there
    base_usage: Optional[np.ndarray] = None  # per compressed step: sum of minimum usages

    @property
    def memory_terms(self) -> int:
        """Rows in the model: explicit maximal live sets, or binding steps of the chain."""
        if self.memory_rows:
            return len(self.memory_rows)
        return int(self.binding.sum()) if self.binding is not None else 0

    @property
    def num_strategies(self) -> int:
        return int(sum(len(a) for a in self.alive))


def presolve(problem: StrategyProblem, prune_dominated: bool = True,
             max_rounds: int = 6, deadline: Optional[float] = None) -> Reduction:
    """`deadline` (perf_counter seconds): raise OutOfTime once it has passed (checked before
    each setup step too: on a loaded machine the setup alone took 5 s on 50k nodes)."""
    check_deadline(deadline)
    n_nodes = problem.num_nodes
    alive = [np.flatnonzero(c < FORBIDDEN_COST) for c in problem.node_costs]
    timeline = Timeline.build(problem.intervals)
    in_memory = np.zeros(n_nodes, dtype=bool)
    if problem.usage_limit is not None and timeline.n_steps:
        # a node matters for memory only if it is live where the limit could bind
        worst = timeline.profile(np.array([int(problem.node_usages[n][a].max()) for n, a in enumerate(alive)]
                                          if all(len(a) for a in alive) else [0] * n_nodes))
        hot = np.concatenate([[0], np.cumsum(worst > problem.usage_limit)])
        in_memory = hot[timeline.end] - hot[timeline.start] > 0
    removed_forbidden = sum(len(c) for c in problem.node_costs) - sum(len(a) for a in alive)
    if any(len(a) == 0 for a in alive):
        raise ValueError("a node has no allowed strategy: the problem is infeasible")
    check_deadline(deadline)
    incident: list[list[tuple[int, bool]]] = [[] for _ in range(n_nodes)]
    for e, (u, v) in enumerate(problem.edges):
        incident[u].append((e, True))
        incident[v].append((e, False))
    replaced_by = [np.arange(len(c)) for c in problem.node_costs]
    removed_dominated = 0

    def edge_rows(n: int, e: int, n_is_u: bool) -> np.ndarray:
        u, v = problem.edges[e]
        t = problem.edge_costs[e]
        if n_is_u:
            return t[np.ix_(alive[n], alive[v])]
        return t[np.ix_(alive[u], alive[n])].T

    # tables without a forbidden entry cannot forbid a row (most of them: skip their slicing)
    check_deadline(deadline)
    forbids = [bool((t >= FORBIDDEN_COST).any()) for t in problem.edge_costs]
    check_deadline(deadline)
    # a node's checks read only its own and its neighbours' kept strategies: a node none of
    # which changed since its last check would give the same answer again, so a round
    # visits only the nodes marked since (the same result as visiting all; V: most of the
    # rounds after the first touch a few nodes)
    dirty = np.ones(n_nodes, dtype=bool)

    def mark(n: int) -> None:
        dirty[n] = True
        for e, is_u in incident[n]:
            u, v = problem.edges[e]
            dirty[v if is_u else u] = True

    for _ in range(max_rounds):
        changed = False
        for n in range(n_nodes):
            if not dirty[n]:
                continue
            dirty[n] = False
            check_deadline(deadline)
            # a strategy whose row on some edge is entirely forbidden can never be picked
            keep = np.ones(len(alive[n]), dtype=bool)
            for e, is_u in incident[n]:
                if forbids[e]:
                    keep &= (edge_rows(n, e, is_u) < FORBIDDEN_COST).any(axis=1)
            if not keep.all():
                if not keep.any():
                    raise ValueError(f"node {n}: every strategy is forbidden by an edge")
                alive[n] = alive[n][keep]
                changed = True
                mark(n)
            if not prune_dominated or len(alive[n]) < 2:
                continue
            feats = [problem.node_costs[n][alive[n]][:, None]]
            if in_memory[n]:
                feats.append(problem.node_usages[n][alive[n]][:, None])
            feats.extend(edge_rows(n, e, is_u) for e, is_u in incident[n])
            f = np.concatenate(feats, axis=1)
            k = len(alive[n])
            dominated_by = -np.ones(k, dtype=np.int64)
            for i in range(k):
                le = (f <= f[i]).all(axis=1)
                le[i] = False
                # ties: the lower index survives
                strict = le & ((f != f[i]).any(axis=1) | (np.arange(k) < i))
                cand = np.flatnonzero(strict)
                cand = cand[dominated_by[cand] < 0]
                if len(cand):
                    dominated_by[i] = cand[0]
            if (dominated_by >= 0).any():
                for i in np.flatnonzero(dominated_by >= 0):
                    j = i
                    while dominated_by[j] >= 0:
                        j = dominated_by[j]
                    old = alive[n][i]
                    replaced_by[n][replaced_by[n] == old] = alive[n][j]
                removed_dominated += int((dominated_by >= 0).sum())
                alive[n] = alive[n][dominated_by < 0]
                changed = True
                mark(n)
        if not changed:
            break
    # strategies removed as forbidden map to the cheapest kept one (only hints use this)
    for n in range(n_nodes):
        if len(alive[n]) == len(replaced_by[n]):
            continue  # nothing removed: every strategy maps to itself
        kept = np.zeros(len(replaced_by[n]), dtype=bool)
        kept[alive[n]] = True
        gone = ~kept[replaced_by[n]]
        if gone.any():
            replaced_by[n][gone] = alive[n][np.argmin(problem.node_costs[n][alive[n]])]
    # memory: the compressed steps where even the worst choices could exceed the limit
    limit = problem.usage_limit
    binding = np.zeros(timeline.n_steps, dtype=bool)
    base = np.zeros(timeline.n_steps, dtype=np.int64)
    rows: list[list[int]] = []
    if limit is not None and timeline.n_steps:
        worst = timeline.profile(np.array([int(problem.node_usages[n][a].max()) for n, a in enumerate(alive)]))
        base = timeline.profile(np.array([int(problem.node_usages[n][a].min()) for n, a in enumerate(alive)]))
        binding = worst > limit
        # explicit rows (one per maximal live set that may bind) while they stay small;
        # otherwise the model uses a running-sum chain over the binding steps
        if int((timeline.end - timeline.start).sum()) <= ROW_MEMBERSHIP_LIMIT:
            for r in maximal_live_sets(problem.intervals):
                if sum(int(problem.node_usages[n][alive[n]].max()) for n in r) > limit:
                    rows.append(r)
    return Reduction(alive, replaced_by, rows, removed_forbidden, removed_dominated,
                     timeline, binding, base)
