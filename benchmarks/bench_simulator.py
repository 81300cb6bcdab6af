"""Timing-only simulation speed on one real-size Llama-3.1-8B decoder layer.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_simulator.py [--runs 5] [--write-docs]

The layer (hidden 4096, 32 heads, 8 KV heads, intermediate 14336, sequence 512, fp16) is
captured with `backend.capture.capture` on fake (unallocated) fp16 tensors from a
transformers LlamaConfig with one layer (the builder in benchmarks/graphs/make_graphs.py,
no weights, no download),
lowered to primitive ops, planned with the naive planner, and timed with
`simulator.timing.time_program`. Reported: the median wall time of `time_program` over
`--runs` runs (the target is < 2 s on the 2-core development machine), with the machine
it ran on. `--write-docs` records the figure in docs/simulator-timing.md (section
"Benchmark"). This is a benchmark, not a test: nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DOC = ROOT / "docs" / "simulator-timing.md"
BEGIN, END = "<!-- bench_simulator:begin -->", "<!-- bench_simulator:end -->"


def capture_llama_layer(seq: int = 512) -> dict:
    """Capture the layer as benchmarks/graphs/make_graphs.py does: fp16 parameters on fake
    (unallocated) CPU tensors, so SDPA keeps the CPU flash-attention op a real model shows."""
    from benchmarks.graphs.make_graphs import _decoder_prefill, fake_fp16, llama31_8b_config
    from backend.capture import capture

    with fake_fp16():
        model, inputs = _decoder_prefill("llama", llama31_8b_config, seq)()
    return capture(model, inputs, name=f"llama31_8b_prefill{seq}")


def machine() -> str:
    return (f"{platform.machine()}, nproc {os.cpu_count()}, Python {platform.python_version()}, "
            f"{platform.system()} {platform.release()}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from lowering import lower_document
    from lowering.graph_format import GraphDocument
    from simulator.hardware import load_target
    from simulator.timing import time_program
    from solver.planners import plan

    hw = load_target()
    t0 = time.perf_counter()
    doc = GraphDocument.model_validate(capture_llama_layer(args.seq))
    t1 = time.perf_counter()
    pg = lower_document(doc)
    t2 = time.perf_counter()
    program = plan(pg, hw, "naive")
    t3 = time.perf_counter()
    walls = []
    report = None
    for _ in range(max(1, args.runs)):
        a = time.perf_counter()
        report = time_program(program, hw)
        walls.append(time.perf_counter() - a)
    median = statistics.median(walls)
    n_cores_ops = sum(o.cores for o in report.ops)
    lines = [
        f"- date: {_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {machine()}",
        f"- graph: Llama-3.1-8B decoder layer, seq {args.seq}, fp16: {len(doc.nodes)} aten nodes, "
        f"{len(pg.ops)} primitive ops, naive plan with {len(program.ops)} program ops "
        f"({n_cores_ops} op-core slices)",
        f"- time_program wall time: median {median * 1e3:.1f} ms over {len(walls)} runs "
        f"(min {min(walls) * 1e3:.1f}, max {max(walls) * 1e3:.1f}); target < 2000 ms",
        f"- simulated latency of the naive plan: {report.total_us / 1e3:.3f} ms",
        f"- (capture {t1 - t0:.1f} s, lowering {t2 - t1:.2f} s, naive plan + validation {t3 - t2:.2f} s; not part of the figure)",
    ]
    text = "\n".join(lines)
    print(text)
    if args.write_docs:
        body = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
        block = f"{BEGIN}\n{text}\n{END}"
        if BEGIN in body:
            body = re.sub(re.escape(BEGIN) + r".*?" + re.escape(END), lambda _: block, body, flags=re.S)
        else:
            body = body.rstrip() + "\n\n## Benchmark\n\n" + block + "\n"
        DOC.write_text(body, encoding="utf-8")
        print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
