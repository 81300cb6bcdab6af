"""Compile time vs model size: the CP-SAT planner with the old-style fixed budget against
the new default, side by side, in one run.

  fixed:  `plan_cpsat(budget="fixed")`: the whole time limit is the budget and only a
          proven optimum ends a CP-SAT round early (the behaviour before 2026-12-01);
  scaled: the default: the budget scales with the problem (`default_budget_s`: strategies
          of the model and the starting plan's predicted time, capped by the time limit)
          and each CP-SAT round stops once its plan is proven within the gap limits.

Both run through `solver.planners.plan` (emit, validate, lower bound, as every caller
gets them); wall is the whole call, sim the simulated time of the returned program.

    python benchmarks/bench_compile_time.py                  # layer graphs + tiny models
    python benchmarks/bench_compile_time.py --suite tiny --no-models --repeat 2
    python benchmarks/bench_compile_time.py --only llama --json

Tiny models (`--models`, default on, needs torch and transformers): a 2-layer MLP
captured with `backend.capture.capture`, and the 2-layer GPT-2 and Llama of
tests/models.py. Wall times depend on the machine and its load; the table says which.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODES = ("fixed", "scaled")
TINY_MODELS = ("mlp2", "gpt2", "llama")


def _register() -> None:
    from solver.spyre.cpsat_planner import plan_cpsat
    from solver.planners import register

    for mode in MODES:
        register(f"cpsat_{mode}", functools.partial(plan_cpsat, budget=mode))


def _mlp2_primgraph():
    """A 2-layer MLP (Linear 64->256, GELU, Linear 256->64) on 16 tokens, captured."""
    import torch
    from backend.capture import capture
    from lowering import lower_document
    from lowering.graph_format import GraphDocument

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    model = model.eval().to(torch.float16)
    x = torch.randn(16, 64, dtype=torch.float16)
    return lower_document(GraphDocument.model_validate(capture(model, (x,), name="mlp2")))


def _model_graphs(names) -> list[tuple[str, object]]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch

    out = []
    for name in names:
        if name == "mlp2":
            out.append(("model:mlp2", _mlp2_primgraph()))
        else:
            from tests.models import tiny_primgraph

            out.append((f"model:{name} (2 layers)", tiny_primgraph(name, dtype=torch.float16)))
    return out


def _suite_graphs(suite: str, only) -> list[tuple[str, object]]:
    from benchmarks.suite import load_suite
    from lowering import lower_document

    return [(f"{suite}/{name}", lower_document(doc)) for name, doc in load_suite(suite, only=only)]


def _strategies(notes) -> int | None:
    for n in notes:
        m = re.match(r"strategies: (\d+) over", n)
        if m:
            return int(m.group(1))
    return None


def _budget(notes) -> float | None:
    for n in notes:
        m = re.match(r"budget: ([\d.]+) s", n)
        if m:
            return float(m.group(1))
    return None


def run_one(pg, hw, mode: str, time_limit_s: float, deterministic: bool) -> dict:
    from simulator.timing import time_program
    from solver.planners import plan

    t0 = time.perf_counter()
    program = plan(pg, hw, f"cpsat_{mode}", time_limit_s=time_limit_s, deterministic=deterministic)
    wall = time.perf_counter() - t0
    st = program.stats
    return {"wall_s": wall, "sim_us": time_program(program, hw).total_us, "status": st.solver_status,
            "gap": st.gap, "budget_s": _budget(st.notes), "strategies": _strategies(st.notes),
            "fallback_from": st.fallback_from}


def run(graphs, time_limit_s: float, deterministic: bool, repeat: int, progress=None) -> list[dict]:
    from target.hardware import load_target

    hw = load_target()
    _register()
    rows = []
    for name, pg in graphs:
        row = {"graph": name, "ops": len(pg.ops), "runs": {m: [] for m in MODES}}
        for i in range(repeat):
            # interleaved, and in turn first (the first plan of a graph warms caches): drift
            # in the machine's load and warm-up hit both alike
            for mode in (MODES if i % 2 == 0 else MODES[::-1]):
                row["runs"][mode].append(run_one(pg, hw, mode, time_limit_s, deterministic))
        row["strategies"] = row["runs"]["scaled"][0]["strategies"]
        for mode in MODES:
            runs = row["runs"][mode]
            row[f"{mode}_wall_s"] = sum(r["wall_s"] for r in runs) / len(runs)
            row[f"{mode}_sim_us"] = sum(r["sim_us"] for r in runs) / len(runs)
        row["budget_s"] = row["runs"]["scaled"][0]["budget_s"]
        row["scaled_status"] = [r["status"] for r in row["runs"]["scaled"]]
        rows.append(row)
        if progress is not None:
            progress(row)
    return rows


def _geomean(xs) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


HEADER = ("| graph | ops | strategies | fixed wall s | fixed sim us | new budget s | new wall s | "
          "new sim us | sim new/fixed |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|")


def format_row(r: dict) -> str:
    ratio = r["scaled_sim_us"] / r["fixed_sim_us"] if r["fixed_sim_us"] else float("nan")
    return (f"| {r['graph']} | {r['ops']} | {r['strategies']} | {r['fixed_wall_s']:.2f} | {r['fixed_sim_us']:.1f} | "
            f"{r['budget_s']:.1f} | {r['scaled_wall_s']:.2f} | {r['scaled_sim_us']:.1f} | {ratio:.3f} |")


def format_table(rows: list[dict]) -> str:
    lines = [HEADER] + [format_row(r) for r in rows]
    fixed_wall = sum(r["fixed_wall_s"] for r in rows)
    new_wall = sum(r["scaled_wall_s"] for r in rows)
    gm = _geomean(r["scaled_sim_us"] / r["fixed_sim_us"] for r in rows if r["fixed_sim_us"])
    if gm:
        lines.append(f"\ntotal wall: fixed {fixed_wall:.1f} s, new {new_wall:.1f} s; geomean sim new/fixed {gm:.3f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--suite", default="layers", help="graph suite under benchmarks/graphs ('' for none)")
    ap.add_argument("--only", help="only graphs whose name contains this")
    ap.add_argument("--models", dest="models", action="store_true", default=True,
                    help="also the tiny models (default)")
    ap.add_argument("--no-models", dest="models", action="store_false")
    ap.add_argument("--time-limit", type=float, default=10.0, help="time limit (the cap) of both, s")
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--repeat", type=int, default=1, help="runs per graph and mode (means are reported)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    graphs = []
    if args.models:
        names = [n for n in TINY_MODELS if not args.only or args.only in n]
        graphs += _model_graphs(names)
    if args.suite:
        graphs += _suite_graphs(args.suite, args.only)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"# {started}, {platform.node()}, {os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f}, "
          f"limit {args.time_limit:g} s{', deterministic' if args.deterministic else ''}, repeat {args.repeat}",
          file=sys.stderr)
    rows = run(graphs, args.time_limit, args.deterministic, args.repeat,
               progress=None if args.json else (lambda r: print(format_row(r), file=sys.stderr, flush=True)))
    if args.json:
        print(json.dumps({"date": started, "time_limit_s": args.time_limit, "deterministic": args.deterministic,
                          "repeat": args.repeat, "load_after": os.getloadavg()[0], "rows": rows}, indent=1))
    else:
        print(format_table(rows))
        print(f"(load average after: {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
