"""`sticksat validate FILE...`: check graph documents (or torch.export programs) without
compiling them, and optionally write the converted document.

Each FILE is a graph document (JSON), a torch.export serialized program (JSON with a
`graph_module`), or a `.pt2` archive from torch.export.save (only its program JSON is
read). One JSON line per file: {file, ok, source, graph_hash, nodes, problems: [{code,
message, node}]}. Exit status 0 when every file is valid, 1 when any has problems, 2 on
unreadable input.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def register(sub) -> None:
    p = sub.add_parser("validate", help="check graph documents or torch.export programs (no compile)")
    p.add_argument("files", nargs="+", help="graph document JSON, exported-program JSON, or .pt2 archive")
    p.add_argument("--no-support-check", action="store_true",
                   help="skip the op-support check (structure and metadata only)")
    p.add_argument("-o", "--output", default=None,
                   help="write the (converted) graph document here; only with one input file")
    p.set_defaults(func=run)


def is_export(raw: bytes) -> bool:
    if raw[:4] == b"PK\x03\x04":
        return True
    # An exported program's top-level keys; a graph document has none of them. Only the
    # head is inspected so a large document is not parsed twice.
    head = raw[:4096]
    return b'"graph_module"' in head or b'"schema_version"' in head


def check_file(path: str, support_check: bool = True) -> tuple[dict[str, Any], Any]:
    """(report line, GraphDocument or None) for one file."""
    from lowering.errors import GraphError
    from lowering.export_serde import document_from_export
    from lowering.validate import find_problems, parse_document

    raw = Path(path).read_bytes()
    source = "export" if is_export(raw) else "graph"
    report: dict[str, Any] = {"file": path, "ok": False, "source": source}
    try:
        doc = document_from_export(raw, name=Path(path).stem) if source == "export" else parse_document(raw)
    except GraphError as e:
        report["problems"] = [e.to_dict()]
        return report, None
    problems = find_problems(doc, check_support=support_check)
    report.update(ok=not problems, graph_hash=doc.graph_hash(), nodes=len(doc.nodes),
                  problems=[p.to_dict() for p in problems])
    if source == "export" and any(p.code == "unsupported_op" for p in problems):
        report["hint"] = ("an exported program must be decomposed like the torch backend does: "
                          "ep.run_decompositions(backend.capture.decomposition_table()) before saving")
    return report, doc


def run(args) -> int:
    if args.output and len(args.files) != 1:
        print(json.dumps({"error": "usage", "message": "--output takes exactly one input file"}), file=sys.stderr)
        return 2
    status = 0
    for path in args.files:
        try:
            report, doc = check_file(path, support_check=not args.no_support_check)
        except OSError as e:
            print(json.dumps({"file": path, "error": "io", "message": str(e)}), file=sys.stderr)
            status = 2
            continue
        print(json.dumps(report))
        if not report["ok"]:
            status = max(status, 1)
        if args.output and doc is not None:
            Path(args.output).write_text(doc.to_json())
    return status
