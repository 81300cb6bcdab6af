"""Strategy pricing on the irregular suite's large pieces (issue 30): the seconds
`core_search.spyre_strategies` (every op's pruned strategies, aligned for residency) and
`core_search.build_problem` take on each graph's range that does not repeat (the encoder
before T5's and the ViT-GPT-2's decoder stack; Qwen's first 300 ops), and a fingerprint of
the strategies (every op's strategies with their prices: equal fingerprints, equal spaces).

    .venv/bin/python benchmarks/bench_pricing.py              # this checkout
    PYTHONPATH=/tmp/old .venv/bin/python benchmarks/bench_pricing.py   # another code, same graphs

Each graph in a fresh process (no cache carried over); the machine and its load are printed.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRAPHS = ("t5_base_12x12_src512_tgt128", "vit_b16_gpt2_12x12_img224_tgt64", "qwen15_moe_a27b_x24_alt_prefill512")


def child(name: str) -> dict:
    from benchmarks.bench_depth import _load, split_point
    from target.hardware import load_target
    from solver.spyre.depth.core_search import build_problem, spyre_strategies
    from solver.spyre.depth.segments import subgraph
    from solver.spyre.schedule import chain_order
    from solver.spyre.start import default_hint
    from solver.spyre.strategies import GraphContext

    hw = load_target()
    pg = chain_order(_load(name))
    cut = split_point(pg)
    idx = list(range(0, cut if cut > 300 else 300))
    sub = subgraph(pg, idx, f"{name}#piece")
    hint, _ = default_hint(sub, hw)
    ctx = GraphContext.build(sub, hw, hint.input_sticks)
    t = time.perf_counter()
    S = spyre_strategies(sub, hw, hint, ctx, align=True)
    t_s = time.perf_counter() - t
    t = time.perf_counter()
    sp = build_problem(sub, hw, ctx, S)
    t_b = time.perf_counter() - t
    lines = [repr((oid, s.key(), s.input_sticks, s.out_stick, s.out_lx_bytes, s.reduction_split,
                   sorted(s.any_forbidden.items()), s.may_reside, sorted(s.parts.combos.items())))
             for oid in sorted(S) for s in S[oid]]
    return dict(graph=name, ops=len(idx), strategies=len(lines), strategies_s=round(t_s, 2),
                build_problem_s=round(t_b, 2), nodes=sp.problem.num_nodes,
                fingerprint=hashlib.sha1("\n".join(lines).encode()).hexdigest()[:16])


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2])))
        return 0
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(ROOT)) if p)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {os.getloadavg()[0]:.1f}")
    print("| graph | ops | strategies | spyre_strategies s | build_problem s | fingerprint |\n|---|---:|---:|---:|---:|---|")
    for g in GRAPHS:
        out = subprocess.run([sys.executable, __file__, "--child", g], capture_output=True, text=True, env=env)
        if out.returncode:
            print(f"| {g} | error: {out.stderr[-300:]!r} |")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"| {g} | {r['ops']} | {r['strategies']} | {r['strategies_s']} | {r['build_problem_s']} | {r['fingerprint']} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
