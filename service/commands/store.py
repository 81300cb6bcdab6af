"""`sticksat store add GRAPH.json... [--store URL]` and `sticksat store list [--json]
[--store URL]`: put graph documents into the program store (validated as /compile
validates them) and list what it holds. The store is a SQLite file or sqlite:///path
(default: $STICKSAT_STORE, else the path `sticksat serve` uses) or a postgresql:// URL.
docs/batch.md."""
from __future__ import annotations

import json
import sys


def register(sub) -> None:
    p = sub.add_parser("store", help="add graph documents to the program store, list what it holds")
    ssub = p.add_subparsers(dest="store_command", metavar="ACTION")
    add = ssub.add_parser("add", help="validate graph documents (or torch.export JSON) and store them")
    add.add_argument("graphs", nargs="+", help="graph document JSON or torch.export program JSON files")
    _store_arg(add)
    add.add_argument("--json", action="store_true", help="one JSON line per file instead of text")
    add.set_defaults(func=run_add)
    ls = ssub.add_parser("list", help="every stored graph with its best program")
    _store_arg(ls)
    ls.add_argument("--json", action="store_true", help="a JSON array instead of a table")
    ls.set_defaults(func=run_list)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _store_arg(p) -> None:
    p.add_argument("--store", default=None,
                   help="store: SQLite path, sqlite:///path or postgresql://user:pw@host/db "
                        "(default $STICKSAT_STORE or ~/.local/share/sticksat/store.sqlite)")


def open_store(location):
    from service.batch.common import default_store_location
    from service.store import ProgramStore

    return ProgramStore(location or default_store_location())


def run_add(args) -> int:
    from service.batch.inventory import add_graphs

    store = open_store(args.store)
    try:
        results = add_graphs(store, args.graphs)
    finally:
        store.close()
    for r in results:
        if args.json:
            print(json.dumps(r))
        elif r["ok"]:
            print(f"{'added' if r['new'] else 'already stored'}: {r['file']} -> {r['name']} "
                  f"{r['graph_hash'][:12]} ({r['nodes']} nodes)")
        else:
            err = r["error"]
            where = f" at node {err.get('node')}" if err.get("node") else ""
            print(f"rejected: {r['file']}: {err.get('code')}{where}: {err.get('message')}", file=sys.stderr)
    return 0 if all(r["ok"] for r in results) else 1


def run_list(args) -> int:
    from service.batch.common import print_table
    from service.batch.inventory import LIST_HEADERS, list_store, list_table_rows
    from service.store import describe_location

    store = open_store(args.store)
    try:
        rows = list_store(store)
    finally:
        store.close()
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print_table(LIST_HEADERS, list_table_rows(rows),
                title=f"{describe_location(store.location)}: {len(rows)} graphs")
    return 0
