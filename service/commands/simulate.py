"""`sticksat simulate PROGRAM.json [--graph GRAPH.json] [--numerics] [--trace FILE] --json`:
validate, time and optionally run a program (random seeded inputs, compared with the
reference interpreter when the graph is given). Exit status 1 when the program is invalid."""
from __future__ import annotations

import json
import sys
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("simulate", help="validate, time and run a SuperDSC program")
    p.add_argument("program", help="program JSON")
    p.add_argument("--graph", default=None, help="graph document the program came from (reference)")
    p.add_argument("--numerics", action="store_true", help="run functionally on seeded random inputs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trace", default=None, help="write a Chrome/Perfetto trace to this file")
    p.add_argument("--hardware", default="spyre", help="hardware target name or JSON path")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from simulator.api import GraphMismatch, simulate
    from target.hardware import load_target

    try:
        hw = load_target(args.hardware)
    except Exception as e:  # noqa: BLE001 - an unknown name or an unreadable/invalid target file
        print(json.dumps({"valid": False, "errors": [{"code": "unknown_target", "message": str(e)}],
                          "simulated_us": None}))
        return 2
    try:
        text = Path(args.program).read_bytes()
    except OSError as e:
        print(json.dumps({"valid": False, "errors": [{"code": "io", "message": str(e)}],
                          "simulated_us": None}))
        return 2
    graph = None
    if args.graph:
        from lowering.errors import GraphError
        from service.commands.compile import load_primgraph
        try:
            graph = load_primgraph(args.graph)
        except (GraphError, OSError) as e:
            err = {"code": getattr(e, "code", "io"), "message": getattr(e, "message", str(e))}
            print(json.dumps({"valid": False, "errors": [err], "simulated_us": None, "graph_error": True}))
            return 2
    try:
        res = simulate(text, hw, graph=graph, numerics=args.numerics, trace=args.trace, seed=args.seed)
    except GraphMismatch as e:  # the graph given for the reference is not this program's
        print(json.dumps({"valid": False, "errors": [e.to_dict()], "simulated_us": None, "graph_error": True}))
        return 2
    out = res.to_json()
    if args.json:
        print(json.dumps(out))
    else:
        status = "valid" if res.valid else "INVALID"
        print(f"{status}: simulated {out['simulated_us']} us")
        for e in out["errors"]:
            print(f"  {e['code']}: {e['message']}")
        if out.get("max_abs_err") is not None:
            print(f"  max_abs_err {out['max_abs_err']:.3g}  max_rel_err {out['max_rel_err']:.3g}")
    return 0 if res.valid else 1
