"""Run-to-run spread of the CP-SAT planner on the prefill layers.

For each graph of the layers suite whose name matches `--only` (default: `prefill`), plans
it `--wall-runs` times in wall-clock mode (default 5) and once per deterministic seed
(`--seeds`, default 1-4), each at the same time limit, validates every program and prints
the simulated times, the spread of each set ((max - min) / min) and the split-aware bound.
Every plan is checked by the validator (`solver.oracle.checked_program`); a failed one is
reported and counted.

    python benchmarks/bench_run_to_run.py [--only prefill] [--time-limit 10] [--wall-runs 5] [--seeds 1,2,3,4]

Wall-clock runs depend on the machine's load (the budget is a wall-clock budget): on a
shared machine compare spreads from one run of this script only. A deterministic plan is the
best of up to four draws (docs/solver.md "Seeds and draws"): seed s is its own set of CP-SAT
seeds, and `det. s` the mean wall of one deterministic plan.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.suite import load_suite  # noqa: E402


def _spread(values: list[float]) -> float:
    return (max(values) - min(values)) / min(values) if values else float("nan")


def run(only: str, time_limit_s: float, wall_runs: int, seeds: list[int]) -> dict:
    from lowering import lower_document
    from simulator.timing import time_program
    from solver.lower_bound import lower_bound
    from solver.oracle import checked_program
    from solver.spyre.cpsat_planner import plan_cpsat
    from target.hardware import load_target

    hw = load_target()
    out = {"date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "machine": f"{platform.processor() or platform.machine()}, Python {platform.python_version()}",
           "time_limit_s": time_limit_s, "graphs": {}}
    for name, doc in load_suite("layers", only=only):
        pg = lower_document(doc)
        bound = lower_bound(pg, hw).split_bound_us
        row = {"split_bound_us": bound, "wall": [], "seeds": {}, "invalid": 0, "wall_s": [], "seed_s": []}

        def simulated(d) -> float:
            prog, issues = checked_program(pg, hw, d)
            if prog is None:
                row["invalid"] += 1
                return float("nan")
            return time_program(prog, hw).total_us
        for _ in range(wall_runs):
            t0 = time.perf_counter()
            us = simulated(plan_cpsat(pg, hw, time_limit_s=time_limit_s, deterministic=False))
            row["wall"].append(us)
            row["wall_s"].append(time.perf_counter() - t0)
            print(f"{name} wall-clock: {us:.1f} us ({time.perf_counter() - t0:.1f} s)", flush=True)
        for seed in seeds:
            t0 = time.perf_counter()
            us = simulated(plan_cpsat(pg, hw, time_limit_s=time_limit_s, deterministic=True, seed=seed))
            row["seeds"][seed] = us
            row["seed_s"].append(time.perf_counter() - t0)
            print(f"{name} deterministic seed {seed}: {us:.1f} us ({time.perf_counter() - t0:.1f} s)", flush=True)
        out["graphs"][name] = row
    return out


def report(res: dict) -> str:
    lines = [f"Run {res['date']} on {res['machine']}; time limit {res['time_limit_s']} s. Simulated us.", "",
             "| graph | wall-clock runs | spread | deterministic seeds | spread | det. s (mean) | best / split bound | invalid |",
             "|---|---|---:|---|---:|---:|---:|---:|"]
    for name, row in res["graphs"].items():
        seeds = list(row["seeds"].values())
        every = row["wall"] + seeds
        lines.append(f"| {name} | {', '.join(f'{v:.1f}' for v in row['wall'])} | {_spread(row['wall']):.1%} | "
                     f"{', '.join(f'{v:.1f}' for v in seeds)} | {_spread(seeds):.1%} | "
                     f"{sum(row['seed_s']) / max(1, len(row['seed_s'])):.0f} | "
                     f"{min(every) / row['split_bound_us']:.2f} | {row['invalid']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="prefill")
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--wall-runs", type=int, default=5)
    ap.add_argument("--seeds", default="1,2,3,4")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s]
    res = run(args.only, args.time_limit, args.wall_runs, seeds)
    print(json.dumps(res, indent=1) if args.json else report(res))


if __name__ == "__main__":
    main()
