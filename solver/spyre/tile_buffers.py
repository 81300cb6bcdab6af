"""Tile buffers: a result that a fused coarse-tiled kernel makes and uses up itself needs no
full-size home.

In a fused kernel (`target.superdsc.fused_group_key`) the tile loop runs every member
on tile j before tile j+1, so a result whose producer and readers all belong to the kernel
only ever exists one tile at a time on each core. Left in device memory it is written
there whole (and its write costs bus time, even though the readers take it on chip); as a
tile buffer (`LxMemory.per_tile`) it costs a tile's worth of LX and no device traffic.

This step takes a validated program with fused kernels and, as a pipeline of small steps:
1. `_candidates`: results whose producer and every reader are members of one kernel, that
   are not program outputs and not shared with a free alias — in device memory, or held
   whole in LX (a tile of it frees the rest of that LX for others);
2. sizes each at its producer's largest per-tile box and places it first-fit in the LX
   the plan leaves free over its live range (`place_first_fit`, in whole sticks, never
   over another live LX buffer);
3. lets the validator judge: a candidate a reader does not take tile by tile from the same
   core (another split, another tiling) is named by an issue and stays in device memory;
Whether the result is faster is the caller's question (solver.spyre.fusion times every trial).
Nothing here is keyed on op names or shapes.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

from target.primitives import PrimGraph
from target.geometry import core_ranges, largest_tile_lx_bytes, op_granules, padded, parsed_prim
from target.superdsc import HbmMemory, LxMemory, Program, fused_group_key, lx_live_spans
from simulator.validate import validate_program
from solver.oracle import program_and_issues
from solver.plan import PlanDecisions, Residency

_MAX_ROUNDS = 4


@dataclass
class TileBufferResult:
    decisions: PlanDecisions
    program: Program
    buffers: list[str] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)  # tensor -> validator code
    issues: list = field(default_factory=list)  # the validator's issues with `program`


def kernel_numbers(program: Program, bundle: bool = True) -> dict[int, int]:
    """Op index -> fused kernel number, for the ops inside a fused kernel (consecutive ops
    with one `fused_group_key`). `bundle=False` leaves bundle cuts out: the emitter made
    them for the external-tensor limit with every result in device memory, and re-cuts them
    around tile buffers (never inside a buffer's live range)."""
    out: dict[int, int] = {}
    prev, n = None, -1
    for k, op in enumerate(program.ops):
        key = fused_group_key(op, bundle=bundle)
        if key is not None and key != prev:
            n += 1
        if key is not None:
            out[k] = n
        prev = key
    return out


def _producers(program: Program, compute_only: bool = False):
    """(producer op index per tensor, reader op indices per tensor, prim op per op index,
    tensors some device-memory tensor aliases, program outputs), over the ops with a
    primitive (`compute_only`: compute ops only)."""
    producer: dict[str, int] = {}
    readers: dict[str, list[int]] = {}
    prims = {}
    for k, op in enumerate(program.ops):
        if op.prim is None or (compute_only and op.kind != "compute"):
            continue
        prim = prims[k] = parsed_prim(op.prim)
        producer[prim.output.tensor] = k
        for a in prim.inputs:
            readers.setdefault(a.tensor, []).append(k)
    aliased = {t.memory.alias_of for t in program.tensors
               if isinstance(t.memory, HbmMemory) and t.memory.alias_of}
    return producer, readers, prims, aliased, set(program.outputs)


@dataclass
class LxRequest:
    """An LX buffer still to be placed: the op-index span it is live over and its size."""
    live_from: int    # producer's op index
    live_to: int      # last reader's op index
    size: int         # largest per-tile box of the producer, whole sticks


def _result_box_bytes(op, prim, tmap: dict, hw, per_tile: bool) -> int:
    """LX bytes (whole sticks) of the largest box of its result any core of `op` writes:
    per temporal tile (`per_tile`) or its whole slice."""
    t = prim.output.tensor
    decl = tmap[t]
    names = [a.tensor for a in prim.inputs] + [t]
    gran = op_granules(prim, {n: tmap[n].layout for n in names}, {n: tmap[n].dtype for n in names},
                       hw.stick_bytes)
    split = {n: f for n, f in op.core_split.items() if f > 1}
    size = largest_tile_lx_bytes(prim, -1, core_ranges(prim, split, op.core_slices, gran),
                                 op.temporal_tiles if per_tile else {}, gran, decl.shape, decl.layout, decl.dtype)
    return padded(size, hw.stick_bytes)


def _candidates(pg: PrimGraph, program: Program, hw) -> dict[str, LxRequest]:
    kernel = kernel_numbers(program, bundle=False)
    tmap = program.tensor_map()
    producer, readers, prims, aliased, outputs = _producers(program)
    out: dict[str, LxRequest] = {}
    for t, k in producer.items():
        decl = tmap[t]
        m = decl.memory
        if (t not in pg.tensors or t in outputs or t in aliased or k not in kernel
                or decl.role != "intermediate"
                or (isinstance(m, HbmMemory) and m.alias_of) or (isinstance(m, LxMemory) and m.per_tile)):
            continue
        rs = readers.get(t, [])
        if not rs or any(kernel.get(r) != kernel[k] for r in rs):
            continue
        size = _result_box_bytes(program.ops[k], prims[k], tmap, hw, per_tile=True)
        out[t] = LxRequest(k, max(rs), size)
    return out


def place_first_fit(program: Program, cands: dict[str, LxRequest], capacity: int, stick: int) -> dict[str, int]:
    """First-fit LX addresses for the buffers `cands` around every other live LX buffer of
    `program` (in whole sticks; a tensor of `cands` that the program already holds in LX
    does not count as taken); a buffer that finds no room is left out."""
    spans = lx_live_spans(program)  # a whole-slice LX tensor is live across the kernels it touches
    taken = [(*spans[t.id], m.lx_address, m.lx_address + m.size_per_core)
             for t in program.tensors if isinstance(m := t.memory, LxMemory) and t.id not in cands]
    addresses: dict[str, int] = {}
    for t in sorted(cands, key=lambda x: (cands[x].live_from, -cands[x].size)):
        c = cands[t]
        busy = sorted((a, b) for lf, lt, a, b in taken if lf <= c.live_to and c.live_from <= lt)
        addr = 0
        for a, b in busy:
            if addr + c.size <= a:
                break
            addr = max(addr, padded(b, stick))
        if addr + c.size <= capacity:
            addresses[t] = addr
            taken.append((c.live_from, c.live_to, addr, addr + c.size))
    return addresses


def _issue_key(i) -> tuple:
    return (i.code, getattr(i, "op", None), getattr(i, "tensor", None))


def add_tile_buffers(pg: PrimGraph, hw, d: PlanDecisions, program: Program) -> Optional[TileBufferResult]:
    """`d` (emitted as `program`) with tile buffers for its fused kernels' own results: the
    candidates the validator accepts, in a program with no problem `program` did not have
    (so a valid `program` stays valid; an invalid trial still gets its buffers, and one
    kernel's problem does not cost the other kernels theirs). None when no candidate
    survives (or the program does not emit). Timing and validity are the caller's question."""
    before: list[set] = []

    def known(issues) -> bool:
        # an issue `program` had already (its kernels were invalid before the buffers)
        if not before:
            before.append({_issue_key(i) for i in validate_program(program, hw)})
        return all(_issue_key(i) in before[0] for i in issues)
    return _place_and_check(pg, hw, d, program, _candidates(pg, program, hw),
                            lambda addr: Residency(lx_address=addr, per_tile=True), known)


def _kernel_spans(program: Program) -> dict[int, tuple[int, int]]:
    """Op index -> the op-index span of the fused kernel it belongs to (itself outside one)."""
    out: dict[int, tuple[int, int]] = {}
    kernel = kernel_numbers(program, bundle=False)
    members: dict[int, list[int]] = {}
    for k, n in kernel.items():
        members.setdefault(n, []).append(k)
    for ks in members.values():
        for k in ks:
            out[k] = (min(ks), max(ks))
    return out


def whole_candidates(pg: PrimGraph, program: Program, hw) -> dict[str, LxRequest]:
    """Results a kernel writes to device memory whole and later ops read back: intermediates
    (not program outputs, not aliased) made by a compute op, sized at the producer's largest
    per-core box, live from the start of the producer's kernel to the end of the last
    reader's (a kernel's tile loop runs every member on every tile)."""
    tmap = program.tensor_map()
    spans = _kernel_spans(program)
    producer, readers, prims, aliased, outputs = _producers(program, compute_only=True)
    out: dict[str, LxRequest] = {}
    for t, k in producer.items():
        decl = tmap[t]
        m = decl.memory
        if (t not in pg.tensors or t in outputs or t in aliased or decl.role != "intermediate"
                or not isinstance(m, HbmMemory) or m.alias_of or not readers.get(t)):
            continue
        size = _result_box_bytes(program.ops[k], prims[k], tmap, hw, per_tile=False)
        last = max(readers[t])
        out[t] = LxRequest(spans.get(k, (k, k))[0], spans.get(last, (last, last))[1], size)
    return out


def add_whole_residencies(pg: PrimGraph, hw, d: PlanDecisions, program: Program,
                          only: Optional[set[str]] = None) -> Optional[TileBufferResult]:
    """`d` (emitted as a valid `program`) with results that go through device memory between
    kernels held whole in LX instead, where the LX the plan leaves free over their live
    range has room (first fit) and the validator accepts them (a reader on another split
    needs other cores' slices: named by an issue, it stays in device memory). `only`: the
    candidates to consider (default all). None when none survives. Whether the result is
    faster is the caller's question."""
    cands = whole_candidates(pg, program, hw)
    if only is not None:
        cands = {t: c for t, c in cands.items() if t in only}
    return _place_and_check(pg, hw, d, program, cands, lambda addr: Residency(lx_address=addr),
                            lambda issues: False)


def _place_and_check(pg: PrimGraph, hw, d: PlanDecisions, program: Program, cands: dict[str, LxRequest],
                     residency, known) -> Optional[TileBufferResult]:
    """First-fit LX addresses for `cands`, `residency(address)` for each placed one, the
    plan emitted and validated: the candidates an issue names are dropped and the rest tried
    again (up to `_MAX_ROUNDS`); issues naming none of them end the search unless
    `known(issues)` says the program had them anyway. None when no candidate survives."""
    dropped: dict[str, str] = {}
    for _ in range(_MAX_ROUNDS):
        if not cands:
            return None
        addresses = place_first_fit(program, cands, hw.lx_capacity_bytes, hw.stick_bytes)
        dropped.update({t: "lx_capacity" for t in cands if t not in addresses})
        if not addresses:
            return None
        resident = dict(d.resident)
        for t, addr in addresses.items():
            resident[t] = residency(addr)
        trial_d = replace(d, resident=resident)
        prog, issues = program_and_issues(pg, hw, trial_d)
        if prog is None:
            return None
        if not issues:
            return TileBufferResult(trial_d, prog, sorted(addresses), dropped, [])
        named = {i.tensor: i.code for i in issues if getattr(i, "tensor", None) in addresses}
        if not named:
            # a new issue not about one buffer: give up rather than guess
            return TileBufferResult(trial_d, prog, sorted(addresses), dropped, issues) if known(issues) else None
        dropped.update(named)
        cands = {t: cands[t] for t in addresses if t not in named}
    return None
