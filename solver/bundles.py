"""Bundles: the one partition step every planner uses.

A bundle is one device program (one kernel launch). The hardware file says what limits it:
- `hw.bundle_tensor_limit`, counted by `hw.bundle_slots` (the target's rule: on Spyre the
  program inputs and outputs a bundle references, plus one for the pool of device-memory
  intermediates);
- `hw.lx_persists_across_bundles`: when false, LX contents die at a bundle boundary, so no
  cut may fall inside an LX live range. A tile buffer (`per_tile`) exists only inside its
  fused kernel's tile loop, so no cut ever falls inside its live range.

`partition(seq, hw, starts)` cuts a program's ops (in order) into bundles greedily: an op
joins the current bundle unless that would take the bundle past the limit. The cut then
goes at the latest point where the new bundle fits, preferring a point outside a fused
coarse-tiled run (consecutive compute ops with the same temporal tile count > 1 on the
same cores: a cut there would split one kernel into two) and never inside a live range
that must not be cut. Where no such point exists the bundle stays over the limit and the
partition says which LX live ranges are in the way (`blocked`).

`fit_residencies(seq, hw)` drops residencies, the longest live range across the first
blocked op first, until nothing is blocked (nothing to do when LX persists across bundles);
`solver.emit.fit_bundles(pg, hw, decisions)` does it on plan decisions (it needs the
emitter's op sequence, so it lives there). The emitter calls `partition` for every
planner's program; planners that choose residencies call `fit_bundles`.

A cut between ops cannot help a single op that references more tensors than a bundle
takes (`aten.cat` of six program inputs: six inputs and the output, seven slots of six).
`split_wide_copies(pg, hw)` rewrites such a copy, before any planner sees the graph, into
a tree of copies that each fit: consecutive pieces along the concatenated dim are
gathered into intermediate tensors (device-memory intermediates share the pool's one
slot), and the op then assembles the output from those. Every piece keeps its map, so the
values are the same; the tree costs one extra pass over the data.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, Optional

from lowering.aten.context import copy_op, row_major_strides
from target.primitives import PrimGraph, PrimOp, PrimTensor, StridedMap


@dataclass(frozen=True)
class OpSequence:
    """What the partition step needs of a program, in op order (restickify ops included)."""

    refs: list[frozenset[str]]                  # per op: alias roots of every tensor it reads or writes
    io: frozenset[str]                          # alias roots of the program inputs and outputs
    lx_ranges: dict[str, tuple[int, int]]       # LX-resident tensor -> (producer index, last reader index)
    per_tile: frozenset[str] = frozenset()      # resident tile buffers
    kernel_key: list[Optional[tuple]] = field(default_factory=list)  # per op: fused-run key or None

    def device_refs(self) -> list[frozenset[str]]:
        """Per op, the tensors it references in device memory (resident tensors are in LX)."""
        lx = set(self.lx_ranges)
        return [frozenset(r - lx) for r in self.refs]


@dataclass
class Partition:
    bundle_of: list[int]                        # bundle index per op
    over_limit: list[int] = field(default_factory=list)   # bundles past the limit
    blocked: Optional[int] = None               # first op where a needed cut was kept out by LX
    blocking: list[str] = field(default_factory=list)     # LX tensors whose live range spans that op

    @property
    def fits(self) -> bool:
        return not self.over_limit


def kernel_key(kind: str, temporal_tiles: dict, cores: int, alias: bool = False) -> Optional[tuple]:
    """The fused coarse-tiled run key of an op (target.superdsc.fused_group_key without
    the bundle): compute ops (not alias copies) with more than one temporal tile, by tile
    count and cores."""
    if kind != "compute" or alias:
        return None
    tiles = 1
    for f in temporal_tiles.values():
        tiles *= max(1, int(f))
    return (tiles, cores) if tiles > 1 else None


def uncuttable(seq: OpSequence, hw) -> dict[int, list[str]]:
    """Op index k -> the LX tensors whose live range forbids a cut before op k."""
    out: dict[int, list[str]] = {}
    n = len(seq.refs)
    for t, (a, b) in seq.lx_ranges.items():
        if hw.lx_persists_across_bundles and t not in seq.per_tile:
            continue
        for k in range(a + 1, min(b, n - 1) + 1):
            out.setdefault(k, []).append(t)
    return out


def partition(seq: OpSequence, hw, starts: Iterable[int] = ()) -> Partition:
    """Bundle index per op (module docstring). `starts`: op indices where the planner asks
    for a new bundle (honoured where a cut is allowed)."""
    n = len(seq.refs)
    starts = set(starts)
    limit = hw.bundle_tensor_limit
    no_cut = uncuttable(seq, hw)
    keys = seq.kernel_key or [None] * n
    inside_run = [k > 0 and keys[k] is not None and keys[k] == keys[k - 1] for k in range(n)]
    dev = seq.device_refs()
    pool = any(r - seq.io for r in dev)

    def slots(tensors) -> int:
        return hw.bundle_slots(tensors, seq.io, pool)

    def cut_point(start: int, k: int) -> Optional[int]:
        """Latest j in (start, k] to start a bundle so that ops j..k fit, outside a fused
        run if possible; None when every such j is inside an uncuttable live range."""
        tail: set[str] = set()
        fallback = None
        for j in range(k, start, -1):
            tail |= dev[j]
            if j < k and slots(tail) > limit:
                break
            if j in no_cut:
                continue
            if not inside_run[j]:
                return j
            if fallback is None:
                fallback = j
        return fallback

    part = Partition(bundle_of=[])
    b, start = 0, 0
    cur: set[str] = set()
    for k in range(n):
        if k > start and k in starts and k not in no_cut:
            b, start, cur = b + 1, k, set()
        elif k > start and slots(cur | dev[k]) > limit:
            j = cut_point(start, k)
            if j is None:
                if part.blocked is None:
                    part.blocked = k
                    part.blocking = sorted(no_cut.get(k, []))
            else:
                b, start = b + 1, j
                cur = set()
                for q in range(j, k):
                    part.bundle_of[q] = b
                    cur |= dev[q]
        cur |= dev[k]
        part.bundle_of.append(b)
    members: dict[int, set[str]] = {}
    for k, bk in enumerate(part.bundle_of):
        members.setdefault(bk, set()).update(dev[k])
    part.over_limit = [bk for bk, ts in sorted(members.items()) if slots(ts) > limit]
    return part


def fit_residencies(seq: OpSequence, hw, starts: Iterable[int] = ()) -> list[str]:
    """Residencies to drop (in the order dropped) so that no bundle is over the limit for
    want of a cut inside an LX live range: each round drops the longest live range across
    the first blocked op. [] when LX persists across bundles and no tile buffer is in the way."""
    starts = list(starts)
    ranges = dict(seq.lx_ranges)
    dropped: list[str] = []
    while True:
        part = partition(replace(seq, lx_ranges=ranges, per_tile=seq.per_tile & set(ranges)), hw, starts)
        if part.blocked is None or not part.blocking:
            return dropped
        k = part.blocked
        victim = max(part.blocking, key=lambda t: (ranges[t][1] - ranges[t][0], t))
        assert ranges[victim][0] < k <= ranges[victim][1]
        del ranges[victim]
        dropped.append(victim)


# -- ops wider than a bundle ---------------------------------------------------------------

def op_slots(op: PrimOp, io, hw) -> int:
    """The bundle slots `op` takes on its own, counting the pool (a graph with a split op
    has device-memory intermediates), every operand in device memory."""
    return hw.bundle_slots({a.tensor for a in op.inputs} | {op.output.tensor}, io, True)


def _worst_slots(names: set[str], hw) -> int:
    """The slots `names` take if each may be a program input or output: the planner may
    make a copy a free alias, and an intermediate that an output aliases is then counted
    as that output. A split sized by this count fits whatever the planner aliases."""
    return hw.bundle_slots(names, names, True)


def _slab_dim(op: PrimOp, out: PrimTensor) -> Optional[int]:
    """The dim along which every piece of copy `op` is a full slab of the output (a cat's
    dim), or None when the pieces are not such slabs."""
    body = op.body
    rank = len(out.shape)
    for d in range(rank):
        if all(offs[j] == 0 and m.shape[j] == out.shape[j]
               for m, offs in zip(body.maps, body.out_offsets) for j in range(rank) if j != d):
            return d
    return None


def _fresh(base: str, taken: set[str]) -> str:
    name, n = base, 0
    while name in taken:
        n += 1
        name = f"{base}.{n}"
    taken.add(name)
    return name


def _split_copy(op: PrimOp, tensors: dict[str, PrimTensor], op_ids: set[str], io, hw) -> Optional[list[PrimOp]]:
    """Copies that together do what `op` does, each within the bundle limit (the last one
    writes `op`'s output under `op`'s id), or None when `op` cannot be split so."""
    out = tensors[op.output.tensor]
    d = _slab_dim(op, out)
    if d is None or len(op.inputs) < 2:
        return None
    limit = hw.bundle_tensor_limit
    order = sorted(range(len(op.inputs)), key=lambda p: op.body.out_offsets[p][d])
    chunks: list[list[int]] = [[]]
    for p in order:
        trial = chunks[-1] + [p]
        names = {op.inputs[q].tensor for q in trial} | {f"{out.id}.part"}
        if chunks[-1] and _worst_slots(names, hw) > limit:
            chunks.append([p])
        else:
            chunks[-1] = trial
    if len(chunks) == len(order):
        return None  # a chunk of one piece is no smaller: the limit is too tight to split
    made: list[PrimOp] = []
    assembled: list[tuple[str, StridedMap, tuple[int, ...]]] = []
    for k, chunk in enumerate(chunks):
        lo = op.body.out_offsets[chunk[0]][d]
        hi = max(op.body.out_offsets[p][d] + op.body.maps[p].shape[d] for p in chunk)
        shape = tuple(hi - lo if j == d else s for j, s in enumerate(out.shape))
        tid = _fresh(f"{out.id}.part{k}", set(tensors))
        tensors[tid] = PrimTensor(tid, shape, out.dtype, "intermediate")
        pieces = [(op.inputs[p].tensor, op.body.maps[p],
                   tuple(o - lo if j == d else o for j, o in enumerate(op.body.out_offsets[p]))) for p in chunk]
        made.append(copy_op(tensors, _fresh(f"{op.id}.part{k}", op_ids), tid, pieces, op.body.pad_value,
                            op.source))
        offset = tuple(lo if j == d else 0 for j in range(len(shape)))
        assembled.append((tid, StridedMap(shape, row_major_strides(shape), 0), offset))
    final = copy_op(tensors, op.id, out.id, assembled, op.body.pad_value, op.source)
    if _worst_slots({a.tensor for a in final.inputs} | {out.id}, hw) > limit:
        rest = _split_copy(final, tensors, op_ids, io, hw)
        if rest is None:
            return None
        return made + rest
    return made + [final]


def split_wide_copies(pg: PrimGraph, hw) -> PrimGraph:
    """`pg` with every copy that takes more bundle slots than a bundle has rewritten into
    a tree of copies that fit (module docstring); `pg` itself when none is too wide. An op
    that cannot be split stays as it is (the validator then names it)."""
    if hw.bundle_tensor_limit_rule == "none":
        return pg
    io = set(pg.inputs) | set(pg.outputs)
    limit = hw.bundle_tensor_limit
    if not any(op.kind == "copy" and op_slots(op, io, hw) > limit for op in pg.ops):
        return pg
    tensors = dict(pg.tensors)
    op_ids = {op.id for op in pg.ops}
    ops: list[PrimOp] = []
    for op in pg.ops:
        wide = op.kind == "copy" and op_slots(op, io, hw) > limit
        split = _split_copy(op, tensors, op_ids, io, hw) if wide else None
        ops.extend(split or [op])
    return replace(pg, tensors=tensors, ops=ops)
