"""`sticksat iopddl FILE.json[.gz]`: solve an IOPDDL contest instance with the generic core
(solver.core.search.optimize), check the solution with the independent evaluator
(solver.core.iopddl.evaluate_solution) and print cost, feasibility, lower bound and seconds.

--json prints one line {"instance","cost","feasible","bound","seconds"}; --solution FILE
writes the chosen strategy index of every node as a JSON list. Exit status 0 with a feasible
solution, 1 without one, 2 on an unreadable or malformed instance.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("iopddl", help="solve an IOPDDL contest instance (JSON or JSON.gz)")
    p.add_argument("file", help="instance file (.json or .json.gz)")
    p.add_argument("--time-limit", type=float, default=60.0, help="seconds, all phases (default 60)")
    p.add_argument("--workers", type=int, default=2, help="CP-SAT workers (default 2)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="one JSON line instead of text")
    p.add_argument("--solution", default=None, help="write the strategy index per node (JSON list)")
    p.add_argument("--verbose", action="store_true", help="progress on stderr")
    p.set_defaults(func=run)


def _instance_name(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".json"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


def run(args) -> int:
    from solver.core.iopddl import evaluate_solution, load_best_known, load_instance
    from solver.core.search import optimize

    path = Path(args.file)
    t0 = time.perf_counter()
    try:
        problem = load_instance(path)
    except OSError as e:
        print(f"sticksat iopddl: cannot read {path}: {e}", file=sys.stderr)
        return 2
    except json.JSONDecodeError as e:
        print(f"sticksat iopddl: {path} is not valid JSON: {e}", file=sys.stderr)
        return 2
    except (ValueError, TypeError) as e:
        print(f"sticksat iopddl: malformed instance {path}: {e}", file=sys.stderr)
        return 2
    log = (lambda s: print(f"# {s}", file=sys.stderr, flush=True)) if args.verbose else None
    remaining = max(0.5, args.time_limit - (time.perf_counter() - t0))
    try:
        result = optimize(problem, time_limit_s=remaining, workers=args.workers, seed=args.seed, log=log)
    except ValueError as e:  # e.g. a node with every strategy forbidden
        print(f"sticksat iopddl: {path}: {e}", file=sys.stderr)
        result = None
    seconds = round(time.perf_counter() - t0, 2)
    cost, feasible, bound = None, False, None
    if result is not None and result.choice is not None:
        ev = evaluate_solution(problem, result.choice)  # the independent check
        feasible, cost = ev.feasible, ev.cost if ev.feasible else None
        bound = result.bound
    if result is not None:
        bound = result.bound
    name = problem.name or _instance_name(path)
    if args.solution and result is not None and result.choice is not None and feasible:
        Path(args.solution).write_text(json.dumps([int(s) for s in result.choice]))
    if args.json:
        print(json.dumps({"instance": name, "cost": cost, "feasible": feasible,
                          "bound": None if bound is None else int(bound), "seconds": seconds}))
    else:
        best = None
        csv = path.parent / "best_known.csv"
        if csv.exists():
            try:
                best = load_best_known(csv).get(_instance_name(path))
            except (OSError, ValueError):
                best = None
        print(f"instance: {name}")
        print(f"feasible: {'yes' if feasible else 'no'}")
        print(f"cost: {cost if cost is not None else '-'}")
        print(f"bound: {int(bound) if bound is not None else 'unknown'}")
        if best is not None:
            ratio = f" ({cost / best:.3f}x)" if cost is not None and best else ""
            print(f"best known: {best}{ratio}")
        print(f"seconds: {seconds}")
    return 0 if feasible else 1
