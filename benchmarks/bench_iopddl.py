"""Benchmark `sticksat iopddl` on the shared IOPDDL contest instances and on synthetic ones at
contest scale (benchmarks/iopddl_synthetic.py), run as a user runs it.

Usage: python benchmarks/bench_iopddl.py [--instances B G V S synth:40000:1 synth:65000:2:2]
       [--time-limit 60] [--reference-limit 180] [--workers 2] [--write-docs]
Every instance runs as its own `sticksat iopddl FILE --time-limit T --json` process: wall
clock from launch to exit (start-up and reading included), peak memory (that process's max
RSS), the cost checked by the command's independent evaluator, the phase table, and the
load average when it started. The reference is the best contest cost for the shared
instances and a run of the same command at --reference-limit for synthetic ones (cached
next to the instance). --write-docs replaces the table in docs/iopddl.md "Results". Run it
by hand (never in a loop).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.iopddl_data import shared_instances_dir  # noqa: E402  (run as a script)
from benchmarks.iopddl_synthetic import instance_path  # noqa: E402

DATA = shared_instances_dir()
DOCS = ROOT / "docs" / "iopddl.md"


def load_csv() -> dict[str, dict]:
    out = {}
    lines = (DATA / "best_known.csv").read_text().splitlines()
    head = lines[0].split(",")
    for line in lines[1:]:
        row = dict(zip(head, line.split(",")))
        out[row["instance"]] = row
    return out


def instance_file(spec: str) -> Path:
    if spec.startswith("synth:"):
        parts = spec.split(":")[1:]
        nodes, seed = int(parts[0]), int(parts[1])
        dense = float(parts[2]) if len(parts) > 2 else 1.0
        return instance_path(nodes, seed, dense)
    return DATA / f"asplos-2025-iopddl-{spec}.json.gz"


def sticksat(exe: str | None = None) -> list[str]:
    """The `sticksat` command: `exe` (another checkout's launcher, for side-by-side runs) or
    this interpreter's."""
    if exe:
        return [exe]
    exe = Path(sys.executable).with_name("sticksat")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "service.cli"]


def run_command(path: Path, limit: float, workers: int, seed: int, portfolio: int = 1,
                exe: str | None = None) -> dict:
    """One `sticksat iopddl` process: its JSON line, wall seconds and the load at its start."""
    load = os.getloadavg()[0]
    t = time.perf_counter()
    res = subprocess.run(sticksat(exe) + ["iopddl", str(path), "--time-limit", str(limit), "--json",
                                       "--workers", str(workers), "--seed", str(seed),
                                       "--portfolio", str(portfolio)],
                         capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t
    lines = res.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"sticksat iopddl {path}: no output\n{res.stderr[-2000:]}")
    row = json.loads(lines[-1])
    row.update(wall=round(wall, 1), load=round(load, 1))
    return row


def run_command_with_peak(path: Path, limit: float, workers: int, seed: int, portfolio: int = 1,
                          exe: str | None = None) -> dict:
    """`run_command` with the peak RSS measured by a wrapper process of its own (so each
    instance's peak is its own, not the largest so far)."""
    code = ("import json,resource,sys;sys.path.insert(0,%r);"
            "from benchmarks.bench_iopddl import run_command;from pathlib import Path;"
            "r=run_command(Path(%r),%r,%r,%r,%r,%r);"
            "r['peak_mb']=round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss/1024);"
            "print(json.dumps(r))") % (str(ROOT), str(path), limit, workers, seed, portfolio, exe)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-2000:])
    return json.loads(res.stdout.strip().splitlines()[-1])


def reference(spec: str, path: Path, args) -> tuple[int | None, str]:
    """The cost to compare with: the best contest cost, or a longer run (cached)."""
    if not spec.startswith("synth:"):
        row = load_csv().get(f"asplos-2025-iopddl-{spec}", {})
        best = row.get("best_contest_cost")
        return (int(best) if best else None), "best contest"
    cache = path.with_suffix(f".ref{int(args.reference_limit)}.json")
    if cache.exists():
        return json.loads(cache.read_text())["cost"], f"{args.reference_limit:g} s run"
    r = run_command_with_peak(path, args.reference_limit, args.workers, args.seed)
    cache.write_text(json.dumps(r))
    print(json.dumps({"reference": spec, **r}), flush=True)
    return r["cost"], f"{args.reference_limit:g} s run"


def table(rows: list[dict], header: str) -> str:
    out = [header, "",
           "| instance | nodes | limit | wall | wall / limit | peak memory | load | cost | reference | cost / reference |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    f = lambda v: "-" if v is None else f"{v:,}"  # noqa: E731
    for r in rows:
        ratio = "-" if not (r["cost"] and r["ref"]) else f"{r['cost'] / r['ref']:.3f}x"
        out.append(f"| {r['spec']} | {f(r['nodes'])} | {r['time_limit']:g} s | {r['wall']} s "
                   f"| {r['wall'] / r['time_limit']:.3f} | {r['peak_mb']} MB | {r['load']} "
                   f"| {f(r['cost'])} | {f(r['ref'])} ({r['ref_kind']}) | {ratio} |")
    return "\n".join(out) + "\n"


def side_by_side(base_rows: list[dict], rows: list[dict], exe: str) -> str:
    """Baseline and this code per instance, run alternately (same seeds)."""
    out = [f"Side by side with `{exe}` (each instance: baseline run, then this code's, alternating):", "",
           "| instance | seed | baseline cost / reference | this / reference | baseline wall, peak | this wall, peak | load |",
           "|---|---|---|---|---|---|---|"]
    for b, r in zip(base_rows, rows):
        ratio = lambda x: "-" if not (x["cost"] and x["ref"]) else f"{x['cost'] / x['ref']:.3f}x"  # noqa: E731
        out.append(f"| {r['spec']} | {r.get('seed', '-')} | {ratio(b)} | {ratio(r)} | {b['wall']} s, {b['peak_mb']} MB "
                   f"| {r['wall']} s, {r['peak_mb']} MB | {b['load']}, {r['load']} |")
    return "\n".join(out) + "\n"


def write_docs(text: str) -> None:
    doc = DOCS.read_text()
    start, end = "<!-- bench_iopddl:begin -->", "<!-- bench_iopddl:end -->"
    block = f"{start}\n{text}{end}"
    if start in doc:
        doc = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: block, doc, flags=re.S)
    else:
        doc = doc.replace("## Results\n", f"## Results\n\n{block}\n", 1)
    DOCS.write_text(doc)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--instances", nargs="+", default=["B", "G", "V", "S", "synth:40000:1", "synth:65000:2:2"])
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--reference-limit", type=float, default=180.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--portfolio", type=int, default=1, help="`sticksat iopddl --portfolio N`")
    ap.add_argument("--baseline-sticksat", default=None,
                    help="another checkout's `sticksat` launcher: each instance runs with it first, then "
                         "with this one (alternating, side by side), and a second table compares them")
    ap.add_argument("--repeats", type=int, default=1, help="runs per instance (and per code)")
    ap.add_argument("--write-docs", action="store_true")
    ap.add_argument("--machine", default=None, help="machine description for the docs header")
    args = ap.parse_args()
    date = f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
    machine = args.machine or f"{platform.node()}, {os.cpu_count()} cpus"
    print(f"# {date}, {machine}, time limit {args.time_limit}s, {args.workers} workers", flush=True)
    rows, base_rows = [], []
    for spec in args.instances:
        path = instance_file(spec)
        ref, kind = reference(spec, path, args)
        m = re.match(r"synth:(\d+)", spec)
        nodes = int(m.group(1)) if m else {"B": 816, "G": 816, "V": 816, "S": 28526}.get(spec)
        for rep in range(args.repeats):
            for exe, out in ([(args.baseline_sticksat, base_rows)] if args.baseline_sticksat else []) + [(None, rows)]:
                r = run_command_with_peak(path, args.time_limit, args.workers, args.seed + rep, args.portfolio, exe)
                r.update(spec=spec, ref=ref, ref_kind=kind, nodes=nodes, seed=args.seed + rep,
                         code="baseline" if exe else "this")
                print(json.dumps(r), flush=True)
                out.append(r)
    command = " ".join(["benchmarks/bench_iopddl.py"] + sys.argv[1:])
    header = (f"`{command}`, {date}, machine: {machine}; each instance one `sticksat iopddl FILE "
              f"--time-limit {args.time_limit:g} --json` process (wall from launch to exit; peak = its max "
              f"RSS; load = 1-minute load average at its start):")
    text = table(rows, header)
    if base_rows:
        text += "\n" + side_by_side(base_rows, rows, args.baseline_sticksat)
    print(text)
    if args.write_docs:
        write_docs(text)


if __name__ == "__main__":
    main()
