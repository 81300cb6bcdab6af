"""`sticksat bench`: plan and simulate a committed benchmark suite with every planner.

Reads the graph documents under benchmarks/graphs/<suite>/ (it never captures: the
service side has no torch), runs naive, heuristic (torch-spyre baseline), torch-spyre-coopt
(upstream's joint CP-SAT co-optimizer, the second baseline) and cpsat, and prints per graph
naive_us, heuristic_us, torch-spyre-coopt_us, cpsat_us, lower_bound_us, cpsat_gap, solve_s,
valid, the speedups heuristic/cpsat and coopt/cpsat, plus their geomeans. `--write-docs FILE` also writes the suite's table and
bar chart into the benchmarks document.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from pathlib import Path

_REPO = Path(__file__).resolve().parents[2]


def suite_module():
    """benchmarks/suite.py: importable from a checkout (it is not an installed package)."""
    try:
        return importlib.import_module("benchmarks.suite")
    except ImportError:
        path = _REPO / "benchmarks" / "suite.py"
        if not path.exists():
            raise SystemExit(f"sticksat bench needs the benchmarks/ directory of a checkout ({path} not found)")
        spec = importlib.util.spec_from_file_location("sticksat_benchmarks_suite", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        return mod


def register(sub) -> None:
    p = sub.add_parser("bench", help="plan + simulate a benchmark suite with every planner")
    p.add_argument("--suite", default="layers", help="suite name (a directory under benchmarks/graphs; "
                                                     "default: layers)")
    p.add_argument("--time-limit", type=float, default=10.0,
                   help="cpsat and torch-spyre-coopt time limit per graph, s (default 10)")
    p.add_argument("--deterministic", action="store_true", help="cpsat and torch-spyre-coopt deterministic mode")
    p.add_argument("--only", help="run only graphs whose name contains this")
    from solver.planners import planner_names

    p.add_argument("--planners", default=",".join(planner_names()),
                   help="comma-separated planners to run (default: every planner of solver.planners)")
    p.add_argument("--graphs-dir", type=Path, help="directory holding the suites (default: benchmarks/graphs)")
    p.add_argument("--numerics", action="store_true",
                   help="also run every program functionally and compare with the reference "
                        "(graphs small enough to run)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--write-docs", type=Path, metavar="FILE",
                   help="write the suite's table and chart into FILE (e.g. docs/benchmarks.md)")
    p.set_defaults(func=run)


def run(args) -> int:
    suite = suite_module()
    graphs_dir = args.graphs_dir or suite.GRAPHS_DIR
    planners = tuple(p.strip() for p in args.planners.split(",") if p.strip())

    def progress(row) -> None:
        if not args.json:
            print(f"  {row.graph}: done", file=sys.stderr, flush=True)

    try:
        report = suite.run_suite(args.suite, time_limit_s=args.time_limit, deterministic=args.deterministic,
                                 graphs_dir=graphs_dir, only=args.only, planners=planners, progress=progress,
                                 numerics=args.numerics)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.write_docs:
        suite.write_docs(report, args.write_docs)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(suite.format_table(report))
    return 0 if all(r.valid for r in report.rows) else 1
