"""Where a plan loses to the split-aware bound, op by op.

For each graph of a suite whose name contains `--only` (default: `prefill` of `layers`),
plans it with `--planner` (default cpsat, deterministic at `--time-limit`), or reads the
program from `--program FILE` (one graph), simulates it and prints per program op: its
simulated time, its share of the split-aware bound (`solver.lower_bound.split_bound_shares`,
at the bound's best lam; restickifies and ops the bound charges nothing have share 0), the
difference, cores, temporal tiles, fused group, device-memory bytes read/written and the
timing model's effects, the largest difference first; then the differences summed by op
kind. `--save DIR` writes each planned program there as JSON (for re-reading with
`--program`). Every planned program passed the validator (`solver.planners.plan`).

    python benchmarks/bound_breakdown.py [--only prefill] [--top 25] [--save DIR]
    python benchmarks/bound_breakdown.py --only llama31_8b_prefill512 --program plan.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.suite import load_suite  # noqa: E402


def breakdown(pg, program, hw) -> dict:
    """The program's per-op simulated time against its per-op share of the split bound."""
    from simulator.timing import time_program
    from solver.lower_bound import lower_bound, split_bound_shares

    rep = time_program(program, hw)
    lb = lower_bound(pg, hw)
    shares = split_bound_shares(pg, hw, lb.ops, lb.memory_us * 1e3)
    kind = {op.id: op.body.kind for op in pg.ops}
    rows = []
    for t in rep.ops:
        share = shares.get(t.op_id, 0.0) / 1e3
        rows.append({"op": t.op_id, "kind": kind.get(t.op_id, t.kind), "us": t.duration_us,
                     "share_us": share, "over_us": t.duration_us - share, "cores": t.cores,
                     "tiles": t.temporal_tiles, "group": t.fused_group,
                     "read_mb": t.hbm_read_bytes / 1e6, "write_mb": t.hbm_write_bytes / 1e6,
                     "effects": list(t.effects)})
    rows.sort(key=lambda r: -r["over_us"])
    by_kind: dict[str, float] = {}
    for r in rows:
        by_kind[r["kind"]] = by_kind.get(r["kind"], 0.0) + r["over_us"]
    return {"simulated_us": rep.total_us, "split_bound_us": lb.split_bound_us,
            "ratio": rep.total_us / lb.split_bound_us, "ops": rows, "over_by_kind": by_kind}


def _print(name: str, b: dict, top: int) -> None:
    print(f"{name}: simulated {b['simulated_us']:.1f} us, split bound {b['split_bound_us']:.1f} us, "
          f"{b['ratio']:.3f}x")
    print(f"  {'op':44s} {'kind':10s} {'us':>8s} {'share':>7s} {'over':>8s} cores  T grp   rd MB  wr MB effects")
    for r in b["ops"][:top]:
        print(f"  {r['op'][-44:]:44s} {r['kind'][:10]:10s} {r['us']:8.1f} {r['share_us']:7.1f} {r['over_us']:8.1f} "
              f"{r['cores']:5d} {r['tiles']:3d} {str(r['group']):4s} {r['read_mb']:6.1f} {r['write_mb']:6.1f} "
              f"{'; '.join(r['effects'])[:90]}")
    print("  over the bound by op kind: " + ", ".join(
        f"{k} {v:.1f}" for k, v in sorted(b["over_by_kind"].items(), key=lambda kv: -kv[1])))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="layers")
    ap.add_argument("--only", default="prefill")
    ap.add_argument("--planner", default="cpsat")
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--wall-clock", action="store_true", help="plan in wall-clock mode (default: deterministic)")
    ap.add_argument("--program", type=Path, help="read the program of the one matching graph from this file")
    ap.add_argument("--save", type=Path, help="write each planned program into this directory")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    from lowering import lower_document
    from target.hardware import load_target
    from target.superdsc import Program
    from solver.planners import plan

    hw = load_target()
    graphs = load_suite(args.suite, only=args.only)
    if args.program and len(graphs) != 1:
        ap.error(f"--program needs --only to name one graph ({len(graphs)} match)")
    out = {}
    for name, doc in graphs:
        pg = lower_document(doc)
        if args.program:
            program = Program.from_json(args.program.read_text())
        else:
            kw = {"time_limit_s": args.time_limit, "deterministic": not args.wall_clock} \
                if args.planner in ("cpsat", "torch-spyre-coopt") else {}
            program = plan(pg, hw, args.planner, **kw)
            if args.save:
                args.save.mkdir(parents=True, exist_ok=True)
                (args.save / f"{name}.json").write_text(program.to_json())
        out[name] = breakdown(pg, program, hw)
        if not args.json:
            _print(name, out[name], args.top)
    if args.json:
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
