"""The whole strategy problem as one CP-SAT model (the shape of XLA's
auto_sharding_solver.cc, rewritten for CP-SAT), and `solve`, which never returns worse than a
feasible hint.

- `pick[n][s]` one-hot per node;
- edges: reparametrize first (row / column minima of each table move into the node costs, an
  exact rewrite), drop tables that become all zero; small tables get one boolean per
  strategy pair tied to both ends by marginal equalities (sum_j e[i,j] == pick[u][i] and
  sum_i e[i,j] == pick[v][j]: the tight "local polytope" relaxation); large tables get one
  integer cost variable bounded by an enforced linear row per strategy of each end (compact,
  weaker relaxation);
- memory: one row per *maximal* distinct live set (a set contained in another set is
  implied), with each node's minimum usage moved to the constant side and rows that can
  never be violated dropped; a running-sum chain over the binding steps when those rows
  would be too many.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np
from ortools.sat.python import cp_model

from solver.core.cpsat import SolveOptions, gap_of, solve_model
from solver.core.reduction import Reduction, presolve
from solver.core.problem import FORBIDDEN_COST, StrategyProblem, evaluate


def _weighted(terms: list) -> cp_model.LinearExpr:
    """Σ coeff·var from (var, coeff) pairs, built flat (Python's sum nests expressions)."""
    return cp_model.LinearExpr.WeightedSum([v for v, _ in terms], [c for _, c in terms])


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
