"""The work behind the HTML pages (service/http/pages.py), run in a pool worker under
the pool's queue limit: the store index and a stored program's report, HTML or JSON.

A report of a large program is costly (timing it on the simulator, the report model,
the HTML: seconds and hundreds of MB for a 5,000-op program), so the server never builds
one on its own process: the route submits `report_page` to the pool (coalesced by key,
format and comparison; 503 with Retry-After when the pool is full) and returns the text
the worker made. Nothing here imports FastAPI. Every string a client chose (graph names
above all) is HTML-escaped.

A page's answer is a `PageAnswer`: the body text and its media type, or a problem
(status, code, detail) the route turns into problem+json.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from html import escape
from typing import Any, Optional

from lowering.version import COMPILER_VERSION

# The index lists at most this many graphs (the first by name); the page says when it cut.
INDEX_GRAPH_LIMIT = 200


@dataclass(frozen=True)
class PageAnswer:
    body: str = ""
    media_type: str = "text/html; charset=utf-8"
    problem: Optional[tuple[int, str, str]] = None  # (status, code, detail)


class _PageProblem(Exception):
    def __init__(self, status: int, code: str, detail: str):
        super().__init__(detail)
        self.problem = (status, code, detail)


_worker_stores: dict[str, Any] = {}


def _worker_store(location: str):
    """One store connection per worker process and location (opened on first use)."""
    store = _worker_stores.get(location)
    if store is None:
        from service.store import ProgramStore

        store = _worker_stores[location] = ProgramStore(location)
    return store


# -- the store index ------------------------------------------------------------------

def _when(ts: Optional[float]) -> str:
    if not ts:
        return "-"
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _num(stats: dict[str, Any], name: str) -> Optional[float]:
    v = stats.get(name)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _time_of(stats: dict[str, Any]) -> Optional[float]:
    """The simulated time when the service measured it, else the planner's prediction."""
    sim = _num(stats, "simulated_us")
    return sim if sim is not None else _num(stats, "predicted_us")


def _bound_ratio(stats: dict[str, Any]) -> Optional[float]:
    """How many times the graph's lower bound the program takes."""
    t, lb = _time_of(stats), _num(stats, "lower_bound_us")
    return (t / lb) if (t is not None and lb) else None


def _ratio(x: Optional[float]) -> str:
    from simulator.report import sig_digits
    return "-" if x is None else f"{sig_digits(x, 3)}×"


def _index_model(store) -> dict[str, Any]:
    """What the index shows, as plain data (rendered by `_index_html`)."""
    counts = store.counts()
    graphs = []
    for graph_hash, name in store.graph_hashes()[:INDEX_GRAPH_LIMIT]:
        programs = []
        for rec in store.programs_for_graph(graph_hash):
            stats = rec.stats
            programs.append({
                "key": rec.key, "planner": stats.get("planner") or rec.options.get("planner") or "",
                "requested": rec.options.get("planner") or "", "time_limit_s": rec.options.get("time_limit_s"),
                "status": stats.get("solver_status") or "", "time_us": _time_of(stats),
                "simulated": _num(stats, "simulated_us") is not None,
                "predicted_us": _num(stats, "predicted_us"), "lower_bound_us": _num(stats, "lower_bound_us"),
                "bound_ratio": _bound_ratio(stats), "solver_gap": _num(stats, "gap"),
                "solve_seconds": _num(stats, "solve_seconds"), "complete": rec.complete,
                "current": rec.compiler_version == COMPILER_VERSION, "compiler_version": rec.compiler_version,
                "hardware": rec.hardware, "solved_at": rec.updated_at or rec.created_at,
            })
        timed = [p for p in programs if p["time_us"] is not None]
        best = min(timed, key=lambda p: (not p["current"], p["time_us"])) if timed else None
        graphs.append({"graph_hash": graph_hash, "name": name,
                       "programs": programs, "best": best})
    return {"counts": counts, "graphs": graphs, "limit": INDEX_GRAPH_LIMIT}


_INDEX_CSS = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:12px} th,td{padding:3px 8px;border-bottom:1px solid #eee;text-align:left}
th{background:#f5f5f5} td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.muted{color:#888} code{font-size:12px} .notes{font-size:12px;color:#555}
"""


def _index_html(model: dict[str, Any]) -> str:
    from simulator.report import fmt_pct, fmt_s, fmt_us

    def report_link(key: str, label: str) -> str:
        return f'<a href="programs/{escape(key)}/report">{escape(label)}</a>'

    def time_text(p: dict[str, Any]) -> str:
        if p["time_us"] is None:
            return "-"
        return escape(fmt_us(p["time_us"])) + ("" if p["simulated"] else ' <span class="muted">(predicted)</span>')

    g_rows, p_rows = [], []
    for g in model["graphs"]:
        name = escape(g["name"] or "(unnamed)")
        b = g["best"]
        g_rows.append(
            f'<tr data-graph="{escape(g["graph_hash"])}"><td>{name}</td><td><code>{escape(g["graph_hash"][:12])}</code>'
            f'</td><td class="n">{len(g["programs"])}</td>'
            + (f'<td class="n">{time_text(b)}</td><td>{escape(b["planner"])}</td>'
               f'<td class="n">{escape(_ratio(b["bound_ratio"]))}</td><td class="n">{escape(fmt_pct(b["solver_gap"]))}</td>'
               f'<td>{escape(_when(b["solved_at"]))}</td><td>{report_link(b["key"], "report")}</td>'
               if b else '<td class="n">-</td><td>-</td><td class="n">-</td><td class="n">-</td><td>-</td><td>-</td>')
            + "</tr>")
        for p in g["programs"]:
            flags = [] if p["complete"] else ["cut short by a deadline"]
            if not p["current"]:
                flags.append(f"compiler {p['compiler_version']}")
            p_rows.append(
                f'<tr data-key="{escape(p["key"])}"><td>{name}</td><td>{escape(p["planner"])}'
                + (f' <span class="muted">(asked {escape(p["requested"])})</span>'
                   if p["requested"] and p["requested"] != p["planner"] else "")
                + f'</td><td class="n">{escape(fmt_s(p["time_limit_s"]) if p["time_limit_s"] else "-")}</td>'
                f'<td>{escape(p["status"] or "-")}</td><td class="n">{time_text(p)}</td>'
                f'<td class="n">{escape(fmt_us(p["predicted_us"]))}</td><td class="n">{escape(fmt_us(p["lower_bound_us"]))}</td>'
                f'<td class="n">{escape(_ratio(p["bound_ratio"]))}</td><td class="n">{escape(fmt_pct(p["solver_gap"]))}</td>'
                f'<td class="n">{escape(fmt_s(p["solve_seconds"]))}</td><td>{escape(p["hardware"])}</td>'
                f'<td>{escape(_when(p["solved_at"]))}</td><td>{escape(", ".join(flags) or "-")}</td>'
                f'<td>{report_link(p["key"], "report")}</td></tr>')

    def table(tid: str, headers: list[str], rows: list[str]) -> str:
        head = "".join(f"<th>{escape(h)}</th>" for h in headers)
        return f'<table id="{tid}"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'

    counts = model["counts"]
    shown = len(model["graphs"])
    cut = (f" (the first {shown} by name shown)" if counts["graphs"] > shown else "")
    body = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>sticksat store</title><style>{_INDEX_CSS}</style></head><body>",
            "<h1>sticksat store</h1>",
            f'<p id="counts">{counts["graphs"]} graphs{cut}, {counts["programs"]} programs; compiler '
            f"{escape(COMPILER_VERSION)}</p>",
            "<p class='notes'>time: the simulator's time of the validated program (predicted where the service "
            "could not time it); vs bound: that time over the graph's lower bound (solver.lower_bound); solver gap: CP-SAT's "
            "objective against its proven bound. The best program of a graph is the fastest of the current "
            "compiler.</p>",
            "<h2>Graphs</h2>",
            table("graphs", ["graph", "hash", "programs", "best time", "planner", "vs bound", "solver gap",
                             "solved", ""], g_rows) if g_rows else "<p id='empty'>The store is empty: POST /compile "
                                                                 "a graph and it appears here.</p>",
            "<h2>Programs</h2>" if p_rows else "",
            table("programs", ["graph", "planner", "limit", "status", "time", "predicted", "lower bound",
                               "vs bound", "solver gap", "solve", "hardware", "solved", "note", ""], p_rows)
            if p_rows else "",
            "<p class='notes'>JSON: <code>GET /programs/{key}</code>, <code>GET /graphs/{hash}</code>, "
            "<code>GET /programs/{key}/report?format=json</code>.</p>",
            "</body></html>"]
    return "".join(body)


# -- a program's report ---------------------------------------------------------------

def _load(store, key: str, what: str = "program"):
    """(record, Program, TimingReport, hardware) of a stored program, timed on its target."""
    from pydantic import ValidationError

    from lowering.errors import GraphError
    from service.pipeline import load_hardware
    from target.superdsc import Program
    from simulator.timing import time_program

    record = store.get_program(key)
    if record is None:
        raise _PageProblem(404, "not_found", f"no {what} with key {key}")
    try:
        hw = load_hardware(record.hardware)
        program = Program.from_json(record.program)
        return record, program, time_program(program, hw), hw
    except (GraphError, ValidationError, ValueError, KeyError) as exc:
        # e.g. a row written by another compiler version this build cannot read
        raise _PageProblem(422, "unreadable_program",
                           f"{what} {key} (compiler {record.compiler_version}) cannot be reported by this "
                           f"build: {type(exc).__name__}: {str(exc)[:500]}") from exc


def _report_of(store, key: str, against: Optional[str] = None):
    """(record, graph record or None, Report, diff or None, the graph's programs) of a
    stored program; the diff is against the program stored under `against`, which must
    be of the same graph (422 different_graphs otherwise)."""
    from simulator.report import build_report, diff_programs

    record, program, timing, hw = _load(store, key)
    graph = store.get_graph(record.graph_hash)
    if not program.graph_name and graph is not None:
        program.graph_name = graph.name
    report = build_report(program, timing, hw)
    diff = None
    if against is not None:
        other, other_program, other_timing, _ = _load(store, against, "program to compare with")
        if other.graph_hash != record.graph_hash:
            raise _PageProblem(422, "different_graphs",
                               f"program {against} is of graph {other.graph_hash[:16]}, not of this program's "
                               f"graph {record.graph_hash[:16]}: only programs of one graph can be compared")
        try:
            diff = diff_programs(program, timing, other_program, other_timing)
        except ValueError as exc:
            raise _PageProblem(422, "different_graphs", str(exc)) from exc
    siblings = [p for p in store.programs_for_graph(record.graph_hash) if p.key != record.key]
    return record, graph, report, diff, siblings


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def index_page(store_location: str) -> PageAnswer:
    """The store index (HTML)."""
    return PageAnswer(_index_html(_index_model(_worker_store(store_location))))


def report_page(store_location: str, key: str, format: str = "html", against: Optional[str] = None) -> PageAnswer:
    """A stored program's report: the HTML page, or (format "json") the report model."""
    try:
        return _report_page(_worker_store(store_location), key, format, against)
    except _PageProblem as exc:
        return PageAnswer(problem=exc.problem)


def _report_page(store, key: str, format: str, against: Optional[str]) -> PageAnswer:
    from simulator.report import fmt_s, fmt_us
    from simulator.report_html import render_html

    record, graph, report, diff, siblings = _report_of(store, key, against)
    if format == "json":
        out = {"key": record.key, "graph_hash": record.graph_hash, "compiler_version": record.compiler_version,
               "options": record.options, "complete": record.complete, "solved_at": record.updated_at,
               "report": report.to_dict()}
        if diff is not None:
            out["against"] = against
            out["diff"] = diff
        return PageAnswer(json.dumps(_finite(out), allow_nan=False), media_type="application/json")
    limit = record.options.get("time_limit_s")
    facts = [("key", record.key[:16]), ("graph", record.graph_hash[:16]),
             ("asked", f"{record.options.get('planner', '?')}" + (f", {fmt_s(limit)} limit" if limit else "")),
             ("solved", _when(record.updated_at or record.created_at)),
             ("compiler", record.compiler_version + ("" if record.compiler_version == COMPILER_VERSION
                                                     else " (not current)"))]
    if not record.complete:
        facts.append(("complete", "no, cut short by a deadline"))
    if against is not None:
        facts.append(("compared with", against[:16]))
    nav = [("../../", "← store index"), ("?format=json", "report JSON"), (f"../{record.key}", "program JSON")]
    if graph is not None:
        nav.append((f"../../graphs/{record.graph_hash}", "graph JSON"))
    # the graph's other programs: open each, or compare this one with it
    for p in siblings:
        label = f"{p.stats.get('planner') or p.options.get('planner') or '?'} {fmt_us(_time_of(p.stats))}"
        nav.append((f"../{p.key}/report", label))
        nav.append((f"?against={p.key}", f"diff vs {label}"))
    return PageAnswer(render_html(report, diff, None, nav, facts))
