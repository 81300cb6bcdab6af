"""IOPDDL (ASPLOS 2025 contest) instances: load them into a StrategyProblem, check solutions.

Format (google/iopddl, example.json): problem.nodes.{intervals,costs,usages},
problem.edges.{nodes,costs} with each edge table flattened row-major over the strategies of
its first then second node, problem.usage_limit (optional). Entries of 1e18 are forbidden.
The evaluator follows the contest's reference `Evaluate`: usage is counted on [start, end).
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Sequence

import numpy as np

from solver.core.problem import Evaluation, StrategyProblem, evaluate

_MAX_NODES = 1_000_000


def _field(obj, key: str, where: str):
    if not isinstance(obj, dict) or key not in obj:
        raise ValueError(f"{where}.{key} is missing")
    return obj[key]


def _int_list(x, where: str) -> np.ndarray:
    try:
        arr = np.asarray(x)
    except (ValueError, TypeError):
        arr = None
    if not isinstance(x, list) or arr is None or arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iuf"):
        raise ValueError(f"{where} must be a list of numbers")
    return arr.astype(np.int64)


def problem_from_dict(data: dict) -> StrategyProblem:
    """A StrategyProblem from a contest document; ValueError naming the offending field
    when the document is malformed."""
    p = _field(data, "problem", "instance")
    nodes = _field(p, "nodes", "problem")
    edges = _field(p, "edges", "problem")
    costs = _field(nodes, "costs", "problem.nodes")
    usages = _field(nodes, "usages", "problem.nodes")
    intervals = _field(nodes, "intervals", "problem.nodes")
    for name, lst in (("costs", costs), ("usages", usages), ("intervals", intervals)):
        if not isinstance(lst, list):
            raise ValueError(f"problem.nodes.{name} must be a list")
    if len(costs) > _MAX_NODES:
        raise ValueError(f"problem.nodes.costs: too many nodes ({len(costs)} > {_MAX_NODES})")
    n = len(costs)
    if len(usages) != n or len(intervals) != n:
        raise ValueError(f"problem.nodes: {n} costs, {len(usages)} usages and {len(intervals)} "
                         "intervals (one of each per node)")
    node_costs, node_usages, ivs = [], [], []
    for i in range(n):
        c = _int_list(costs[i], f"problem.nodes.costs[{i}]")
        u = _int_list(usages[i], f"problem.nodes.usages[{i}]")
        if not len(c):
            raise ValueError(f"problem.nodes.costs[{i}]: node {i} has no strategy")
        if len(u) != len(c):
            raise ValueError(f"problem.nodes.usages[{i}]: {len(u)} usages for {len(c)} strategies")
        iv = _int_list(intervals[i], f"problem.nodes.intervals[{i}]")
        if len(iv) != 2:
            raise ValueError(f"problem.nodes.intervals[{i}] must be [start, end]")
        node_costs.append(c)
        node_usages.append(u)
        ivs.append((int(iv[0]), int(iv[1])))
    e_nodes = _field(edges, "nodes", "problem.edges")
    e_costs = _field(edges, "costs", "problem.edges")
    if not isinstance(e_nodes, list) or not isinstance(e_costs, list) or len(e_nodes) != len(e_costs):
        raise ValueError("problem.edges.nodes and problem.edges.costs must be lists of equal length")
    edge_nodes, edge_costs = [], []
    for e, (pair, table) in enumerate(zip(e_nodes, e_costs)):
        pair = _int_list(pair, f"problem.edges.nodes[{e}]")
        if len(pair) != 2:
            raise ValueError(f"problem.edges.nodes[{e}]: only two-node edges are supported")
        u, v = int(pair[0]), int(pair[1])
        if not (0 <= u < n and 0 <= v < n):
            raise ValueError(f"problem.edges.nodes[{e}]: node index out of range 0..{n - 1}")
        t = _int_list(table, f"problem.edges.costs[{e}]")
        want = len(node_costs[u]) * len(node_costs[v])
        if len(t) != want:
            raise ValueError(f"problem.edges.costs[{e}]: {len(t)} entries, expected {want} "
                             f"({len(node_costs[u])} x {len(node_costs[v])} strategies of nodes {u}, {v})")
        edge_nodes.append((u, v))
        edge_costs.append(t)
    limit = p.get("usage_limit")
    if limit is not None and (not isinstance(limit, (int, float)) or isinstance(limit, bool)):
        raise ValueError("problem.usage_limit must be a number")
    return StrategyProblem(
        node_costs=node_costs, node_usages=node_usages, intervals=ivs,
        edges=edge_nodes,  # type: ignore[arg-type]
        edge_costs=edge_costs,
        usage_limit=int(limit) if limit is not None else None,
        name=str(p.get("name", "")),
    )


def load_instance(path: str | Path) -> StrategyProblem:
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return problem_from_dict(json.load(f))


def evaluate_solution(problem: StrategyProblem, solution: Sequence[int]) -> Evaluation:
    """Feasibility and total cost of a contest solution (one strategy index per node)."""
    return evaluate(problem, solution)


def load_best_known(csv_path: str | Path) -> dict[str, int]:
    out = {}
    for line in Path(csv_path).read_text().splitlines()[1:]:
        cols = line.split(",")
        if len(cols) >= 4 and cols[3]:
            out[cols[0]] = int(cols[3])
    return out
