"""Benchmark suites: plan every committed graph with every planner, simulate, compare.

Service-side (no torch): graphs are read from the committed documents under
benchmarks/graphs/<suite>/ (regenerate them with benchmarks/graphs/make_graphs.py), lowered,
planned with naive, heuristic (the torch-spyre baseline), torch-spyre-coopt (upstream's joint
CP-SAT co-optimizer, the second baseline) and cpsat, validated (plan() always
validates) and timed by the simulator's timing model. `sticksat bench` is the CLI.

Per graph: naive_us, heuristic_us, torch-spyre-coopt_us (attribute `coopt_us`), cpsat_us (simulated), lower_bound_us and split_bound_us (solver.lower_bound),
cpsat_gap and cpsat_bound_us (the solver's own gap and proven bound, in its cost model's
units), solve_s (cpsat wall time), valid (every planner's program passed the validator, and with numerics every functional run matched the reference).
Per suite: the geometric means of heuristic_us / cpsat_us and of torch-spyre-coopt_us / cpsat_us
(the `coopt/cpsat` column).
"""
from __future__ import annotations

import datetime as _dt
import gzip
import math
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Optional

from solver.planners import planner_names

GRAPHS_DIR = Path(__file__).resolve().parent / "graphs"
# Every planner of the registry (solver.planners.KNOWN_PLANNERS), each a column of BenchRow.
PLANNER_NAMES = planner_names()
# planners with a time limit and a deterministic mode (bench passes --time-limit / --deterministic)
SEARCH_PLANNERS = planner_names(searches=True)


def _attr(planner: str) -> str:
    """BenchRow attribute of a planner's simulated time (`torch-spyre-coopt` -> `coopt_us`)."""
    return "coopt_us" if planner == "torch-spyre-coopt" else f"{planner.replace('-', '_')}_us"
# Functional runs keep every tensor in numpy byte arrays: graphs whose tensors total more
# than this are timed but not run.
NUMERICS_MAX_BYTES = 64 * 2**20
# fp16 storage after every op: what a correct program's outputs differ from the reference by
NUMERICS_REL_TOL = 5e-2


@dataclass
class BenchRow:
    graph: str
    ops: int = 0
    naive_us: Optional[float] = None
    heuristic_us: Optional[float] = None
    heuristic_2026_06_us: Optional[float] = None   # the baseline as of mid-2026 (docs/baseline.md)
    coopt_us: Optional[float] = None          # torch-spyre-coopt (reported as torch-spyre-coopt_us)
    cpsat_us: Optional[float] = None
    lower_bound_us: Optional[float] = None
    per_op_bound_us: Optional[float] = None
    split_bound_us: Optional[float] = None   # also charges every matmul's core split
    datasheet_bound_us: Optional[float] = None
    cpsat_gap: Optional[float] = None
    cpsat_bound_us: Optional[float] = None   # the solver's proven bound, in its cost model's µs
    cpsat_status: Optional[str] = None
    solve_s: Optional[float] = None
    heuristic_solve_s: Optional[float] = None
    coopt_solve_s: Optional[float] = None
    cpsat_notes: list[str] = field(default_factory=list)   # the plan's own account (stats.notes)
    # with numerics: per planner, max relative error of the functional run vs the reference
    max_rel_err: dict[str, float] = field(default_factory=dict)
    valid: bool = False
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def speedup_vs_heuristic(self) -> Optional[float]:
        if self.heuristic_us and self.cpsat_us:
            return self.heuristic_us / self.cpsat_us
        return None

    @property
    def speedup_vs_coopt(self) -> Optional[float]:
        """torch-spyre-coopt_us / cpsat_us (the `coopt/cpsat` column)."""
        if self.coopt_us and self.cpsat_us:
            return self.coopt_us / self.cpsat_us
        return None


@dataclass
class BenchReport:
    suite: str
    time_limit_s: float
    deterministic: bool
    date: str
    machine: dict
    rows: list[BenchRow]

    @property
    def geomean_speedup_vs_heuristic(self) -> Optional[float]:
        return geomean(r.speedup_vs_heuristic for r in self.rows)

    @property
    def geomean_speedup_vs_coopt(self) -> Optional[float]:
        return geomean(r.speedup_vs_coopt for r in self.rows)

    def to_dict(self) -> dict:
        return {
            "suite": self.suite, "date": self.date, "machine": self.machine,
            "time_limit_s": self.time_limit_s, "deterministic": self.deterministic,
            "graphs": [_row_dict(r) for r in self.rows],
            "geomean_speedup_vs_heuristic": self.geomean_speedup_vs_heuristic,
            "geomean_speedup_vs_coopt": self.geomean_speedup_vs_coopt,
        }


def _row_dict(r: BenchRow) -> dict:
    d = asdict(r)
    d["torch-spyre-coopt_us"] = d.pop("coopt_us")
    d["heuristic-2026-06_us"] = d.pop("heuristic_2026_06_us")
    d["torch-spyre-coopt_solve_s"] = d.pop("coopt_solve_s")
    d["speedup_vs_heuristic"] = r.speedup_vs_heuristic
    d["coopt/cpsat"] = r.speedup_vs_coopt
    return d


def geomean(values: Iterable[Optional[float]]) -> Optional[float]:
    vals = [v for v in values if v is not None and v > 0]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def machine_info() -> dict:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"machine": platform.machine(), "cpu": cpu, "nproc": os.cpu_count(),
            "python": platform.python_version(), "system": platform.system()}


def suite_names(graphs_dir: Path = GRAPHS_DIR) -> list[str]:
    return sorted(p.name for p in graphs_dir.iterdir()
                  if p.is_dir() and any(_graph_files(p)))


def _graph_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.name.endswith((".json", ".json.gz")))


def graph_name(path: Path) -> str:
    return path.name.removesuffix(".gz").removesuffix(".json")


def read_document_text(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if path.name.endswith(".gz") else data


def load_suite(suite: str, graphs_dir: Path = GRAPHS_DIR, only: Optional[str] = None):
    """(name, GraphDocument) per committed graph of `suite`, in name order."""
    from lowering.graph_format import GraphDocument

    directory = graphs_dir / suite
    if not directory.is_dir():
        raise FileNotFoundError(f"no suite {suite!r} under {graphs_dir} (known: {suite_names(graphs_dir)})")
    out = []
    for path in _graph_files(directory):
        name = graph_name(path)
        if only and only not in name:
            continue
        out.append((name, GraphDocument.from_json(read_document_text(path))))
    return out


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


def run_graph(name: str, doc, hw, time_limit_s: float = 10.0, deterministic: bool = False,
              planners: tuple[str, ...] = PLANNER_NAMES, numerics: bool = False) -> BenchRow:
    from lowering import lower_document
    from simulator.timing import time_program
    from solver.lower_bound import lower_bound
    from solver.planners import ensure_registered, plan

    row = BenchRow(graph=name)
    try:
        pg = lower_document(doc)
    except Exception as exc:  # a graph the lowering cannot take is reported, not fatal
        row.errors["lowering"] = _short(exc)
        return row
    row.ops = len(pg.ops)
    lb = lower_bound(pg, hw)
    row.lower_bound_us, row.per_op_bound_us, row.datasheet_bound_us, row.split_bound_us = \
        lb.lower_bound_us, lb.per_op_us, lb.datasheet_us, lb.split_bound_us
    ok = True
    run_numerics = numerics and sum(t.nbytes for t in pg.tensors.values()) <= NUMERICS_MAX_BYTES
    for planner in planners:
        kwargs = {}
        if planner in SEARCH_PLANNERS:
            kwargs = dict(time_limit_s=time_limit_s, deterministic=deterministic)
        # a planner's module (and OR-tools) is imported on its first use in a process: that
        # is start-up, not solving (0.5 s on the first graph a planner sees)
        ensure_registered(planner)
        t0 = time.perf_counter()
        try:
            program = plan(pg, hw, planner, **kwargs)
            wall = time.perf_counter() - t0
            simulated = time_program(program, hw).total_us
        except Exception as exc:
            row.errors[planner] = _short(exc)
            ok = False
            continue
        setattr(row, _attr(planner), simulated)
        if run_numerics:
            from simulator.api import simulate

            res = simulate(program, hw, graph=pg, numerics=True, timing=False)
            if res.max_rel_err is None or not res.max_rel_err <= NUMERICS_REL_TOL:
                row.errors[f"{planner} numerics"] = f"max_rel_err {res.max_rel_err} ({'; '.join(res.notes)})"[:500]
                ok = False
            if res.max_rel_err is not None:
                row.max_rel_err[planner] = res.max_rel_err
        if planner == "heuristic":
            row.heuristic_solve_s = wall
        if planner == "torch-spyre-coopt":
            row.coopt_solve_s = wall
        if planner == "cpsat":
            row.solve_s = wall
            row.cpsat_gap = program.stats.gap
            row.cpsat_bound_us = program.stats.bound
            row.cpsat_status = program.stats.solver_status
            row.cpsat_notes = list(program.stats.notes)
    row.valid = ok
    return row


def run_suite(suite: str, time_limit_s: float = 10.0, deterministic: bool = False,
              graphs_dir: Path = GRAPHS_DIR, only: Optional[str] = None, hw=None,
              planners: tuple[str, ...] = PLANNER_NAMES, progress=None, numerics: bool = False) -> BenchReport:
    if hw is None:
        from target.hardware import load_target
        hw = load_target()
    rows = []
    for name, doc in load_suite(suite, graphs_dir, only):
        row = run_graph(name, doc, hw, time_limit_s, deterministic, planners, numerics)
        rows.append(row)
        if progress is not None:
            progress(row)
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return BenchReport(suite, time_limit_s, deterministic, date, machine_info(), rows)


# -- reporting ----------------------------------------------------------------------------------
COLUMNS = ("graph", "naive_us", "heuristic_us", "heuristic_2026_06_us", "coopt_us", "cpsat_us", "lower_bound_us", "cpsat_gap", "solve_s", "valid")


_HEAD = {"coopt_us": "torch-spyre-coopt_us", "heuristic_2026_06_us": "heuristic-2026-06_us"}


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1 else f"{v:,.1f}"
    return str(v)


def format_table(report: BenchReport) -> str:
    head = [_HEAD.get(c, c) for c in COLUMNS] + ["speedup", "coopt/cpsat"]
    lines = [head]
    for r in report.rows:
        lines.append([_fmt(getattr(r, c)) for c in COLUMNS] + [_fmt(r.speedup_vs_heuristic),
                                                             _fmt(r.speedup_vs_coopt)])
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = ["  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(line, widths)))
           for line in lines]
    out.append(f"geomean_speedup_vs_heuristic: {_fmt(report.geomean_speedup_vs_heuristic)}")
    out.append(f"geomean_speedup_vs_coopt: {_fmt(report.geomean_speedup_vs_coopt)}")
    for r in report.rows:
        for planner, msg in r.errors.items():
            out.append(f"{r.graph}: {planner}: {msg}")
    return "\n".join(out)


def markdown_section(report: BenchReport, chart_name: Optional[str] = None) -> str:
    m = report.machine
    lines = [
        f"## Suite `{report.suite}`",
        "",
        f"Run {report.date} on {m.get('cpu') or m.get('machine')} ({m.get('machine')}, {m.get('nproc')} cores, "
        f"Python {m.get('python')}); cpsat and torch-spyre-coopt time limit {report.time_limit_s:g} s"
        f"{', deterministic' if report.deterministic else ''}. Times are simulated µs "
        f"(simulator.timing); lower bounds from solver.lower_bound.",
        "",
        "| graph | naive_us | heuristic_us | torch-spyre-coopt_us | cpsat_us | lower_bound_us | split_bound_us "
        "| datasheet_bound_us | heuristic/cpsat | coopt/cpsat | cpsat/lower_bound | cpsat/split_bound | cpsat_gap "
        "| cpsat_bound_us (model) | solve_s | coopt_solve_s | valid |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    for r in report.rows:
        ratio = (r.cpsat_us / r.lower_bound_us) if r.cpsat_us and r.lower_bound_us else None
        split_ratio = (r.cpsat_us / r.split_bound_us) if r.cpsat_us and r.split_bound_us else None
        lines.append("| " + " | ".join([
            r.graph, _fmt(r.naive_us), _fmt(r.heuristic_us), _fmt(r.coopt_us), _fmt(r.cpsat_us),
            _fmt(r.lower_bound_us), _fmt(r.split_bound_us), _fmt(r.datasheet_bound_us),
            _fmt(r.speedup_vs_heuristic), _fmt(r.speedup_vs_coopt), _fmt(ratio), _fmt(split_ratio),
            _fmt(r.cpsat_gap), _fmt(r.cpsat_bound_us), _fmt(r.solve_s), _fmt(r.coopt_solve_s),
            _fmt(r.valid)]) + " |")
    lines += ["", f"Geometric-mean speedup of cpsat over the heuristic: "
                  f"**{_fmt(report.geomean_speedup_vs_heuristic)}**; over the co-optimizer baseline "
                  f"(torch-spyre-coopt): **{_fmt(report.geomean_speedup_vs_coopt)}**"]
    errs = [f"- `{r.graph}` {p}: {msg}" for r in report.rows for p, msg in r.errors.items()]
    if errs:
        lines += ["", "Failures (reported, not hidden):", *errs]
    if chart_name:
        lines += ["", f"![{report.suite}]({chart_name})"]
    return "\n".join(lines) + "\n"


def write_chart(report: BenchReport, path: Path) -> bool:
    """Bar chart of simulated time per graph and planner (log scale); False without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in report.rows if any(getattr(r, _attr(p)) for p in PLANNER_NAMES)]
    if not rows:
        return False
    series = [("naive", "naive_us"), ("heuristic (torch-spyre)", "heuristic_us"),
              ("torch-spyre-coopt", "coopt_us"), ("cpsat", "cpsat_us"),
              ("split-aware bound", "split_bound_us"), ("lower bound", "lower_bound_us")]
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows) + 2), 4.5))
    for j, (label, attr) in enumerate(series):
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(rows))]
        ys = [getattr(r, attr) or 0 for r in rows]
        ax.bar(xs, ys, width, label=label)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r.graph for r in rows], rotation=35, ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("simulated time (µs, log)")
    ax.set_title(f"suite {report.suite}: simulated time per planner ({report.date})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


_DOC_HEADER = """# Benchmarks

Generated by `sticksat bench --suite NAME --write-docs docs/benchmarks.md` (benchmarks/suite.py);
each suite's section is replaced when it is re-run. Graphs: benchmarks/graphs/ (regenerated by
benchmarks/graphs/make_graphs.py). The heuristic is the torch-spyre baseline (docs/baseline.md).
"""


def write_docs(report: BenchReport, doc_path: Path) -> Path:
    """Replace (or add) this suite's section in the benchmarks document, with its chart."""
    chart = doc_path.with_name(f"{doc_path.stem}-{report.suite}.png")
    has_chart = write_chart(report, chart)
    section = markdown_section(report, chart.name if has_chart else None)
    begin, end = f"<!-- suite:{report.suite} -->", f"<!-- /suite:{report.suite} -->"
    block = f"{begin}\n{section}{end}\n"
    text = doc_path.read_text() if doc_path.exists() else _DOC_HEADER
    if begin in text and end in text:
        text = text[:text.index(begin)] + block + text[text.index(end) + len(end) + 1:]
    else:
        text = text.rstrip("\n") + "\n\n" + block
    doc_path.parent.mkdir(parents=True, exist_ok=True)
    doc_path.write_text(text)
    return doc_path
