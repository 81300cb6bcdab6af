"""`sticksat reoptimize [--store URL] [--time-limit S] [--only-stale] [--engine local|dask]
[--scheduler ADDRESS] [--jobs N]`: re-solve stored graphs with a larger budget, warm-started
from the stored plan, and keep each new plan only when the simulator says it is better
(service/batch/reoptimize.py, docs/batch.md). A progress bar (rich) on a terminal, one line
per graph otherwise, and a summary table. Exit 0 when no graph failed, 1 otherwise."""
from __future__ import annotations

import json
import sys


def register(sub) -> None:
    from service.batch.reoptimize import DEFAULT_BUDGET_S

    p = sub.add_parser("reoptimize", help="re-solve stored graphs with a larger budget; keep only better plans")
    p.add_argument("--store", default=None,
                   help="store: SQLite path, sqlite:///path or postgresql://... "
                        "(default $STICKSAT_STORE or ~/.local/share/sticksat/store.sqlite)")
    p.add_argument("--time-limit", type=float, default=DEFAULT_BUDGET_S,
                   help=f"solver budget per graph in seconds (default {DEFAULT_BUDGET_S:g})")
    p.add_argument("--only-stale", action="store_true",
                   help="only graphs without a plan of this compiler version and hardware file")
    p.add_argument("--engine", choices=("local", "dask"), default="local",
                   help="local: a process pool here (default); dask: an existing Dask cluster (--scheduler)")
    p.add_argument("--scheduler", default=None, help="Dask scheduler address, e.g. tcp://10.0.0.5:8786")
    p.add_argument("--jobs", type=int, default=None, help="local worker processes (default: cores - 1)")
    p.add_argument("--planner", default=None, help="planner for the re-solve (default: /compile's default)")
    p.add_argument("--deterministic", action="store_true", help="the planner's deterministic mode")
    p.add_argument("--budget-mode", choices=("whole", "scaled"), default="whole",
                   help="whole: search for the whole time limit, stopping early only on a proven optimum "
                        "(default); scaled: the online planner's own budget rule (at most the limit)")
    p.add_argument("--graph-timeout", type=float, default=None, metavar="S",
                   help="wall-time limit of one graph (local engine): a re-solve still running after S seconds "
                        "is stopped and fails, the stored plan is kept (default: the time limit plus half of it, "
                        "at least 30 s more)")
    p.add_argument("--memory-limit", type=float, default=None, metavar="GIB",
                   help="address-space limit of each worker process in GiB (local engine; default: the "
                        "machine's memory shared among the workers, at least 2)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON instead of a table")
    p.set_defaults(func=run)


class _Progress:
    """rich's progress bar on a terminal; one line per finished graph otherwise."""

    def __init__(self, stream, quiet: bool):
        self.stream, self.quiet, self.bar, self.task = stream, quiet, None, None
        if not quiet and getattr(stream, "isatty", lambda: False)():
            try:
                from rich.console import Console
                from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

                self.bar = Progress(TextColumn("reoptimize"), BarColumn(), MofNCompleteColumn(),
                                    TimeElapsedColumn(), TextColumn("{task.description}"),
                                    console=Console(file=stream))
            except ImportError:
                self.bar = None

    def __call__(self, row, done: int, total: int) -> None:
        if self.bar is not None:
            if self.task is None:
                self.bar.start()
                self.task = self.bar.add_task(row.name, total=total)
            self.bar.update(self.task, completed=done, description=f"{row.name}: {row.outcome}")
            return
        if not self.quiet:
            print(f"[{done}/{total}] {row.name}: {row.outcome}"
                  + (f" ({row.error})" if row.error else ""), file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None and self.task is not None:
            self.bar.stop()


def run(args) -> int:
    from service.batch.common import default_store_location, print_table
    from service.batch.reoptimize import SUMMARY_HEADERS, reoptimize, summary_rows, totals_line

    if args.engine == "dask" and not args.scheduler:
        print("sticksat reoptimize: --engine dask needs --scheduler ADDRESS", file=sys.stderr)
        return 2
    if args.time_limit <= 0:
        print("sticksat reoptimize: --time-limit must be positive", file=sys.stderr)
        return 2
    if args.engine == "dask":
        try:
            import distributed  # noqa: F401
        except ImportError:
            print("sticksat reoptimize: --engine dask needs dask.distributed "
                  "(pip install 'sticksat[cli]' or 'dask[distributed]')", file=sys.stderr)
            return 2
    if args.graph_timeout is not None and args.graph_timeout <= 0:
        print("sticksat reoptimize: --graph-timeout must be positive", file=sys.stderr)
        return 2
    if args.memory_limit is not None and args.memory_limit <= 0:
        print("sticksat reoptimize: --memory-limit must be positive", file=sys.stderr)
        return 2
    from service.batch.isolated import signals_as_interrupt

    progress = _Progress(sys.stderr, quiet=args.json)
    try:
        with signals_as_interrupt():
            summary = reoptimize(args.store or default_store_location(), budget_s=args.time_limit,
                                 only_stale=args.only_stale, engine=args.engine, scheduler=args.scheduler,
                                 jobs=args.jobs, planner=args.planner, deterministic=args.deterministic,
                                 budget_mode=args.budget_mode, progress=progress,
                                 graph_wall_s_limit=args.graph_timeout,
                                 memory_bytes=int(args.memory_limit * 2**30) if args.memory_limit else None)
    except KeyboardInterrupt as exc:
        progress.close()
        how = str(exc) or "SIGINT"
        print(f"sticksat reoptimize: stopped by {how}; the graphs finished so far are committed, the workers "
              f"are stopped (a rerun with the same budget skips what was processed)", file=sys.stderr)
        return 143 if how == "SIGTERM" else 130
    finally:
        progress.close()
    if args.json:
        print(json.dumps(summary.to_json(), indent=1))
    else:
        print_table(SUMMARY_HEADERS, summary_rows(summary), title="sticksat reoptimize")
        print(totals_line(summary))
    return 1 if summary.count("failed") else 0
