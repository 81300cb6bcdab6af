"""What the batch commands share: the default store location, reading graph files the
way /compile reads them (a gzipped file decompressed under the same size limit, counted
while it streams), client text made safe for a terminal or XML (`printable`), and a
readable table (rich when installed, else plain text)."""
from __future__ import annotations

import datetime as _dt
import os
import sys
import unicodedata
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


# Characters never written to a terminal or XML as they are: C0/C1 controls (escape
# sequences, carriage returns), format characters (bidirectional overrides, zero-width
# joiners), surrogates, private-use and unassigned code points, line/paragraph separators.
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def printable(text, limit: Optional[int] = None) -> str:
    """`text` with every character of `_UNSAFE_CATEGORIES` written as a Python-style
    escape (`\x1b`, `\u202e`), so client text (a graph's name, a node id, a message that
    quotes them) cannot move a terminal's cursor, recolour it, hide text, or make XML
    ill-formed. `limit`: cut to that many characters (an ellipsis marks the cut)."""
    text = "" if text is None else str(text)
    if limit is not None and len(text) > limit:
        text = text[:limit] + "\u2026"
    if text.isascii() and text.isprintable():
        return text
    out = []
    for ch in text:
        if unicodedata.category(ch) in _UNSAFE_CATEGORIES:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
    return "".join(out)


def read_limited(path: str | os.PathLike[str], max_bytes: int) -> bytes:
    """A file's bytes, decompressed when it ends in `.gz`, never more than `max_bytes`
    of them: a compressed file is inflated in chunks and refused as soon as the output
    passes the limit (a 1 MB gzip bomb never grows past the limit in memory). GraphError
    `graph_too_large` past the limit, `schema` for a file that is not gzip."""
    import zlib

    from lowering.errors import GraphError

    p = Path(path)
    if not str(path).endswith(".gz"):
        # read, not stat: a device or a pipe (/dev/zero) has no size and no end
        with open(p, "rb") as f:
            data = f.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise GraphError("graph_too_large", f"{p.name} holds more than {max_bytes} bytes (the limit)")
        return data
    out = bytearray()
    # wbits 16 + MAX_WBITS: a gzip member; a file of several members is inflated member by member.
    inflater, mid_member = zlib.decompressobj(16 + zlib.MAX_WBITS), False
    try:
        with open(p, "rb") as f:
            while chunk := f.read(64 * 1024):
                while chunk:
                    mid_member = True
                    out += inflater.decompress(chunk, max_bytes + 1 - len(out))
                    if len(out) > max_bytes:
                        raise GraphError("graph_too_large", f"{p.name} decompresses to more than {max_bytes} "
                                                            f"bytes (the limit); stopped there")
                    if inflater.eof:
                        chunk, mid_member = inflater.unused_data, False
                        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
                    else:
                        chunk = inflater.unconsumed_tail
    except zlib.error as exc:
        raise GraphError("schema", f"{p.name}: not a gzip file: {exc}") from None
    if mid_member:
        raise GraphError("schema", f"{p.name}: the gzip stream is cut short")
    return bytes(out)


def read_graph_file(path: str | os.PathLike[str], limits=None, max_bytes: Optional[int] = None):
    """A graph document (or torch.export program JSON; either may be gzipped, `.json.gz`)
    file -> GraphDocument, validated
    as /compile validates a document: parsed, no non-finite literal, within the service's
    size limits, and every finding of the full validator (op support included). Raises
    GraphError (the first finding) when it would be a 422. The file (decompressed) may
    hold at most `max_bytes` (default: the document limit, `MAX_DOCUMENT_BYTES`)."""
    from lowering.export_serde import document_from_export
    from lowering.validate import MAX_DOCUMENT_BYTES, find_problems, non_finite_problems, parse_document
    from service.commands.validate import is_export
    from service.pipeline import GraphLimits, check_graph_limits

    raw = read_limited(path, MAX_DOCUMENT_BYTES if max_bytes is None else max_bytes)
    name = graph_file_stem(path)
    doc = document_from_export(raw, name=name) if is_export(raw) else parse_document(raw)
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
    # Cells may hold client text (graph names, messages): escaped, and given to rich as
    # plain Text so "[...]" is not read as markup.
    cells = [[("-" if c is None else printable(c)) for c in row] for row in rows]
    title = printable(title)
    if not plain:
        try:
            from rich.console import Console
            from rich.table import Table
            from rich.text import Text
        except ImportError:
            plain = True
    if not plain:
        table = Table(title=Text(title) if title else None)
        for h in headers:
            table.add_column(h, overflow="fold")
        for row in cells:
            table.add_row(*(Text(c) for c in row))
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
