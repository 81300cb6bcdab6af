"""Benchmark the generic CP-SAT core on IOPDDL contest instances.

Usage: python benchmarks/bench_iopddl.py [--instances B G V] [--time-limit 60] [--workers 2]
Prints one row per instance: cost of the local-search start, CP-SAT cost, ratio to the best
known contest cost, CP-SAT bound and gap, presolve/solve seconds. Run it by hand (never in a
loop); the results go to docs/solver.md with date and machine.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from solver.core import SolveOptions, best_start, evaluate, presolve, solve
from solver.core.iopddl import load_best_known, load_instance

# the instances live next to the repository: ../shared/iopddl/ from its root
DATA = Path(os.environ.get("IOPDDL_DIR", Path(__file__).resolve().parents[1].parent / "shared" / "iopddl"))


def run(letter: str, time_limit: float, workers: int, pair_limit: int, dominance: bool = True) -> dict:
    name = f"asplos-2025-iopddl-{letter}"
    problem = load_instance(DATA / f"{name}.json.gz")
    best = load_best_known(DATA / "best_known.csv").get(name)
    t0 = time.perf_counter()
    reduction = presolve(problem, prune_dominated=dominance)
    print(f"# {letter}: presolve {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    start = best_start(problem, reduction)
    ls_s = time.perf_counter() - t0
    print(f"# {letter}: start {ls_s:.1f}s", file=sys.stderr, flush=True)
    start_cost = evaluate(problem, start).cost if start else None
    opts = SolveOptions(time_limit_s=time_limit, num_workers=workers, pair_table_limit=pair_limit,
                        prune_dominated=dominance)
    sol = solve(problem, opts, hint=start, reduction=reduction)
    return {
        "instance": letter, "nodes": problem.num_nodes, "edges": len(problem.edges),
        "strategies_kept": sol.strategies_kept, "strategies_total": sol.strategies_total,
        "memory_rows": sol.memory_rows, "start_cost": start_cost, "local_search_s": round(ls_s, 2),
        "cpsat_cost": sol.cost, "status": sol.status, "bound": sol.bound,
        "gap": None if sol.gap is None else round(sol.gap, 4),
        "best_known": best, "ratio_to_best": None if not (best and sol.cost) else round(sol.cost / best, 3),
        "presolve_s": round(sol.presolve_seconds, 1), "solve_s": round(sol.wall_seconds, 1),
        "from_hint": sol.from_hint,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--instances", nargs="+", default=["B", "G", "V"])
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--pair-limit", type=int, default=SolveOptions().pair_table_limit)
    ap.add_argument("--no-dominance", action="store_true", help="skip dominated-strategy pruning")
    args = ap.parse_args()
    print(f"# {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
          f"{os.cpu_count()} cpus, time limit {args.time_limit}s, {args.workers} workers")
    for letter in args.instances:
        print(json.dumps(run(letter, args.time_limit, args.workers, args.pair_limit,
                             not args.no_dominance)), flush=True)


if __name__ == "__main__":
    main()
