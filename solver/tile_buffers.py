"""Tile buffers: a result that a fused coarse-tiled kernel makes and uses up itself needs no
full-size home.

In a fused kernel (`simulator.superdsc.fused_group_key`) the tile loop runs every member
on tile j before tile j+1, so a result whose producer and readers all belong to the kernel
only ever exists one tile at a time on each core. Left in device memory it is written
there whole (and its write costs bus time, even though the readers take it on chip); as a
tile buffer (`LxMemory.per_tile`) it costs a tile's worth of LX and no device traffic.

This step takes a validated program with fused kernels and, as a pipeline of small steps:
1. `_candidates`: results in device memory whose producer and every reader are members of
   one kernel, that are not program outputs and not shared with a free alias;
2. emits them as tile buffers (the emitter sizes each at its largest per-tile box) and
   places them first-fit in the LX the plan leaves free over their live ranges
   (`_place`, in whole sticks, never over another live LX buffer);
3. lets the validator judge: a candidate a reader does not take tile by tile from the same
   core (another split, another tiling) is named by an issue and stays in device memory;
4. keeps the result only if the simulator times it faster.
Nothing here is keyed on op names or shapes.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

from lowering.primitives import PrimGraph, op_from_json
from simulator.geometry import padded
from simulator.superdsc import HbmMemory, LxMemory, Program, fused_group_key
from simulator.timing import TimingReport, time_program
from simulator.validate import validate_program
from solver.emit import emit_program
from solver.plan import PlanDecisions, Residency

_MAX_ROUNDS = 4


@dataclass
class TileBufferResult:
    decisions: PlanDecisions
    program: Program
    report: TimingReport
    buffers: list[str] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)  # tensor -> validator code


def _kernel_of(program: Program) -> dict[int, int]:
    """Op index -> fused kernel number, for ops inside a fused kernel."""
    out: dict[int, int] = {}
    prev, n = None, -1
    for k, op in enumerate(program.ops):
        key = fused_group_key(op)
        if key is not None and key != prev:
            n += 1
        if key is not None:
            out[k] = n
        prev = key
    return out


def _candidates(pg: PrimGraph, program: Program) -> list[str]:
    kernel = _kernel_of(program)
    tmap = program.tensor_map()
    producer: dict[str, int] = {}
    readers: dict[str, list[int]] = {}
    for k, op in enumerate(program.ops):
        if op.prim is None:
            continue
        prim = op_from_json(op.prim)
        producer[prim.output.tensor] = k
        for a in prim.inputs:
            readers.setdefault(a.tensor, []).append(k)
    aliased = {t.memory.alias_of for t in program.tensors
               if isinstance(t.memory, HbmMemory) and t.memory.alias_of}
    outputs = set(program.outputs)
    out = []
    for t, k in producer.items():
        decl = tmap[t]
        if (t not in pg.tensors or t in outputs or t in aliased or k not in kernel
                or not isinstance(decl.memory, HbmMemory) or decl.memory.alias_of
                or decl.role != "intermediate"):
            continue
        rs = readers.get(t, [])
        if rs and all(kernel.get(r) == kernel[k] for r in rs):
            out.append(t)
    return out


def _place(program: Program, new: list[str], capacity: int, stick: int) -> dict[str, int]:
    """First-fit LX addresses for the tile buffers `new` (already emitted, so their sizes and
    live ranges are in `program`), around every other live LX buffer; a buffer that finds
    no room is left out."""
    tmap = program.tensor_map()
    taken = [(m.live_from, m.live_to, m.lx_address, m.lx_address + m.size_per_core)
             for t in program.tensors if isinstance(m := t.memory, LxMemory) and t.id not in new]
    addresses: dict[str, int] = {}
    for t in sorted(new, key=lambda x: (tmap[x].memory.live_from, -tmap[x].memory.size_per_core)):
        m = tmap[t].memory
        size = padded(m.size_per_core, stick)
        busy = sorted((a, b) for lf, lt, a, b in taken if lf <= m.live_to and m.live_from <= lt)
        addr = 0
        for a, b in busy:
            if addr + size <= a:
                break
            addr = max(addr, padded(b, stick))
        if addr + size <= capacity:
            addresses[t] = addr
            taken.append((m.live_from, m.live_to, addr, addr + size))
    return addresses


def _with_buffers(d: PlanDecisions, buffers: dict[str, int]) -> PlanDecisions:
    resident = dict(d.resident)
    for t, addr in buffers.items():
        resident[t] = Residency(lx_address=addr, per_tile=True)
    return replace(d, resident=resident)


def assign_tile_buffers(pg: PrimGraph, hw, d: PlanDecisions, program: Program,
                        report: TimingReport) -> Optional[TileBufferResult]:
    """`d` with tile buffers for the fused kernels' own results, or None when no candidate
    survives validation or the result is not faster (simulated) than `program`."""
    cands = _candidates(pg, program)
    dropped: dict[str, str] = {}
    for _ in range(_MAX_ROUNDS):
        if not cands:
            return None
        try:
            sized = emit_program(pg, hw, _with_buffers(d, {t: 0 for t in cands}))
        except ValueError:
            return None
        addresses = _place(sized, cands, hw.lx_capacity_bytes, hw.stick_bytes)
        dropped.update({t: "lx_capacity" for t in cands if t not in addresses})
        if not addresses:
            return None
        trial_d = _with_buffers(d, addresses)
        try:
            prog = emit_program(pg, hw, trial_d)
        except ValueError:
            return None
        issues = validate_program(prog, hw)
        if not issues:
            rep = time_program(prog, hw)
            if rep.total_us >= report.total_us:
                return None
            return TileBufferResult(trial_d, prog, rep, sorted(addresses), dropped)
        named = {i.tensor: i.code for i in issues if getattr(i, "tensor", None) in addresses}
        if not named:
            return None  # an issue not about one buffer: give up rather than guess
        dropped.update(named)
        cands = [t for t in addresses if t not in named]
    return None
