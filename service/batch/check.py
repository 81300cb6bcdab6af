"""`sticksat check`: the CI gate. Compiles every graph of a directory (or of a store),
and fails when one does not compile, its program fails validation on the simulator, its
planner had to fall back to a simpler one, or its simulated time regresses beyond a
tolerance against a baseline file. Writes JUnit XML (one testcase per graph) and a
table; `--update-baseline` (re)writes the baseline.

The baseline file (JSON, versioned):
    {"format": "sticksat.check-baseline", "version": 1, "compiler_version": ..., "planner": ...,
     "deterministic": true, "time_limit_s": 5.0, "target": "spyre", "hardware_digest": ...,
     "tolerance_pct": 5.0, "created_at": "2026-12-01T17:40:00Z",
     "graphs": {"<graph name>": {"graph_hash": ..., "simulated_us": ..., "planner": ...,
                                 "compiler_version": ..., "solver_status": ...}}}
Entries are looked up by graph name, then by graph hash.

CP-SAT under a wall-clock limit is not deterministic, so the gate's default is the
planner's deterministic mode (bounded by CP-SAT's deterministic time, one worker, fixed
seed): the same compiler gives the same plan on any machine, and a change in simulated
time means the compiler or the graph changed. The heuristic planner is deterministic
too and fast (`--planner heuristic`).
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

BASELINE_FORMAT = "sticksat.check-baseline"
BASELINE_VERSION = 1
DEFAULT_TOLERANCE_PCT = 5.0
DEFAULT_PLANNER = "cpsat"
DEFAULT_TIME_LIMIT_S = 5.0


@dataclass
class CheckCase:
    name: str
    source: str  # file path or store graph hash
    graph_hash: Optional[str] = None
    status: str = "fail"  # pass | fail | new (passes: not in the baseline)
    reason: Optional[str] = None  # compile | validation | fallback | regression | timing | limit (when failed)
    message: str = ""
    simulated_us: Optional[float] = None
    baseline_us: Optional[float] = None
    planner: Optional[str] = None
    solver_status: Optional[str] = None
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.status == "fail"

    @property
    def change(self) -> Optional[float]:
        if self.simulated_us is not None and self.baseline_us:
            return self.simulated_us / self.baseline_us - 1.0
        return None


@dataclass
class CheckResult:
    cases: list[CheckCase] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def failures(self) -> list[CheckCase]:
        return [c for c in self.cases if c.failed]

    def to_json(self) -> dict[str, Any]:
        return {"options": self.options, "failures": len(self.failures),
                "cases": [{**asdict(c), "change": c.change} for c in self.cases]}


class BaselineError(ValueError):
    pass


def load_baseline(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise BaselineError(f"cannot read baseline {path}: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != BASELINE_FORMAT:
        raise BaselineError(f"{path} is not a sticksat check baseline (format {BASELINE_FORMAT!r})")
    if data.get("version") != BASELINE_VERSION:
        raise BaselineError(f"{path} has baseline version {data.get('version')!r}; this build reads "
                            f"{BASELINE_VERSION}")
    graphs = data.get("graphs")
    if not isinstance(graphs, dict):
        raise BaselineError(f"{path}: 'graphs' must be an object")
    for name, entry in graphs.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("simulated_us"), (int, float)):
            raise BaselineError(f"{path}: graphs[{name!r}] needs a numeric simulated_us")
    return data


def _baseline_entry(baseline: Optional[dict[str, Any]], name: str, graph_hash: Optional[str]):
    if not baseline:
        return None
    graphs = baseline["graphs"]
    if name in graphs:
        return graphs[name]
    for entry in graphs.values():
        if graph_hash and entry.get("graph_hash") == graph_hash:
            return entry
    return None


def iter_sources(location: str) -> Iterator[tuple[str, str, Any]]:
    """(name, source, loader) per graph: loader() -> GraphDocument (raises GraphError for
    an invalid one). A directory: every *.json and *.json.gz below it (sorted); a store:
    every graph."""
    from service.batch.common import graph_file_stem, is_store_location, read_graph_file

    if is_store_location(location):
        from service.store import ProgramStore

        store = ProgramStore(location)
        for graph_hash, name in store.graph_hashes():
            def load(h=graph_hash):
                from lowering.validate import parse_document

                return parse_document(store.get_graph(h).document)
            yield name or graph_hash[:12], graph_hash, load
        return
    root = Path(location)
    if not root.is_dir():
        raise FileNotFoundError(f"{location} is neither a directory of graph documents nor a store")
    for path in sorted(p for p in root.rglob("*") if p.name.endswith((".json", ".json.gz")) and p.is_file()):
        yield graph_file_stem(path), str(path), (lambda p=path: read_graph_file(p))


def _loaded(name: str, source: str, load) -> tuple[CheckCase, Any]:
    """The case of one graph source and its document, or the case failed with why it could
    not be read (document None)."""
    from lowering.errors import GraphError

    case = CheckCase(name=name, source=source)
    started = time.time()
    try:
        doc = load()
    except GraphError as exc:
        case.reason, case.message = "compile", f"invalid graph: {exc.code}: {exc.message}" + (
            f" (node {exc.node})" if exc.node else "")
        case.seconds = time.time() - started
        return case, None
    except OSError as exc:
        case.reason, case.message = "compile", f"cannot read: {exc}"
        return case, None
    case.name = name or doc.name
    case.graph_hash = doc.graph_hash()
    return case, doc


def _judged(case: CheckCase, outcome, options, baseline: Optional[dict[str, Any]], tolerance_pct: float,
            allow_fallback: bool) -> CheckCase:
    """`case` with the verdict on its compile `outcome` (a pipeline.CompileOutcome)."""
    from service import pipeline
    from simulator.validate import validate_program
    from target.superdsc import Program

    if outcome.status != "ok" or outcome.program is None:
        err = outcome.error or {}
        case.reason = "compile"
        case.message = f"does not compile: {err.get('code', outcome.status)}: {err.get('message', '')}" + (
            f" (node {err['node']})" if err.get("node") else "")
        return case
    stats = outcome.stats
    case.planner, case.solver_status = stats.get("planner"), stats.get("solver_status")
    hw = pipeline.load_hardware(options.target)
    issues = validate_program(Program.from_json(outcome.program), hw)
    if issues:
        case.reason = "validation"
        case.message = "program fails validation: " + "; ".join(f"{i.code}: {i.message}" for i in issues[:3])
        return case
    if stats.get("fallback_from") and not allow_fallback:
        case.reason = "fallback"
        case.message = (f"planner {stats['fallback_from']} failed ({stats.get('fallback_reason')}); "
                        f"the program was made by {stats.get('planner')}")
        return case
    sim = stats.get("simulated_us")
    if not isinstance(sim, (int, float)):
        case.reason, case.message = "timing", f"no simulated time: {stats.get('timing_error')}"
        return case
    case.simulated_us = float(sim)
    entry = _baseline_entry(baseline, case.name, case.graph_hash)
    if entry is None:
        case.status = "new"
        case.message = "not in the baseline" if baseline else ""
        return case
    case.baseline_us = float(entry["simulated_us"])
    limit = case.baseline_us * (1.0 + tolerance_pct / 100.0)
    if case.simulated_us > limit:
        case.reason = "regression"
        case.message = (f"simulated {case.simulated_us:.3f} us vs baseline {case.baseline_us:.3f} us "
                        f"({100 * case.change:+.1f}%, tolerance {tolerance_pct:g}%)")
        if entry.get("planner") and entry.get("planner") != case.planner:
            case.message += f"; baseline planner {entry['planner']}, now {case.planner}"
        return case
    case.status = "pass"
    if entry.get("graph_hash") and entry["graph_hash"] != case.graph_hash:
        case.message = "graph changed since the baseline (hash differs)"
    return case


def check_one(name: str, source: str, load, options, baseline: Optional[dict[str, Any]], tolerance_pct: float,
              allow_fallback: bool) -> CheckCase:
    """One graph compiled in this process and judged (no time or memory limit)."""
    from service import pipeline

    case, doc = _loaded(name, source, load)
    if doc is None:
        return case
    started = time.time()
    outcome = pipeline.compile_job(pipeline.CompileJob(document=doc.to_json(), options=options))
    case.seconds = time.time() - started
    return _judged(case, outcome, options, baseline, tolerance_pct, allow_fallback)


def run_check(location: str, *, baseline_path: Optional[str] = None, tolerance_pct: float = DEFAULT_TOLERANCE_PCT,
              planner: Optional[str] = DEFAULT_PLANNER, time_limit_s: Optional[float] = DEFAULT_TIME_LIMIT_S,
              deterministic: bool = True, target: Optional[str] = None, allow_fallback: bool = False,
              update_baseline: bool = False, progress=None, graph_wall_s: Optional[float] = None,
              memory_bytes: Optional[int] = None) -> CheckResult:
    """Compile and judge every graph of `location`. With `graph_wall_s` or `memory_bytes`
    each compile runs in a worker process under those limits (service/batch/isolated.py):
    a graph past either fails with reason "limit" and the run goes on; without them, in
    this process."""
    from service import pipeline
    from service.batch.isolated import JobLimitExceeded, run_isolated

    options = pipeline.resolve_options(planner, time_limit_s, deterministic, target)
    baseline = None
    if baseline_path and Path(baseline_path).exists():
        baseline = load_baseline(baseline_path)
    elif baseline_path and not update_baseline:
        raise BaselineError(f"baseline {baseline_path} does not exist (write it with --update-baseline)")
    result = CheckResult(options={**options.solve_dict(), "target": options.target, "tolerance_pct": tolerance_pct,
                                  "baseline": baseline_path, "location": location})
    judge_against = None if update_baseline else baseline
    sources = list(iter_sources(location))
    if graph_wall_s is None and memory_bytes is None:
        for i, (name, source, load) in enumerate(sources):
            if progress is not None:
                progress(i, len(sources), name)
            result.cases.append(check_one(name, source, load, options, judge_against, tolerance_pct,
                                          allow_fallback))
    else:
        loaded = [_loaded(name, source, load) for name, source, load in sources]
        result.cases = [case for case, _ in loaded]
        jobs = {k: pipeline.CompileJob(document=doc.to_json(), options=options)
                for k, (_, doc) in enumerate(loaded) if doc is not None}
        case_of = {id(job): k for k, job in jobs.items()}
        started = {k: time.time() for k in jobs}
        done = 0
        for job, outcome in run_isolated(list(jobs.values()), pipeline.compile_job, jobs=1,
                                         wall_s=lambda _job: graph_wall_s, memory_bytes=memory_bytes):
            k = case_of[id(job)]
            case = result.cases[k]
            if progress is not None:
                progress(done, len(jobs), case.name)
            done += 1
            case.seconds = time.time() - started[k]
            if isinstance(outcome, JobLimitExceeded):
                case.reason, case.message = "limit", f"stopped at the per-graph time limit ({graph_wall_s:g} s)"
            elif isinstance(outcome, BaseException):
                case.reason = "limit" if memory_bytes else "compile"
                case.message = f"the compile's worker failed: {type(outcome).__name__}: {outcome}" + (
                    " (the per-graph memory limit?)" if memory_bytes else "")
            else:
                _judged(case, outcome, options, judge_against, tolerance_pct, allow_fallback)
    if progress is not None:
        progress(len(sources), len(sources), None)
    if update_baseline and baseline_path:
        write_baseline(baseline_path, result, options, tolerance_pct, previous=baseline)
    return result


def write_baseline(path: str, result: CheckResult, options, tolerance_pct: float,
                   previous: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The baseline from the passing cases; a graph that failed keeps its old entry."""
    from lowering.version import COMPILER_VERSION
    from service import pipeline

    graphs: dict[str, Any] = dict((previous or {}).get("graphs", {}))
    for case in result.cases:
        if case.failed or case.simulated_us is None:
            continue
        graphs[case.name] = {"graph_hash": case.graph_hash, "simulated_us": case.simulated_us,
                             "planner": case.planner, "compiler_version": COMPILER_VERSION,
                             "solver_status": case.solver_status}
    data = {"format": BASELINE_FORMAT, "version": BASELINE_VERSION, "compiler_version": COMPILER_VERSION,
            "planner": options.planner, "deterministic": options.deterministic,
            "time_limit_s": options.time_limit_s, "target": options.target,
            "hardware_digest": pipeline.load_hardware(options.target).digest, "tolerance_pct": tolerance_pct,
            "created_at": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "graphs": dict(sorted(graphs.items()))}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=1) + "\n")
    return data


def write_junit(path: str, result: CheckResult) -> None:
    """JUnit XML: one testsuite, one testcase per graph; a failed case has a <failure>
    whose message says why (type: compile | validation | fallback | regression | timing).
    Every text from a graph (its name, messages quoting node ids) goes through
    `printable`: XML 1.0 has no way to write most control characters, so one left as it
    is makes the whole report ill-formed."""
    from service.batch.common import printable as p

    suite = ET.Element("testsuite", name="sticksat check", tests=str(len(result.cases)),
                       failures=str(len(result.failures)), errors="0", skipped="0",
                       time=f"{sum(c.seconds for c in result.cases):.3f}")
    props = ET.SubElement(suite, "properties")
    for k, v in result.options.items():
        ET.SubElement(props, "property", name=p(k), value=p(v))
    for case in result.cases:
        tc = ET.SubElement(suite, "testcase", classname="sticksat.check", name=p(case.name), file=p(case.source),
                           time=f"{case.seconds:.3f}")
        if case.failed:
            failure = ET.SubElement(tc, "failure", message=p(case.message), type=case.reason or "failure")
            failure.text = json.dumps({**asdict(case), "change": case.change}, indent=1)  # ASCII, escaped
        else:
            out = ET.SubElement(tc, "system-out")
            out.text = p(f"simulated_us={case.simulated_us} baseline_us={case.baseline_us} "
                         f"planner={case.planner} status={case.solver_status} {case.message}".strip())
    root = ET.Element("testsuites", name="sticksat check", tests=suite.get("tests"),
                      failures=suite.get("failures"), errors="0", time=suite.get("time"))
    root.append(suite)
    ET.indent(root)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


TABLE_HEADERS = ("graph", "result", "simulated us", "baseline us", "change", "planner", "status", "seconds", "why")


def table_rows(result: CheckResult) -> list[list[Any]]:
    from service.batch.common import fmt_us

    rows = []
    for c in result.cases:
        change = f"{100 * c.change:+.1f}%" if c.change is not None else "-"
        rows.append([c.name, c.status.upper(), fmt_us(c.simulated_us), fmt_us(c.baseline_us), change, c.planner,
                     c.solver_status, f"{c.seconds:.1f}", c.message])
    return rows
