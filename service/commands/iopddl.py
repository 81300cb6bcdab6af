"""`sticksat iopddl FILE.json[.gz]`: solve an IOPDDL contest instance with the generic core
(solver.core.search.optimize), check the solution with the independent evaluator
(solver.core.iopddl.evaluate_solution) and print cost, feasibility, lower bound and seconds.

--time-limit T bounds the whole command, reading the instance included: the answer is the
best solution held when the time is up, and the phase table says where the time went (each
phase's seconds and share of the limit; the shares sum to at most 1 when the limit held).

--json prints one line {"instance","cost","feasible","bound","seconds","time_limit","phases"};
--solution FILE writes the chosen strategy index of every node as a JSON list. Exit status 0
with a feasible solution, 1 without one, 2 on an unreadable or malformed instance.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("iopddl", help="solve an IOPDDL contest instance (JSON or JSON.gz)")
    p.add_argument("file", help="instance file (.json or .json.gz)")
    p.add_argument("--time-limit", type=float, default=60.0, help="seconds, all phases (default 60)")
    p.add_argument("--workers", type=int, default=2, help="CP-SAT workers (default 2)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--portfolio", type=int, default=1,
                   help="searches run at once, seeds seed, seed+1, ...; the best answer kept (default 1)")
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


def _process_age() -> float:
    """Seconds since this process started (Linux /proc; 0 elsewhere): interpreter start-up
    and imports are part of the user's wait."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def run(args) -> int:
    # imported here, not at the top: `sticksat --help` imports every command module
    from solver.core.iopddl import evaluate_solution, load_best_known, load_instance
    from solver.core.portfolio import portfolio
    from solver.core.search import optimize

    path = Path(args.file)
    # the user's clock: from the process start when this process is `sticksat iopddl ...`
    # (start-up, imports and reading count), else from this call (run in-process)
    launched = Path(sys.argv[0]).name == "sticksat" and sys.argv[1:2] == ["iopddl"]
    t0 = time.perf_counter() - (_process_age() if launched else 0.0)
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
    t_read = time.perf_counter() - t0
    log = (lambda s: print(f"# {s}", file=sys.stderr, flush=True)) if args.verbose else None
    try:
        if getattr(args, "portfolio", 1) > 1:
            result = portfolio(problem, args.time_limit, runs=args.portfolio, seed=args.seed, started=t0, log=log)
        else:
            result = optimize(problem, time_limit_s=args.time_limit, workers=args.workers, seed=args.seed,
                              log=log, started=t0)
    except ValueError as e:  # e.g. a node with every strategy forbidden
        print(f"sticksat iopddl: {path}: {e}", file=sys.stderr)
        result = None
    t_check = time.perf_counter()
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
    seconds = round(time.perf_counter() - t0, 2)
    phases = result.stats.get("phases", []) if result is not None else \
        [{"phase": "start-up + read", "seconds": round(t_read, 2), "share": round(t_read / args.time_limit, 4)}]
    t_out = time.perf_counter() - t_check
    phases.append({"phase": "independent check", "seconds": round(t_out, 2),
                   "share": round(t_out / args.time_limit, 4)})
    if args.json:
        print(json.dumps({"instance": name, "cost": cost, "feasible": feasible,
                          "bound": None if bound is None else int(bound), "seconds": seconds,
                          "time_limit": args.time_limit, "phases": phases}))
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
        print(f"seconds: {seconds} (limit {args.time_limit:g})")
        print(f"{'phase':<40} seconds   share of the limit")
        for row in phases:
            print(f"  {row['phase']:<38} {row['seconds']:>7.2f}   {row['share']:.3f}")
        print(f"  {'total':<38} {sum(r['seconds'] for r in phases):>7.2f}   "
              f"{sum(r['share'] for r in phases):.3f}")
    return 0 if feasible else 1
