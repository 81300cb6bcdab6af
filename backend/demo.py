"""The main job until the service lands: compile a built-in tiny GPT-2 with
`torch.compile(backend="sticksat")`, show what was captured and lowered, and compare the
outputs with eager torch.

    python -m backend.demo [--dtype float32|float16] [--seq 16]

Exits 1 when the compiled outputs disagree with eager beyond the stated tolerance.
"""
from __future__ import annotations

import argparse
import collections
import logging
import os
import sys

# A tiny GPT-2 built from a config with random weights: nothing to download.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

# Max |compiled - eager| / max |eager|. fp32: the interpreter computes in fp32 like eager
# but in a different summation order. fp16: both round every stored intermediate to fp16
# (eager CPU and sticksat accumulate in fp32), so results differ by a few fp16 ulps.
TOLERANCE = {"float32": 1e-5, "float16": 5e-3}

GPT2_CONFIG = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64, use_cache=False)


def build_model(dtype: torch.dtype, seq: int, seed: int = 0):
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(seed)
    model = GPT2Model(GPT2Config(**GPT2_CONFIG)).eval().to(dtype)
    input_ids = torch.randint(0, GPT2_CONFIG["vocab_size"], (1, seq), generator=torch.Generator().manual_seed(seed + 1))
    return model, input_ids


def _histogram(items, top: int = 8) -> str:
    counts = collections.Counter(items).most_common()
    shown = ", ".join(f"{name} {n}" for name, n in counts[:top])
    rest = len(counts) - top
    return shown + (f", ... {rest} more kinds" if rest > 0 else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m backend.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=sorted(TOLERANCE), default="float32")
    parser.add_argument("--seq", type=int, default=16, help="sequence length (<= 64)")
    parser.add_argument("--executor", choices=("interpreter", "simulator"), default="interpreter",
                        help="run regions on the reference interpreter, or plan them and run the "
                             "program on the simulator (reports simulated latency)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s: %(message)s")

    from backend.region import compiled_regions, forget_compiled_regions, last_run_info

    dtype = getattr(torch, args.dtype)
    model, input_ids = build_model(dtype, args.seq)
    print(f"model: GPT-2, {GPT2_CONFIG['n_layer']} layers, hidden {GPT2_CONFIG['n_embd']}, "
          f"{GPT2_CONFIG['n_head']} heads, {sum(p.numel() for p in model.parameters())} parameters, {args.dtype}, "
          f"input {tuple(input_ids.shape)}")

    torch._dynamo.reset()
    forget_compiled_regions()
    compiled = torch.compile(model, backend="sticksat", dynamic=False, options={"executor": args.executor})
    with torch.no_grad():
        expected = model(input_ids).last_hidden_state
        actual = compiled(input_ids).last_hidden_state

    regions = compiled_regions()
    for k, region in enumerate(regions):
        doc = region.doc
        kinds = collections.Counter(i["kind"] for i in doc["inputs"])
        print(f"captured region {k}: {len(doc['nodes'])} aten nodes, inputs {dict(kinds)}, "
              f"{len(doc['outputs'])} outputs, graph hash {region.graph_hash[:16]}")
        print(f"  aten ops: {_histogram(n['target'] for n in doc['nodes'])}")
        prim_graph = getattr(region.executable, "prim_graph", None)
        if prim_graph is not None:
            print(f"  lowered: {len(prim_graph.ops)} primitive ops: "
                  f"{_histogram(op.body.kind for op in prim_graph.ops)}")
        program = getattr(region.executable, "program", None)
        if program is not None:
            stats = program.stats
            predicted = f", predicted {stats.predicted_us:.1f} us" if stats.predicted_us is not None else ""
            bound = f", lower bound {stats.lower_bound_us:.1f} us" if stats.lower_bound_us is not None else ""
            print(f"  planned: SuperDSC program with {len(program.ops)} ops in {len(program.bundles)} bundles, "
                  f"planner {stats.planner} ({stats.solver_status or 'n/a'}){predicted}{bound}")
    if not regions:
        print("nothing was compiled by sticksat (everything ran in eager torch)")
    info = last_run_info()
    if info is not None:
        timing = f", simulated latency {info.latency_us:.1f} us" if info.latency_us is not None else ""
        print(f"ran on: {info.executor}, {info.wall_seconds * 1e3:.1f} ms wall{timing}")

    diff = (actual.float() - expected.float()).abs()
    max_abs = diff.max().item()
    max_rel = max_abs / max(expected.float().abs().max().item(), 1e-30)
    tolerance = TOLERANCE[args.dtype]
    ok = bool(torch.isfinite(actual).all()) and max_rel <= tolerance and actual.shape == expected.shape
    print(f"vs eager: max abs error {max_abs:.3g}, max error relative to max |eager| {max_rel:.3g} "
          f"(tolerance {tolerance:g}): {'OK' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
