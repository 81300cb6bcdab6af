"""The compiler version: part of every store key and every program's stats. Lives in
`lowering` (the package every service-side package may import) so the solver can stamp
programs without importing `service`.

`COMPILER_VERSION` is the package version plus a build fingerprint, e.g.
`0.1.0+b3f9c2e81d0a4c57`: the package version alone stays `0.1.0` across every commit, so
after an upgrade the old build's programs would answer as current cache hits. The
fingerprint is a SHA-256 over the source files of the packages that decide what a
program is (`FINGERPRINT_PACKAGES`: the device model and program format, the lowering,
the planners and emitter, the simulator that validates and times; their `.py` and `.json`
files, format versions included), by path and content: computed once per process from
the files themselves, so it needs no git and is the same for a checkout, an editable or
a regular install, or the image, of the same code. Any change to those files keys a new
build apart; a change elsewhere (the service, the CLI, docs, tests) does not.
"""
from __future__ import annotations

import hashlib
from importlib import metadata
from pathlib import Path

# The packages whose code changes plans and programs (paths below the project root).
FINGERPRINT_PACKAGES = ("target", "lowering", "solver", "simulator")
FINGERPRINT_SUFFIXES = (".py", ".json")


def _package_version() -> str:
    try:
        return metadata.version("sticksat")
    except metadata.PackageNotFoundError:  # running from a source tree without install
        return "0.0.0+source"


def source_fingerprint(root: Path | None = None) -> str:
    """SHA-256 over (path, content) of every fingerprinted source file below `root` (the
    directory holding the packages; default: this installation's)."""
    root = root or Path(__file__).resolve().parent.parent
    digest = hashlib.sha256(b"sticksat.build-fingerprint.v1\0")
    for package in FINGERPRINT_PACKAGES:
        base = root / package
        files = sorted(p for p in base.rglob("*")
                       if p.suffix in FINGERPRINT_SUFFIXES and "__pycache__" not in p.parts and p.is_file())
        for path in files:
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(path.read_bytes().replace(b"\r\n", b"\n"))
            digest.update(b"\0")
    return digest.hexdigest()


PACKAGE_VERSION = _package_version()
BUILD_FINGERPRINT = source_fingerprint()
# PEP 440 local version label: `+fingerprint`, or `.fingerprint` after an existing one.
COMPILER_VERSION = f"{PACKAGE_VERSION}{'.' if '+' in PACKAGE_VERSION else '+'}{BUILD_FINGERPRINT[:16]}"
