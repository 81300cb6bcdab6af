"""The README's main job: start the compile service on embedded defaults (loopback, a
temporary store), compile a built-in tiny GPT-2 with `torch.compile(backend="sticksat")`
against it, show what was captured, lowered and planned, run the returned SuperDSC
program on the simulator, compare the outputs with eager torch, and compile once more to
show the store answering (a cache hit in /metrics).

    python -m backend.demo [--dtype float32|float16] [--seq 16] [--planner cpsat]
    python -m backend.demo --in-process     # no service: plan in this process

Exits 1 when the compiled outputs disagree with eager beyond the stated tolerance.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import logging
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

# A tiny GPT-2 built from a config with random weights: nothing to download.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

# Max |compiled - eager| / max |eager|. fp32: the interpreter computes in fp32 like eager
# but in a different summation order. fp16: both round every stored intermediate to fp16
# (eager CPU and sticksat accumulate in fp32), so results differ by a few fp16 ulps.
TOLERANCE = {"float32": 1e-5, "float16": 5e-3}

GPT2_CONFIG = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64, use_cache=False,
                   bos_token_id=0, eos_token_id=0)


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
    parser.add_argument("--planner", default="cpsat", choices=("naive", "heuristic", "cpsat"))
    parser.add_argument("--time-limit", type=float, default=10.0, help="solver time limit, seconds")
    parser.add_argument("--in-process", action="store_true",
                        help="do not start the service: plan in this process")
    parser.add_argument("--executor", choices=("interpreter", "simulator"), default="simulator",
                        help="with --in-process: plan and run on the simulator (default), or run the "
                             "lowered graph on the reference interpreter")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s: %(message)s")
    if args.in_process:
        options = {"executor": args.executor, "planner": args.planner, "time_limit_s": args.time_limit}
        return _compile_and_compare(args, options)
    with _service() as url:
        options = {"url": url, "planner": args.planner, "time_limit_s": args.time_limit}
        status = _compile_and_compare(args, options)
        print("\ncompiling the same model again (a fresh torch.compile): the service answers from its store")
        status |= _compile_and_compare(args, options, quiet=True)
        hits = _metric(url, "sticksat_cache_hits_total")
        print(f"service metrics: sticksat_cache_hits_total {hits:g}")
        return status


@contextlib.contextmanager
def _service():
    """`sticksat serve` on a free loopback port with a temporary store, stopped on exit."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="sticksat-demo-") as tmp:
        log_path = os.path.join(tmp, "service.log")
        command = [sys.executable, "-m", "service.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
                   "--store", os.path.join(tmp, "store.sqlite3"), "--workers", "1", "--log-level", "warning"]
        print(f"starting the compile service: sticksat serve --port {port} (store in {tmp})")
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + 120
            while True:
                if proc.poll() is not None:
                    raise SystemExit(f"the service exited with {proc.returncode}:\n{open(log_path).read()[-2000:]}")
                try:
                    with urllib.request.urlopen(url + "/readyz", timeout=2) as reply:
                        if reply.status == 200:
                            break
                except OSError:
                    pass
                if time.time() > deadline:
                    raise SystemExit(f"the service was not ready within 120 s:\n{open(log_path).read()[-2000:]}")
                time.sleep(0.2)
            print(f"service ready at {url}")
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def _compile_and_compare(args, options: dict, quiet: bool = False) -> int:
    from backend.region import compiled_regions, forget_compiled_regions, last_run_info

    dtype = getattr(torch, args.dtype)
    model, input_ids = build_model(dtype, args.seq)
    if not quiet:
        print(f"model: GPT-2, {GPT2_CONFIG['n_layer']} layers, hidden {GPT2_CONFIG['n_embd']}, "
              f"{GPT2_CONFIG['n_head']} heads, {sum(p.numel() for p in model.parameters())} parameters, {args.dtype}, "
              f"input {tuple(input_ids.shape)}")

    torch._dynamo.reset()
    forget_compiled_regions()
    compiled = torch.compile(model, backend="sticksat", dynamic=False, options=options)
    with torch.no_grad():
        expected = model(input_ids).last_hidden_state
        actual = compiled(input_ids).last_hidden_state

    regions = compiled_regions()
    for k, region in enumerate(regions if not quiet else []):
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
        cached = getattr(regions[-1].executable, "cached", None) if regions else None
        origin = "" if cached is None else (", program from the store (cache hit)" if cached else
                                           ", program solved by the service")
        print(f"ran on: {info.executor}{origin}, {info.wall_seconds * 1e3:.1f} ms wall{timing}")

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
