"""`sticksat check GRAPHS_DIR_OR_STORE [--baseline FILE] [--tolerance PCT] [--junit FILE]
[--update-baseline] [--planner P] [--time-limit S]`: the CI gate (service/batch/check.py,
docs/batch.md). Exit 0 when every graph passes, 1 when one does not compile, fails
validation, fell back to another planner, or regressed beyond the tolerance against the
baseline; 2 on a usage error (no such directory, unreadable baseline)."""
from __future__ import annotations

import json
import os
import sys


def register(sub) -> None:
    from service.batch.check import DEFAULT_PLANNER, DEFAULT_TIME_LIMIT_S, DEFAULT_TOLERANCE_PCT

    p = sub.add_parser("check", help="CI gate: compile every graph, fail on errors or simulated-time regressions")
    p.add_argument("location", metavar="GRAPHS_DIR_OR_STORE",
                   help="a directory of graph documents (*.json, *.json.gz, recursively) or a store (SQLite file, "
                        "sqlite:///path, postgresql://...)")
    p.add_argument("--baseline", default=None, help="baseline JSON file (simulated time per graph)")
    p.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE_PCT,
                   help=f"allowed simulated-time regression in percent (default {DEFAULT_TOLERANCE_PCT:g})")
    p.add_argument("--junit", default=None, help="write JUnit XML here (one testcase per graph)")
    p.add_argument("--update-baseline", action="store_true",
                   help="write the baseline from this run (regressions are accepted; failures still fail)")
    p.add_argument("--planner", default=DEFAULT_PLANNER, help=f"planner (default {DEFAULT_PLANNER})")
    p.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT_S,
                   help=f"solver budget per graph in seconds (default {DEFAULT_TIME_LIMIT_S:g})")
    p.add_argument("--no-deterministic", dest="deterministic", action="store_false",
                   help="wall-clock CP-SAT instead of its deterministic mode (results then vary run to run)")
    p.add_argument("--target", default=None, help="hardware target (default spyre)")
    p.add_argument("--allow-fallback", action="store_true",
                   help="pass a graph whose planner fell back to a simpler one (default: fail it)")
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    p.add_argument("--graph-timeout", type=float, default=None, metavar="S",
                   help="per-graph wall-time limit: each compile runs in a worker process, stopped past S "
                        "seconds (the graph fails with reason 'limit'; default: the time limit plus its grace, "
                        "pipeline.wall_limit_s); 0 compiles in this process without limits")
    p.add_argument("--memory-limit", type=float, default=None, metavar="GIB",
                   help="per-graph memory limit of the compile's worker, GiB (default: the machine's memory "
                        "shared among the worker and this process, at least 2 GiB)")
    p.set_defaults(func=run)


def run(args) -> int:
    from lowering.errors import GraphError
    from service.batch.check import BaselineError, run_check, table_rows, TABLE_HEADERS, write_junit
    from service.batch.common import print_table

    if args.update_baseline and not args.baseline:
        print("sticksat check: --update-baseline needs --baseline FILE", file=sys.stderr)
        return 2
    # an output the run could not write is a usage error, found before minutes of compiling
    for flag, path in (("--junit", args.junit), ("--baseline", args.baseline if args.update_baseline else None)):
        if path is not None:
            parent = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
                print(f"sticksat check: {flag} {path}: directory {parent} is missing or not writable",
                      file=sys.stderr)
                return 2

    from service.batch.common import printable

    def progress(i, n, name):
        if name is not None and not args.json:
            print(f"[{i + 1}/{n}] {printable(name)}", file=sys.stderr, flush=True)

    from service.batch.isolated import default_memory_bytes, signals_as_interrupt
    from service.pipeline import wall_limit_s

    if (args.graph_timeout is not None and args.graph_timeout < 0) or (
            args.memory_limit is not None and args.memory_limit <= 0):
        print("sticksat check: --graph-timeout must be >= 0 and --memory-limit positive", file=sys.stderr)
        return 2
    isolated = args.graph_timeout != 0
    graph_wall_s = (args.graph_timeout or wall_limit_s(args.time_limit, deterministic=args.deterministic)) if isolated else None
    memory_bytes = (int(args.memory_limit * 2**30) if args.memory_limit else default_memory_bytes(1)) if isolated \
        else None
    try:
        with signals_as_interrupt():
            result = run_check(args.location, baseline_path=args.baseline, tolerance_pct=args.tolerance,
                               planner=args.planner, time_limit_s=args.time_limit, deterministic=args.deterministic,
                               target=args.target, allow_fallback=args.allow_fallback,
                               update_baseline=args.update_baseline, progress=progress,
                               graph_wall_s=graph_wall_s, memory_bytes=memory_bytes)
    except KeyboardInterrupt as exc:
        how = str(exc) or "SIGINT"
        print(f"sticksat check: stopped by {how}; no worker is left running", file=sys.stderr)
        return 143 if how == "SIGTERM" else 130
    except (BaselineError, FileNotFoundError) as exc:
        print(f"sticksat check: {printable(str(exc))}", file=sys.stderr)
        return 2
    except GraphError as exc:  # a bad --planner or --target
        print(f"sticksat check: {exc.code}: {printable(exc.message)}", file=sys.stderr)
        return 2
    if args.junit:
        try:
            write_junit(args.junit, result)
        except OSError as exc:
            print(f"sticksat check: cannot write --junit {args.junit}: {exc}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps(result.to_json(), indent=1))
    else:
        print_table(TABLE_HEADERS, table_rows(result),
                    title=f"sticksat check {printable(args.location)}: {len(result.cases)} graphs, "
                          f"{len(result.failures)} failed")
        if args.update_baseline:
            print(f"baseline written: {args.baseline}")
    if not result.cases:
        print(f"sticksat check: no graphs in {args.location}", file=sys.stderr)
        return 2
    return 1 if result.failures else 0
