"""`sticksat compile GRAPH.json [--planner cpsat] -o PROGRAM.json`: graph document -> validated
SuperDSC program (parse + validate the document, lower to primitive ops, plan, validate)."""
from __future__ import annotations

import json
import sys
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("compile", help="compile a graph document into a SuperDSC program")
    p.add_argument("graph", help="graph document (JSON)")
    from solver.planners import DEFAULT_PLANNER, KNOWN_PLANNERS

    p.add_argument("--planner", default=DEFAULT_PLANNER,
                   help="planner name: " + ", ".join(f"{i.name} ({i.summary})" for i in KNOWN_PLANNERS))
    p.add_argument("--hardware", default="spyre", help="hardware target name or JSON path")
    p.add_argument("--time-limit", type=float, default=None,
                   help="solver time limit in seconds (default: the planner's own, 10 s for cpsat)")
    p.add_argument("--deterministic", action="store_true", help="deterministic solver mode")
    p.add_argument("--strict", action="store_true",
                   help="fail when the planner fails, instead of falling back to the next planner "
                        "(cpsat -> heuristic -> naive)")
    p.add_argument("-o", "--output", default="-", help="program JSON path ('-': stdout)")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress and no summary on stderr (errors and warnings only)")
    p.set_defaults(func=run)


def load_primgraph(path: str):
    """Read (a graph document or torch.export program JSON, either may be `.json.gz`),
    validate as /compile does, and lower. The service's per-request operating limits
    (service.pipeline.GraphLimits: nodes, total elements) bound what a remote client may
    make the service allocate; a local file planned for its own user is held only to the
    format's bounds, so a whole model at real size compiles here."""
    from lowering import lower_document
    from service.batch.common import read_graph_file
    from service.pipeline import GraphLimits

    local = GraphLimits(max_nodes=2**31, max_total_elements=2**62)
    return lower_document(read_graph_file(path, local))


def run(args) -> int:
    from lowering.errors import GraphError
    from target.hardware import load_target
    from solver.planners import PlanInvalid, PlannerFailed, plan

    try:
        pg = load_primgraph(args.graph)
    except GraphError as e:
        print(json.dumps({"error": e.code, "message": e.message, "node": e.node}), file=sys.stderr)
        return 2
    except OSError as e:
        print(json.dumps({"error": "io", "message": str(e)}), file=sys.stderr)
        return 2
    hw = load_target(args.hardware)
    progress = None if args.quiet else make_progress(sys.stderr)
    try:
        try:
            program = plan(pg, hw, planner=args.planner, time_limit_s=args.time_limit,
                           deterministic=args.deterministic, fallback=not args.strict,
                           events=progress)
        finally:
            if progress is not None:
                progress.close()
    except PlannerFailed as e:
        cause = e.__cause__
        issues = [i.to_json() for i in cause.issues] if isinstance(cause, PlanInvalid) else []
        print(json.dumps({"error": "planner_failed", "message": str(e), "node": e.op, "errors": issues}),
              file=sys.stderr)
        return 1
    except KeyError as e:
        print(json.dumps({"error": "unknown_planner", "message": str(e)}), file=sys.stderr)
        return 2
    if program.stats.fallback_from:
        print(f"warning: planner {program.stats.fallback_from} failed ({program.stats.fallback_reason}); "
              f"the program was made by {program.stats.planner}", file=sys.stderr)
    text = program.to_json(indent=1)
    if args.output == "-":
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    else:
        Path(args.output).write_text(text)
    if not args.quiet:
        print_summary(program, hw)
    return 0


def print_summary(program, hw, stream=None) -> None:
    """The compile summary (simulator.report.summary_lines) on stderr: stdout stays the
    program when it is written there."""
    from simulator.report import summary_lines
    from simulator.timing import time_program

    try:
        timing = time_program(program, hw)
    except Exception:  # noqa: BLE001 - the summary never fails a compile that succeeded
        timing = None
    stream = stream or sys.stderr
    for line in summary_lines(program, timing):
        print(line, file=stream)


# -- live progress --------------------------------------------------------------------------------
def make_progress(stream):
    """The live progress sink for a terminal (`rich` when installed, else plain lines), or
    None when `stream` is not a TTY: then nothing is computed for progress at all."""
    if not getattr(stream, "isatty", lambda: False)():
        return None
    try:
        return RichProgress(stream)
    except ImportError:
        return PlainProgress(stream)


def _incumbent_text(ev) -> str:
    from simulator.report import fmt_pct, fmt_us
    return (f"round {ev.round}: incumbent {fmt_us(ev.objective_us)}, bound {fmt_us(ev.bound_us)}, "
            f"gap {fmt_pct(ev.gap)} after {ev.wall_s:.1f} s")


def _line(ev) -> str | None:
    """A finished-phase or terminal event as one line (None for the others)."""
    from simulator.report import fmt_s, fmt_us
    k = ev.kind
    if k == "phase_finished":
        return f"{ev.planner}: {ev.phase} done in {fmt_s(ev.seconds)}" + (f" ({ev.detail})" if ev.detail else "")
    if k == "fallback":
        return f"{ev.planner} failed ({ev.reason}); falling back to {ev.next_planner}"
    if k == "finished":
        return f"{ev.planner}: finished, status {ev.status or '-'}, predicted {fmt_us(ev.predicted_us)}"
    if k == "failed":
        return f"{ev.planner}: failed ({ev.reason})"
    return None


class PlainProgress:
    """One line per finished phase; incumbents at most twice a second."""

    def __init__(self, stream):
        self.stream, self.last = stream, 0.0

    def __call__(self, ev) -> None:
        import time
        if ev.kind == "incumbent":
            now = time.perf_counter()
            if now - self.last < 0.5:
                return
            self.last = now
            text = "  " + _incumbent_text(ev)
        else:
            text = _line(ev)
        if text:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        pass


class RichProgress:
    """A spinner with the current phase and the incumbent/bound/gap, and one printed line per
    finished phase (rich, on stderr)."""

    def __init__(self, stream):
        from rich.console import Console
        self.console = Console(file=stream)
        self.status = self.console.status("planning", spinner="dots")
        self.status.start()
        self.phase = "planning"

    def __call__(self, ev) -> None:
        from rich.markup import escape
        k = ev.kind
        if k == "phase_started":
            self.phase = f"{ev.planner}: {ev.phase}" + (f" ({ev.detail})" if ev.detail else "")
            self.status.update(escape(self.phase))
        elif k == "incumbent":
            self.status.update(f"{escape(self.phase)}  [bold]{escape(_incumbent_text(ev))}[/bold]")
        else:
            text = _line(ev)
            if text:
                self.console.print(("[green]✓[/green] " if k == "phase_finished" else "") + escape(text))

    def close(self) -> None:
        self.status.stop()
