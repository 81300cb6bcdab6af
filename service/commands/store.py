"""`sticksat store add GRAPH.json... [--store URL]`, `sticksat store list [--json]
[--store URL]`, `sticksat store check [--quick] [--json]`, `sticksat store backup DEST`
and `sticksat store adopt`: put graph documents into the program store (validated as
/compile validates them), list what it holds, check it (integrity, unsound rows moved to
quarantine, acknowledged writes lost), copy it while it is in use, and adopt another
build's programs under this build's keys. The store is a SQLite file or sqlite:///path
(default: $STICKSAT_STORE, else the path `sticksat serve` uses) or a postgresql:// URL.
docs/batch.md, docs/reliability.md ("The store")."""
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
    chk = ssub.add_parser("check", help="check the store: integrity, every row, acknowledged writes lost")
    _store_arg(chk)
    chk.add_argument("--quick", action="store_true", help="SQLite's quick_check instead of the full integrity check")
    chk.add_argument("--json", action="store_true", help="the result as JSON")
    chk.add_argument("--clear-lost-writes", action="store_true",
                     help="after reporting them, forget the recorded lost-write events (later checks pass again)")
    chk.set_defaults(func=run_check)
    bak = ssub.add_parser("backup", help="copy a SQLite store while it is in use (online backup API)")
    bak.add_argument("dest", help="the backup file to create (must not exist)")
    _store_arg(bak)
    bak.set_defaults(func=run_backup)
    adopt = ssub.add_parser("adopt", help="serve another build's programs as this build's, after validating "
                                          "and timing them again")
    _store_arg(adopt)
    adopt.add_argument("--target", default=None, help="hardware target (default spyre)")
    adopt.add_argument("--from-version", default=None,
                       help="adopt only rows of this compiler version (default: any other build)")
    adopt.add_argument("--json", action="store_true", help="one JSON line per graph")
    adopt.set_defaults(func=run_adopt)
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
    from service.batch.common import printable as p

    for r in results:
        if args.json:
            print(json.dumps(r))
        elif r["ok"]:
            print(f"{'added' if r['new'] else 'already stored'}: {p(r['file'])} -> {p(r['name'])} "
                  f"{r['graph_hash'][:12]} ({r['nodes']} nodes)")
        else:
            err = r["error"]
            where = f" at node {p(err.get('node'))}" if err.get("node") else ""
            print(f"rejected: {p(r['file'])}: {p(err.get('code'))}{where}: {p(err.get('message'))}",
                  file=sys.stderr)
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


def run_check(args) -> int:
    """Exit 0 when the store is sound, 1 when the check found something (it is printed),
    2 when the store cannot be opened."""
    from service.batch.common import printable as p
    from service.store import describe_location
    from service.store_integrity import StoreError

    try:
        store = open_store(args.store)
    except StoreError as exc:
        print(f"sticksat store check: {p(str(exc))}", file=sys.stderr)
        return 2
    try:
        result = store.check(quick=args.quick)
        if args.clear_lost_writes and result.lost_writes:
            store.clear_events("lost_writes")
    finally:
        store.close()
    if args.json:
        print(json.dumps(result.to_json(), indent=1))
        return 0 if result.ok else 1
    where = describe_location(store.location)
    print(f"{p(where)}: {result.programs} programs, {result.graphs} graphs checked in {result.seconds:.2f} s")
    print(f"integrity ({'quick_check' if args.quick else 'integrity_check'}): "
          + ("ok" if not result.integrity else f"{len(result.integrity)} problems"))
    for line in result.integrity[:20]:
        print(f"  {p(line)}")
    for q in result.quarantined:
        print(f"quarantined program {q['key']} (graph {q['graph_hash']}): {p(q['reason'])}; its key compiles "
              f"again on the next request")
    for h in result.bad_graphs:
        print(f"graph {p(h)}: the stored document does not parse")
    if result.orphans:
        print(f"{result.orphans} programs without their graph")
    for e in result.lost_writes:
        print(f"lost writes: {e['writes']} acknowledged write transactions missing when the store was opened "
              f"(store at write {e['store_seq']}, acknowledged up to {e['acknowledged_seq']}); lost program keys: "
              + (", ".join(x["id"] for x in e["lost"] if x["kind"] == "program") or "none")
              + "; lost graphs: " + (", ".join(x["id"] for x in e["lost"] if x["kind"] == "graph") or "none"))
    print("ok" if result.ok else "problems found")
    return 0 if result.ok else 1


def run_backup(args) -> int:
    from service.batch.common import printable as p
    from service.store_integrity import StoreError

    store = open_store(args.store)
    try:
        result = store.backup(args.dest)
    except (StoreError, OSError) as exc:
        print(f"sticksat store backup: {p(str(exc))}", file=sys.stderr)
        return 2
    finally:
        store.close()
    print(f"backup written: {p(result.path)} ({result.bytes} bytes, {result.graphs} graphs, {result.programs} "
          f"programs, {result.seconds:.2f} s)")
    return 0


def run_adopt(args) -> int:
    from service.batch.common import printable as p
    from service.batch.inventory import adopt_programs

    store = open_store(args.store)
    try:
        rows = adopt_programs(store, target=args.target, from_version=args.from_version)
    finally:
        store.close()
    for r in rows:
        if args.json:
            print(json.dumps(r))
        else:
            print(f"{r['outcome']}: {p(r['name'])} {r['graph_hash'][:12]}"
                  + (f" from {p(r['from_version'])}" if r.get("from_version") else "")
                  + (f": {p(r['reason'])}" if r.get("reason") else ""))
    return 0
