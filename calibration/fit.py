"""Least-squares fit of the timing model's free parameters to the calibration dataset.

Residual of a point: log(simulated / measured) (of the ratio, for a ratio point), over the
points that are neither unbuildable nor disputed. Levenberg-Marquardt in numpy on the log
of each parameter (all are positive), finite-difference Jacobian, bounds by clipping.
`leave_one_source_out` refits without each source in turn and predicts it: the measure of
how the model generalizes, reported beside the in-sample errors.

The fitted values, the fit's date, the dataset version and every point's residual are
written into the hardware file (`write_fit`); nothing else in the file changes.
"""
from __future__ import annotations

import copy
import datetime as _dt
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

import numpy as np

from calibration.dataset import Dataset
from calibration.evaluate import Programs, evaluate, summarize
from target.hardware import TARGETS_DIR, Hardware, hardware_from_dict

# The parameters the dataset decides, with the range a fit may move them in. Every other
# number of the hardware file keeps its own source.
FIT_PARAMS: dict[str, tuple[float, float]] = {
    "shared_read_free_fanout": (1.0, 32.0),
    "shared_read_fanout_exponent": (0.05, 3.0),
    "untiled_overlap_chunks": (1.0, 64.0),
    # operand order (docs/simulator-timing.md "Compute")
    "pt_batch_inside_input_ns_per_mac": (1e-5, 0.05),
    "pt_batch_inside_output_ns_per_mac": (1e-6, 0.05),
    "pt_projection_batch_inside_ns_per_mac": (1e-6, 0.05),
    "bmm_layout_saturation_batch": (1.5, 64.0),
    "projection_layout_saturation_batch": (1.5, 64.0),
    # core count and read-after-write ("Shared bus")
    "dram_core_read_gbps": (5.0, 150.0),
    "dram_partial_machine_fraction": (0.2, 1.0),
    "dram_raw_turnaround_ns_per_byte": (1e-6, 0.05),
    "host_call_overhead_us": (100.0, 10000.0),
}


def target_document(target: str = "spyre") -> dict:
    return json.loads((TARGETS_DIR / f"{target}.json").read_text(encoding="utf-8"))


def document_with(doc: dict, values: dict[str, float]) -> dict:
    d = copy.deepcopy(doc)
    for k, v in values.items():
        d["params"][k]["value"] = float(v)
    return d


def hardware_with(doc: dict, values: dict[str, float]) -> Hardware:
    return hardware_from_dict(document_with(doc, values), origin="<fit>")


def current_values(doc: dict, names: Iterable[str] = FIT_PARAMS) -> dict[str, float]:
    return {k: float(doc["params"][k]["value"]) for k in names}


def _residuals(dataset: Dataset, programs: Programs, hw: Hardware, skip_sources: frozenset) -> np.ndarray:
    out = [math.log1p(r.error) for r in evaluate(dataset, hw, programs)
           if r.fitted and r.source not in skip_sources]
    return np.asarray(out, dtype=float)


@dataclass
class FitResult:
    before: dict[str, float]
    after: dict[str, float]
    cost_before: float
    cost_after: float
    iterations: int
    notes: list[str] = field(default_factory=list)

    def changes(self) -> list[tuple[str, float, float]]:
        return [(k, self.before[k], self.after[k]) for k in self.after
                if not math.isclose(self.before[k], self.after[k], rel_tol=1e-9)]


def fit(dataset: Dataset, doc: dict, programs: Programs, params: Optional[dict[str, tuple[float, float]]] = None,
        skip_sources: Iterable[str] = (), max_iter: int = 40) -> FitResult:
    params = params or FIT_PARAMS
    skip = frozenset(skip_sources)
    names = list(params)
    lo = np.log([params[n][0] for n in names])
    hi = np.log([params[n][1] for n in names])
    start = current_values(doc, names)
    theta = np.clip(np.log([start[n] for n in names]), lo, hi)

    def res(th: np.ndarray) -> np.ndarray:
        return _residuals(dataset, programs, hardware_with(doc, dict(zip(names, np.exp(th)))), skip)

    r = res(theta)
    cost0 = cost = float(r @ r)
    lam = 1e-2
    it = 0
    for it in range(1, max_iter + 1):
        jac = np.empty((len(r), len(names)))
        for j in range(len(names)):
            step = 1e-3 if theta[j] + 1e-3 <= hi[j] else -1e-3
            th = theta.copy()
            th[j] += step
            jac[:, j] = (res(th) - r) / step
        g = jac.T @ r
        h = jac.T @ jac
        improved = False
        while lam < 1e8:
            delta = np.linalg.solve(h + lam * np.diag(np.diag(h) + 1e-9), -g)
            cand = np.clip(theta + delta, lo, hi)
            rc = res(cand)
            cc = float(rc @ rc)
            if cc < cost:
                theta, r, improved = cand, rc, True
                lam = max(lam / 3, 1e-7)
                break
            lam *= 4
        if not improved or cost - cc < 1e-9 * max(1.0, cost):
            cost = min(cost, cc) if improved else cost
            break
        cost = cc
    after = dict(zip(names, (float(v) for v in np.exp(theta))))
    # values written to the file: 4 significant figures (a fit is not that precise)
    after = {k: float(f"{v:.4g}") for k, v in after.items()}
    return FitResult(start, after, cost0, float(res(np.log([after[n] for n in names])) @
                                              res(np.log([after[n] for n in names]))), it)


def leave_one_source_out(dataset: Dataset, doc: dict, programs: Programs, max_iter: int = 12) -> dict[str, dict]:
    """Per source: refit without its points (starting from `doc`'s values), then the mean
    absolute error on them."""
    sources = sorted({p.source_key for p in dataset.points if p.usable})
    out = {}
    for src in sources:
        f = fit(dataset, doc, programs, skip_sources=[src], max_iter=max_iter)
        hw = hardware_with(doc, f.after)
        errs = [abs(r.error) for r in evaluate(dataset, hw, programs) if r.fitted and r.source == src]
        if errs:
            out[src] = {"points": len(errs), "mean_abs_error": sum(errs) / len(errs), "max_abs_error": max(errs)}
    return out


def write_fit(doc: dict, result: FitResult, dataset: Dataset, programs: Programs, path: Path,
              today: Optional[str] = None) -> dict:
    """The hardware file with the fitted values and a `calibration` record (date, dataset,
    summary, every point's residual)."""
    new = document_with(doc, result.after)
    hw = hardware_from_dict(new, origin=str(path))
    results = evaluate(dataset, hw, programs)
    summary = summarize(results)
    new["calibration"] = {
        "date": today or _dt.date.today().isoformat(),
        "dataset": dataset.label,
        "fitted": sorted(result.after),
        "absolute_mean_abs_error": round(summary["absolute"]["mean_abs_error"], 4),
        "ratio_mean_abs_error": round(summary["ratios"]["mean_abs_error"], 4),
        "residuals": {r.id: round(r.error, 4) for r in results if r.error is not None},
    }
    path.write_text(json.dumps(new, indent=2) + "\n", encoding="utf-8")
    return new
