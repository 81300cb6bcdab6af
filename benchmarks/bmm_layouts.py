"""The planner's device dim orders on batched matmuls, against the default orders and the best
of all orders, simulated (issue 28's bmm sweep).

Cases (fp16):
- `bmm`: [B, 512, 128] x [B, 128, 512] (attention scores) for B = 1, 2, 4, 8, 16;
- `proj`: torch-spyre PR #4302's shapes, [B, 512, 4096] x [4096, N] (a batched activation
  against a shared weight) for B = 2, 4, 8 and N = 12800, 25600;
- `pv+flatten`: [B, 512, 512] x [B, 512, 128] written [512, B, 128] (the transpose of
  attention's output folded into the bmm, `lowering.fold_layouts`), flattened to
  [512, B*128] by a reshape copy and scaled, for B = 1, 2, 4, 8, 16: the order of the bmm's
  result is the planner's decision (batch outermost: no drain stall, but the reshape moves
  data; row-major: the reshape is a free alias, the drain stalls).

Per case, with the CP-SAT planner's plan (deterministic) and its splits kept:
- `rowmajor_us`: every tensor in the plain row-major order (the emitter's default);
- `spyre_default_us`: the activations (every tensor but the weight) in torch-spyre's default
  order (`target.layout.spyre_default_dim_order`: the batch just inside the stick rows);
- `best_us` / `best_orders`: the fastest over every order of every tensor the planner may
  order (the intermediates) — and, for `bmm`/`proj`, of the graph's activations too, which
  a planner takes as the runtime hands them (row-major) — each simulated;
- `planner_us` / `planner_orders`: the plan as the planner returned it.
An order that makes a plan invalid (an alias copy between non-row-major layouts) is skipped;
a copy claimed as an alias is re-planned as a data move for the other orders.

    python benchmarks/bmm_layouts.py [--write-docs docs/benchmarks.md] [--quick]
"""
from __future__ import annotations

import argparse
import datetime as _dt
import itertools
import re
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from target.hardware import load_target  # noqa: E402
from target.layout import default_dim_order, spyre_default_dim_order  # noqa: E402
from target.primitives import (  # noqa: E402
    Access, Call, Const, CopyBody, In, IterDim, MatmulBody, PointwiseBody, PrimGraph, PrimOp, PrimTensor, StridedMap,
)
from solver.oracle import simulated_us  # noqa: E402
from solver.plan import PlanDecisions  # noqa: E402
from solver.spyre.cpsat_planner import plan_cpsat  # noqa: E402

F16 = "float16"
BEGIN, END = "<!-- bmm-layouts -->", "<!-- /bmm-layouts -->"


def _t(i, shape, role="intermediate"):
    return PrimTensor(i, tuple(shape), F16, role)


def bmm_graph(B: int, M: int, K: int, N: int) -> PrimGraph:
    it = (IterDim("b", B), IterDim("m", M), IterDim("n", N), IterDim("k", K, "reduction"))
    ts = [_t("x", (B, M, K), "user_input"), _t("y", (B, K, N), "user_input"), _t("o", (B, M, N))]
    ops = [PrimOp("bmm", it, (Access("x", (0, 1, 3)), Access("y", (0, 3, 2))), Access("o", (0, 1, 2)),
                  MatmulBody(1, 2, 3))]
    return PrimGraph(f"bmm_b{B}_m{M}_k{K}_n{N}", {t.id: t for t in ts}, ops, ["x", "y"], ["o"])


def proj_graph(B: int, M: int, K: int, N: int) -> PrimGraph:
    it = (IterDim("b", B), IterDim("m", M), IterDim("n", N), IterDim("k", K, "reduction"))
    ts = [_t("x", (B, M, K), "user_input"), _t("w", (K, N), "parameter"), _t("o", (B, M, N))]
    ops = [PrimOp("proj", it, (Access("x", (0, 1, 3)), Access("w", (3, 2))), Access("o", (0, 1, 2)),
                  MatmulBody(1, 2, 3))]
    return PrimGraph(f"proj_b{B}_m{M}_k{K}_n{N}", {t.id: t for t in ts}, ops, ["x", "w"], ["o"])


def pv_flatten_graph(B: int, M: int, K: int, N: int) -> PrimGraph:
    it = (IterDim("b", B), IterDim("m", M), IterDim("n", N), IterDim("k", K, "reduction"))
    ts = [_t("p", (B, M, K), "user_input"), _t("v", (B, K, N), "user_input"), _t("o", (M, B, N)),
          _t("r", (M, B * N)), _t("s", (M, B * N))]
    flat = (IterDim("i", M), IterDim("j", B * N))
    ops = [
        PrimOp("pv", it, (Access("p", (0, 1, 3)), Access("v", (0, 3, 2))), Access("o", (1, 0, 2)),
               MatmulBody(1, 2, 3)),
        PrimOp("flatten", flat, (Access("o", (None, None, None)),), Access("r", (0, 1)),
               CopyBody((StridedMap((M, B * N), (B * N, 1), 0),), ((0, 0),))),
        PrimOp("scale", flat, (Access("r", (0, 1)),), Access("s", (0, 1)),
               PointwiseBody(Call("mul", (In(0), Const(0.5))))),
    ]
    return PrimGraph(f"pvflat_b{B}_m{M}_k{K}_n{N}", {t.id: t for t in ts}, ops, ["p", "v"], ["s"])


def _stick_of(pg: PrimGraph, d: PlanDecisions, t: str) -> int:
    from target.op_rules import default_choice
    prod = next((op for op in pg.ops if op.output.tensor == t), None)
    if prod is None:
        return d.input_sticks.get(t, len(pg.tensors[t].shape) - 1)
    plan = d.ops.get(prod.id)
    ch = plan.stick if plan is not None and plan.stick is not None else default_choice(prod)
    return ch.output


def _orders(rank: int) -> list[list[int]]:
    return [list(p) for p in itertools.permutations(range(rank))]


def _sim(pg: PrimGraph, hw, d: PlanDecisions, orders: dict) -> Optional[float]:
    """Simulated µs of `d` with these dim orders; an alias copy the orders break becomes a
    data move (its split left to the emitter's default)."""
    trial = replace(d, dim_orders={t: list(o) for t, o in orders.items()})
    us = simulated_us(pg, hw, trial)
    if us is None and any(p.alias for p in d.ops.values()):
        ops = {k: replace(p, alias=False) for k, p in d.ops.items()}
        us = simulated_us(pg, hw, replace(trial, ops=ops, resident={}))
    return us


def measure(kind: str, pg: PrimGraph, hw, time_limit_s: float) -> dict:
    d = plan_cpsat(pg, hw, time_limit_s=time_limit_s, deterministic=True)
    planner_us = simulated_us(pg, hw, d)
    weights = {t for t, x in pg.tensors.items() if x.role == "parameter"}
    # the tensors whose order is searched: the intermediates; for the single-matmul cases the
    # activations too (what a layout a runtime handed over would give)
    searched = [t for t in pg.tensors if t not in weights and (kind != "pv+flatten" or t == "o")]
    rowmajor = _sim(pg, hw, d, {})
    spyre = {t: spyre_default_dim_order(len(pg.tensors[t].shape), _stick_of(pg, d, t))
             for t in pg.tensors if t not in weights}
    spyre_us = _sim(pg, hw, d, {t: o for t, o in spyre.items()
                                if o != default_dim_order(len(pg.tensors[t].shape), _stick_of(pg, d, t))})
    best, best_orders = None, None
    for combo in itertools.product(*[_orders(len(pg.tensors[t].shape)) for t in searched]):
        orders = {t: o for t, o in zip(searched, combo)
                  if o != default_dim_order(len(pg.tensors[t].shape), _stick_of(pg, d, t))}
        us = _sim(pg, hw, d, orders)
        if us is not None and (best is None or us < best - 1e-9):
            best, best_orders = us, orders
    return {"case": pg.name, "kind": kind, "rowmajor_us": rowmajor, "spyre_default_us": spyre_us,
            "best_us": best, "best_orders": best_orders or {}, "planner_us": planner_us,
            "planner_orders": dict(d.dim_orders)}


def cases(quick: bool = False) -> list[tuple[str, PrimGraph]]:
    bs = (1, 4, 16) if quick else (1, 2, 4, 8, 16)
    out = [("bmm", bmm_graph(b, 512, 128, 512)) for b in bs]
    for n in ((12800,) if quick else (12800, 25600)):
        for b in ((2,) if quick else (2, 4, 8)):
            out.append(("proj", proj_graph(b, 512, 4096, n)))
    out += [("pv+flatten", pv_flatten_graph(b, 512, 512, 128)) for b in bs]
    return out


def _fmt(x: Optional[float]) -> str:
    return "—" if x is None else f"{x:,.1f}"


def _orders_text(o: dict) -> str:
    return ", ".join(f"{t}: {v}" for t, v in sorted(o.items())) or "row-major"


def table(rows: list[dict], machine: str, date: str, seconds: float) -> str:
    lines = [
        "## Batched matmul layouts (bmm sweep)",
        "",
        f"Run {date} on {machine} by `python benchmarks/bmm_layouts.py` ({seconds:.0f} s); simulated µs "
        "(simulator.timing), the CP-SAT planner deterministic, its splits kept for every order. "
        "Columns: every tensor row-major (the emitter's default); the activations in torch-spyre's "
        "default order (batch just inside the stick rows); the best over every order of the searched "
        "tensors (the intermediates; for `bmm`/`proj` the activations too, which a planner takes as the "
        "runtime hands them); the planner's own plan and the orders it chose (tensors not named: "
        "row-major). `pv+flatten` is attention's output path: the bmm writes [512, B, 128] (the "
        "transpose folded in), a reshape flattens it.",
        "",
        "| case | kind | rowmajor_us | spyre_default_us | best_us | best orders | planner_us | planner orders | planner/best |",
        "|---|---|---:|---:|---:|---|---:|---|---:|",
    ]
    for r in rows:
        ratio = (r["planner_us"] / r["best_us"]) if r["planner_us"] and r["best_us"] else None
        lines.append(f"| {r['case']} | {r['kind']} | {_fmt(r['rowmajor_us'])} | {_fmt(r['spyre_default_us'])} | "
                     f"{_fmt(r['best_us'])} | {_orders_text(r['best_orders'])} | {_fmt(r['planner_us'])} | "
                     f"{_orders_text(r['planner_orders'])} | {'—' if ratio is None else f'{ratio:.3f}'} |")
    return "\n".join(lines) + "\n"


def write_docs(path: Path, text: str) -> None:
    doc = path.read_text()
    block = f"{BEGIN}\n{text}{END}\n"
    if BEGIN in doc:
        doc = re.sub(re.escape(BEGIN) + r".*?" + re.escape(END) + r"\n?", lambda _: block, doc, flags=re.S)
    else:
        doc = doc.rstrip("\n") + "\n\n" + block
    path.write_text(doc)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write-docs", type=Path, default=None)
    ap.add_argument("--quick", action="store_true", help="fewer batch sizes and shapes")
    ap.add_argument("--time-limit", type=float, default=10.0)
    args = ap.parse_args(argv)
    from benchmarks.suite import machine_info
    hw = load_target()
    t0 = time.perf_counter()
    rows = []
    for kind, pg in cases(args.quick):
        r = measure(kind, pg, hw, args.time_limit)
        rows.append(r)
        print(f"{r['case']:28s} rowmajor {_fmt(r['rowmajor_us'])} spyre {_fmt(r['spyre_default_us'])} "
              f"best {_fmt(r['best_us'])} ({_orders_text(r['best_orders'])}) planner {_fmt(r['planner_us'])} "
              f"({_orders_text(r['planner_orders'])})", flush=True)
    m = machine_info()
    machine = f"{m['cpu']} ({m['machine']}, {m['nproc']} cores, Python {m['python']})"
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = table(rows, machine, date, time.perf_counter() - t0)
    print(text)
    if args.write_docs:
        write_docs(args.write_docs, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
