"""What a compiler user reads about a program: the compile summary, the per-op report, the
roofline view, the restickifies and the diff of two programs of one graph (docs/report.md).

Only reads a `Program` and its `TimingReport` (`simulator.timing`); no planner, no torch.
Numbers are formatted for people: units, 3-4 significant figures (`fmt_us`, `fmt_bytes`).
"""
from __future__ import annotations

from typing import Optional

from simulator.superdsc import LxMemory, Program
from simulator.timing import TimingReport


# -- formatting ---------------------------------------------------------------------------------
def _sig(v: float, digits: int = 4) -> str:
    """`v` with `digits` significant figures, never in exponent form for |v| < 1e6."""
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 10 ** digits:
        return f"{v:,.0f}"
    decimals = max(0, digits - 1 - int(_floor_log10(a)))
    return f"{v:.{decimals}f}"


def _floor_log10(a: float) -> int:
    import math
    return math.floor(math.log10(a))


def fmt_us(us: Optional[float]) -> str:
    """A duration given in microseconds, in ns / µs / ms / s."""
    if us is None:
        return "-"
    a = abs(us)
    if a == 0:
        return "0 µs"
    if a < 1:
        return f"{_sig(us * 1e3)} ns"
    if a < 1e3:
        return f"{_sig(us)} µs"
    if a < 1e6:
        return f"{_sig(us / 1e3)} ms"
    return f"{_sig(us / 1e6)} s"


def fmt_s(s: Optional[float]) -> str:
    return "-" if s is None else fmt_us(s * 1e6)


def fmt_bytes(n: Optional[float]) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{_sig(n / scale, 3)} {unit}"
    return f"{int(n)} B"


def fmt_pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{_sig(100 * x, 3)}%"


# -- compile summary ----------------------------------------------------------------------------
def program_counts(program: Program) -> dict:
    """Op, bundle, LX residency and restickify counts of a program."""
    kinds: dict[str, int] = {}
    for o in program.ops:
        kinds[o.kind] = kinds.get(o.kind, 0) + 1
    lx = [t for t in program.tensors if isinstance(t.memory, LxMemory)]
    return {
        "ops": len(program.ops), "compute_ops": kinds.get("compute", 0),
        "restickifies": kinds.get("restickify", 0), "relayouts": kinds.get("relayout", 0),
        "bundles": len(program.bundles), "lx_residencies": len(lx),
        "lx_tile_buffers": sum(1 for t in lx if t.memory.per_tile),
    }


def summary(program: Program, timing: Optional[TimingReport]) -> dict:
    """The numbers `sticksat compile` prints when it finishes (JSON-able)."""
    s = program.stats
    sim = timing.total_us if timing is not None else None
    lb = s.lower_bound_us
    out = {
        "graph": program.graph_name, "planner": s.planner, "requested_planner": s.fallback_from or s.planner,
        "fallback_reason": s.fallback_reason, "status": s.solver_status, "predicted_us": s.predicted_us,
        "simulated_us": sim, "lower_bound_us": lb,
        "gap_to_lower_bound": (sim / lb - 1.0) if (sim is not None and lb) else None,
        "solver_objective_us": s.objective, "solver_bound_us": s.bound, "solver_gap": s.gap,
        "solve_seconds": s.solve_seconds, "notes": list(s.notes),
    }
    out.update(program_counts(program))
    if timing is not None:
        out["fused_kernels"] = len({o.fused_group for o in timing.ops if o.fused_group is not None})
    return out


def summary_lines(program: Program, timing: Optional[TimingReport]) -> list[str]:
    """The compile summary as lines for a terminal."""
    m = summary(program, timing)
    planner = m["planner"]
    if m["fallback_reason"]:
        planner += f" (fallback from {m['requested_planner']}: {m['fallback_reason']})"
    lines = [f"compiled {m['graph'] or 'graph'} with {planner}"
             + (f", status {m['status']}" if m["status"] else "")]
    lines.append(f"  simulated   {fmt_us(m['simulated_us'])}   predicted {fmt_us(m['predicted_us'])}")
    lb = f"  lower bound {fmt_us(m['lower_bound_us'])}"
    if m["gap_to_lower_bound"] is not None:
        lb += f"   simulated is {_sig(1 + m['gap_to_lower_bound'], 3)}x the bound"
    if m["solver_gap"] is not None:
        lb += f"   solver gap {fmt_pct(m['solver_gap'])} (objective {fmt_us(m['solver_objective_us'])}, " \
              f"bound {fmt_us(m['solver_bound_us'])})"
    lines.append(lb)
    lines.append(f"  solved in   {fmt_s(m['solve_seconds'])}")
    lines.append(f"  {m['ops']} ops ({m['compute_ops']} compute, {m['restickifies']} restickify, "
                 f"{m['relayouts']} LX relayout), {m['bundles']} bundles, {m['lx_residencies']} LX residencies"
                 + (f" ({m['lx_tile_buffers']} tile buffers)" if m["lx_tile_buffers"] else "")
                 + (f", {m['fused_kernels']} fused kernels" if m.get("fused_kernels") else ""))
    if m["notes"]:
        lines.append("  notes:")
        lines.extend(f"    {n}" for n in m["notes"])
    return lines
