"""The `sticksat` command. Each subcommand lives in its own module under
service/commands/ and exposes `register(subparsers)`; this file only dispatches."""
from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module (kept in the order `sticksat --help` shows them)
COMMANDS: dict[str, str] = {
    "version": "service.commands.version",
    "serve": "service.commands.serve",
    "compile": "service.commands.compile",
    "simulate": "service.commands.simulate",
    "report": "service.commands.report",
    "bench": "service.commands.bench",
    "calibrate": "service.commands.calibrate",
    "validate": "service.commands.validate",
    "iopddl": "service.commands.iopddl",
    "store": "service.commands.store",
    "check": "service.commands.check",
    "reoptimize": "service.commands.reoptimize",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sticksat", description="Spyre layout and tiling optimizer")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS.values():
        importlib.import_module(module).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
