"""`sticksat compile GRAPH.json [--planner cpsat] -o PROGRAM.json`: graph document -> validated
SuperDSC program (parse + validate the document, lower to primitive ops, plan, validate)."""
from __future__ import annotations

import json
import sys
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("compile", help="compile a graph document into a SuperDSC program")
    p.add_argument("graph", help="graph document (JSON)")
    from solver.planners import DEFAULT_PLANNER

    p.add_argument("--planner", default=DEFAULT_PLANNER,
                   help=f"planner name: naive, heuristic (the torch-spyre baseline), cpsat (default: {DEFAULT_PLANNER})")
    p.add_argument("--hardware", default="spyre", help="hardware target name or JSON path")
    p.add_argument("--time-limit", type=float, default=None,
                   help="solver time limit in seconds (default: the planner's own, 10 s for cpsat)")
    p.add_argument("--deterministic", action="store_true", help="deterministic solver mode")
    p.add_argument("--strict", action="store_true",
                   help="fail when the planner fails, instead of falling back to the next planner "
                        "(cpsat -> heuristic -> naive)")
    p.add_argument("-o", "--output", default="-", help="program JSON path ('-': stdout)")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress and no summary on stderr (errors and warnings only)")
    p.set_defaults(func=run)


def load_primgraph(path: str):
    """Read, validate and lower a graph document."""
    from lowering import lower_document
    from lowering.validate import parse_document, validate_document

    doc = parse_document(Path(path).read_bytes())
    validate_document(doc)
    return lower_document(doc)


def run(args) -> int:
    from lowering.errors import GraphError
    from simulator.hardware import load_target
    from solver.planners import PlanInvalid, PlannerFailed, plan

    try:
        pg = load_primgraph(args.graph)
    except GraphError as e:
        print(json.dumps({"error": e.code, "message": e.message, "node": e.node}), file=sys.stderr)
        return 2
    except OSError as e:
        print(json.dumps({"error": "io", "message": str(e)}), file=sys.stderr)
        return 2
    hw = load_target(args.hardware)
    try:
        program = plan(pg, hw, planner=args.planner, time_limit_s=args.time_limit,
                       deterministic=args.deterministic, fallback=not args.strict)
    except PlannerFailed as e:
        cause = e.__cause__
        issues = [i.to_json() for i in cause.issues] if isinstance(cause, PlanInvalid) else []
        print(json.dumps({"error": "planner_failed", "message": str(e), "node": e.op, "errors": issues}),
              file=sys.stderr)
        return 1
    except KeyError as e:
        print(json.dumps({"error": "unknown_planner", "message": str(e)}), file=sys.stderr)
        return 2
    if program.stats.fallback_from:
        print(f"warning: planner {program.stats.fallback_from} failed ({program.stats.fallback_reason}); "
              f"the program was made by {program.stats.planner}", file=sys.stderr)
    text = program.to_json(indent=1)
    if args.output == "-":
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    else:
        Path(args.output).write_text(text)
    if not args.quiet:
        print_summary(program, hw)
    return 0


def print_summary(program, hw, stream=None) -> None:
    """The compile summary (simulator.report.summary_lines) on stderr: stdout stays the
    program when it is written there."""
    from simulator.report import summary_lines
    from simulator.timing import time_program

    try:
        timing = time_program(program, hw)
    except Exception:  # noqa: BLE001 - the summary never fails a compile that succeeded
        timing = None
    stream = stream or sys.stderr
    for line in summary_lines(program, timing):
        print(line, file=stream)
