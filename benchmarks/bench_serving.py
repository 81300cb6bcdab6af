"""The serving warmup set (issue 26): what a vLLM Spyre deployment of Granite-3.3-8B compiles,
cold and with plan transfer, and the simulated time per token it gets.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_serving.py [--time-limit 10]
        [--deterministic] [--only decode_b8] [--json out.json] [--baseline-json main.json]

Graphs: benchmarks/graphs/serving/ (one layer each; make_graphs.py --suite serving). Per graph:
- `heuristic`: the torch-spyre baseline's plan (simulated µs);
- `cold`: the CP-SAT planner from nothing at the time limit (wall s of `plan()`, simulated µs);
- `transfer`: the CP-SAT planner given the plan of the previous shape of the same structure
  (the next smaller prefill, or the same batch at the next smaller KV length) as
  `SizedPlan`, as the compile driver gives it for a new shape of a graph it compiled before:
  wall s of `plan()` (transfer, validation, lower bound), simulated µs, and whether it was
  transferred (`TRANSFERRED`) or solved because the transfer failed; the first shape of each
  family has no source and is compiled cold only.
Per-token times multiply one layer by the model's 40 layers: a decode step of batch B gives
B tokens (time per step and tokens per second), a prefill of S tokens one time to first token.
Every program is validated by `plan()` or by the transfer's own check before it is timed.

`--paged` instead plans the decode graph of vLLM Spyre's continuous batching: one FMS
Granite-3.3-8B block (`GraniteBlock`, fp16) with `attn_name="spyre_paged_attn"`, one new
token per sequence stored into and attending over a paged KV cache of `--cache-blocks`
blocks of 64 tokens (the plugin sizes it for its largest batch at full context, plus the
padding block), at batch 1, 4 and 32 against KV lengths 1k-8k, the shapes whose blocks fit
the cache (batch 32 at 8k needs 4,097 blocks). Per shape: the baseline's and the cold CP-SAT
plan's simulated time, and the share of the latter in the paged store (an in-place row store:
the rows written) and in the paged attention; beside it the cold CP-SAT plan of the sdpa
decode graph of the same shape (benchmarks/graphs/serving), planned in the same run.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.suite import machine_info, read_document_text  # noqa: E402
from lowering import lower_document  # noqa: E402
from lowering.graph_format import GraphDocument  # noqa: E402
from simulator.timing import time_program  # noqa: E402
from solver.planners import PlannerFailed, plan  # noqa: E402
from solver.spyre.transfer import SizedPlan, structure_key  # noqa: E402
from target.hardware import load_target  # noqa: E402

GRAPHS = ROOT / "benchmarks" / "graphs" / "serving"
LAYERS = 40   # Granite-3.3-8B
_NAME = re.compile(r"granite33_8b_(?:prefill(?P<seq>\d+)|decode_b(?P<b>\d+)_kv(?P<kv>\d+))$")


def _shape(name: str) -> tuple[str, int, int]:
    """(family, batch, length): prefill graphs are one family ordered by length; decode graphs
    one family per batch size ordered by KV length."""
    m = _NAME.match(name)
    if m is None:
        raise ValueError(f"not a serving graph: {name}")
    if m["seq"]:
        return "prefill", 1, int(m["seq"])
    return f"decode_b{m['b']}", int(m["b"]), int(m["kv"])


def _load(name: str):
    path = GRAPHS / f"{name}.json"
    return lower_document(GraphDocument.from_json(read_document_text(path)))


def run(time_limit_s: float, deterministic: bool, only: str = "") -> dict:
    hw = load_target()
    names = sorted((p.name[:-5] for p in GRAPHS.glob("*.json")), key=lambda n: _shape(n))
    names = [n for n in names if any(part in n for part in only.split(","))]
    previous: dict[str, tuple] = {}     # family -> (pg, program) of its last shape
    rows = []
    for name in names:
        family, batch, length = _shape(name)
        pg = _load(name)
        row = {"graph": name, "family": family, "batch": batch, "length": length}
        try:
            row["heuristic_us"] = time_program(plan(pg, hw, "heuristic", fallback=False), hw).total_us
        except PlannerFailed as exc:   # the baseline cannot plan every shape (e.g. a core's span)
            row["heuristic_us"], row["heuristic_note"] = None, exc.reason[:200]
        t = time.perf_counter()
        try:
            cold = plan(pg, hw, "cpsat", time_limit_s=time_limit_s, deterministic=deterministic, fallback=False)
        except PlannerFailed as exc:   # said in the table, not hidden: the family's next shape has no source
            row["cold_note"] = exc.reason[:300]
            previous.pop(family, None)
            rows.append(row)
            print(json.dumps(row), flush=True)
            continue
        row["cold_s"] = time.perf_counter() - t
        row["cold_us"] = time_program(cold, hw).total_us
        source = previous.get(family)
        if source is not None and structure_key(source[0]) == structure_key(pg):
            t = time.perf_counter()
            moved = plan(pg, hw, "cpsat", time_limit_s=time_limit_s, deterministic=deterministic,
                         hint=SizedPlan(*source), fallback=False)
            row["transfer_s"] = time.perf_counter() - t
            row["transfer_us"] = time_program(moved, hw).total_us
            row["transfer_status"] = moved.stats.solver_status
        elif source is not None:
            row["transfer_note"] = "structure differs from the previous shape"
        previous[family] = (pg, cold)
        per_step_ms = row["cold_us"] * LAYERS / 1e3
        row["step_ms_40_layers"] = per_step_ms
        if family != "prefill":
            row["tokens_per_s"] = batch / (per_step_ms / 1e3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine_info(),
            "time_limit_s": time_limit_s,
            "deterministic": deterministic, "rows": rows}


PAGED_SHAPES = [(b, kv) for b in (1, 4, 32) for kv in (1024, 2048, 4096, 8192)]
BLOCK = 64


def _fms_paged_decode(batch: int, kv: int, blocks: int, block=[None]) -> dict:
    """The graph document of one FMS Granite-3.3-8B block's paged decode step (weights
    random, never written to the document)."""
    import torch

    import fms.utils.spyre.paged  # noqa: F401  registers spyre_paged_attn
    from backend.capture import capture
    from fms.models.granite import GraniteBlock, GraniteConfig
    from fms.modules.positions import RotaryEmbedding

    if block[0] is None:
        cfg = GraniteConfig(src_vocab_size=256, emb_dim=4096, nheads=32, kvheads=8, head_dim=128, nlayers=1,
                            hidden_grow_factor=12800 / 4096, multiple_of=1, max_expected_seq_len=16384,
                            attention_multiplier=0.0078125, residual_multiplier=0.22, rope_theta=10000000.0)

        class Step(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.rot = RotaryEmbedding(dim=128, ratio=cfg.rope_theta, max_seq_len=cfg.max_expected_seq_len)
                self.block = GraniteBlock(cfg, self.rot)

            def forward(self, x, positions, key_cache, value_cache, slots, tkv, start, table):
                return self.block(x, position_ids=positions, past_key_value_state=(key_cache, value_cache),
                                  use_cache=True, attn_name="spyre_paged_attn", slot_mapping=slots,
                                  current_tkv_mask=tkv, left_padded_prompt_mask=start, block_table=table, mask=None)

        model = Step().eval().half()
        model.rot.compute_freqs_cis(torch.device("cpu"), cfg.max_expected_seq_len)
        block[0] = model
    i64 = dict(dtype=torch.int64)
    cache = (blocks, BLOCK, 8, 128)
    args = (torch.zeros(batch, 1, 4096, dtype=torch.float16), torch.zeros(batch, 1, **i64),
            torch.zeros(cache, dtype=torch.float16), torch.zeros(cache, dtype=torch.float16),
            torch.zeros(batch, 1, **i64), torch.zeros(batch, **i64), torch.zeros(batch, **i64),
            torch.zeros(batch, kv // BLOCK, **i64))
    return capture(block[0], args, name=f"fms_granite33_8b_paged_decode_b{batch}_kv{kv}_cache{blocks}")


def run_paged(blocks: int, time_limit_s: float, deterministic: bool) -> dict:
    hw = load_target()
    rows = []
    for batch, kv in PAGED_SHAPES:
        if batch * kv // BLOCK + 1 > blocks:
            continue
        pg = lower_document(GraphDocument.model_validate(_fms_paged_decode(batch, kv, blocks)))
        row = {"graph": f"paged_decode_b{batch}_kv{kv}", "batch": batch, "length": kv, "cache_blocks": blocks}
        try:
            row["heuristic_us"] = time_program(plan(pg, hw, "heuristic", fallback=False), hw).total_us
        except PlannerFailed as exc:
            row["heuristic_us"], row["heuristic_note"] = None, exc.reason[:200]
        t = time.perf_counter()
        try:
            cold = plan(pg, hw, "cpsat", time_limit_s=time_limit_s, deterministic=deterministic, fallback=False)
        except PlannerFailed as exc:
            row["cold_note"] = exc.reason[:300]
            rows.append(row)
            print(json.dumps(row), flush=True)
            continue
        row["cold_s"] = time.perf_counter() - t
        report = time_program(cold, hw)
        row["cold_us"] = report.total_us
        row["store_us"] = sum(o.duration_us for o in report.ops if "paged_attn_store" in o.op_id)
        row["attention_us"] = sum(o.duration_us for o in report.ops if "paged_attn_compute" in o.op_id)
        sdpa = f"granite33_8b_decode_b{batch}_kv{kv}"
        if (GRAPHS / f"{sdpa}.json").exists():   # the same layer and shape with the sdpa cache, side by side
            row["sdpa_us"] = time_program(plan(_load(sdpa), hw, "cpsat", time_limit_s=time_limit_s,
                                               deterministic=deterministic, fallback=False), hw).total_us
        rows.append(row)
        print(json.dumps(row), flush=True)
    return {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine_info(),
            "time_limit_s": time_limit_s, "deterministic": deterministic, "cache_blocks": blocks, "rows": rows}


def paged_table(report: dict) -> str:
    out = ["| graph | heuristic µs | cold s | cold µs | paged store µs (share) | paged attention µs | "
           "sdpa decode cold µs |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for r in report["rows"]:
        if "cold_us" not in r:
            out.append(f"| {r['graph']} | - | - | no valid plan: {r.get('cold_note', '')[:160]} | - | - | - |")
            continue
        h = "-" if r["heuristic_us"] is None else f"{r['heuristic_us']:,.1f}"
        sdpa = "-" if r.get("sdpa_us") is None else f"{r['sdpa_us']:,.1f}"
        out.append(f"| {r['graph']} | {h} | {r['cold_s']:.2f} | {r['cold_us']:,.1f} | "
                   f"{r['store_us']:,.1f} ({r['store_us'] / r['cold_us']:.0%}) | {r['attention_us']:,.1f} | {sdpa} |")
    return "\n".join(out)


def summary(report: dict) -> str:
    """The targets (issue 26): a new shape of a known graph at least 5x faster to compile than
    cold, its plan within 3% of the cold plan's simulated time; and the plans against the
    baseline's."""
    moved = [r for r in report["rows"] if r.get("transfer_s")]
    kept = [r for r in moved if r.get("transfer_status") == "TRANSFERRED"]
    lines = [f"new shapes: {len(moved)}; transferred (guard kept the transfer): {len(kept)}; "
             f"solved from the transfer: {len(moved) - len(kept)}"]
    if moved:
        speed = [r["cold_s"] / r["transfer_s"] for r in moved]
        ratio = [r["transfer_us"] / r["cold_us"] for r in moved]
        lines.append(f"compile speed-up cold/transfer: {min(speed):.1f}x-{max(speed):.1f}x "
                     f"({sum(x >= 5 for x in speed)} of {len(moved)} at least 5x); transfer/cold simulated: "
                     f"{min(ratio):.3f}-{max(ratio):.3f} ({sum(x <= 1.03 for x in ratio)} of {len(moved)} within 3%)")
    failed = [r["graph"] for r in report["rows"] if "cold_us" not in r]
    if failed:
        lines.append(f"no valid cold CP-SAT plan: {', '.join(failed)}")
    base = [r for r in report["rows"] if r.get("heuristic_us") and "cold_us" in r]
    missing = [r["graph"] for r in report["rows"] if not r.get("heuristic_us")]
    if base:
        gain = [r["heuristic_us"] / r["cold_us"] for r in base]
        lines.append(f"baseline (heuristic) plans: {len(base)} of {len(report['rows'])} valid"
                     f"{' (none: ' + ', '.join(missing) + ')' if missing else ''}; baseline / sticksat "
                     f"(cold) simulated: {min(gain):.2f}x-{max(gain):.2f}x")
    return "\n".join(lines)


def table(report: dict) -> str:
    out = ["| graph | heuristic µs | cold s | cold µs | transfer s | transfer µs | cold/transfer time | "
           "transfer/cold µs | heuristic/cold µs | 40-layer step ms (heuristic) | tokens/s (heuristic) |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def f(v, fmt="{:,.1f}"):
        return "-" if v is None else fmt.format(v)

    for r in report["rows"]:
        if "cold_us" not in r:
            out.append(f"| {r['graph']} | {f(r.get('heuristic_us'))} | no valid cold plan: {r.get('cold_note', '')[:160]} |"
                       + " - |" * 8)
            continue
        speed = r["cold_s"] / r["transfer_s"] if r.get("transfer_s") else None
        ratio = r["transfer_us"] / r["cold_us"] if r.get("transfer_us") else None
        solved = "" if r.get("transfer_status") in (None, "TRANSFERRED") else " (solved)"
        vs = r["heuristic_us"] / r["cold_us"] if r.get("heuristic_us") else None
        out.append(f"| {r['graph']} | {f(r['heuristic_us'])} | {f(r['cold_s'], '{:.2f}')} | {f(r['cold_us'])} | "
                   f"{f(r.get('transfer_s'), '{:.2f}')}{solved} | {f(r.get('transfer_us'))} | {f(speed, '{:.1f}x')} | "
                   f"{f(ratio, '{:.3f}')} | {f(vs, '{:.2f}x')} | {f(r['step_ms_40_layers'], '{:.2f}')} "
                   f"({f(r['heuristic_us'] * LAYERS / 1e3 if r.get('heuristic_us') else None, '{:.2f}')}) | "
                   f"{f(r.get('tokens_per_s'), '{:,.0f}')}"
                   + (f" ({r['batch'] / (r['heuristic_us'] * LAYERS / 1e6):,.0f})"
                      if r.get('heuristic_us') and r["family"] != "prefill" else "") + " |")
    return "\n".join(out)


def compare_table(report: dict, baseline: dict) -> str:
    """Transfer side by side: this run's rows with another run's (`--baseline-json`, e.g. the
    same benchmark on another commit) transfer s, µs and their ratios to that run's cold."""
    base = {r["graph"]: r for r in baseline["rows"]}
    out = ["| graph | cold s | cold µs | transfer s | transfer µs | cold/transfer time | transfer/cold µs | "
           "baseline run: cold s | transfer s | cold/transfer time | transfer/cold µs |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def cells(r: Optional[dict]) -> list[str]:
        if r is None or not r.get("transfer_s"):
            return ["-", "-", "-", "-"] if r is None else [f"{r['cold_s']:.2f}", "-", "-", "-"]
        solved = "" if r.get("transfer_status") in (None, "TRANSFERRED") else " (solved)"
        return [f"{r['cold_s']:.2f}", f"{r['transfer_s']:.2f}{solved}", f"{r['cold_s'] / r['transfer_s']:.1f}x",
                f"{r['transfer_us'] / r['cold_us']:.3f}"]

    for r in report["rows"]:
        mine, theirs = cells(r), cells(base.get(r["graph"]))
        us = f"{r['transfer_us']:,.1f}" if r.get("transfer_us") else "-"
        out.append(f"| {r['graph']} | {mine[0]} | {r['cold_us']:,.1f} | {mine[1]} | {us} | {mine[2]} | {mine[3]} | "
                   + " | ".join(theirs) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=10.0, help="cold CP-SAT limit per graph, s")
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--only", default="", help="graphs whose name contains this (comma-separated: any of these)")
    ap.add_argument("--json", type=Path, help="write the report here")
    ap.add_argument("--paged", action="store_true", help="FMS paged decode graphs (continuous batching) instead")
    ap.add_argument("--cache-blocks", type=int, default=513, help="paged KV cache size, blocks of 64 tokens")
    ap.add_argument("--from-json", type=Path, help="print the tables of this report instead of running")
    ap.add_argument("--baseline-json", type=Path,
                    help="a report of another run (another commit) to set the transfer columns beside")
    args = ap.parse_args(argv)
    if args.from_json:
        report = json.loads(args.from_json.read_text())
    elif args.paged:
        report = run_paged(args.cache_blocks, args.time_limit, args.deterministic)
    else:
        report = run(args.time_limit, args.deterministic, args.only)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    print(paged_table(report) if args.paged else table(report))
    if not args.paged:
        print()
        print(summary(report))
    if args.baseline_json and not args.paged:
        print()
        print(compare_table(report, json.loads(args.baseline_json.read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
