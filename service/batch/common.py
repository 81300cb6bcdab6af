"""What the batch commands share: the default store location, reading graph files the
way /compile reads them, and a readable table (rich when installed, else plain text)."""
from __future__ import annotations

import datetime as _dt
import os
import sys
from pathlib import Path
from typing import Any, Optional, Sequence, TextIO


def default_store_location() -> str:
    """The store `sticksat serve` uses without --store: $STICKSAT_STORE or the user's
    data directory."""
    from service.app import default_store_path

    return os.environ.get("STICKSAT_STORE") or default_store_path()


def is_store_location(text: str) -> bool:
    """A store URL, or an existing file that is not a directory of graphs."""
    from service.store import is_postgres_url

    if is_postgres_url(text) or text.startswith("sqlite:///"):
        return True
    path = Path(text)
    return path.is_file() and path.suffix in (".sqlite", ".sqlite3", ".db")


def graph_file_stem(path: str | os.PathLike[str]) -> str:
    """`dir/name.json` and `dir/name.json.gz` -> `name`."""
    return Path(path).name.removesuffix(".gz").removesuffix(".json")


def read_graph_file(path: str | os.PathLike[str], limits=None):
    """A graph document (or torch.export program JSON; either may be gzipped, `.json.gz`)
    file -> GraphDocument, validated
    as /compile validates a document: parsed, no non-finite literal, within the service's
    size limits, and every finding of the full validator (op support included). Raises
    GraphError (the first finding) when it would be a 422."""
    from lowering.export_serde import document_from_export
    from lowering.validate import find_problems, non_finite_problems, parse_document
    from service.commands.validate import _is_export
    from service.pipeline import GraphLimits, check_graph_limits

    raw = Path(path).read_bytes()
    if str(path).endswith(".gz"):
        import gzip

        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            from lowering.errors import GraphError

            raise GraphError("schema", f"not a gzip file: {exc}") from None
    name = graph_file_stem(path)
    doc = document_from_export(raw, name=name) if _is_export(raw) else parse_document(raw)
    bad = non_finite_problems(doc)
    if bad:
        raise bad[0]
    check_graph_limits(doc, limits or GraphLimits())
    problems = find_problems(doc)
    if problems:
        raise problems[0]
    return doc


def fmt_time(ts: Optional[float]) -> str:
    if not ts:
        return "-"
    return _dt.datetime.fromtimestamp(float(ts), _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def fmt_us(value: Any) -> str:
    return f"{float(value):.3f}" if isinstance(value, (int, float)) else "-"


def fmt_pct(value: Any) -> str:
    return f"{100.0 * float(value):.1f}%" if isinstance(value, (int, float)) else "-"


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, title: str = "",
                stream: Optional[TextIO] = None, plain: bool = False) -> None:
    """A table on `stream` (stdout): rich's when installed (and not `plain`), else
    aligned columns."""
    stream = stream or sys.stdout
    cells = [[("-" if c is None else str(c)) for c in row] for row in rows]
    if not plain:
        try:
            from rich.console import Console
            from rich.table import Table
        except ImportError:
            plain = True
    if not plain:
        table = Table(title=title or None)
        for h in headers:
            table.add_column(h, overflow="fold")
        for row in cells:
            table.add_row(*row)
        tty = getattr(stream, "isatty", lambda: False)()
        Console(file=stream, width=None if tty else 220).print(table)
        return
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    if title:
        print(title, file=stream)
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)), file=stream)
    print("  ".join("-" * w for w in widths), file=stream)
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)), file=stream)
