"""The FMS static-batching serving loop through the sticksat backend: programs compiled,
compile time, simulated time per step, against eager CPU fp32's tokens.

A tiny random-weight FMS Granite (tests/fms_zoo.py: 2 layers, width 64, 4 heads, vocabulary
128) generates greedily for two prompts of 7 and 12 tokens (one left-padded batch of 2):
the prefill, then `--steps` decode steps with the sdpa KV cache (tests/fms_serving.py,
driven by `fms.utils.generation.generate` as aiu-fms-testing-utils' inference script does
for `--attention_type sdpa`). Both Dynamo modes run side by side in one process:

  static        the Spyre scripts without --compile_dynamic: dynamic_shapes, automatic
                dynamic shapes off; Dynamo recompiles each step (one graph per step)
  mark_dynamic  FMS's default: the KV cache's sequence dim marked dynamic; the decode steps
                share one symbolic Dynamo graph that the backend specializes per KV length

then each mode generates again with the same compiled model (every program a hit).

    python benchmarks/bench_fms_serving.py                       # cpsat planner, 32 decode steps
    python benchmarks/bench_fms_serving.py --planner heuristic --steps 8 --json
    python benchmarks/bench_fms_serving.py --write      # also rewrite the table in docs/fms-vllm.md
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from benchmarks.bench_service import machine  # noqa: E402


def run(planner: str, steps: int, time_limit: float | None) -> dict:
    import torch

    from backend.region import forget_compiled_regions
    from tests.fms_serving import compile_for_serving, max_logit_error, static_batching
    from tests.fms_zoo import build

    model, _ = build("granite")
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 128, (n,), generator=g) for n in (7, 12)]
    new_tokens = steps + 1
    reference = static_batching(model, prompts, new_tokens)
    options = {"planner": planner, "strict": True}
    if time_limit is not None:
        options["time_limit_s"] = time_limit
    results = {"machine": machine(), "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               "planner": planner, "decode_steps": steps, "eager_seconds": reference.seconds, "modes": {}}
    for mode in ("static", "mark_dynamic"):
        forget_compiled_regions()
        compiled = compile_for_serving(model, options)
        first = static_batching(compiled, prompts, new_tokens, dynamo=mode)
        started = time.perf_counter()
        again = static_batching(compiled, prompts, new_tokens, dynamo=mode)
        cov = first.coverage
        latencies = [x for x in first.step_latency_us if x is not None]
        results["modes"][mode] = {
            "tokens_equal_cpu_fp32": bool(torch.equal(first.tokens, reference.tokens)
                                         and torch.equal(again.tokens, reference.tokens)),
            "max_logit_error": max_logit_error(first, reference),
            "dynamo_graphs": first.dynamo_graphs, "programs": first.programs,
            "aten_ops_on_device": cov.device_ops, "aten_ops_total": cov.total_ops,
            "eager_graphs": len(cov.eager_graphs),
            "compile_seconds_total": cov.compile_seconds,
            "compile_seconds_prefill": cov.graphs[0].compile_seconds,
            "compile_seconds_decode_mean": (sum(g.compile_seconds for g in cov.graphs[1:]) / max(1, len(cov.graphs) - 1)),
            "first_generate_seconds": first.seconds,
            "second_generate_seconds": time.perf_counter() - started,
            "second_generate_programs": len(again.coverage.graphs),
            "simulated_us_prefill": latencies[0] if latencies else None,
            "simulated_us_decode_first": latencies[1] if len(latencies) > 1 else None,
            "simulated_us_decode_last": latencies[-1] if len(latencies) > 1 else None,
        }
    return results


def table(r: dict) -> str:
    rows = [f"Run {r['date']} on {r['machine']}; planner `{r['planner']}`, {r['decode_steps']} decode steps, "
            f"eager CPU generate {r['eager_seconds']:.2f} s.", "",
            "| Dynamo mode | graphs (Dynamo) | programs | ATen ops on device | tokens = CPU fp32 | max logit error | "
            "compile total (s) | prefill / mean decode compile (s) | 2nd generate (s, programs) | "
            "simulated prefill / first / last decode step (us) |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for mode, m in r["modes"].items():
        rows.append(f"| {mode} | {m['dynamo_graphs']} | {m['programs']} | {m['aten_ops_on_device']} / "
                    f"{m['aten_ops_total']} | {'yes' if m['tokens_equal_cpu_fp32'] else 'NO'} | "
                    f"{m['max_logit_error']:.1e} | {m['compile_seconds_total']:.1f} | "
                    f"{m['compile_seconds_prefill']:.2f} / {m['compile_seconds_decode_mean']:.2f} | "
                    f"{m['second_generate_seconds']:.1f}, {m['second_generate_programs']} | "
                    f"{m['simulated_us_prefill']:.1f} / {m['simulated_us_decode_first']:.1f} / "
                    f"{m['simulated_us_decode_last']:.1f} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--planner", default="cpsat")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--time-limit", type=float, default=None, help="per-program planner budget (s)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write", action="store_true", help="rewrite the results table in docs/fms-vllm.md")
    args = ap.parse_args(argv)
    r = run(args.planner, args.steps, args.time_limit)
    print(json.dumps(r, indent=2) if args.json else table(r))
    if args.write:
        write_doc(table(r))
    return 0


BEGIN, END = "<!-- fms-serving:begin -->", "<!-- fms-serving:end -->"


def write_doc(text: str, path: Path = ROOT / "docs" / "fms-vllm.md") -> None:
    doc = path.read_text()
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


if __name__ == "__main__":
    sys.exit(main())
