"""`sticksat reoptimize`: offline re-solves of stored graphs with a larger budget.

For every graph in the store, the row `/compile` answers with default options (the key
of (graph hash, this compiler version, the default options' hash, the shipped hardware
file's digest)) is the target. A graph is re-solved when that row
- is missing: the graph was only added (`sticksat store add`) or its plans were made by
  an older compiler version or for an older hardware file ("stale"), or
- holds a plan that is not proven optimal (`--only-stale` skips these).
The solve starts from the stored plan as a complete hint (the target row's program, else
the best plan of any other row of the graph) and runs the planner with the batch budget
(by default searching for all of it: `BUDGET_MODES`). The worker validates and times its
program on the simulator (besides `plan()`'s own check), and the process that commits it
does so once more, so a worker (possibly another build on a remote Dask worker) can never
put an invalid plan or a wrong time into the store. The store keeps the new plan only
when it is faster on the simulator, or as fast and proven optimal
(`service.store.faster_or_proven`): never a slower or an invalid plan. Because it lands
under the default key, `/compile` serves it from then on.

Every result is committed as it arrives, together with a `reoptimizations` row keyed by
(program key, compiler version, hardware digest, budget) in the same transaction: a run
killed at any moment loses only the jobs in flight, and a rerun with the same budget
skips what was processed. Failures are recorded too (a graph that does not compile with
this compiler is not retried for the same budget).

Engines: `local` (a process pool on this machine, `--jobs` workers), `dask`
(`dask.distributed.Client(scheduler)`: the same jobs on an existing cluster; the workers
need only the job's JSON, never the store), `inline` (this process; tests).
"""
from __future__ import annotations

import os
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

from service.store import ProgramRecord, ProgramStore, Reoptimization, faster_or_proven, program_key

DEFAULT_BUDGET_S = 60.0
ENGINES = ("local", "dask", "inline")
# "whole": the planner searches for the whole budget, stopping early only on a proven
# optimum (CP-SAT's `budget="fixed"`); "scaled": the planner's online rule, which sizes
# its own budget from the model's size and the plan's predicted time (at most the limit)
# and stops at a small gap, so a larger limit often changes nothing.
BUDGET_MODES = ("whole", "scaled")


@dataclass(frozen=True)
class ReoptTask:
    """One re-solve: what a worker needs (JSON text and plain values only)."""

    graph_hash: str
    name: str
    document: str
    key: str  # the store key /compile looks up with default options
    planner: str
    budget_s: float
    deterministic: bool
    target: str
    hint: Optional[str]  # a stored program (JSON), the warm start
    hint_source: str  # "current" | "older" | "none"
    before_us: Optional[float]  # the target row's simulated time (None: no row)
    before_status: Optional[str]
    before_complete: bool
    budget_mode: str = "whole"


@dataclass
class ReoptResult:
    graph_hash: str
    name: str
    status: str  # ok | failed
    program: Optional[str] = None
    stats: dict[str, Any] = field(default_factory=dict)
    solution: Optional[str] = None
    error: Optional[str] = None
    seconds: float = 0.0


@dataclass
class ReoptRow:
    name: str
    graph_hash: str
    outcome: str  # improved | proved | new | unchanged | failed | skipped:<why>
    before_us: Optional[float] = None
    after_us: Optional[float] = None
    stored_us: Optional[float] = None  # what the store holds after this run
    solver_status: Optional[str] = None
    seconds: Optional[float] = None
    error: Optional[str] = None


@dataclass
class ReoptSummary:
    run_id: str
    budget_s: float
    engine: str
    rows: list[ReoptRow] = field(default_factory=list)
    seconds: float = 0.0

    def count(self, outcome: str) -> int:
        return sum(1 for r in self.rows if r.outcome == outcome)

    @property
    def skipped(self) -> int:
        return sum(1 for r in self.rows if r.outcome.startswith("skipped"))

    @property
    def saved_us(self) -> float:
        """Simulated time saved over the graphs whose stored plan was replaced."""
        return sum(r.before_us - r.after_us for r in self.rows
                   if r.outcome == "improved" and r.before_us is not None and r.after_us is not None)

    def totals(self) -> dict[str, Any]:
        return {"graphs": len(self.rows), "processed": len(self.rows) - self.skipped,
                "improved": self.count("improved"), "proved": self.count("proved"), "new": self.count("new"),
                "unchanged": self.count("unchanged"), "failed": self.count("failed"), "skipped": self.skipped,
                "saved_us": self.saved_us}

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "budget_s": self.budget_s, "engine": self.engine, "seconds": self.seconds,
                "totals": self.totals(), "rows": [asdict(r) for r in self.rows]}


# -- the job a worker runs -----------------------------------------------------------

def solve_task(task: ReoptTask) -> ReoptResult:
    """Re-solve one graph with the batch budget from its hint; validate the program on the
    simulator and time it. Never raises: a failure is a result."""
    from service import pipeline

    started = time.time()
    result = ReoptResult(graph_hash=task.graph_hash, name=task.name, status="failed")
    hint = task.hint
    if hint is not None:
        try:
            pipeline._hint_from(hint)
        except Exception:  # noqa: BLE001 - an older compiler's program may not parse: solve cold
            hint = None
    options = pipeline.CompileOptions(planner=offline_planner(task.planner, task.budget_mode),
                                      time_limit_s=task.budget_s, deterministic=task.deterministic,
                                      target=task.target)
    try:
        outcome = pipeline.compile_job(pipeline.CompileJob(document=task.document, options=options, hint=hint))
    except Exception as exc:  # noqa: BLE001 - a compiler bug fails this graph, not the run
        result.error = f"{type(exc).__name__}: {exc}"
        result.seconds = time.time() - started
        return result
    result.seconds = time.time() - started
    if outcome.status != "ok" or outcome.program is None:
        err = outcome.error or {}
        result.error = f"{err.get('code', outcome.status)}: {err.get('message', '')}"
        return result
    problem = validate_and_time(outcome.program, outcome.stats, task.target)
    if problem:
        result.error = problem
        return result
    result.status, result.program, result.solution = "ok", outcome.program, outcome.solution
    result.stats = dict(outcome.stats)
    return result


def offline_planner(planner: str, budget_mode: str) -> str:
    """The registered planner name that searches for the whole budget (`budget_mode`
    "whole"): for cpsat, its `budget="fixed"` mode registered as "cpsat-whole-budget" in
    this process (the registry's extension point; programs still say planner cpsat).
    Planners without such a mode are used as they are."""
    if budget_mode not in BUDGET_MODES:
        raise ValueError(f"unknown budget mode {budget_mode!r}; known: {BUDGET_MODES}")
    if budget_mode == "scaled" or planner != "cpsat":
        return planner
    from functools import partial

    from solver import planners

    name = "cpsat-whole-budget"
    if name not in planners.PLANNERS:
        planners.ensure_registered("cpsat")
        from solver.spyre.cpsat_planner import plan_cpsat

        planners.register(name, partial(plan_cpsat, budget="fixed"))
    return name


def validate_and_time(program_json: str, stats: dict[str, Any], target: str) -> Optional[str]:
    """The simulator's verdict on a program, independent of what the planner claims:
    None when it is valid and the simulator times it at the stats' simulated_us, else
    what is wrong. Rewrites stats["simulated_us"] with the simulator's own number."""
    from service import pipeline
    from target.superdsc import Program
    from simulator.timing import time_program
    from simulator.validate import validate_program

    hw = pipeline.load_hardware(target)
    try:
        program = Program.from_json(program_json)
    except Exception as exc:  # noqa: BLE001
        return f"program does not parse: {exc}"
    issues = validate_program(program, hw)
    if issues:
        return "program fails validation: " + "; ".join(f"{i.code}: {i.message}" for i in issues[:3])
    try:
        stats["simulated_us"] = time_program(program, hw).total_us
    except Exception as exc:  # noqa: BLE001
        return f"the simulator cannot time the program: {type(exc).__name__}: {exc}"
    return None


# -- choosing the graphs ---------------------------------------------------------------

def _sim(stats: dict[str, Any]) -> Optional[float]:
    v = stats.get("simulated_us")
    return float(v) if isinstance(v, (int, float)) else None


def _optimal(stats: dict[str, Any]) -> bool:
    return str(stats.get("solver_status") or "").upper() == "OPTIMAL"


def default_options(planner: Optional[str] = None, target: Optional[str] = None):
    """The options /compile resolves for a request that names none (the key's options)."""
    from service import pipeline

    return pipeline.resolve_options(planner, None, False, target)


def plan_tasks(store: ProgramStore, *, budget_s: float, only_stale: bool = False, planner: Optional[str] = None,
               deterministic: bool = False, target: Optional[str] = None,
               budget_mode: str = "whole") -> tuple[list[ReoptTask], list[ReoptRow]]:
    """(tasks to run, rows for the graphs skipped and why)."""
    from lowering.version import COMPILER_VERSION
    from service import pipeline

    key_options = default_options(target=target)
    solve_planner = planner or key_options.planner
    hw = pipeline.load_hardware(key_options.target)
    tasks: list[ReoptTask] = []
    skipped: list[ReoptRow] = []
    for graph_hash, name in store.graph_hashes():
        key = program_key(graph_hash, COMPILER_VERSION, key_options.options_hash(), hw.digest)
        current = store.get_program(key)
        before_us = _sim(current.stats) if current else None
        if current is not None and current.complete and _optimal(current.stats):
            skipped.append(ReoptRow(name, graph_hash, "skipped:optimal", before_us, stored_us=before_us,
                                    solver_status="OPTIMAL"))
            continue
        if only_stale and current is not None:
            skipped.append(ReoptRow(name, graph_hash, "skipped:current", before_us, stored_us=before_us))
            continue
        done = store.get_reoptimization(key, COMPILER_VERSION, hw.digest, budget_s)
        if done is not None:
            skipped.append(ReoptRow(name, graph_hash, "skipped:done", done.before_us, done.after_us,
                                    stored_us=before_us, solver_status=done.solver_status))
            continue
        hint, source = None, "none"
        if current is not None:
            hint, source = current.program, "current"
        else:
            others = [p for p in store.programs_for_graph(graph_hash)
                      if p.hardware == hw.name and _sim(p.stats) is not None]
            if others:
                hint, source = min(others, key=lambda p: _sim(p.stats)).program, "older"
        graph = store.get_graph(graph_hash)
        tasks.append(ReoptTask(graph_hash=graph_hash, name=name, document=graph.document, key=key,
                               planner=solve_planner, budget_s=float(budget_s), deterministic=deterministic,
                               target=key_options.target, hint=hint, hint_source=source, before_us=before_us,
                               before_status=current.stats.get("solver_status") if current else None,
                               before_complete=bool(current.complete) if current else False,
                               budget_mode=budget_mode))
    return tasks, skipped


# -- committing a result ---------------------------------------------------------------

def commit_result(store: ProgramStore, task: ReoptTask, result: ReoptResult, run_id: str) -> ReoptRow:
    """Store the result (when it is better) and record the graph as processed, in one
    transaction."""
    from lowering.version import COMPILER_VERSION
    from service import pipeline

    key_options = default_options(target=task.target)
    hw = pipeline.load_hardware(task.target)
    record = None
    if result.status == "ok":
        # Trust no worker (a remote one may run another build): validate and time the
        # program here again before it can reach the store.
        result.stats = dict(result.stats)
        problem = validate_and_time(result.program or "", result.stats, task.target)
        if problem:
            result.status, result.error = "failed", problem
    after_us = _sim(result.stats) if result.status == "ok" else None
    if result.status != "ok":
        outcome = "failed"
    elif task.before_us is None:
        outcome = "new"
    elif faster_or_proven(result.stats, {"simulated_us": task.before_us, "solver_status": task.before_status},
                          task.before_complete):
        # faster, or as fast with a proof of optimality (or answering the options in full)
        outcome = "improved" if (_sim(result.stats) or 0.0) < task.before_us * (1 - 1e-9) else "proved"
    else:
        outcome = "unchanged"
    if result.status == "ok":
        now = time.time()
        stats = dict(result.stats)
        stats["reoptimized"] = {"budget_s": task.budget_s, "run_id": run_id, "before_us": task.before_us,
                                "hint": task.hint_source, "planner": task.planner,
                                "deterministic": task.deterministic, "budget_mode": task.budget_mode}
        record = ProgramRecord(key=task.key, graph_hash=task.graph_hash, compiler_version=COMPILER_VERSION,
                               options_hash=key_options.options_hash(), options=key_options.solve_dict(),
                               hardware=hw.name, hardware_digest=hw.digest, program=result.program or "",
                               stats=stats, solution=result.solution, complete=True, created_at=now,
                               updated_at=now)
    entry = Reoptimization(program_key=task.key, compiler_version=COMPILER_VERSION, hardware_digest=hw.digest,
                           budget_s=task.budget_s, graph_hash=task.graph_hash, run_id=run_id, outcome=outcome,
                           before_us=task.before_us, after_us=after_us,
                           solver_status=result.stats.get("solver_status"), seconds=result.seconds,
                           error=result.error, finished_at=time.time())
    recorded, replaced = store.finish_reoptimization(entry, record)
    if not recorded:
        outcome = "skipped:done"
    elif outcome in ("improved", "proved", "new") and not replaced:
        outcome = "unchanged"
    stored = store.get_program(task.key)
    return ReoptRow(task.name, task.graph_hash, outcome, task.before_us, after_us,
                    stored_us=_sim(stored.stats) if stored else None,
                    solver_status=result.stats.get("solver_status"), seconds=result.seconds, error=result.error)


# -- engines ---------------------------------------------------------------------------

def _run_inline(tasks, solve):
    for task in tasks:
        yield task, solve(task)


def graph_wall_s(budget_s: float) -> float:
    """The default wall-time limit of one graph's re-solve: the budget plus what lowering,
    the early plan, emitting and validating take (half the budget, at least 30 s)."""
    return budget_s + max(30.0, 0.5 * budget_s)


def _run_local(tasks, solve, jobs: int, wall_s: float, memory_bytes: Optional[int]):
    """Each graph in a pool worker with a wall-time and a memory limit
    (service/batch/isolated.py): a graph past either fails; the run goes on."""
    from service import pipeline
    from service.batch.isolated import JobLimitExceeded, run_isolated

    for task, result in run_isolated(tasks, solve, jobs=jobs, wall_s=lambda _task: wall_s,
                                     memory_bytes=memory_bytes, warm=pipeline.warm_worker):
        if isinstance(result, JobLimitExceeded):
            result = ReoptResult(task.graph_hash, task.name, "failed",
                                 error=f"time limit: still running after {wall_s:g} s; stopped (the stored plan "
                                       f"is kept)")
        elif isinstance(result, MemoryError):
            result = ReoptResult(task.graph_hash, task.name, "failed",
                                 error=f"memory limit: the solve needed more than {_gib(memory_bytes)} (the stored "
                                       f"plan is kept)")
        elif isinstance(result, BaseException):
            # a dead worker (the memory limit hit in native code, a crash) fails its graph only
            result = ReoptResult(task.graph_hash, task.name, "failed",
                                 error=f"worker: {type(result).__name__}: {result}"
                                       + (f" (memory limit {_gib(memory_bytes)})" if memory_bytes else ""))
        yield task, result


def _gib(n: Optional[int]) -> str:
    return "no limit" if not n else f"{n / 2**30:.1f} GiB"


def _run_dask(tasks, solve, scheduler, run_id: str):
    from distributed import Client, as_completed

    own = not hasattr(scheduler, "submit")
    client = Client(scheduler) if own else scheduler
    try:
        futures = [client.submit(solve, task, pure=False, key=f"sticksat-reopt-{task.key[:16]}-{run_id}")
                   for task in tasks]
        by_key = {future.key: task for future, task in zip(futures, tasks)}
        for future in as_completed(futures):
            task = by_key[future.key]
            try:
                yield task, future.result()
            except Exception as exc:  # noqa: BLE001 - a lost worker fails its job, the run goes on
                yield task, ReoptResult(task.graph_hash, task.name, "failed",
                                        error=f"dask: {type(exc).__name__}: {exc}")
    finally:
        if own:
            client.close()


# -- the run ----------------------------------------------------------------------------

def reoptimize(store_location: str, *, budget_s: float = DEFAULT_BUDGET_S, only_stale: bool = False,
               engine: str = "local", scheduler: Any = None, jobs: Optional[int] = None,
               planner: Optional[str] = None, deterministic: bool = False, target: Optional[str] = None,
               budget_mode: str = "whole", progress: Optional[Callable[[ReoptRow, int, int], None]] = None,
               solve: Callable[[ReoptTask], ReoptResult] = solve_task, run_id: Optional[str] = None,
               graph_wall_s_limit: Optional[float] = None, memory_bytes: Optional[int] = None) -> ReoptSummary:
    """Re-solve the store's graphs (module docstring); every result is committed as it
    arrives. `progress(row, done, total)` is called after each. The local engine bounds
    each graph's wall time (`graph_wall_s_limit`, default `graph_wall_s(budget_s)`) and
    its worker's memory (`memory_bytes`, default `isolated.default_memory_bytes`).
    KeyboardInterrupt (Ctrl-C; SIGTERM in the CLI) stops the run at once: the workers are
    killed, what was committed stays."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; known: {ENGINES}")
    if budget_mode not in BUDGET_MODES:
        raise ValueError(f"unknown budget mode {budget_mode!r}; known: {BUDGET_MODES}")
    if engine == "dask" and scheduler is None:
        raise ValueError("the dask engine needs a scheduler address (--scheduler tcp://host:8786)")
    started = time.time()
    run_id = run_id or uuid.uuid4().hex[:12]
    store = ProgramStore(store_location)
    summary = ReoptSummary(run_id=run_id, budget_s=float(budget_s), engine=engine)
    try:
        tasks, skipped = plan_tasks(store, budget_s=float(budget_s), only_stale=only_stale, planner=planner,
                                    deterministic=deterministic, target=target, budget_mode=budget_mode)
        summary.rows.extend(skipped)
        total = len(tasks)
        if engine == "inline":
            results = _run_inline(tasks, solve)
        elif engine == "local":
            from service.batch.isolated import default_memory_bytes

            workers = max(1, jobs or (os.cpu_count() or 2) - 1)
            results = _run_local(tasks, solve, workers, graph_wall_s_limit or graph_wall_s(float(budget_s)),
                                 memory_bytes if memory_bytes is not None else default_memory_bytes(workers))
        else:
            results = _run_dask(tasks, solve, scheduler, run_id)
        for done, (task, result) in enumerate(results, start=1):
            row = commit_result(store, task, result, run_id)
            summary.rows.append(row)
            if progress is not None:
                progress(row, done, total)
    finally:
        close = getattr(locals().get("results"), "close", None)
        if close is not None:  # a generator engine: stop its workers now, not when collected
            close()
        store.close()
    summary.seconds = time.time() - started
    return summary


SUMMARY_HEADERS = ("graph", "outcome", "before us", "after us", "stored us", "saved", "status", "seconds", "note")


def summary_rows(summary: ReoptSummary) -> list[list[Any]]:
    from service.batch.common import fmt_us

    rows = []
    for r in sorted(summary.rows, key=lambda r: r.name):
        saved = "-"
        if r.outcome == "improved" and r.before_us and r.after_us is not None:
            saved = f"{100 * (1 - r.after_us / r.before_us):.1f}%"
        rows.append([r.name, r.outcome, fmt_us(r.before_us), fmt_us(r.after_us), fmt_us(r.stored_us), saved,
                     r.solver_status, "-" if r.seconds is None else f"{r.seconds:.1f}", (r.error or "")[:80]])
    return rows


def totals_line(summary: ReoptSummary) -> str:
    t = summary.totals()
    return (f"{t['graphs']} graphs: {t['improved']} improved, {t['proved']} proved optimal at the same time, "
            f"{t['new']} new, {t['unchanged']} unchanged, "
            f"{t['failed']} failed, {t['skipped']} skipped; simulated time saved {t['saved_us']:.3f} us "
            f"(budget {summary.budget_s:g} s per graph, engine {summary.engine}, run {summary.run_id}, "
            f"{summary.seconds:.1f} s)")
