"""Measured vs simulated for every calibration point.

A point with `measured_us` compares the simulated time of its program (plus the host call
overhead when the point is host wall clock); a point with only `measured_ratio` compares
its simulated time over its `ratio_to` point's. Programs are built once per point and
re-timed under any hardware variant, so a fit re-times, never re-plans.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional

from calibration.cases import Built, CaseError, build
from calibration.dataset import Dataset, Point
from simulator.timing import time_program


@dataclass
class PointResult:
    id: str
    family: str
    source: str
    timing: str
    measured_us: Optional[float]
    simulated_us: Optional[float]
    error: Optional[float]            # simulated / measured - 1 (or of the ratio)
    ratio_to: Optional[str] = None
    measured_ratio: Optional[float] = None
    simulated_ratio: Optional[float] = None
    status: str = "ok"                # ok | unbuildable | disputed | reserved | holdout | build_error
    reason: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def fitted(self) -> bool:
        return self.status == "ok" and self.error is not None

    def to_json(self) -> dict:
        return asdict(self)


class Programs:
    """Each usable point's program, built once (`build` depends on layouts and LX sizes,
    not on rates)."""

    def __init__(self, dataset: Dataset, hw):
        self.built: dict[str, Built] = {}
        self.errors: dict[str, str] = {}
        for p in dataset.points:
            if p.unbuildable is not None:
                continue
            try:
                self.built[p.id] = build(p.case, hw)
            except CaseError as e:
                self.errors[p.id] = str(e)


def simulated_us(point: Point, built: Built, hw) -> float:
    t = time_program(built.program, hw).total_us
    return t + (hw.host_call_overhead_us if point.timing == "wall" else 0.0)


def evaluate(dataset: Dataset, hw, programs: Optional[Programs] = None) -> list[PointResult]:
    programs = programs or Programs(dataset, hw)
    sims = {pid: simulated_us(p, programs.built[pid], hw)
            for pid, p in dataset.by_id().items() if pid in programs.built}
    out = []
    for p in dataset.points:
        r = PointResult(p.id, p.family, p.source_key, p.timing, p.measured_us, sims.get(p.id), None,
                        p.ratio_to, p.measured_ratio)
        if p.unbuildable is not None:
            r.status, r.reason = "unbuildable", p.unbuildable
        elif p.id in programs.errors:
            r.status, r.reason = "build_error", programs.errors[p.id]
        else:
            r.notes = list(programs.built[p.id].notes)
            if p.measured_us is not None:
                r.error = sims[p.id] / p.measured_us - 1.0
            elif p.ratio_to in sims and p.measured_ratio is not None:
                r.simulated_ratio = sims[p.id] / sims[p.ratio_to]
                r.error = r.simulated_ratio / p.measured_ratio - 1.0
            if p.disputed is not None:
                r.status, r.reason = "disputed", p.disputed
            elif p.reserved is not None:
                r.status, r.reason = "reserved", p.reserved
            elif p.holdout is not None:
                r.status, r.reason = "holdout", p.holdout
        out.append(r)
    return out


@dataclass
class FamilySummary:
    family: str
    points: int
    ratios: int
    mean_abs_error: float
    max_abs_error: float


def summarize(results: list[PointResult]) -> dict:
    """Per family and overall: mean and max absolute error over the fitted points
    (absolute times and ratios counted apart)."""
    fams: dict[str, list[PointResult]] = {}
    for r in results:
        if r.fitted:
            fams.setdefault(r.family, []).append(r)

    def stats(rs: list[PointResult]) -> tuple[float, float]:
        errs = [abs(r.error) for r in rs]
        return (sum(errs) / len(errs), max(errs)) if errs else (math.nan, math.nan)

    families = []
    for fam, rs in sorted(fams.items()):
        mae, mx = stats(rs)
        families.append(FamilySummary(fam, sum(r.measured_us is not None for r in rs),
                                      sum(r.measured_us is None for r in rs), mae, mx))
    absolute = [r for rs in fams.values() for r in rs if r.measured_us is not None]
    ratios = [r for rs in fams.values() for r in rs if r.measured_us is None]
    a_mae, a_max = stats(absolute)
    r_mae, r_max = stats(ratios)
    return {
        "families": [asdict(f) for f in families],
        "absolute": {"points": len(absolute), "mean_abs_error": a_mae, "max_abs_error": a_max},
        "ratios": {"points": len(ratios), "mean_abs_error": r_mae, "max_abs_error": r_max},
        "sources": len({r.source for rs in fams.values() for r in rs}),
        "not_fitted": {s: sum(r.status == s for r in results)
                       for s in ("unbuildable", "disputed", "reserved", "holdout", "build_error")},
        "within_25pct": sum(abs(r.error) <= 0.25 for rs in fams.values() for r in rs),
        "points": sum(len(rs) for rs in fams.values()),
        "mean_abs_error": _mean([abs(r.error) for rs in fams.values() for r in rs]),
        "worst": _worst([r for rs in fams.values() for r in rs]),
    }


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def _worst(rs: list[PointResult]) -> Optional[dict]:
    if not rs:
        return None
    w = max(rs, key=lambda r: abs(r.error))
    return {"id": w.id, "error": w.error}


def reserved_summary(results: list[PointResult]) -> dict:
    """The reserved (validation-only) points on their own: each absolute time, and for each
    baseline/variant pair of one source row (ids that differ only in their last `-` part)
    the ratio variant / baseline, measured and simulated."""
    res = [r for r in results if r.status == "reserved" and r.error is not None]
    pairs: dict[str, dict[str, PointResult]] = {}
    for r in res:
        stem, _, tag = r.id.rpartition("-")
        pairs.setdefault(stem, {})[tag] = r
    ratios = []
    for stem, tags in sorted(pairs.items()):
        if len(tags) != 2:
            continue
        base_tag = "baseline" if "baseline" in tags else sorted(tags)[0]
        (other_tag,) = [t for t in tags if t != base_tag]
        b, o = tags[base_tag], tags[other_tag]
        meas = o.measured_us / b.measured_us
        sim = o.simulated_us / b.simulated_us
        ratios.append({"pair": stem, "measured_ratio": meas, "simulated_ratio": sim, "error": sim / meas - 1.0})
    return {
        "points": [{"id": r.id, "measured_us": r.measured_us, "simulated_us": r.simulated_us, "error": r.error}
                   for r in res],
        "ratios": ratios,
        "absolute_mean_abs_error": _mean([abs(r.error) for r in res]),
        "ratio_mean_abs_error": _mean([abs(x["error"]) for x in ratios]),
        "within_20pct": sum(abs(r.error) <= 0.20 for r in res) + sum(abs(x["error"]) <= 0.20 for x in ratios),
        "checks": len(res) + len(ratios),
    }


def holdout_summary(results: list[PointResult]) -> dict:
    """The held-out points (out-of-sample checks, never fitted) per source: how many, their
    mean and max absolute error, how many within +-25%, and the worst."""
    by_src: dict[str, list[PointResult]] = {}
    for r in results:
        if r.status == "holdout" and r.error is not None:
            by_src.setdefault(r.source, []).append(r)
    out = {}
    for src, rs in sorted(by_src.items()):
        errs = [abs(r.error) for r in rs]
        worst = sorted(rs, key=lambda r: -abs(r.error))[:3]
        fams: dict[str, list[float]] = {}
        for r in rs:
            fams.setdefault(r.family, []).append(abs(r.error))
        out[src] = {"points": len(rs), "mean_abs_error": _mean(errs), "max_abs_error": max(errs),
                    "within_25pct": sum(e <= 0.25 for e in errs),
                    "families": {f: {"points": len(e), "mean_abs_error": _mean(e),
                                     "within_25pct": sum(x <= 0.25 for x in e)} for f, e in sorted(fams.items())},
                    "worst": [{"id": r.id, "error": r.error} for r in worst]}
    return out
