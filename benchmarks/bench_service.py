"""Service latency benchmark (not a test): a real `sticksat serve` process on 127.0.0.1.

1. Cache-hit /compile latency for a transformer layer graph: one cold compile, then
   --repeats identical requests over one keep-alive connection; median / p90 / min of the
   client-observed wall time.
2. Cold /compile latency for the tiny foundation models (captured with
   backend.capture; needs torch), per planner: client wall time and the worker's solve
   seconds, each against a fresh store.

    python benchmarks/bench_service.py [--write docs/service.md]

With --write, the results replace the block between the bench markers in the doc,
stamped with the date and the machine.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from service_helpers import ServiceProcess  # noqa: E402

LAYER_GRAPH = REPO / "benchmarks" / "graphs" / "layers" / "gpt2_block512.json"
START, END = "<!-- bench_service:start -->", "<!-- bench_service:end -->"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores ({cpu}), Python {platform.python_version()}"


def cache_hit_latency(server: ServiceProcess, graph: dict, planner: str, repeats: int) -> dict:
    body = json.dumps({"graph": graph, "options": {"planner": planner, "deterministic": True}})
    headers = {"content-type": "application/json"}
    with httpx.Client(base_url=server.url, timeout=600) as client:
        t0 = time.perf_counter()
        cold = client.post("/compile", content=body, headers=headers)
        cold_s = time.perf_counter() - t0
        cold.raise_for_status()
        server_sum = server.metric("sticksat_request_seconds_sum", {"route": "/compile"})
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            resp = client.post("/compile", content=body, headers=headers)
            times.append(time.perf_counter() - t0)
            assert resp.status_code == 200 and resp.json()["cached"] is True
    # Server-side time (middleware to last byte handed to uvicorn) from the service's own
    # request histogram: the rest of the client wall time is HTTP transport and the client.
    server_mean_ms = 1000 * (server.metric("sticksat_request_seconds_sum", {"route": "/compile"}) - server_sum) / repeats
    times.sort()
    return {"server_mean_ms": server_mean_ms, "graph": graph.get("name", "?"), "nodes": len(graph["nodes"]), "planner": planner,
            "cold_s": cold_s, "request_bytes": len(body), "response_bytes": len(cold.content),
            "median_ms": 1000 * statistics.median(times), "p90_ms": 1000 * times[int(0.9 * (len(times) - 1))],
            "min_ms": 1000 * times[0], "repeats": repeats}


def tiny_model_documents() -> dict[str, dict]:
    import torch

    from backend.capture import capture
    from models import TINY_MODEL_NAMES, tiny_model

    docs = {}
    for name in TINY_MODEL_NAMES:
        model, inputs = tiny_model(name, torch.float16)
        docs[name] = capture(model, inputs)
    return docs


def cold_compiles(server: ServiceProcess, docs: dict[str, dict], planners: list[str]) -> list[dict]:
    rows = []
    with httpx.Client(base_url=server.url, timeout=900) as client:
        for name, doc in docs.items():
            for planner in planners:
                t0 = time.perf_counter()
                resp = client.post("/compile", json={"graph": doc, "options": {"planner": planner,
                                                                               "deterministic": True}})
                wall = time.perf_counter() - t0
                row = {"model": name, "nodes": len(doc["nodes"]), "planner": planner, "status": resp.status_code,
                       "wall_s": wall}
                if resp.status_code == 200:
                    body = resp.json()
                    row["cached"] = body["cached"]
                    row["solve_seconds"] = body["stats"].get("solve_seconds")
                    row["predicted_us"] = body["stats"].get("predicted_us")
                    row["simulated_us"] = body["stats"].get("simulated_us")
                else:
                    row["error"] = resp.json().get("detail", "")[:120]
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def render(hit: dict, cold: list[dict], stamp: str) -> str:
    lines = [START, "", f"Measured {stamp}.", "",
             "Cache-hit `/compile` (client wall time over one keep-alive connection, "
             f"{hit['repeats']} requests after one cold compile):", "",
             "| graph | nodes | planner | request | response | cold compile | median | p90 | min | server-side mean |",
             "|---|---|---|---|---|---|---|---|---|---|",
             f"| {hit['graph']} | {hit['nodes']} | {hit['planner']} | {hit['request_bytes'] / 1024:.0f} KiB "
             f"| {hit['response_bytes'] / 1024:.0f} KiB | {hit['cold_s']:.2f} s | {hit['median_ms']:.1f} ms "
             f"| {hit['p90_ms']:.1f} ms | {hit['min_ms']:.1f} ms | {hit['server_mean_ms']:.1f} ms |",
             "", "Cold `/compile` of the tiny models (fp16, fresh store; wall = client time including "
             "validation, lowering, planning, validation on the simulator and the store write):", "",
             "| model | nodes | planner | wall | solve (planner) | predicted (planner) | simulated | status |",
             "|---|---|---|---|---|---|---|---|"]
    for r in cold:
        solve = f"{r['solve_seconds']:.2f} s" if r.get("solve_seconds") is not None else "-"
        pred = f"{r['predicted_us']:.1f} µs" if r.get("predicted_us") is not None else "-"
        sim = f"{r['simulated_us']:.1f} µs" if r.get("simulated_us") is not None else "-"
        status = str(r["status"]) + (f" ({r['error']})" if r.get("error") else "")
        lines.append(f"| {r['model']} | {r['nodes']} | {r['planner']} | {r['wall_s']:.2f} s | {solve} | {pred} "
                     f"| {sim} | {status} |")
    lines += ["", END]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--hit-planner", default="naive")
    parser.add_argument("--planners", default="naive,heuristic",
                        help="comma-separated planners for the cold tiny-model compiles")
    parser.add_argument("--skip-models", action="store_true", help="only the cache-hit measurement")
    parser.add_argument("--write", default=None, help="markdown file whose bench block to replace")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    graph = json.loads(LAYER_GRAPH.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        server = ServiceProcess(Path(tmp) / "store.sqlite", Path(tmp) / "server.log", ["--workers", "1",
                                                                                       "--log-level", "warning"])
        server.start()
        try:
            hit = cache_hit_latency(server, graph, args.hit_planner, args.repeats)
            print(json.dumps(hit), flush=True)
            cold = [] if args.skip_models else cold_compiles(server, tiny_model_documents(),
                                                             [p for p in args.planners.split(",") if p])
        finally:
            server.stop()
    stamp = f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC on {machine()}"
    block = render(hit, cold, stamp)
    print(block)
    if args.write:
        path = Path(args.write)
        text = path.read_text()
        if START in text and END in text:
            text = text[:text.index(START)] + block + text[text.index(END) + len(END):]
        else:
            text = text.rstrip("\n") + "\n\n" + block + "\n"
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
