"""Scratchpad (LX) placement the torch-spyre way (`scratchpad/allocator.py`,
`scratchpad/plan_solver.py`): which buffers may live in LX, and where.

Eligibility (upstream `ScratchpadAllocator` in `scratchpad/allocator.py`, the op filter in
`scratchpad/utils.py`):
- every op's output may be pinned except the ops upstream denies
  (`OP_OUTPUT_NOT_GOOD_FOR_LX_REUSE`, a denylist since PR #4065: convolution, avg_pool2d);
  a restickify's copy too (PR #4153: a restickify keeps its producer's ownership and may
  read and write LX, which makes it an on-chip relayout);
- never graph inputs or outputs: upstream clones them at the graph boundary (always on
  since #4065), but our program model cannot add a clone op, so they stay in device memory;
- never a buffer nobody reads, one read through an index (a gather's table: upstream's
  indirect-access gate), one read only in part (upstream's partial-read gate);
- every reader must find, on each core, what it reads inside what the producer wrote on
  that core (upstream resolves other core-division mismatches by an on-chip LX relayout,
  PR #3439; our program model has no cross-core LX copy, so those stay in device memory),
  and a producer whose reduction dim is split across cores (partial sums) disqualifies it.

Placement (upstream default `GreedyLayoutSolver`): walk the op indices where some buffer's
lifetime starts or ends; free the buffers whose lifetime ended, then place each starting
buffer, in program order, at the first address that fits: address 0 if everything live sits
above it, else right above the highest live buffer, else the first gap between live buffers,
all stick aligned. A buffer that fits nowhere stays in device memory: no eviction, nothing
is revisited. Upstream's in-place reuse (a child taking its dying parent's address at the
same op) is not done: our validator treats the parent's last read and the child's write at
that op as overlapping lifetimes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from target.primitives import Call, PrimOp

# Upstream OP_OUTPUT_NOT_GOOD_FOR_LX_REUSE (scratchpad/utils.py, a denylist since PR #4065;
# it replaced the allowlist OP_OUTPUT_GOOD_FOR_LX_REUSE): a strided direct conv miscomputes
# with its output in LX, and a windowed pool's operand paged through LX aborts the backend.
LX_DENIED_OPS = frozenset({"convolution", "avg_pool2d"})


@dataclass
class LxBuffer:
    name: str
    size: int            # bytes per core
    uses: list[int]      # sorted op indices: producer first, then readers
    address: Optional[int] = None
    # what keeping it in LX is worth to the placement's objective, when the caller knows
    # better than the spill traffic `len(uses) * size` (`lx_cpsat.spill_cost`): a tile
    # buffer's per-tile size understates the traffic holding it saves
    value: Optional[int] = None

    @property
    def start(self) -> int:
        return self.uses[0]

    @property
    def end(self) -> int:
        """Exclusive end: the buffer is free again after its last use."""
        return self.uses[-1] + 1


def upstream_op_name(op: PrimOp) -> str:
    """The aten op name upstream would see for this op: taken from the aten target the op
    was lowered from when known (`aten.amax.default` -> `amax`), else from the body."""
    src = op.source or ""
    parts = src.split(".")
    if len(parts) >= 2 and parts[0] in ("aten", "prims"):
        return parts[1]
    body = op.body
    if body.kind == "reduce":
        return "amax" if body.fn == "max" else body.fn
    if body.kind == "pointwise" and isinstance(body.expr, Call):
        return body.expr.fn
    return body.kind


def lx_eligible_op(op: PrimOp) -> bool:
    return upstream_op_name(op) not in LX_DENIED_OPS


def _align(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def _find_free_block(live: list[LxBuffer], size: int, capacity: int, alignment: int) -> Optional[int]:
    if size > capacity:
        return None
    if not live or min(b.address for b in live) >= size:
        return 0
    top = _align(max(b.address + b.size for b in live), alignment)
    if top + size <= capacity:
        return top
    ordered = sorted(live, key=lambda b: b.address)
    for lo, hi in zip(ordered, ordered[1:]):
        start = _align(lo.address + lo.size, alignment)
        if hi.address - start >= size:
            return start
    return None


def greedy_place(buffers: list[LxBuffer], capacity: int, alignment: int) -> list[LxBuffer]:
    """Assign `address` (or leave None) to every buffer, upstream GreedyLayoutSolver order."""
    for b in buffers:
        b.address = None
    times = sorted({b.start for b in buffers} | {b.end for b in buffers})
    starting: dict[int, list[LxBuffer]] = {}   # in the buffers' order, as upstream walks them
    for b in buffers:
        starting.setdefault(b.start, []).append(b)
    live: list[LxBuffer] = []
    for t in times:
        live = [b for b in live if b.end != t]
        for b in starting.get(t, ()):
            addr = _find_free_block(live, b.size, capacity, alignment)
            if addr is not None:
                b.address = addr
                live.append(b)
    return buffers
