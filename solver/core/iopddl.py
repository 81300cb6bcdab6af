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

from solver.core import Evaluation, StrategyProblem, evaluate

_MAX_NODES = 1_000_000


def problem_from_dict(data: dict) -> StrategyProblem:
    p = data["problem"]
    nodes, edges = p["nodes"], p["edges"]
    if len(nodes["costs"]) > _MAX_NODES:
        raise ValueError("too many nodes")
    edge_nodes = [tuple(int(x) for x in e) for e in edges["nodes"]]
    for e in edge_nodes:
        if len(e) != 2:
            raise ValueError("only two-node edges are supported")
    return StrategyProblem(
        node_costs=[np.asarray(c, dtype=np.int64) for c in nodes["costs"]],
        node_usages=[np.asarray(u, dtype=np.int64) for u in nodes["usages"]],
        intervals=[(int(a), int(b)) for a, b in nodes["intervals"]],
        edges=edge_nodes,  # type: ignore[arg-type]
        edge_costs=[np.asarray(c, dtype=np.int64) for c in edges["costs"]],
        usage_limit=int(p["usage_limit"]) if p.get("usage_limit") is not None else None,
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
