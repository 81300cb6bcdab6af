"""Human and machine views of a calibration run: the per-point table, the per-family
summary, leave-one-source-out errors, a Markdown block for docs/simulator-timing.md and the
measured-vs-simulated plot (log axes)."""
from __future__ import annotations

import math
from typing import Optional

from calibration.evaluate import PointResult


def _us(v: Optional[float]) -> str:
    if v is None:
        return "-"
    return f"{v:,.1f}" if v >= 100 else f"{v:.2f}"


def _pct(v: Optional[float]) -> str:
    return "-" if v is None or math.isnan(v) else f"{v * 100:+.1f}%"


def rows(results: list[PointResult]) -> list[tuple[str, ...]]:
    out = []
    for r in results:
        if r.measured_us is not None:
            meas, sim = _us(r.measured_us) + " us", _us(r.simulated_us) + " us"
        elif r.measured_ratio is not None:
            meas = f"x{r.measured_ratio:.3f} of {r.ratio_to}"
            sim = "-" if r.simulated_ratio is None else f"x{r.simulated_ratio:.3f}"
        else:
            meas, sim = "(reference)", _us(r.simulated_us) + " us" if r.simulated_us else "-"
        status = r.status if r.status == "ok" else f"{r.status}: {r.reason}"
        out.append((r.id, r.family, r.timing, meas, sim, _pct(r.error), status))
    return out


def text_table(results: list[PointResult]) -> str:
    head = ("point", "family", "timing", "measured", "simulated", "error", "status")
    body = rows(results)
    widths = [min(48, max(len(str(x[i])) for x in [head] + body)) for i in range(len(head) - 1)]
    lines = []
    for row in [head] + body:
        cells = [str(c)[:w].ljust(w) for c, w in zip(row[:-1], widths)]
        lines.append("  ".join(cells) + "  " + str(row[-1])[:110])
    return "\n".join(lines)


def summary_text(summary: dict, loso: Optional[dict] = None, reserved: Optional[dict] = None,
                 holdout: Optional[dict] = None) -> str:
    a, r = summary["absolute"], summary["ratios"]
    worst = summary.get("worst") or {}
    lines = [f"fitted points:  {summary['points']}, mean |error| {_pct(summary['mean_abs_error'])[1:]}, "
             f"{summary['within_25pct']} within +-25%, worst {worst.get('id', '-')} {_pct(worst.get('error'))}",
             f"absolute times: {a['points']} points, mean |error| {_pct(a['mean_abs_error'])[1:]}, "
             f"max {_pct(a['max_abs_error'])[1:]}",
             f"plan ratios:    {r['points']} points, mean |error| {_pct(r['mean_abs_error'])[1:]}, "
             f"max {_pct(r['max_abs_error'])[1:]}",
             f"sources fitted: {summary['sources']}; not fitted: " +
             ", ".join(f"{v} {k}" for k, v in summary["not_fitted"].items())]
    for f in summary["families"]:
        lines.append(f"  {f['family']:10s} {f['points']:3d} times {f['ratios']:3d} ratios  mean |error| "
                     f"{_pct(f['mean_abs_error'])[1:]:>6s}  max {_pct(f['max_abs_error'])[1:]:>6s}")
    if loso:
        errs = [v["mean_abs_error"] * v["points"] for v in loso.values()]
        n = sum(v["points"] for v in loso.values())
        lines.append(f"leave-one-source-out: mean |error| {_pct(sum(errs) / max(1, n))[1:]} over {n} points")
        for src, v in loso.items():
            lines.append(f"  without {src[:70]:70s} {v['points']:3d} points  mean {_pct(v['mean_abs_error'])[1:]:>6s}"
                         f"  max {_pct(v['max_abs_error'])[1:]:>6s}")
    if reserved and reserved["checks"]:
        lines.append(reserved_text(reserved))
    if holdout:
        lines.append(holdout_text(holdout))
    return "\n".join(lines)


def holdout_text(holdout: dict) -> str:
    """The held-out sources (out-of-sample checks, never fitted), one line each."""
    n = sum(v["points"] for v in holdout.values())
    within = sum(v["within_25pct"] for v in holdout.values())
    mean = sum(v["mean_abs_error"] * v["points"] for v in holdout.values()) / max(1, n)
    lines = [f"held out (out-of-sample checks, never fitted): {n} points, mean |error| {_pct(mean)[1:]}, "
             f"{within} within +-25%"]
    for src, v in holdout.items():
        worst = ", ".join(f"{w['id']} {_pct(w['error'])}" for w in v["worst"])
        lines.append(f"  {src[:70]:70s} {v['points']:3d} points  mean {_pct(v['mean_abs_error'])[1:]:>6s}  "
                     f"{v['within_25pct']} within +-25%; worst {worst}")
        for fam, f in v.get("families", {}).items():
            lines.append(f"    {fam:10s} {f['points']:3d} points  mean {_pct(f['mean_abs_error'])[1:]:>6s}  "
                         f"{f['within_25pct']} within +-25%")
    return "\n".join(lines)


def reserved_text(reserved: dict) -> str:
    """The reserved (validation-only) points: never fitted, reported on their own."""
    lines = [f"reserved (out of sample, never fitted): {len(reserved['points'])} times, mean |error| "
             f"{_pct(reserved['absolute_mean_abs_error'])[1:]}; {len(reserved['ratios'])} pair ratios, mean |error| "
             f"{_pct(reserved['ratio_mean_abs_error'])[1:]}; {reserved['within_20pct']} of {reserved['checks']} "
             f"within +-20%"]
    by_id = {p["id"]: p for p in reserved["points"]}
    for x in reserved["ratios"]:
        pair = [p for pid, p in by_id.items() if pid.startswith(x["pair"] + "-")]
        times = "  ".join(f"{p['id'][len(x['pair']) + 1:]} {_us(p['measured_us'])}/{_us(p['simulated_us'])} us "
                          f"{_pct(p['error'])}" for p in sorted(pair, key=lambda p: p["id"]))
        lines.append(f"  {x['pair']:24s} ratio measured {x['measured_ratio']:.3f} simulated {x['simulated_ratio']:.3f} "
                     f"{_pct(x['error']):>7s}   {times}")
    return "\n".join(lines)


def markdown(results: list[PointResult], summary: dict, loso: dict, dataset_label: str, when: str,
             reserved: Optional[dict] = None, holdout: Optional[dict] = None) -> str:
    out = [f"Dataset {dataset_label}; run {when}.", "",
           "| point | family | timing | measured | simulated | error | status |", "|---|---|---|---|---|---:|---|"]
    for row in rows(results):
        out.append("| " + " | ".join(str(c).replace("|", "/") for c in row) + " |")
    out += ["", "```", summary_text(summary, loso, reserved, holdout), "```"]
    return "\n".join(out)


def plot(results: list[PointResult], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 5.5))
    for fam in sorted({r.family for r in results}):
        pts = [r for r in results if r.family == fam and r.measured_us is not None and r.simulated_us]
        ok = [r for r in pts if r.status == "ok"]
        bad = [r for r in pts if r.status == "disputed"]
        held = [r for r in pts if r.status == "reserved"]
        out = [r for r in pts if r.status == "holdout"]
        if out:
            ax.scatter([r.measured_us for r in out], [r.simulated_us for r in out], marker="^", s=18,
                       facecolors="none", edgecolors="tab:gray", label=f"{fam} (held out, not fitted)")
        if held:
            ax.scatter([r.measured_us for r in held], [r.simulated_us for r in held], marker="D", s=34,
                       facecolors="none", edgecolors="k", label=f"{fam} (reserved, not fitted)")
        if ok:
            ax.scatter([r.measured_us for r in ok], [r.simulated_us for r in ok], label=fam, s=22)
        if bad:
            ax.scatter([r.measured_us for r in bad], [r.simulated_us for r in bad], marker="x", s=30,
                       label=f"{fam} (disputed)")
        rat = [r for r in results if r.family == fam and r.simulated_ratio is not None]
        if rat:
            bx.scatter([r.measured_ratio for r in rat], [r.simulated_ratio for r in rat], label=fam, s=22)
    from calibration.evaluate import reserved_summary

    pairs = reserved_summary(results)["ratios"]
    if pairs:
        bx.scatter([x["measured_ratio"] for x in pairs], [x["simulated_ratio"] for x in pairs], marker="D", s=34,
                   facecolors="none", edgecolors="k", label="reserved pairs (not fitted)")
    for a, title, unit in ((ax, "absolute times", "us"), (bx, "ratios between two plans of one shape", "ratio")):
        vals = [v for c in a.collections for xy in c.get_offsets() for v in xy if v > 0]
        lo, hi = (min(vals) / 1.5, max(vals) * 1.5) if vals else (1e-3, 1.0)
        xs = [lo, hi]
        a.plot(xs, xs, "k-", lw=0.8)
        a.plot(xs, [x * 1.2 for x in xs], "k:", lw=0.6)
        a.plot(xs, [x / 1.2 for x in xs], "k:", lw=0.6)
        a.set_xscale("log")
        a.set_yscale("log")
        a.set_xlabel(f"measured ({unit})")
        a.set_ylabel(f"simulated ({unit})")
        a.set_title(title + " (dotted: +-20%)")
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
