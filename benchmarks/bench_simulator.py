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

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_simulator.py --search [--rounds 3] [--write-docs]

`--search` measures the memo caches (`target.geometry.set_caches`) on the planners'
pattern, reference path and cached path side by side in one run, on
benchmarks/graphs/layers/llama31_8b_prefill512.json:
1. the calls a deterministic cpsat plan makes to `emit_program`, `validate_program` and
   `time_program` (its fusion search re-emits, re-validates and re-times the layer with a
   few ops changed per trial), recorded once and replayed `--rounds` times per path (best
   round reported; the cached path starts each round with empty caches);
2. the final program re-validated and re-timed `--variants` times with one op changed each
   time (an op's temporal tiles set or dropped), per path;
3. the whole deterministic compile per path: the plan note "fusion and relayouts X s" and
   whether both paths give the same program.
Every replayed result is compared between the paths (a mismatch is printed and makes the
exit status 1). `--write-docs` records the figures in docs/simulator.md (section "Speed").
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
SPEED_DOC = ROOT / "docs" / "simulator.md"
SPEED_BEGIN, SPEED_END = "<!-- bench_simulator_search:begin -->", "<!-- bench_simulator_search:end -->"


def capture_llama_layer(seq: int = 512) -> dict:
    """Capture the layer as benchmarks/graphs/make_graphs.py does: fp16 parameters on fake
    (unallocated) CPU tensors, so SDPA keeps the CPU flash-attention op a real model shows."""
    from benchmarks.graphs.make_graphs import _decoder_prefill, fake_fp16, llama31_8b_config
    from backend.capture import capture

    with fake_fp16():
        model, inputs = _decoder_prefill("llama", llama31_8b_config, seq)()
    return capture(model, inputs, name=f"llama31_8b_prefill{seq}")


def _report(lines: list[str], write: bool, path: Path, begin: str, end: str, heading: str) -> None:
    """Print the result lines; with `write`, also put them between the `begin` and `end`
    markers of `path` (or append them there, under `heading`)."""
    text = "\n".join(lines)
    print(text)
    if not write:
        return
    body = path.read_text(encoding="utf-8") if path.exists() else ""
    block = f"{begin}\n{text}\n{end}"
    if begin in body:
        body = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: block, body, flags=re.S)
    else:
        body = body.rstrip() + "\n\n" + heading + block + "\n"
    path.write_text(body, encoding="utf-8")
    print(f"wrote {path}")


def machine() -> str:
    return (f"{platform.machine()}, nproc {os.cpu_count()}, Python {platform.python_version()}, "
            f"{platform.system()} {platform.release()}")


def load() -> str:
    try:
        return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "load average n/a"


_FUNCS = ("emit_program", "validate_program", "time_program")


def canonical(name: str, result):
    """A result of one of `sim_functions()` in a comparable form (JSON data)."""
    if name == "validate_program":
        return [i.to_json() for i in result]
    if name == "time_program":
        return result.to_dict()
    return result.model_dump(mode="json")


def sim_functions() -> dict:
    """The three functions the planners call over and over, by name."""
    import simulator.timing as timing_mod
    import simulator.validate as validate_mod
    import solver.emit as emit_mod

    return {"emit_program": emit_mod.emit_program, "validate_program": validate_mod.validate_program,
            "time_program": timing_mod.time_program}


def record_calls(fn):
    """Run fn() and return every (name, args, kwargs) call it made to `sim_functions()`,
    wherever they were imported, and fn's result. Used here and by tests/test_sim_caches.py."""
    import importlib

    for m in ("solver.planners", "solver.spyre.cpsat_planner", "solver.spyre.fusion", "solver.spyre.relayout",
              "solver.spyre.depth", "solver.spyre.tile_buffers", "solver.oracle"):
        importlib.import_module(m)  # before patching: a lazy import would bind the unpatched function
    funcs = sim_functions()
    calls: list = []
    patched = []

    def wrap(name, f):
        def w(*a, **k):
            calls.append((name, a, k))
            return f(*a, **k)
        return w

    for mod in list(sys.modules.values()):
        for name, f in funcs.items():
            if getattr(mod, name, None) is f:
                patched.append((mod, name, f))
                setattr(mod, name, wrap(name, f))
    try:
        out = fn()
    finally:
        for mod, name, f in patched:
            setattr(mod, name, f)
    return calls, out


def _record_plan(pg, hw):
    """A deterministic cpsat plan of `pg`, with every call it made to the three functions."""
    from solver.planners import plan

    calls, program = record_calls(lambda: plan(pg, hw, "cpsat", deterministic=True))
    return program, calls, sim_functions()


def _paths(rounds: int):
    """Per round, the reference path then the cached one (caches emptied), each after a
    collection: yields whether the caches are on."""
    import gc

    from target import geometry

    for _ in range(max(1, rounds)):
        for on in (False, True):
            geometry.set_caches(on)
            geometry.clear_caches()
            gc.collect()
            yield on


def _variants(program, n: int) -> list:
    """`program` with one op changed each: its temporal tiles dropped, or 2 tiles on its
    first iteration dim (the kind of change a fusion trial makes)."""
    out = []
    ops = [k for k, o in enumerate(program.ops) if o.prim is not None]
    for i in range(n):
        k = ops[(i * 7) % len(ops)]
        q = program.model_copy(deep=False)
        q.ops = list(program.ops)
        o = program.ops[k].model_copy()
        if o.temporal_tiles:
            o.temporal_tiles = {}
        else:
            o.temporal_tiles = {o.prim["iter_dims"][0]["name"]: 2}
        q.ops[k] = o
        out.append(q)
    return out


def search_main(args) -> int:
    import json

    from lowering import lower_document
    from lowering.graph_format import GraphDocument
    from target import geometry
    from target.hardware import load_target
    from simulator.timing import time_program
    from simulator.validate import validate_program

    hw = load_target()
    graph = ROOT / "benchmarks" / "graphs" / "layers" / "llama31_8b_prefill512.json"
    pg = lower_document(GraphDocument.model_validate(json.loads(graph.read_text())))
    start_load = load()
    # 3. the whole deterministic compile per path (reference first: no warm caches)
    compiles = {}
    for on in (False, True):
        geometry.set_caches(on)
        geometry.clear_caches()
        t0 = time.perf_counter()
        program, calls, funcs = _record_plan(pg, hw)
        wall = time.perf_counter() - t0
        note = next((n for n in program.stats.notes if n.startswith("time:")), "")
        m = re.search(r"fusion and relayouts ([0-9.]+) s", note)
        compiles[on] = (program, calls, funcs, wall, float(m.group(1)) if m else float("nan"))
    # the program itself (the stats hold wall times)
    same_program = compiles[False][0].model_dump(mode="json", exclude={"stats"}) == \
        compiles[True][0].model_dump(mode="json", exclude={"stats"})
    early = {on: any("stopped early" in n or "time limit" in n for n in c[0].stats.notes) for on, c in compiles.items()}
    program, calls, funcs = compiles[False][0], compiles[False][1], compiles[False][2]
    counts = {n: sum(c[0] == n for c in calls) for n in _FUNCS}

    # 1. replay the recorded calls
    best = {}
    results = {}
    for on in _paths(args.rounds):
        tt = {n: 0.0 for n in _FUNCS}
        res = []
        for name, a, k in calls:
            t = time.perf_counter()
            r = funcs[name](*a, **k)
            tt[name] += time.perf_counter() - t
            res.append(canonical(name, r))
        results.setdefault(on, res)
        if res != results[on]:
            print("MISMATCH between rounds of one path")
            return 1
        for n, v in tt.items():
            best[(on, n)] = min(best.get((on, n), float("inf")), v)
    mismatches = sum(a != b for a, b in zip(results[False], results[True]))

    # 2. one op changed per call
    variants = _variants(program, args.variants)
    vbest = {}
    vres = {}
    for on in _paths(args.rounds):
        tv = tt_ = 0.0
        res = []
        for q in variants:
            t = time.perf_counter()
            issues = validate_program(q, hw)
            t2 = time.perf_counter()
            rep = time_program(q, hw)
            t3 = time.perf_counter()
            tv += t2 - t
            tt_ += t3 - t2
            res.append(([i.to_json() for i in issues], rep.to_dict()))
        vres.setdefault(on, res)
        vbest[(on, "validate")] = min(vbest.get((on, "validate"), float("inf")), tv)
        vbest[(on, "time")] = min(vbest.get((on, "time"), float("inf")), tt_)
    mismatches += sum(a != b for a, b in zip(vres[False], vres[True]))
    geometry.set_caches(True)

    def row(n, count):
        r, c = best[(False, n)], best[(True, n)]
        return (f"  - {n}: {count} calls, reference {r:.3f} s ({r / max(1, count) * 1e3:.1f} ms/call), "
                f"cached {c:.3f} s ({c / max(1, count) * 1e3:.1f} ms/call): x{r / c:.2f}")

    tot_r = sum(best[(False, n)] for n in _FUNCS)
    tot_c = sum(best[(True, n)] for n in _FUNCS)
    nv = len(variants)
    lines = [
        f"- date: {_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {machine()}; {start_load} at the start, {load()} at the end (shared machine)",
        f"- graph: llama31_8b_prefill512 ({len(pg.ops)} primitive ops), deterministic cpsat plan "
        f"({len(program.ops)} program ops)",
        f"- the plan's {len(calls)} calls replayed, best of {args.rounds} rounds per path "
        f"(cached path: empty caches at the start of each round):",
        row("emit_program", counts["emit_program"]),
        row("validate_program", counts["validate_program"]),
        row("time_program", counts["time_program"]),
        f"  - all three: reference {tot_r:.3f} s, cached {tot_c:.3f} s: x{tot_r / tot_c:.2f}",
        f"- the final program with one op's temporal tiles changed, {nv} variants, best of {args.rounds}: "
        f"validate reference {vbest[(False, 'validate')] / nv * 1e3:.1f} ms/call, cached "
        f"{vbest[(True, 'validate')] / nv * 1e3:.1f} ms/call; time reference "
        f"{vbest[(False, 'time')] / nv * 1e3:.1f} ms/call, cached {vbest[(True, 'time')] / nv * 1e3:.1f} ms/call",
        f"- whole deterministic compile: reference {compiles[False][3]:.2f} s (fusion and relayouts "
        f"{compiles[False][4]:.2f} s), cached {compiles[True][3]:.2f} s (fusion and relayouts "
        f"{compiles[True][4]:.2f} s); same program on both paths: {'yes' if same_program else 'NO'} "
        f"(simulated {time_program(compiles[False][0], hw).total_us:.1f} / "
        f"{time_program(compiles[True][0], hw).total_us:.1f} us; a search stopped by its time limit: "
        f"{early[False]} / {early[True]})",
        f"- results compared between the paths: {len(calls) + nv * 2} results, {mismatches} differ",
    ]
    _report(lines, args.write_docs, SPEED_DOC, SPEED_BEGIN, SPEED_END, "")
    return 0 if mismatches == 0 and same_program else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--write-docs", action="store_true")
    ap.add_argument("--search", action="store_true",
                    help="the memo caches on the planners' repeated calls (reference vs cached)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", type=int, default=40)
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.search:
        return search_main(args)

    from lowering import lower_document
    from lowering.graph_format import GraphDocument
    from target.hardware import load_target
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
    _report(lines, args.write_docs, DOC, BEGIN, END, "## Benchmark\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
