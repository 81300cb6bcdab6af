"""The CP-SAT objective against the fused program, per deterministic seed.

For each graph of a suite whose name matches `--only` (default: `prefill` of `layers`),
plans it deterministically once per seed (`--seeds`, default 1-4) at the time limit and
prints, per plan: the fused program's simulated time, the model's objective of the plan the
solve handed to the post-solve steps (its residencies, and with `budget.FUSED_HANDOFFS` the
hand-offs its picks allow), their ratio, and per graph the Spearman rank correlation of the
two over the seeds (1.0: the model ranks the seeds' plans as their fused programs run).
`--set KNOB=VALUE` (repeatable) sets a `solver.spyre.budget` knob first, e.g.
`--set TILE_CLASSES=True --set FUSED_HANDOFFS=True`. Every plan is validated
(`solver.oracle.checked_program`).

    python benchmarks/bench_objective_agreement.py [--only prefill] [--seeds 1,2,3,4] [--set KNOB=VALUE]
"""
from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.suite import load_suite  # noqa: E402


def _ranks(xs: list[float]) -> list[float]:
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0.0] * len(xs)
    for pos, i in enumerate(order):
        r[i] = float(pos)
    return r


def spearman(a: list[float], b: list[float]) -> float:
    n = len(a)
    if n < 2:
        return float("nan")
    ra, rb = _ranks(a), _ranks(b)
    return 1 - 6 * sum((x - y) ** 2 for x, y in zip(ra, rb)) / (n * (n * n - 1))


def run(suite: str, only: str, seeds: list[int], time_limit_s: float) -> list[dict]:
    from lowering import lower_document
    from simulator.timing import time_program
    from solver.bundles import split_wide_copies
    from solver.oracle import checked_program
    from solver.spyre import single, steps
    from solver.spyre.cpsat_planner import plan_cpsat
    from target.hardware import load_target

    hw = load_target()
    seen: dict = {}
    # what the solve handed to the post-solve steps, and its model
    real_post_solve, real_build = steps.post_solve, single.build_model

    def post_solve(pg, hw_, chosen, **kw):
        seen["d"], seen["pg"] = chosen, pg
        return real_post_solve(pg, hw_, chosen, **kw)

    def build_model(*a, **k):
        out = real_build(*a, **k)
        seen["sm"] = out[2]
        return out
    single.steps.post_solve, single.build_model = post_solve, build_model
    rows = []
    try:
        for name, doc in load_suite(suite, only=only):
            pg = split_wide_copies(lower_document(doc), hw)
            for seed in seeds:
                d = plan_cpsat(pg, hw, time_limit_s=time_limit_s, deterministic=True, seed=seed)
                prog, issues = checked_program(pg, hw, d)
                fused = time_program(prog, hw).total_us if prog is not None and not issues else None
                sm, dd = seen["sm"], seen["d"]
                picks = {op.id: sm.strategy_index(op.id, dd.ops[op.id], dd.dim_orders) for op in seen["pg"].ops}
                held = {t for t in dd.resident if t in sm.res}
                held |= {t for t in sm.handoffs if sm.residency_ok(t, picks)}
                model = sm.objective_of(picks, held, dd.input_sticks) / 1000.0
                rows.append({"graph": name, "seed": seed, "fused_us": fused, "model_us": model,
                             "valid": fused is not None})
                print(json.dumps(rows[-1]), flush=True)
    finally:
        single.steps.post_solve, single.build_model = real_post_solve, real_build
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="layers")
    ap.add_argument("--only", default="prefill")
    ap.add_argument("--seeds", default="1,2,3,4")
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE")
    args = ap.parse_args(argv)
    from solver.spyre import budget
    for kv in args.set:
        k, v = kv.split("=", 1)
        if not hasattr(budget, k):
            ap.error(f"no budget knob {k}")
        setattr(budget, k, ast.literal_eval(v))
    rows = run(args.suite, args.only, [int(s) for s in args.seeds.split(",")], args.time_limit)
    bad = [r for r in rows if not r["valid"]]
    for g in sorted({r["graph"] for r in rows}):
        rs = [r for r in rows if r["graph"] == g and r["valid"]]
        fused, model = [r["fused_us"] for r in rs], [r["model_us"] for r in rs]
        ratios = [m / f for m, f in zip(model, fused)]
        print(f"{g}: fused {min(fused):.1f}-{max(fused):.1f} us, model/fused {min(ratios):.2f}-{max(ratios):.2f}, "
              f"Spearman {spearman(model, fused):.2f} over {len(rs)} seeds")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
