"""The strategy problem (XLA auto-sharding / IOPDDL): every node picks one strategy (node
cost, memory usage), every edge adds a cost from a table indexed by the strategies of its
two ends, and at every time step the usages of the nodes live then must stay within a
limit. `evaluate` is the reference check of a complete choice."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

# Entries at or above this are forbidden (IOPDDL encodes "impossible" as 1e18).
FORBIDDEN_COST = 10**18


@dataclass
class StrategyProblem:
    """node_costs[n][s], node_usages[n][s]; intervals[n] = [start, end) live time steps;
    edges[e] = (u, v) with edge_costs[e] of shape (len(node_costs[u]), len(node_costs[v]))."""

    node_costs: list[np.ndarray]
    node_usages: list[np.ndarray]
    intervals: list[tuple[int, int]]
    edges: list[tuple[int, int]]
    edge_costs: list[np.ndarray]
    usage_limit: Optional[int] = None
    name: str = ""

    def __post_init__(self) -> None:
        self.node_costs = [np.asarray(c, dtype=np.int64).reshape(-1) for c in self.node_costs]
        self.node_usages = [np.asarray(u, dtype=np.int64).reshape(-1) for u in self.node_usages]
        n = len(self.node_costs)
        if len(self.node_usages) != n or len(self.intervals) != n:
            raise ValueError("node_costs, node_usages and intervals differ in length")
        for i, (c, u) in enumerate(zip(self.node_costs, self.node_usages)):
            if len(c) == 0 or len(c) != len(u):
                raise ValueError(f"node {i}: needs >= 1 strategy and one usage per strategy")
        if len(self.edges) != len(self.edge_costs):
            raise ValueError("edges and edge_costs differ in length")
        fixed = []
        for e, ((u, v), table) in enumerate(zip(self.edges, self.edge_costs)):
            shape = (len(self.node_costs[u]), len(self.node_costs[v]))
            fixed.append(np.asarray(table, dtype=np.int64).reshape(shape))
        self.edge_costs = fixed

    @property
    def num_nodes(self) -> int:
        return len(self.node_costs)


@dataclass
class Evaluation:
    feasible: bool
    cost: Optional[int]
    reason: str = ""
    peak_usage: int = 0


def evaluate(problem: StrategyProblem, choice: Sequence[int]) -> Evaluation:
    """Cost of a complete choice, or why it is infeasible (same semantics as IOPDDL's
    reference Evaluate: usage counted on [start, end), forbidden entries infeasible)."""
    if len(choice) != problem.num_nodes:
        return Evaluation(False, None, "wrong number of nodes")
    cost = 0
    for n, s in enumerate(choice):
        if not 0 <= int(s) < len(problem.node_costs[n]):
            return Evaluation(False, None, f"node {n}: strategy {s} out of range")
        c = int(problem.node_costs[n][s])
        if c >= FORBIDDEN_COST:
            return Evaluation(False, None, f"node {n}: strategy {s} is forbidden")
        cost += c
    for (u, v), table in zip(problem.edges, problem.edge_costs):
        c = int(table[choice[u], choice[v]])
        if c >= FORBIDDEN_COST:
            return Evaluation(False, None, f"edge {u}-{v}: pair forbidden")
        cost += c
    horizon = max((e for _, e in problem.intervals), default=0)
    usage = np.zeros(horizon + 1, dtype=np.int64)
    for n, (a, b) in enumerate(problem.intervals):
        if b > a:
            usage[a] += problem.node_usages[n][choice[n]]
            usage[b] -= problem.node_usages[n][choice[n]]
    live = np.cumsum(usage)
    peak = int(live.max()) if len(live) else 0
    if problem.usage_limit is not None and peak > problem.usage_limit:
        return Evaluation(False, cost, f"usage {peak} exceeds limit {problem.usage_limit}", peak)
    return Evaluation(True, cost, "", peak)
