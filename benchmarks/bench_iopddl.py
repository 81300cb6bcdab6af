"""Benchmark the generic core (solver.core.search.optimize) on IOPDDL contest instances.

Usage: python benchmarks/bench_iopddl.py [--instances B G V S] [--time-limit 60] [--workers 2]
       [--write-docs]
Every instance runs in a fresh process (peak memory = that process's max RSS). One JSON
line per instance: cost, feasibility, ratio to the best contest cost and to XLA's baseline
where it has one, seconds, peak memory. --write-docs replaces the table in docs/iopddl.md
"IOPDDL results". Run it by hand (never in a loop).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the instances live next to the repository: ../shared/iopddl/ from its root
DATA = Path(os.environ.get("IOPDDL_DIR", ROOT.parent / "shared" / "iopddl"))
DOCS = ROOT / "docs" / "iopddl.md"


def load_csv() -> dict[str, dict]:
    out = {}
    lines = (DATA / "best_known.csv").read_text().splitlines()
    head = lines[0].split(",")
    for line in lines[1:]:
        row = dict(zip(head, line.split(",")))
        out[row["instance"]] = row
    return out


def run_one(letter: str, time_limit: float, workers: int, seed: int) -> dict:
    """Solve one instance in this process (called in a child)."""
    from solver.core.iopddl import evaluate_solution, load_instance
    from solver.core.search import optimize
    name = f"asplos-2025-iopddl-{letter}"
    t0 = time.perf_counter()
    problem = load_instance(DATA / f"{name}.json.gz")
    r = optimize(problem, time_limit_s=max(1.0, time_limit - (time.perf_counter() - t0)),
                 workers=workers, seed=seed)
    seconds = time.perf_counter() - t0
    ev = evaluate_solution(problem, r.choice) if r.choice is not None else None
    row = load_csv().get(name, {})
    best = int(row["best_contest_cost"]) if row.get("best_contest_cost") else None
    xla = int(row["xla_baseline_cost"]) if row.get("xla_baseline_cost") else None
    cost = ev.cost if ev is not None and ev.feasible else None
    return {"instance": letter, "nodes": problem.num_nodes, "edges": len(problem.edges),
            "feasible": bool(ev is not None and ev.feasible), "cost": cost, "best": best, "xla": xla,
            "ratio_best": None if not (cost and best) else round(cost / best, 3),
            "ratio_xla": None if not (cost and xla) else round(cost / xla, 3),
            "seconds": round(seconds, 1),
            "peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "stats": r.stats}


def table(rows: list[dict], header: str) -> str:
    out = [header, "",
           "| instance | nodes | feasible | our cost | best contest | ours / best | XLA baseline | ours / XLA | seconds | peak memory |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        f = lambda v: "-" if v is None else f"{v:,}"
        out.append(f"| {r['instance']} | {r['nodes']:,} | {'yes' if r['feasible'] else 'no'} | {f(r['cost'])} "
                   f"| {f(r['best'])} | {'-' if r['ratio_best'] is None else str(r['ratio_best']) + 'x'} "
                   f"| {f(r['xla'])} | {'-' if r['ratio_xla'] is None else str(r['ratio_xla']) + 'x'} "
                   f"| {r['seconds']} | {r['peak_mb']} MB |")
    return "\n".join(out) + "\n"


def write_docs(text: str) -> None:
    doc = DOCS.read_text()
    start, end = "<!-- bench_iopddl:begin -->", "<!-- bench_iopddl:end -->"
    block = f"{start}\n{text}{end}"
    if start in doc:
        doc = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: block, doc, flags=re.S)
    else:
        doc = doc.replace("### IOPDDL results\n", f"### IOPDDL results\n\n{block}\n", 1)
    DOCS.write_text(doc)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--instances", nargs="+", default=["B", "G", "V", "S"])
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--write-docs", action="store_true")
    ap.add_argument("--date", default=None, help="date for the docs header (default: today, UTC)")
    ap.add_argument("--machine", default=None, help="machine description for the docs header")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # child mode
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args.time_limit, args.workers, args.seed)))
        return
    date = args.date or f"{datetime.now(timezone.utc):%Y-%m-%d}"
    machine = args.machine or f"{platform.node()}, {os.cpu_count()} cpus"
    print(f"# {date}, {machine}, time limit {args.time_limit}s, {args.workers} workers", flush=True)
    rows = []
    for letter in args.instances:
        cmd = [sys.executable, __file__, "--one", letter, "--time-limit", str(args.time_limit),
               "--workers", str(args.workers), "--seed", str(args.seed)]
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        if res.returncode != 0:
            print(res.stderr, file=sys.stderr)
            continue
        row = json.loads(res.stdout.strip().splitlines()[-1])
        print(json.dumps(row), flush=True)
        rows.append(row)
    command = " ".join(["benchmarks/bench_iopddl.py"] + sys.argv[1:])  # the command as run
    header = (f"`{command}`, {date}, machine: {machine}; `solver.core.search.optimize`, "
              f"load + presolve + search within the limit, each instance in a fresh process:")
    text = table(rows, header)
    print(text)
    if args.write_docs:
        write_docs(text)


if __name__ == "__main__":
    main()
