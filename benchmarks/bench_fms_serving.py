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

`--loop paged` (and `both`, the default) also runs continuous batching with FMS's paged KV
cache (tests/fms_paged_serving.py, driven as vLLM's Spyre plugin drives it): the same tiny
Granite (rotary table of 256 positions) serves four requests arriving at different steps
(prompts of 7, 12, 70 and 30 tokens; 20, 33, 10 and 12 new tokens), so the decode batch
grows and shrinks (sizes 1-4) over 32 decode steps, compiled in fp32 and in fp16; tokens and
aiu-fms-testing-utils' level-1 metrics (the compiled run fed the CPU's tokens when its own
differ, as their GoldenTokenHook does) against the eager CPU fp32 run, then the same requests
served again.

    python benchmarks/bench_fms_serving.py                       # cpsat planner, 32 decode steps
    python benchmarks/bench_fms_serving.py --planner heuristic --steps 8 --json
    python benchmarks/bench_fms_serving.py --write      # also rewrite the tables in docs/fms-vllm.md
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


# (prompt tokens, new tokens, arrival step): 32 decode steps at batch sizes 1-4
PAGED_REQUESTS = [(7, 20, 0), (12, 33, 0), (70, 10, 6), (30, 12, 15)]
CE_THRESHOLD, DIFF_THRESHOLD = 3.0, 0.001   # aiu-fms-testing-utils' defaults without model thresholds


def run_paged(planner: str, time_limit: float | None) -> dict:
    """The continuous-batching loop compiled in fp32 and in fp16, each against eager CPU fp32."""
    import torch

    from tests.fms_paged_serving import Request, continuous_batching, granite

    g = torch.Generator().manual_seed(0)
    requests = [Request(torch.randint(1, 128, (n,), generator=g), new, at) for n, new, at in PAGED_REQUESTS]
    reference = continuous_batching(granite(), requests)
    options = {"planner": planner, "strict": True}
    if time_limit is not None:
        options["time_limit_s"] = time_limit
    return {"requests": PAGED_REQUESTS, "eager_seconds": reference.seconds,
            "dtypes": {name: _paged_dtype(dtype, requests, reference, options)
                       for name, dtype in (("fp32", torch.float32), ("fp16", torch.float16))}}


def _paged_dtype(dtype, requests, reference, options: dict) -> dict:
    import torch

    from backend.region import forget_compiled_regions
    from tests.fms_paged_serving import continuous_batching, granite, level_1_metrics

    forget_compiled_regions()
    torch._dynamo.reset()
    compiled = torch.compile(granite(dtype=dtype), backend="sticksat", dynamic=False, options=options)
    first = continuous_batching(compiled, requests)
    again = continuous_batching(compiled, requests)
    # level 1 as aiu-fms-testing-utils measures it: the run fed the CPU's tokens
    fed = first if first.tokens == reference.tokens else continuous_batching(compiled, requests,
                                                                               golden=reference.tokens)
    cov = first.coverage
    metrics = level_1_metrics(fed, reference)
    self_ce = level_1_metrics(reference, reference)
    prefill = [g for g, s in zip(cov.graphs, _first_steps(first)) if s.kind == "prefill"]
    decode = [g for g, s in zip(cov.graphs, _first_steps(first)) if s.kind == "decode"]
    per_batch: dict[int, list[float]] = {}
    for s in first.steps:
        if s.kind == "decode" and s.latency_us is not None:
            per_batch.setdefault(s.batch, []).append(s.latency_us)
    matched = sum(a == b for x, y in zip(first.tokens, reference.tokens) for a, b in zip(x, y))
    return {
        "decode_steps": first.decode_steps, "batch_sizes": sorted(set(first.batch_sizes)),
        "tokens_matching_cpu_fp32": matched,
        "tokens_equal_cpu_fp32": first.tokens == reference.tokens and again.tokens == reference.tokens,
        "second_serve_tokens_equal_first": again.tokens == first.tokens,
        "tokens": sum(len(t) for t in first.tokens),
        "level_1_max_ce": max(m[2][0] for m in metrics),
        "level_1_max_ce_over_reference": max(m[2][0] - r[2][0] for m, r in zip(metrics, self_ce)),
        "level_1_max_mean_diff": max(m[2][1] for m in metrics),
        "level_1_failures": sum(m[2][0] >= CE_THRESHOLD or m[2][1] >= DIFF_THRESHOLD for m in metrics),
        "dynamo_graphs": len({(g.code, g.compile_id) for g in cov.graphs}), "programs": len(cov.graphs),
        "aten_ops_on_device": cov.device_ops, "aten_ops_total": cov.total_ops, "eager_graphs": len(cov.eager_graphs),
        "compile_seconds_total": cov.compile_seconds,
        "compile_seconds_prefill_mean": sum(g.compile_seconds for g in prefill) / max(1, len(prefill)),
        "compile_seconds_decode_mean": sum(g.compile_seconds for g in decode) / max(1, len(decode)),
        "programs_prefill": len(prefill), "programs_decode": len(decode),
        "first_serve_seconds": first.seconds, "second_serve_seconds": again.seconds,
        "second_serve_programs": len(again.coverage.graphs) if again.coverage else 0,
        "simulated_us_prefill": sorted({round(s.latency_us, 1) for s in first.steps if s.kind == "prefill"}),
        "simulated_us_decode_by_batch": {b: sum(v) / len(v) for b, v in sorted(per_batch.items())},
    }


def _first_steps(run) -> list:
    """The step of each new shape, in order: the steps that compiled a program."""
    seen, out = set(), []
    for s in run.steps:
        key = (s.kind, s.batch, s.shape)
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out


def paged_table(r: dict, head: dict) -> str:
    rows = [f"Run {head['date']} on {head['machine']}; planner `{head['planner']}`; requests (prompt, new tokens, "
            f"arrival step) {r['requests']}; eager CPU fp32 serve {r['eager_seconds']:.2f} s.", "",
            "| dtype | decode steps (batch sizes) | graphs (Dynamo) | programs (prefill + decode) | ATen ops on device | "
            "tokens = CPU fp32 | level 1: max CE (over CPU's own) / max mean diff / failures | compile total (s) | "
            "prefill / mean decode compile (s) | 2nd serve (s, programs) | simulated prefill (us) | "
            "simulated decode step by batch size (us) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for dtype, p in r["dtypes"].items():
        per_batch = ", ".join(f"{b}: {us:.1f}" for b, us in p["simulated_us_decode_by_batch"].items())
        rows.append(
            f"| {dtype} | {p['decode_steps']} ({', '.join(map(str, p['batch_sizes']))}) | {p['dynamo_graphs']} | "
            f"{p['programs']} ({p['programs_prefill']} + {p['programs_decode']}) | {p['aten_ops_on_device']} / "
            f"{p['aten_ops_total']} | {p['tokens_matching_cpu_fp32']} of {p['tokens']} | {p['level_1_max_ce']:.3f} "
            f"({p['level_1_max_ce_over_reference']:+.1e}) / {p['level_1_max_mean_diff']:.1e} / {p['level_1_failures']} | "
            f"{p['compile_seconds_total']:.1f} | {p['compile_seconds_prefill_mean']:.2f} / "
            f"{p['compile_seconds_decode_mean']:.2f} | {p['second_serve_seconds']:.1f}, {p['second_serve_programs']} | "
            f"{' / '.join(f'{x:.1f}' for x in p['simulated_us_prefill'])} | {per_batch} |")
    return "\n".join(rows)


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
    ap.add_argument("--loop", choices=("static", "paged", "both"), default="both")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write", action="store_true", help="rewrite the results table in docs/fms-vllm.md")
    args = ap.parse_args(argv)
    r = run(args.planner, args.steps, args.time_limit) if args.loop != "paged" else {
        "machine": machine(), "planner": args.planner,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    if args.loop != "static":
        r["paged"] = run_paged(args.planner, args.time_limit)
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        if "modes" in r:
            print(table(r))
        if "paged" in r:
            print(paged_table(r["paged"], r))
    if args.write:
        if "modes" in r:
            write_doc(table(r))
        if "paged" in r:
            write_doc(paged_table(r["paged"], r), PAGED_BEGIN, PAGED_END)
    return 0


BEGIN, END = "<!-- fms-serving:begin -->", "<!-- fms-serving:end -->"
PAGED_BEGIN, PAGED_END = "<!-- fms-paged-serving:begin -->", "<!-- fms-paged-serving:end -->"


def write_doc(text: str, begin: str = BEGIN, end: str = END, path: Path = ROOT / "docs" / "fms-vllm.md") -> None:
    doc = path.read_text()
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{begin}\n{text}\n{end}{tail}")


if __name__ == "__main__":
    sys.exit(main())
