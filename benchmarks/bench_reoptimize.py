"""Online vs re-optimized plans of the benchmark suites (docs/batch.md).

For every graph of the chosen suites: the online plan is what /compile makes with its
default options (cpsat, 10 s, stored under /compile's key); then `sticksat reoptimize`
re-solves every stored graph that is not proven optimal with a larger budget (default
60 s per graph), warm-started from the online plan, and keeps the new plan only when the
simulator says it is better. Per graph: simulated time online and after, the gap to the
machine lower bound (simulated / lower bound - 1) and the solver's own gap, before and
after.

    .venv/bin/python benchmarks/bench_reoptimize.py --suites tiny,layers,moe,sweep --budget 60 \
        --json docs/batch-reoptimize.json --plot docs/batch-reoptimize.png --write-docs

Service-side (no torch). Results: docs/batch.md (date and machine with the table).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

DOC = ROOT / "docs" / "batch.md"
BEGIN, END = "<!-- bench_reoptimize:begin -->", "<!-- bench_reoptimize:end -->"


def _gap(stats):
    sim, lb = stats.get("simulated_us"), stats.get("lower_bound_us")
    return sim / lb - 1.0 if isinstance(sim, (int, float)) and isinstance(lb, (int, float)) and lb > 0 else None


def run(suites, budget_s, online_limit_s, jobs, store_path, log=print):
    from service.batch.inventory import compile_into_store
    from service.batch.reoptimize import reoptimize
    from service.store import ProgramStore
    from suite import load_suite

    store = ProgramStore(store_path)
    rows, seen, duplicates = [], {}, []
    for suite in suites:
        for name, doc in load_suite(suite):
            graph_hash = doc.graph_hash()
            if graph_hash in seen:  # the same computation under another name: one store row
                duplicates.append(f"{suite}/{name} = {seen[graph_hash]}")
                continue
            seen[graph_hash] = f"{suite}/{name}"
            store.put_graph(graph_hash, doc.to_json(), doc.name or name)
            t0 = time.time()
            online = compile_into_store(store, graph_hash, time_limit_s=online_limit_s, as_default=True)
            if online is None:
                log(f"{suite}/{name}: online compile failed")
                continue
            s = online.stats
            rows.append({"suite": suite, "graph": name, "graph_hash": graph_hash, "key": online.key,
                         "online_us": s.get("simulated_us"), "online_status": s.get("solver_status"),
                         "online_solver_gap": s.get("gap"), "online_gap": _gap(s),
                         "lower_bound_us": s.get("lower_bound_us"), "online_s": round(time.time() - t0, 2)})
            log(f"{suite}/{name}: online {s.get('simulated_us'):.3f} us ({s.get('solver_status')}) "
                f"in {time.time() - t0:.1f} s")
    t0 = time.time()
    summary = reoptimize(store_path, budget_s=budget_s, engine="local", jobs=jobs,
                         progress=lambda r, d, n: log(f"  [{d}/{n}] {r.name}: {r.outcome}"))
    outcome = {r.graph_hash: r for r in summary.rows}
    for row in rows:
        after = store.get_program(row["key"]).stats
        r = outcome.get(row["graph_hash"])
        row.update(outcome=r.outcome if r else None, reopt_us=after.get("simulated_us"),
                   reopt_status=after.get("solver_status"), reopt_solver_gap=after.get("gap"),
                   reopt_gap=_gap(after), reopt_s=r.seconds if r else None)
        row["speedup"] = (row["online_us"] / row["reopt_us"]) if row["reopt_us"] else None
    return {"date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": _machine(),
            "source": _source(),
            "budget_s": budget_s, "online_limit_s": online_limit_s, "jobs": jobs, "suites": suites,
            "reoptimize_seconds": round(time.time() - t0, 1), "totals": summary.totals(), "rows": rows,
            "duplicates": duplicates}


def _source() -> str:
    """The commit measured, and whether the compiler's sources differed from it."""
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "solver", "lowering", "simulator"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" + uncommitted changes in solver/lowering/simulator" if dirty else "")


def _machine() -> str:
    from suite import machine_info

    m = machine_info()
    return f"{m['machine']} {m['cpu'] or ''} {m['nproc']} cores, Python {m['python']}".replace("  ", " ")


def _pct(v):
    return "-" if v is None else f"{100 * v:.1f}%"


def _us(v):
    return "-" if v is None else f"{v:.3f}"


def markdown(result) -> str:
    lines = [f"Measured {result['date']} on {result['machine']} (source {result.get('source', 'unknown')}): "
             f"online = /compile's default options "
             f"(cpsat, {result['online_limit_s']:g} s); re-optimized = `sticksat reoptimize --time-limit "
             f"{result['budget_s']:g} --jobs {result['jobs']}` from the online plan. Gap = simulated / machine "
             f"lower bound - 1; solver gap = CP-SAT's own (objective vs proven bound, in its cost model). "
             f"Totals: {result['totals']['improved']} improved, {result['totals'].get('proved', 0)} proved optimal "
             f"at the same time, {result['totals']['unchanged']} unchanged, "
             f"{result['totals']['skipped']} skipped (proven optimal online), {result['totals']['failed']} failed; "
             f"simulated time saved {result['totals']['saved_us']:.3f} us; re-optimization took "
             f"{result['reoptimize_seconds']:g} s."
             + (" Same graph (one hash, one store row), listed once: " + "; ".join(result["duplicates"]) + "."
                if result.get("duplicates") else ""), "",
             "| suite | graph | online us | re-optimized us | speedup | gap online | gap after | solver gap online "
             "| solver gap after | status after | outcome |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in result["rows"]:
        speed = "-" if r["speedup"] is None else f"{r['speedup']:.3f}x"
        lines.append(f"| {r['suite']} | {r['graph']} | {_us(r['online_us'])} | {_us(r['reopt_us'])} | {speed} | "
                     f"{_pct(r['online_gap'])} | {_pct(r['reopt_gap'])} | {_pct(r['online_solver_gap'])} | "
                     f"{_pct(r['reopt_solver_gap'])} | {r['reopt_status'] or '-'} | {r['outcome'] or '-'} |")
    return "\n".join(lines)


def plot(result, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    names = [f"{r['suite']}/{r['graph']}" for r in rows]
    x = range(len(rows))
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(max(8, 0.45 * len(rows)), 8), sharex=True)
    ratio = [(r["reopt_us"] / r["online_us"]) if r["online_us"] and r["reopt_us"] else 1.0 for r in rows]
    ax1.bar(x, ratio, color=["tab:green" if v < 1 else "tab:gray" for v in ratio])
    ax1.axhline(1.0, color="black", linewidth=0.8)
    ax1.set_ylabel("re-optimized / online\nsimulated time")
    ax1.set_ylim(min(0.8, min(ratio) - 0.02), 1.02)
    ax1.set_title(f"online (cpsat {result['online_limit_s']:g} s) vs re-optimized ({result['budget_s']:g} s/graph)")
    width = 0.4
    g_on = [100 * (r["online_solver_gap"] or 0) for r in rows]
    g_re = [100 * (r["reopt_solver_gap"] or 0) for r in rows]
    ax2.bar([i - width / 2 for i in x], g_on, width, label="online")
    ax2.bar([i + width / 2 for i in x], g_re, width, label="re-optimized")
    ax2.set_ylabel("solver gap (%)")
    ax2.legend()
    ax2.set_xticks(list(x))
    ax2.set_xticklabels(names, rotation=70, ha="right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_docs(result) -> None:
    text = DOC.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOC} has no {BEGIN} ... {END} block")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(head + BEGIN + "\n" + markdown(result) + "\n" + END + tail)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suites", default="tiny,layers,moe,sweep")
    p.add_argument("--budget", type=float, default=60.0, help="re-optimization budget per graph (s)")
    p.add_argument("--online-limit", type=float, default=10.0, help="online time limit (/compile's default)")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--store", default=None, help="store to use (default: a fresh temporary one)")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--plot", default=None, help="write the plot (PNG) here")
    p.add_argument("--write-docs", action="store_true", help=f"replace the results block of {DOC.name}")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        store = args.store or str(Path(tmp) / "store.sqlite")
        result = run(args.suites.split(","), args.budget, args.online_limit, args.jobs, store,
                     log=lambda m: print(m, file=sys.stderr, flush=True))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    if args.plot:
        plot(result, args.plot)
    print(markdown(result))
    if args.write_docs:
        write_docs(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
