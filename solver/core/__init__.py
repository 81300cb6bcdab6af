"""Generic strategy-selection core: the XLA auto-sharding / IOPDDL problem on CP-SAT.

Problem: every node picks exactly one strategy (node cost, memory usage); every edge adds a
cost from a table indexed by the strategies of its two end nodes; at every time step the
usages of the nodes live then must stay within a limit. Minimize the total cost.

CP-SAT formulation (the shape of XLA's auto_sharding_solver.cc, rewritten for CP-SAT):
- `pick[n][s]` one-hot per node;
- edges: reparametrize first (row / column minima of each table move into the node costs, an
  exact rewrite), drop tables that become all zero; small tables get one boolean per
  strategy pair tied to both ends by marginal equalities (sum_j e[i,j] == pick[u][i] and
  sum_i e[i,j] == pick[v][j]: the tight "local polytope" relaxation); large tables get one
  integer cost variable bounded by an enforced linear row per strategy of each end (compact,
  weaker relaxation);
- memory: one row per *maximal* distinct live set (a set contained in another set is
  implied), with each node's minimum usage moved to the constant side and rows that can
  never be violated dropped.

Presolve (scaling tricks from XLA): strategies with a forbidden cost are removed; dominated
strategies (another strategy of the same node is no worse in node cost, usage and every edge
row) are removed, iterated to a fixpoint. A hint that uses a removed strategy is mapped to
its dominator, which is no worse by construction.

Front ends (the Spyre planner) call `build_core` to get the CpModel with the pick variables
and objective terms, add their own variables, constraints and objective terms, then call
`solve_model`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
from ortools.sat.python import cp_model

# Entries at or above this are forbidden (IOPDDL encodes "impossible" as 1e18).
FORBIDDEN_COST = 10**18
# Up to this many (node, live set) memberships, memory is one explicit row per maximal live
# set; beyond it (28k-node instances have tens of millions) a running-sum chain.
ROW_MEMBERSHIP_LIMIT = 2_000_000


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


# -- presolve ------------------------------------------------------------------------------
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


def maximal_live_sets(intervals: Sequence[tuple[int, int]]) -> list[list[int]]:
    """The distinct live sets not contained in another one: a live set can only be maximal
    at a time step after which some interval ends (the set shrinks next)."""
    starts: dict[int, list[int]] = {}
    ends: dict[int, list[int]] = {}
    for n, (a, b) in enumerate(intervals):
        if b > a:
            starts.setdefault(a, []).append(n)
            ends.setdefault(b, []).append(n)
    times = sorted(set(starts) | set(ends))
    live: set[int] = set()
    rows: list[list[int]] = []
    grown = False
    for t in times:
        if t in ends:
            if grown and live:
                rows.append(sorted(live))
            live.difference_update(ends[t])
            grown = False
        if t in starts:
            live.update(starts[t])
            grown = True
    if grown and live:
        rows.append(sorted(live))
    return rows


@dataclass
class Timeline:
    """Live intervals on compressed time: usage only changes where an interval starts or
    ends, so the distinct event points are the only time steps that matter. Node n covers
    compressed steps [start[n], end[n]) (empty intervals: start == end)."""

    start: np.ndarray
    end: np.ndarray
    n_steps: int

    @classmethod
    def build(cls, intervals: Sequence[tuple[int, int]]) -> "Timeline":
        pts = sorted({p for a, b in intervals if b > a for p in (a, b)})
        index = {p: i for i, p in enumerate(pts)}
        start = np.array([index[a] if b > a else 0 for a, b in intervals], dtype=np.int64)
        end = np.array([index[b] if b > a else 0 for a, b in intervals], dtype=np.int64)
        return cls(start, end, max(0, len(pts) - 1))

    def profile(self, per_node: np.ndarray) -> np.ndarray:
        """Sum of `per_node` values live at each compressed step."""
        diff = np.zeros(self.n_steps + 1, dtype=np.int64)
        np.add.at(diff, self.start, per_node)
        np.add.at(diff, self.end, -per_node)
        return np.cumsum(diff)[: self.n_steps]


def presolve(problem: StrategyProblem, prune_dominated: bool = True,
             max_rounds: int = 6) -> Reduction:
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

    for _ in range(max_rounds):
        changed = False
        for n in range(n_nodes):
            # a strategy whose row on some edge is entirely forbidden can never be picked
            keep = np.ones(len(alive[n]), dtype=bool)
            for e, is_u in incident[n]:
                keep &= (edge_rows(n, e, is_u) < FORBIDDEN_COST).any(axis=1)
            if not keep.all():
                if not keep.any():
                    raise ValueError(f"node {n}: every strategy is forbidden by an edge")
                alive[n] = alive[n][keep]
                changed = True
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
        if not changed:
            break
    # strategies removed as forbidden map to the cheapest kept one (only hints use this)
    for n in range(n_nodes):
        kept = set(alive[n].tolist())
        cheapest = alive[n][np.argmin(problem.node_costs[n][alive[n]])]
        for s in range(len(replaced_by[n])):
            if int(replaced_by[n][s]) not in kept:
                replaced_by[n][s] = cheapest
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


def _weighted(terms: list) -> cp_model.LinearExpr:
    """Σ coeff·var from (var, coeff) pairs, built flat (Python's sum nests expressions)."""
    return cp_model.LinearExpr.WeightedSum([v for v, _ in terms], [c for _, c in terms])


# -- local search (a complete starting point for the hint) ---------------------------------
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


# -- model ---------------------------------------------------------------------------------
@dataclass
class SolveOptions:
    time_limit_s: float = 10.0
    num_workers: int = 2
    deterministic: bool = False
    # deterministic mode stops on CP-SAT's deterministic clock (about seconds of work on one
    # core); the wall clock limit stays as a safety net at `deterministic_wall_factor` x.
    deterministic_time: Optional[float] = None
    deterministic_wall_factor: float = 6.0
    seed: int = 1
    log: bool = False
    prune_dominated: bool = True
    # edges whose reduced table has at most this many entries get pair booleans
    pair_table_limit: int = 2048
    # CP-SAT's own presolve (off pays when a complete hint is given and presolve is slow)
    presolve: bool = True
    # stop once the incumbent is proven within this gap of the bound: relative,
    # (objective - bound) / |objective|, or absolute, in objective units (None: CP-SAT's
    # defaults, 0 and 1e-4, i.e. only a proven optimum stops the search early). CP-SAT then
    # reports OPTIMAL; `gap_of` gives the gap actually left.
    relative_gap_limit: Optional[float] = None
    absolute_gap_limit: Optional[float] = None


@dataclass
class CoreModel:
    problem: StrategyProblem
    reduction: Reduction
    model: cp_model.CpModel
    pick: list[dict[int, cp_model.IntVar]]  # pick[n][original strategy] for kept strategies
    objective_terms: list = field(default_factory=list)  # linear expressions
    objective_offset: int = 0
    # auxiliary variables and how to derive their hint value from a choice
    _pair_vars: list = field(default_factory=list)  # (u, v, i, j, var)
    _edge_cost_vars: list = field(default_factory=list)  # (u, v, residual dict, var)

    def choice_value(self, solver: cp_model.CpSolver) -> list[int]:
        out = []
        for n, vars_ in enumerate(self.pick):
            chosen = [s for s, var in vars_.items() if solver.BooleanValue(var)]
            out.append(chosen[0])
        return out

    def hint_choice(self, choice: Sequence[int]) -> list[int]:
        """Map a complete choice onto kept strategies and add it as a complete hint."""
        mapped = [int(self.reduction.replaced_by[n][int(s)]) for n, s in enumerate(choice)]
        for n, vars_ in enumerate(self.pick):
            for s, var in vars_.items():
                self.model.AddHint(var, s == mapped[n])
        for u, v, i, j, var in self._pair_vars:
            self.model.AddHint(var, mapped[u] == i and mapped[v] == j)
        for u, v, residual, var in self._edge_cost_vars:
            self.model.AddHint(var, int(residual[mapped[u], mapped[v]]))
        return mapped


def _memory_chain(problem: StrategyProblem, red: Reduction, model: cp_model.CpModel, pick) -> None:
    """Usage limit as a running sum over compressed steps: U[t] = U[t-1] + (variable usage
    of nodes starting at t) - (of nodes ending at t), U[t] <= limit - base[t] where the limit
    may bind. Exact, with O(nodes x strategies) terms instead of one row per live set."""
    tl, limit = red.timeline, problem.usage_limit
    hot = np.concatenate([[0], np.cumsum(red.binding)])
    var_use: dict[int, tuple[cp_model.IntVar, int]] = {}
    for n, a in enumerate(red.alive):
        if tl.end[n] <= tl.start[n] or hot[tl.end[n]] - hot[tl.start[n]] == 0:
            continue
        usage = problem.node_usages[n]
        lo = int(usage[a].min())
        terms = [(pick[n][int(s)], int(usage[s] - lo)) for s in a if usage[s] != lo]
        if not terms:
            continue
        top = max(w for _, w in terms)
        u = model.NewIntVar(0, top, f"use{n}")
        model.Add(u == _weighted(terms))
        var_use[n] = (u, top)
    starts: dict[int, list] = {}
    ends: dict[int, list] = {}
    for n, (u, _) in var_use.items():
        starts.setdefault(int(tl.start[n]), []).append(u)
        ends.setdefault(int(tl.end[n]), []).append(u)
    last = int(np.flatnonzero(red.binding).max())
    prev = None
    cap = int(sum(top for _, top in var_use.values()))
    for t in range(last + 1):
        delta = starts.get(t, []), ends.get(t, [])
        if prev is None and not delta[0]:
            continue
        cur = model.NewIntVar(0, cap, f"U{t}")
        expr = cp_model.LinearExpr.Sum(delta[0]) - cp_model.LinearExpr.Sum(delta[1])
        model.Add(cur == (prev if prev is not None else 0) + expr)
        prev = cur
        if red.binding[t]:
            model.Add(cur <= limit - int(red.base_usage[t]))


def build_core(problem: StrategyProblem, options: SolveOptions | None = None,
               model: cp_model.CpModel | None = None,
               reduction: Reduction | None = None) -> CoreModel:
    options = options or SolveOptions()
    model = model or cp_model.CpModel()
    red = reduction or presolve(problem, prune_dominated=options.prune_dominated)
    pick: list[dict[int, cp_model.IntVar]] = []
    node_cost = [problem.node_costs[n].astype(np.int64).copy() for n in range(problem.num_nodes)]
    for n, kept in enumerate(red.alive):
        vars_ = {int(s): model.NewBoolVar(f"pick_{n}_{s}") for s in kept}
        model.AddExactlyOne(vars_.values())
        pick.append(vars_)
    core = CoreModel(problem, red, model, pick)
    offset = 0
    for e, ((u, v), table) in enumerate(zip(problem.edges, problem.edge_costs)):
        au, av = red.alive[u], red.alive[v]
        sub = table[np.ix_(au, av)]
        forbidden = sub >= FORBIDDEN_COST
        finite = np.where(forbidden, np.iinfo(np.int64).max, sub)
        row_min = finite.min(axis=1)  # every kept row has a finite entry (presolve)
        r = np.where(forbidden, 0, sub - row_min[:, None])
        finite_r = np.where(forbidden, np.iinfo(np.int64).max, r)
        col_min = finite_r.min(axis=0)
        col_min = np.where(col_min == np.iinfo(np.int64).max, 0, col_min)
        r = np.where(forbidden, 0, r - col_min[None, :])
        node_cost[u][au] += row_min
        node_cost[v][av] += col_min
        if not forbidden.any() and not r.any():
            continue
        if len(au) == 1 or len(av) == 1:
            # one end fixed: the table is a node cost of the other end (moved above), only
            # forbidden pairs remain
            for i, j in zip(*np.nonzero(forbidden)):
                model.AddBoolOr([pick[u][int(au[i])].Not(), pick[v][int(av[j])].Not()])
            continue
        if sub.size <= options.pair_table_limit:
            pairs = {}
            for i in range(len(au)):
                for j in range(len(av)):
                    if forbidden[i, j]:
                        continue
                    var = model.NewBoolVar(f"e{e}_{i}_{j}")
                    pairs[i, j] = var
                    core._pair_vars.append((u, v, int(au[i]), int(av[j]), var))
            for i in range(len(au)):
                model.Add(cp_model.LinearExpr.Sum(
                    [pairs[i, j] for j in range(len(av)) if (i, j) in pairs]) == pick[u][int(au[i])])
            for j in range(len(av)):
                model.Add(cp_model.LinearExpr.Sum(
                    [pairs[i, j] for i in range(len(au)) if (i, j) in pairs]) == pick[v][int(av[j])])
            costly = [(var, int(r[i, j])) for (i, j), var in pairs.items() if r[i, j]]
            if costly:
                core.objective_terms.append(_weighted(costly))
        else:
            top = int(r.max())
            cost = model.NewIntVar(0, top, f"ecost{e}")
            for i in range(len(au)):
                pu = pick[u][int(au[i])]
                for j in np.flatnonzero(forbidden[i]):
                    model.AddImplication(pu, pick[v][int(av[j])].Not())
                if r[i].any():
                    model.Add(cost >= _weighted([(pick[v][int(av[j])], int(r[i, j]))
                                                 for j in np.flatnonzero(r[i])])).OnlyEnforceIf(pu)
            for j in range(len(av)):
                pv = pick[v][int(av[j])]
                if r[:, j].any():
                    model.Add(cost >= _weighted([(pick[u][int(au[i])], int(r[i, j]))
                                                 for i in np.flatnonzero(r[:, j])])).OnlyEnforceIf(pv)
            full = np.zeros((len(problem.node_costs[u]), len(problem.node_costs[v])), np.int64)
            full[np.ix_(au, av)] = r
            core._edge_cost_vars.append((u, v, full, cost))
            core.objective_terms.append(cost)
    # node costs: shift each node's minimum to the constant so terms stay small
    for n, kept in enumerate(red.alive):
        c = node_cost[n][kept]
        base = int(c.min())
        offset += base
        terms = [(pick[n][int(s)], int(c[k] - base)) for k, s in enumerate(kept) if c[k] != base]
        if terms:
            core.objective_terms.append(_weighted(terms))
    core.objective_offset = offset
    if problem.usage_limit is not None and not red.memory_rows and red.binding is not None \
            and red.binding.any():
        _memory_chain(problem, red, model, pick)
    if problem.usage_limit is not None:
        for row in red.memory_rows:
            base = sum(int(problem.node_usages[n][red.alive[n]].min()) for n in row)
            terms = []
            for n in row:
                usage = problem.node_usages[n]
                lo = int(usage[red.alive[n]].min())
                terms.extend((pick[n][int(s)], int(usage[s] - lo))
                             for s in red.alive[n] if usage[s] != lo)
            if base > problem.usage_limit:
                model.AddBoolOr([])  # infeasible: even minimum usages exceed the limit
            elif terms:
                model.Add(_weighted(terms) <= problem.usage_limit - base)
    return core


@dataclass
class ModelSolution:
    status: str  # OPTIMAL, FEASIBLE, INFEASIBLE, UNKNOWN, MODEL_INVALID
    objective: Optional[float]
    bound: Optional[float]
    gap: Optional[float]
    wall_seconds: float
    deterministic_time: float
    solver: Optional[cp_model.CpSolver] = None


def solver_parameters(options: SolveOptions) -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    p = solver.parameters
    p.num_workers = max(1, int(options.num_workers))
    p.random_seed = int(options.seed)
    p.log_search_progress = bool(options.log)
    p.cp_model_presolve = bool(options.presolve)
    if options.relative_gap_limit is not None:
        p.relative_gap_limit = float(options.relative_gap_limit)
    if options.absolute_gap_limit is not None:
        p.absolute_gap_limit = float(options.absolute_gap_limit)
    if options.deterministic:
        # One sequential worker; the deterministic clock (not the wall clock) decides when to
        # stop. CP-SAT's interleaved mode (`interleave_search`, meant to make parallel search
        # reproducible) returned different solutions and bounds for one model proto in fresh
        # processes, with 1 or 2 workers (ortools 9.15, bert layer, 2026-11-29); the
        # sequential search repeated exactly.
        p.num_workers = 1
        p.interleave_search = False
        p.max_deterministic_time = float(options.deterministic_time or options.time_limit_s)
        p.max_time_in_seconds = float(options.time_limit_s * options.deterministic_wall_factor)
    else:
        p.max_time_in_seconds = float(options.time_limit_s)
    return solver


def gap_of(objective: Optional[float], bound: Optional[float]) -> Optional[float]:
    if objective is None or bound is None:
        return None
    if objective == 0:
        return 0.0
    return max(0.0, (objective - bound) / abs(objective))


def solve_model(model: cp_model.CpModel, objective, options: SolveOptions) -> ModelSolution:
    """Minimize `objective` (a linear expression) and report status, objective, bound, gap."""
    model.Minimize(objective)
    solver = solver_parameters(options)
    t0 = time.perf_counter()
    status = solver.Solve(model)
    wall = time.perf_counter() - t0
    name = solver.StatusName(status)
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        obj = float(solver.ObjectiveValue())
        bound = float(solver.BestObjectiveBound())
        return ModelSolution(name, obj, bound, gap_of(obj, bound), wall,
                             solver.deterministic_time, solver)
    return ModelSolution(name, None, None, None, wall, solver.deterministic_time, None)


@dataclass
class CoreSolution:
    choice: Optional[list[int]]
    cost: Optional[int]
    status: str
    bound: Optional[float]
    gap: Optional[float]
    wall_seconds: float
    presolve_seconds: float
    deterministic_time: float
    strategies_kept: int
    strategies_total: int
    memory_rows: int
    from_hint: bool = False  # the hint was returned because the search found nothing better


def solve(problem: StrategyProblem, options: SolveOptions | None = None,
          hint: Optional[Sequence[int]] = None, reduction: Optional[Reduction] = None) -> CoreSolution:
    """Solve a strategy problem; with a feasible hint, never return anything worse.
    `reduction`: a presolve result to reuse."""
    options = options or SolveOptions()
    t0 = time.perf_counter()
    red = reduction or presolve(problem, prune_dominated=options.prune_dominated)
    core = build_core(problem, options, reduction=red)
    hint_eval = None
    if hint is not None:
        mapped = core.hint_choice(hint)
        hint_eval = evaluate(problem, mapped)
        if not hint_eval.feasible:
            hint_eval = None
        else:
            hint_choice = mapped
    presolve_s = time.perf_counter() - t0
    objective = cp_model.LinearExpr.Sum(core.objective_terms) + core.objective_offset
    sol = solve_model(core.model, objective, options)
    total = sum(len(c) for c in problem.node_costs)
    common = dict(presolve_seconds=presolve_s, deterministic_time=sol.deterministic_time,
                  strategies_kept=red.num_strategies, strategies_total=total,
                  memory_rows=red.memory_terms)
    choice, cost = None, None
    if sol.solver is not None:
        choice = core.choice_value(sol.solver)
        ev = evaluate(problem, choice)
        if not ev.feasible:  # a modelling bug, never a result
            raise AssertionError(f"CP-SAT returned an infeasible choice: {ev.reason}")
        cost = ev.cost
    bound = sol.bound
    if hint_eval is not None and (cost is None or hint_eval.cost < cost):
        return CoreSolution(hint_choice, hint_eval.cost, "FEASIBLE" if sol.status != "INFEASIBLE"
                            else sol.status, bound, gap_of(hint_eval.cost, bound),
                            sol.wall_seconds, from_hint=True, **common)
    return CoreSolution(choice, cost, sol.status, bound, gap_of(cost, bound), sol.wall_seconds,
                        **common)
