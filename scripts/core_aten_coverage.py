"""Core ATen coverage of the lowering.

Which of torch's core ATen op overloads (those tagged `torch.Tag.core`) can reach the
lowering — the ones the backend's decomposition table (Inductor's,
`backend.capture.decomposition_table`) does not rewrite into others — which of those have a
lowering (`lowering.SUPPORTED_TARGETS`), and whether docs/ops.md's "Core ATen coverage"
table lists exactly the ones without.

    python scripts/core_aten_coverage.py            # the numbers and the unsupported ops
    python scripts/core_aten_coverage.py --check    # exit 1 unless docs/ops.md lists exactly those

Needs torch (the op tags and the decomposition table come from it).
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DOC_PATH = ROOT / "docs" / "ops.md"
BEGIN = "<!-- core-unsupported:begin -->"
END = "<!-- core-unsupported:end -->"


@dataclass(frozen=True)
class Coverage:
    core: frozenset[str]          # every core ATen overload
    arrive: frozenset[str]        # core overloads the decomposition table leaves
    supported: frozenset[str]     # of those, the ones with a lowering

    @property
    def unsupported(self) -> frozenset[str]:
        return self.arrive - self.supported


def _name(op) -> str:
    return f"{op.namespace}.{op._opname}.{op._overloadname}"


def coverage() -> Coverage:
    import torch

    from backend.capture import decomposition_table
    from lowering import SUPPORTED_TARGETS

    decomposed = {_name(o) for o in decomposition_table() if isinstance(o, torch._ops.OpOverload)}
    core = set()
    for name in dir(torch.ops.aten):
        packet = getattr(torch.ops.aten, name, None)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for overload in packet.overloads():
            if torch.Tag.core in getattr(packet, overload).tags:
                core.add(f"aten.{name}.{overload}")
    arrive = core - decomposed
    return Coverage(frozenset(core), frozenset(arrive), frozenset(arrive & set(SUPPORTED_TARGETS)))


def documented_unsupported(text: str) -> dict[str, str]:
    """op -> reason, from the marked table of docs/ops.md."""
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise SystemExit(f"docs/ops.md needs exactly one {BEGIN} ... {END} section")
    section = text.split(BEGIN, 1)[1].split(END, 1)[0]
    out = {}
    for line in section.splitlines():
        m = re.match(r"^\|\s*(`[^|]+`)\s*\|\s*(.+?)\s*\|\s*$", line)
        if m:
            for op in re.findall(r"`([^`]+)`", m.group(1)):
                out[op] = m.group(2)
    return out


def check(cov: Coverage, text: str) -> list[str]:
    """What is wrong with the documented list (empty when it is exact)."""
    listed = documented_unsupported(text)
    problems = [f"{op} has no lowering but is not in docs/ops.md's table" for op in sorted(cov.unsupported - set(listed))]
    problems += [f"{op} is in docs/ops.md's table but {'has a lowering' if op in cov.supported else 'is not a core op that arrives'}"
                 for op in sorted(set(listed) - cov.unsupported)]
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 unless docs/ops.md lists exactly the unsupported ops")
    args = ap.parse_args(argv)
    cov = coverage()
    print(f"core ATen overloads: {len(cov.core)}; left by the decomposition table: {len(cov.arrive)}; "
          f"with a lowering: {len(cov.supported)}; without: {len(cov.unsupported)}")
    for op in sorted(cov.unsupported):
        print(f"  {op}")
    if args.check:
        problems = check(cov, DOC_PATH.read_text())
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
