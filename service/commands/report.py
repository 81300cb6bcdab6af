"""`sticksat report PROGRAM.json [--graph G] [--top N] [--json] [--html FILE] [--against OTHER]`:
where a program's time goes (per-op table sorted by simulated time, roofline, restickifies
and the consumers needing each stick), the diff against another program of the same graph,
and a self-contained HTML report (docs/report.md). The report model is simulator/report.py."""
from __future__ import annotations

import json
import sys
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("report", help="per-op report of a SuperDSC program (table, roofline, restickifies, diff, HTML)")
    p.add_argument("program", help="program JSON")
    p.add_argument("--graph", default=None,
                   help="graph document the program came from (checked against the program's graph hash)")
    p.add_argument("--top", type=int, default=None, help="only the N slowest ops in the tables")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--html", default=None, metavar="FILE", help="also write a self-contained HTML report")
    p.add_argument("--against", default=None, metavar="OTHER",
                   help="another program of the same graph: which decisions differ and what each costs")
    p.add_argument("--hardware", default=None, help="hardware target name or JSON path (default: the program's)")
    p.set_defaults(func=run)


def _load(path: str, hw):
    from target.superdsc import Program
    from simulator.timing import time_program
    from simulator.validate import validate_program

    program = Program.from_json(Path(path).read_bytes())
    issues = validate_program(program, hw)
    if issues:
        raise ValueError(f"{path}: invalid program: " + "; ".join(f"{i.code}: {i.message}" for i in issues[:3]))
    return program, time_program(program, hw)


def run(args) -> int:
    from pydantic import ValidationError

    from target.hardware import list_targets, load_target
    from simulator.report import build_report, diff_programs, render_diff_text, render_text

    try:
        head = json.loads(Path(args.program).read_bytes())
        # --hardware may name a file (the user chose it); the program's own field only a
        # shipped target, so a program file cannot make the CLI open a path it names
        named = head.get("hardware", "spyre") if isinstance(head, dict) else "spyre"
        if not args.hardware and named not in list_targets():
            raise ValueError(f"the program's hardware {str(named)[:200]!r} is no shipped target "
                             f"({', '.join(sorted(list_targets()))}); pass --hardware")
        hw = load_target(args.hardware or named)
        program, timing = _load(args.program, hw)
        other = _load(args.against, hw) if args.against else None
    except (OSError, ValueError, ValidationError) as e:
        print(json.dumps({"error": "bad_program", "message": str(e)[:2000]}), file=sys.stderr)
        return 2
    if args.graph:
        from lowering.errors import GraphError
        from service.commands.compile import load_primgraph
        try:
            pg = load_primgraph(args.graph)
        except (GraphError, OSError) as e:
            print(json.dumps({"error": getattr(e, "code", "io"), "message": getattr(e, "message", str(e))}),
                  file=sys.stderr)
            return 2
        if program.graph_hash and pg.source_hash and program.graph_hash != pg.source_hash:
            print(json.dumps({"error": "different_graphs",
                              "message": f"{args.program} was not compiled from {args.graph}"}), file=sys.stderr)
            return 2
    report = build_report(program, timing, hw)
    diff = None
    if other is not None:
        try:
            diff = diff_programs(program, timing, other[0], other[1])
        except ValueError as e:
            print(json.dumps({"error": "different_graphs", "message": str(e)}), file=sys.stderr)
            return 2
    if args.html:
        from simulator.report_html import render_html  # noqa: PLC0415
        Path(args.html).write_text(render_html(report, diff, top=args.top), encoding="utf-8")
    if args.json:
        out = report.to_dict()
        if diff is not None:
            out["diff"] = diff
        print(json.dumps(out))
    else:
        sys.stdout.write(render_text(report, args.top))
        if diff is not None:
            sys.stdout.write("\ndiff against " + args.against + "\n" + render_diff_text(diff, args.top))
    return 0
