"""`sticksat store add` / `sticksat store list`: put graph documents into the store, and
what the store holds per graph (its best program: predicted and simulated time, gap to
the lower bound, planner, compiler version, hardware digest, when solved, complete,
proven optimal)."""
from __future__ import annotations

import time
from typing import Any, Optional

from service.store import ProgramRecord, ProgramStore


def add_graphs(store: ProgramStore, paths: list[str]) -> list[dict[str, Any]]:
    """Validate each file as /compile would and store its document. One result per file:
    {file, ok, graph_hash, name, nodes, new} or {file, ok: false, error: {code, message, node}}."""
    from lowering.errors import GraphError

    from service.batch.common import read_graph_file

    out: list[dict[str, Any]] = []
    for path in paths:
        try:
            doc = read_graph_file(path)
        except GraphError as exc:
            out.append({"file": path, "ok": False, "error": exc.to_dict()})
            continue
        except OSError as exc:
            out.append({"file": path, "ok": False, "error": {"code": "io", "message": str(exc), "node": None}})
            continue
        graph_hash = doc.graph_hash()
        new = store.put_graph(graph_hash, doc.to_json(), doc.name)
        out.append({"file": path, "ok": True, "graph_hash": graph_hash, "name": doc.name, "nodes": len(doc.nodes),
                    "new": new})
    return out


def _current_digest(hardware: str) -> Optional[str]:
    from service.pipeline import available_targets, load_hardware

    return load_hardware(hardware).digest if hardware in available_targets() else None


def is_current(record: ProgramRecord) -> bool:
    """Made by this compiler for the hardware file this build ships for its target."""
    from lowering.version import COMPILER_VERSION

    return record.compiler_version == COMPILER_VERSION and record.hardware_digest == _current_digest(record.hardware)


def _sim(record: ProgramRecord) -> float:
    value = record.stats.get("simulated_us")
    return float(value) if isinstance(value, (int, float)) else float("inf")


def best_program(programs: list[ProgramRecord]) -> Optional[ProgramRecord]:
    """The program a listing shows for a graph: current ones first, then complete ones,
    then the fastest on the simulator."""
    if not programs:
        return None
    return min(programs, key=lambda r: (not is_current(r), not r.complete, _sim(r)))


def gap_to_bound(stats: dict[str, Any]) -> Optional[float]:
    """simulated / lower bound - 1 (the stats' machine lower bound; None without both)."""
    sim, bound = stats.get("simulated_us"), stats.get("lower_bound_us")
    if isinstance(sim, (int, float)) and isinstance(bound, (int, float)) and bound > 0:
        return float(sim) / float(bound) - 1.0
    return None


def list_store(store: ProgramStore) -> list[dict[str, Any]]:
    """One entry per stored graph with the summary of its best program (None fields when
    it has no program yet)."""
    rows: list[dict[str, Any]] = []
    for graph_hash, name in store.graph_hashes():
        programs = store.programs_for_graph(graph_hash)
        best = best_program(programs)
        row: dict[str, Any] = {"graph_hash": graph_hash, "name": name, "programs": len(programs), "key": None,
                               "planner": None, "compiler_version": None, "hardware": None,
                               "hardware_digest": None, "current": None, "predicted_us": None,
                               "simulated_us": None, "lower_bound_us": None, "gap": None, "solver_gap": None,
                               "solver_status": None, "complete": None, "optimal": None, "solved_at": None,
                               "reoptimized": None}
        if best is not None:
            s = best.stats
            row.update(key=best.key, planner=s.get("planner"), compiler_version=best.compiler_version,
                       hardware=best.hardware, hardware_digest=best.hardware_digest, current=is_current(best),
                       predicted_us=s.get("predicted_us"), simulated_us=s.get("simulated_us"),
                       lower_bound_us=s.get("lower_bound_us"), gap=gap_to_bound(s), solver_gap=s.get("gap"),
                       solver_status=s.get("solver_status"), complete=best.complete,
                       optimal=str(s.get("solver_status") or "").upper() == "OPTIMAL", solved_at=best.updated_at,
                       reoptimized=s.get("reoptimized"))
        rows.append(row)
    return rows


LIST_HEADERS = ("graph", "hash", "progs", "planner", "predicted us", "simulated us", "gap", "status",
                "complete", "compiler", "hw digest", "solved (UTC)")


def list_table_rows(rows: list[dict[str, Any]]) -> list[list[Any]]:
    from service.batch.common import fmt_pct, fmt_time, fmt_us

    out = []
    for r in rows:
        version = r["compiler_version"]
        if version is not None and r["current"] is False:
            version += " (not current)"
        out.append([r["name"], r["graph_hash"][:12], r["programs"], r["planner"], fmt_us(r["predicted_us"]),
                    fmt_us(r["simulated_us"]), fmt_pct(r["gap"]),
                    ("OPTIMAL" if r["optimal"] else r["solver_status"]),
                    None if r["complete"] is None else ("yes" if r["complete"] else "no"),
                    version, (r["hardware_digest"] or "")[:12] or None, fmt_time(r["solved_at"])])
    return out


def compile_into_store(store: ProgramStore, graph_hash: str, planner: Optional[str] = None,
                       time_limit_s: Optional[float] = None, deterministic: bool = False,
                       target: Optional[str] = None, as_default: bool = False) -> Optional[ProgramRecord]:
    """Compile a stored graph as /compile would with these options (default: /compile's
    defaults) and store the program under the key /compile looks up for them; with
    `as_default`, under the key of /compile's default options instead (a stand-in for an
    online plan made under a tighter budget). Returns the row the store then holds (None
    when the compile failed). How tests and the benchmark seed an "online" plan."""
    from lowering.version import COMPILER_VERSION
    from service import pipeline
    from service.store import program_key

    graph = store.get_graph(graph_hash)
    if graph is None:
        raise KeyError(f"graph {graph_hash} is not in the store")
    options = pipeline.resolve_options(planner, time_limit_s, deterministic, target)
    key_options = pipeline.resolve_options(None, None, False, target) if as_default else options
    hw = pipeline.load_hardware(options.target)
    key = program_key(graph_hash, COMPILER_VERSION, key_options.options_hash(), hw.digest)
    outcome = pipeline.compile_job(pipeline.CompileJob(document=graph.document, options=options))
    if outcome.status != "ok" or outcome.program is None:
        return None
    slot = pipeline.StoreSlot(store.location, ProgramRecord.empty(
        key=key, graph_hash=graph_hash, compiler_version=COMPILER_VERSION,
        options_hash=key_options.options_hash(), options=key_options.solve_dict(), hardware=hw.name,
        hardware_digest=hw.digest))
    store.put_program(slot.record(outcome.program, outcome.stats, outcome.solution, outcome.complete))
    return store.get_program(key)


def adopt_programs(store: ProgramStore, target: Optional[str] = None,
                   from_version: Optional[str] = None) -> list[dict[str, Any]]:
    """Adopt another build's programs deliberately: for every stored graph without a
    complete row of this build under /compile's default key, the fastest row another
    build made for the same target (or only rows of `from_version`) is validated and timed
    again by this build's simulator, and stored under this build's key (complete, its
    stats saying `adopted_from`), so /compile serves it and `sticksat reoptimize` starts
    from it. A row that no longer validates is left where it is. One result per graph:
    {graph_hash, name, outcome: adopted | current | none | invalid, from_version, reason}.

    Build fingerprints (lowering.version) key every build apart, so nothing is adopted
    unless asked: an old program may be slower than what this build plans, or planned by
    a planner with a bug this build fixed; the re-validation on this build's simulator is
    what makes adopting it safe."""
    from dataclasses import replace

    from lowering.version import COMPILER_VERSION
    from service import pipeline
    from service.batch.reoptimize import validate_and_time
    from service.store import program_key

    options = pipeline.resolve_options(None, None, False, target)
    hw = pipeline.load_hardware(options.target)
    key_hash = options.options_hash()
    out: list[dict[str, Any]] = []
    for graph_hash, name in store.graph_hashes():
        key = program_key(graph_hash, COMPILER_VERSION, key_hash, hw.digest)
        row: dict[str, Any] = {"graph_hash": graph_hash, "name": name, "outcome": "none", "from_version": None,
                               "reason": None, "key": key}
        current = store.get_program(key)
        if current is not None and current.complete:
            row["outcome"] = "current"
            out.append(row)
            continue
        others = [p for p in store.programs_for_graph(graph_hash)
                  if p.compiler_version != COMPILER_VERSION and p.hardware == hw.name
                  and (from_version is None or p.compiler_version == from_version)]
        reasons = []
        for old in sorted(others, key=_sim):
            stats = dict(old.stats)
            problem = validate_and_time(old.program, stats, options.target)
            if problem:
                reasons.append(f"{old.compiler_version}: {problem}")
                continue
            now = time.time()
            stats["adopted_from"] = {"compiler_version": old.compiler_version, "key": old.key,
                                     "hardware_digest": old.hardware_digest, "simulated_us": _sim(old)}
            store.put_program(replace(old, key=key, compiler_version=COMPILER_VERSION, options_hash=key_hash,
                                      options=options.solve_dict(), hardware_digest=hw.digest, stats=stats,
                                      complete=True, created_at=now, updated_at=now))
            row.update(outcome="adopted", from_version=old.compiler_version)
            break
        else:
            if reasons:
                row.update(outcome="invalid", reason="; ".join(reasons)[:500])
        out.append(row)
    return out
