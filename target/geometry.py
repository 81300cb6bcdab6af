"""Per-core geometry: pure functions over shapes, layouts and splits.

Used by the emitter (solver/emit.py), the validator, the functional run and the timing
model, so every one of them sees the same slices. Where a tensor's bytes are (its device
layout: strides, offsets, spans, sticks, contiguity) is `target.layout`'s; the layout
functions most callers need are importable from here as well.

- A core split gives each iteration dim a factor; core c runs the slice whose index along
  every split dim its `CoreSlice` names. Along a dim that is some operand's stick dim the
  slice is a whole number of sticks (the *granule*): chunk = padded extent / factor, and the
  last slices may hold fewer real elements (padding-aware split).
- An operand's *box* for a core: per tensor dim the [start, stop) range it touches.
- An LX-resident tensor is held per core as the producer's output box, stored in the
  tensor's layout order with the box's stick-dim extent padded to whole sticks.
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from functools import lru_cache
from typing import Any, Callable, Hashable, Iterable, Mapping, Optional, Sequence

import numpy as np

from target.layout import (  # noqa: F401  (the layout geometry: callers also import it from here)
    Box, Range, box_lx_bytes, box_span_bytes, box_sticks, box_storage_extents, layout_nbytes,
    layout_problems, make_layout, padded,
)
from target.op_rules import split_granules
from target.primitives import Access, PrimOp, op_from_json, op_to_json
from target.superdsc import CoreSlice, Layout


# -- memo caches ----------------------------------------------------------------------------
# The planners' searches emit, validate and time the same graph many times with a few ops
# changed between trials. The per-op geometry those calls derive (core ranges, operand
# boxes, tile ranges, the validator's per-op verdicts, the timing model's per-op analysis)
# is a pure function of the op's content, so it is memoized in bounded LRU maps keyed on
# that content (the loop nest, and a `flat_key` of the rest): never on object identity, and
# every input the result depends on is in the key. `set_caches(False)` runs every
# caller on its reference (uncached) path; results are identical either way
# (tests/test_sim_caches.py).
class LRU:
    """A bounded memo map: the least recently used entries go when it holds more than
    `maxsize` entries or, with `weigh` (the bytes of a value, fixed once stored), more than
    `max_bytes` bytes."""

    def __init__(self, maxsize: int, name: str = "", max_bytes: Optional[int] = None,
                 weigh: Optional[Callable[[Any], int]] = None):
        self.name = name or f"cache{len(_CACHES)}"
        self.maxsize = maxsize
        self.max_bytes = max_bytes
        self.weigh = weigh
        self.data: OrderedDict = OrderedDict()
        self.nbytes = 0
        self.hits = 0
        self.misses = 0
        # threads share the maps (the service renders reports in worker threads); `make`
        # runs outside the lock (it may use another map, or this one)
        self._lock = threading.Lock()
        _CACHES.append(self)

    def get(self, key: Hashable, make: Callable[[], Any]) -> Any:
        d = self.data
        with self._lock:
            v = d.get(key, _MISSING)
            if v is not _MISSING:
                d.move_to_end(key)
                self.hits += 1
                return v
            self.misses += 1
        v = make()
        with self._lock:
            had = d.get(key, _MISSING)
            if had is not _MISSING:  # another thread made it meanwhile: one value per key
                d.move_to_end(key)
                return had
            d[key] = v
            if self.weigh is not None:
                self.nbytes += self.weigh(v)
            while len(d) > 1 and (len(d) > self.maxsize or (
                    self.max_bytes is not None and self.nbytes > self.max_bytes)):
                _, old = d.popitem(last=False)
                if self.weigh is not None:
                    self.nbytes -= self.weigh(old)
        return v

    def clear(self) -> None:
        with self._lock:
            self.data.clear()
            self.nbytes = 0
            self.hits = self.misses = 0


_CACHES: list[LRU] = []
_MISSING = object()
# STICKSAT_SIM_CACHES=0 in the environment starts with them off (a reference run)
_ENABLED = [os.environ.get("STICKSAT_SIM_CACHES", "1").strip().lower() not in ("0", "false", "no", "off")]


def caches_enabled() -> bool:
    return _ENABLED[0]


def set_caches(enabled: bool) -> bool:
    """Turn the memo caches on or off (off: every caller takes its reference path); returns
    the previous setting. Turning them off also empties them."""
    prev = _ENABLED[0]
    _ENABLED[0] = bool(enabled)
    if not enabled:
        clear_caches()
    return prev


def clear_caches() -> None:
    for c in _CACHES:
        c.clear()


def cache_stats() -> dict[str, tuple[int, int, int]]:
    """(entries, hits, misses) per cache, by the name it was registered under."""
    return {c.name: (len(c.data), c.hits, c.misses) for c in _CACHES}


# Flat keys: the builders below append a record's content to one list of ints and strs
# (every sequence preceded by its length, so the layout is unambiguous for a fixed builder
# order); `flat_key` makes it a tuple when every element is exactly an int or a str (1, 1.0
# and True compare equal: anything else is not keyed, the caller computes afresh). One
# list and one tuple per key keeps the garbage collector's work small.
_ATOMS = frozenset({int, str})


def flat_key(f: list) -> Optional[tuple]:
    return tuple(f) if set(map(type, f)) <= _ATOMS else None


def flag(v):
    """A bool as a key atom ("T" / "F"); anything else as it is (then judged by flat_key)."""
    return "T" if v is True else "F" if v is False else v


def put_dict(f: list, d: Mapping) -> None:
    f.append(len(d))
    f.extend(d)
    f.extend(d.values())


def put_slices(f: list, core_slices: Sequence) -> None:
    """A coreIdToWkSlice_ list: core ids and slice maps, in order."""
    f.append(len(core_slices))
    for cs in core_slices:
        sl = cs.slice
        f.append(cs.core)
        f.append(len(sl))
        f.extend(sl)
        f.extend(sl.values())


def put_layout(f: list, layout: Layout) -> None:
    dm, ds = layout.dim_map, layout.device_size
    f.append(len(dm))
    f.extend(dm)
    f.append(len(ds))
    f.extend(ds)
    f.append(layout.stick_elems)


def put_tensor(f: list, t) -> None:
    """What of a declared tensor its ops' geometry depends on (not where it lives)."""
    shape = t.shape
    f.append(t.id)
    f.append(t.dtype)
    f.append(len(shape))
    f.extend(shape)
    put_layout(f, t.layout)


def prim_key(prim: PrimOp) -> Optional[PrimOp]:
    """The loop nest as a key part (a frozen dataclass compared by content), or None when an
    operand map holds a non-integer dim that would compare equal to an integer one."""
    for acc in prim.inputs:
        for d in acc.dims:
            if d is not None and type(d) is not int:
                return None
    for d in prim.output.dims:
        if d is not None and type(d) is not int:
            return None
    return prim


# Loop nests of programs, parsed once per content: the validator, the timing model and the
# fusion steps each parse every op of every trial program, and a trial changes a few ops.
# Keyed on the op id; an entry holds the parsed nest and the canonical JSON it prints as
# (`op_to_json`), and serves a request only when the request's JSON equals that (a nest
# edited in place, or one printed another way, is parsed afresh). Equal JSON parses to an
# equal nest, up to Python's 1 == 1.0 (a dim index given as a float: `prim_key` keeps such a
# nest out of the other memo maps, whose reference path gives the same results).
_PRIMS = LRU(4096, "geometry.parsed_prims")
_PRIMS_PER_ID = 4  # nests kept under one op id (ops of several graphs share ids)


def parsed_prim(d: dict) -> PrimOp:
    """`op_from_json(d)` (same errors for a malformed nest), memoized on the JSON's content."""
    oid = d.get("id") if isinstance(d, dict) else None
    if type(oid) is not str or not caches_enabled():
        return op_from_json(d)
    entries = _PRIMS.get(oid, list)
    for canon, prim in entries:
        if canon == d:
            return prim
    prim = op_from_json(d)
    canon = op_to_json(prim)
    if canon == d:
        entries.insert(0, (canon, prim))
        del entries[_PRIMS_PER_ID:]
    return prim


def box_elems(box: Box) -> int:
    n = 1
    for a, b in box:
        n *= max(0, b - a)
    return n


def box_contains(outer: Box, inner: Box) -> bool:
    return len(outer) == len(inner) and all(
        (ib <= ia) or (oa <= ia and ib <= ob) for (oa, ob), (ia, ib) in zip(outer, inner))


# -- splits and slices ---------------------------------------------------------------------
def op_granules(op: PrimOp, layouts: Mapping[str, Layout], dtypes: Mapping[str, str],
                stick_bytes: int) -> dict[int, int]:
    """Split granule per iteration dim given the operand tensors' layouts."""
    ins = [layouts[a.tensor].stick_dim for a in op.inputs]
    out = layouts[op.output.tensor].stick_dim
    dts = [dtypes[a.tensor] for a in op.inputs] + [dtypes[op.output.tensor]]
    return split_granules(op, ins, out, dts, stick_bytes)


def dim_chunk(size: int, factor: int, granule: int) -> int:
    """Elements per slice along a dim split `factor` ways (whole granules, padding-aware)."""
    return padded(size, granule) // factor


def slice_ranges(op: PrimOp, core_split: Mapping[str, int], slice_index: Mapping[str, int],
                 granules: Mapping[int, int]) -> list[Range]:
    """Iteration range per iteration dim of the work slice `slice_index`."""
    out: list[Range] = []
    for i, d in enumerate(op.iter_dims):
        f = core_split.get(d.name, 1)
        if f <= 1:
            out.append((0, d.size))
            continue
        chunk = dim_chunk(d.size, f, granules.get(i, 1))
        k = slice_index.get(d.name, 0)
        out.append((min(k * chunk, d.size), min((k + 1) * chunk, d.size)))
    return out


def default_core_slices(op: PrimOp, core_split: Mapping[str, int]) -> list[CoreSlice]:
    """coreIdToWkSlice_ in the natural order: cores 0..n-1 enumerate the slices row-major
    over the split dims in iteration-dim order (the last split dim fastest)."""
    names = tuple(d.name for d in op.iter_dims if core_split.get(d.name, 1) > 1)
    return list(_natural_slices(names, tuple(core_split[n] for n in names)))


@lru_cache(maxsize=4096)
def _natural_slices(names: tuple[str, ...], factors: tuple[int, ...]) -> tuple[CoreSlice, ...]:
    # planners price thousands of candidate splits over a few dim names: build each map once
    # (the CoreSlice objects are shared, never modified)
    total = 1
    for f in factors:
        total *= f
    slices = []
    for c in range(total):
        pos = [0] * len(names)
        rem = c
        for i in reversed(range(len(names))):
            pos[i] = rem % factors[i]
            rem //= factors[i]
        slices.append(CoreSlice.model_construct(core=c, slice=dict(zip(names, pos))))
    return tuple(slices)


def core_ranges(op: PrimOp, core_split: Mapping[str, int], core_slices: Iterable[CoreSlice],
                granules: Mapping[int, int]) -> dict[int, list[Range]]:
    """Iteration ranges per core (cores not in core_slices do not run the op). An op with no
    split runs on core 0 when core_slices is empty."""
    slices = list(core_slices)
    if not slices:
        return {0: slice_ranges(op, core_split, {}, granules)}
    # per dim, the range of every slice index (as slice_ranges cuts them), computed once
    per_dim: list[tuple[Optional[str], list[Range]]] = []
    for i, d in enumerate(op.iter_dims):
        f = core_split.get(d.name, 1)
        if f <= 1:
            per_dim.append((None, [(0, d.size)]))
            continue
        chunk = dim_chunk(d.size, f, granules.get(i, 1))
        per_dim.append((d.name, [(min(k * chunk, d.size), min((k + 1) * chunk, d.size)) for k in range(f)]))
    return {cs.core: [rs[0] if name is None else rs[cs.slice.get(name, 0)] for name, rs in per_dim]
            for cs in slices}


def operand_box(op: PrimOp, operand: int, ranges: Sequence[Range], shape: Sequence[int],
                copy_reads: bool = False) -> Box:
    """The box of a tensor an operand touches for iteration `ranges`. operand = input index,
    or -1 for the output. A gather table is read whole along its gathered axis. A copy input
    is read whole, or with `copy_reads` in the box its piece's strided map reaches from the
    part of the output box the piece writes (`copy_read_box`): the validator, the functional
    run and the LX-hold step ask for that; the planners' own searches, the heuristic
    baseline and the timing model's fused-kernel reuse keep the whole input (so the plans
    they make do not move with it)."""
    acc: Access = op.output if operand < 0 else op.inputs[operand]
    kind = op.body.kind
    if operand >= 0 and kind == "copy":
        if not copy_reads:
            return tuple((0, s) for s in shape)
        out_box = [(0, 1) if d is None or d >= len(ranges) else ranges[d] for d in op.output.dims]
        return copy_read_box(op, operand, out_box, shape)
    box = []
    for j, d in enumerate(acc.dims):
        if kind in ("gather", "scatter") and (operand == 0 or (operand < 0 and kind == "scatter")) \
                and j in op.body.table_axes:
            # a gather reads any row of its table; a scatter may write any row (the rows it
            # does write are data: the timing model and the functional run take them)
            box.append((0, shape[j]))
        elif d is None or d >= len(ranges):
            box.append((0, shape[j]))
        else:
            box.append(ranges[d])
    return tuple(box)


# -- copy inputs: the box a strided map reaches ------------------------------------------------
# A copy piece reads in_flat[offset + sum_j i_j * strides[j]] (row-major over the input's
# shape) for the output positions i of its region. Each map stride is written in the mixed
# radix of the input's shape: a stride that is one digit c on input dim k moves dim k's
# index by c per step. A map dim whose steps run past dim k's extent (a reshape merging
# dims: [.., 32, 128] read as [.., 4096]) is cut into levels: the inner one of radix
# S_k / c on dim k, the next with the stride S_k * R_k (one step of the next dim out), and so
# on. When no input index can then carry into the next dim out (offset digit plus the
# largest sum of every level's contribution stays inside the dim), each input dim's index
# is a sum of independent terms: the bounding range of those terms over the output box is
# the dim's read range (exact when one term reaches the dim; a superset when several
# interleave, or a level's range wraps). Anything else (a negative stride, a stride of
# more than one digit, a carry) reads the input whole.
_CopyPlan = tuple  # (offset digit per input dim, per map dim: ((k, c, radix), ...) inner level first)


@lru_cache(maxsize=4096)
def _copy_plan(map_shape: tuple, strides: tuple, offset: int, in_shape: tuple) -> Optional[_CopyPlan]:
    """How a strided map reaches its input's dims (see above), or None (read whole)."""
    rank = len(in_shape)
    if rank == 0 or len(strides) != len(map_shape):
        return None
    row = [1] * rank
    for k in range(rank - 2, -1, -1):
        row[k] = row[k + 1] * in_shape[k + 1]
    numel = row[0] * in_shape[0]
    if numel <= 0 or not (0 <= offset < numel):
        return None

    def digits(x: int) -> list[int]:
        return [(x // row[k]) % in_shape[k] for k in range(rank)]

    off = digits(offset)
    reach = list(off)   # per input dim, the largest index the map can reach
    levels_of = []
    for n, s in zip(map_shape, strides):
        if n <= 1 or s == 0:
            levels_of.append(())  # one position, or a broadcast: no input dim moves
            continue
        if s < 0:
            return None
        levels = []
        while True:
            if s >= numel:
                return None
            dg = digits(s)
            nz = [k for k in range(rank) if dg[k]]
            if len(nz) != 1:
                return None
            k = nz[0]
            c = dg[k]
            if c * (n - 1) < in_shape[k] or k == 0:
                levels.append((k, c, n))
                reach[k] += c * (n - 1)
                break
            # the steps run past dim k: an inner level of radix S_k / c, the rest one dim out
            if in_shape[k] % c or n % (in_shape[k] // c):
                return None
            m = in_shape[k] // c
            levels.append((k, c, m))
            reach[k] += c * (m - 1)
            n //= m
            s *= m
        levels_of.append(tuple(levels))
    if any(reach[k] >= in_shape[k] for k in range(rank)):
        return None  # some index would carry into the next dim out
    return tuple(off), tuple(levels_of)


def _copy_piece(op: PrimOp, operand: int, in_shape: Sequence[int]):
    """(map, out_offset, plan) of the piece a copy input feeds, or None (read whole)."""
    body = op.body
    if operand >= len(body.maps) or operand >= len(body.out_offsets):
        return None
    mp, oo = body.maps[operand], body.out_offsets[operand]
    if len(mp.shape) != len(op.output.dims) or len(oo) != len(mp.shape):
        return None
    try:
        plan = _copy_plan(tuple(int(x) for x in mp.shape), tuple(int(x) for x in mp.strides), int(mp.offset),
                          tuple(int(x) for x in in_shape))
    except (TypeError, ValueError):
        return None
    return None if plan is None else (mp, oo, plan)


def copy_read_box(op: PrimOp, operand: int, out_box: Sequence[Range], in_shape: Sequence[int]) -> Box:
    """The box of copy input `operand` that writing `out_box` of the output reads: through
    its piece's strided map, from the part of `out_box` the piece writes (an empty box,
    (0, 0) per dim, when it writes none of it); the whole input when the map does not
    decompose onto the input's dims. One output box of `_copy_read_boxes`."""
    olo = np.array([[a for a, _ in out_box]], dtype=np.int64)
    ohi = np.array([[b for _, b in out_box]], dtype=np.int64)
    got = _copy_read_boxes(op, operand, olo, ohi, in_shape)
    if got is None:
        return tuple((0, int(s)) for s in in_shape)
    lo, hi = got
    return tuple((int(a), int(b)) for a, b in zip(lo[0], hi[0]))


def _copy_read_boxes(op: PrimOp, operand: int, olo: np.ndarray, ohi: np.ndarray, in_shape: Sequence[int]):
    """The boxes copy input `operand` reads for arrays of output boxes (olo/ohi: (...,
    output rank), half-open): (blo, bhi) of shape (..., input rank), an empty box where the
    piece writes none of an output box, or None when the input is read whole."""
    got = _copy_piece(op, operand, in_shape)
    if got is None:
        return None
    mp, oo, (off, levels_of) = got
    lead = olo.shape[:-1]
    rank = len(in_shape)
    lo = np.zeros(lead + (rank,), dtype=np.int64) + np.asarray(off, dtype=np.int64)
    hi = lo.copy()
    empty = np.zeros(lead, dtype=bool)
    for j, (o, n, levels) in enumerate(zip(oo, mp.shape, levels_of)):
        a = np.maximum(olo[..., j], o) - o
        b = np.minimum(ohi[..., j], o + n) - o
        empty |= b <= a
        b = b - 1
        for li, (k, c, m) in enumerate(levels):
            if li == len(levels) - 1:
                ra, rb = a, b
            else:
                same = (a // m) == (b // m)
                ra = np.where(same, a % m, 0)
                rb = np.where(same, b % m, m - 1)
                a, b = a // m, b // m
            lo[..., k] += c * ra
            hi[..., k] += c * rb
    hi += 1
    lo[empty] = 0
    hi[empty] = 0
    return lo, hi


def tile_ranges(op: PrimOp, ranges: Sequence[Range], temporal_tiles: Mapping[str, int],
                granules: Mapping[int, int]) -> list[list[Range]]:
    """The iteration ranges of each temporal tile of one core's work slice `ranges`, in the
    order the tile loop runs them (row-major over the tiled dims in iteration-dim order).
    A dim of u whole split units tiled t ways gives tile j the units [j*u//t, (j+1)*u//t)
    (balanced, never an empty tile while t <= u), cut at the slice's end."""
    tiles: list[list[Range]] = [list(ranges)]
    for i, d in enumerate(op.iter_dims):
        t = int(temporal_tiles.get(d.name, 1))
        if t <= 1:
            continue
        g = max(1, granules.get(i, 1))
        a, b = ranges[i]
        units = -(-(b - a) // g)
        nxt = []
        for cur in tiles:
            for j in range(t):
                lo = min(b, a + (j * units // t) * g)
                hi = min(b, a + ((j + 1) * units // t) * g)
                nxt.append(cur[:i] + [(lo, hi)] + cur[i + 1:])
        tiles = nxt
    return tiles


def tile_iteration_ranges(op: PrimOp, ranges_by_core: Mapping[int, Sequence[tuple[int, int]]],
                          temporal_tiles: Mapping[str, int], granules: Mapping[int, int]):
    """Vectorized `geometry.tile_ranges` over all cores: (cores, lo, hi) with lo/hi of shape
    (cores, tiles, iteration dims), tile j of core cores[i] at [i, j]. Same tile order and
    bounds as `tile_ranges` (row-major over the tiled dims in iteration-dim order)."""
    cores = sorted(ranges_by_core)
    n_it = len(op.iter_dims)
    a = np.array([[r[0] for r in ranges_by_core[c]] for c in cores], dtype=np.int64).reshape(len(cores), n_it)
    b = np.array([[r[1] for r in ranges_by_core[c]] for c in cores], dtype=np.int64).reshape(len(cores), n_it)
    tiled = [(i, int(temporal_tiles.get(d.name, 1))) for i, d in enumerate(op.iter_dims)]
    tiled = [(i, t) for i, t in tiled if t > 1]
    n_tiles = 1
    for _, t in tiled:
        n_tiles *= t
    lo = np.repeat(a[:, None, :], n_tiles, axis=1)
    hi = np.repeat(b[:, None, :], n_tiles, axis=1)
    j = np.arange(n_tiles, dtype=np.int64)
    stride = n_tiles
    for i, t in tiled:
        stride //= t
        digit = ((j // stride) % t)[None, :]
        g = max(1, int(granules.get(i, 1)))
        ai, bi = a[:, i:i + 1], b[:, i:i + 1]
        units = -(-(bi - ai) // g)
        lo[:, :, i] = np.minimum(bi, ai + (digit * units // t) * g)
        hi[:, :, i] = np.minimum(bi, ai + ((digit + 1) * units // t) * g)
    return cores, lo, hi


def tile_operand_boxes(op: PrimOp, operand: int, lo: np.ndarray, hi: np.ndarray, shape: Sequence[int],
                       copy_reads: bool = False):
    """`geometry.operand_box` applied to every (core, tile) of `tile_iteration_ranges`:
    (box_lo, box_hi) of shape (cores, tiles, tensor rank)."""
    acc = op.output if operand < 0 else op.inputs[operand]
    kind = op.body.kind
    n_it = lo.shape[2]
    if operand >= 0 and kind == "copy" and copy_reads:
        olo, ohi = tile_operand_boxes(op, -1, lo, hi, [1] * len(op.output.dims))
        got = _copy_read_boxes(op, operand, olo, ohi, shape)
        if got is not None:
            return got
    out_shape = lo.shape[:2] + (len(acc.dims),)
    blo = np.zeros(out_shape, dtype=np.int64)
    bhi = np.zeros(out_shape, dtype=np.int64)
    for j, d in enumerate(acc.dims):
        whole = (operand >= 0 and kind == "copy") or d is None or d >= n_it \
            or (kind in ("gather", "scatter") and (operand == 0 or (operand < 0 and kind == "scatter"))
                and j in op.body.table_axes)
        if whole:
            bhi[:, :, j] = shape[j]
        else:
            blo[:, :, j] = lo[:, :, d]
            bhi[:, :, j] = hi[:, :, d]
    return blo, bhi


def largest_tile_lx_bytes(op: PrimOp, operand: int, ranges_by_core: Mapping[int, Sequence[Range]],
                          temporal_tiles: Mapping[str, int], granules: Mapping[int, int],
                          shape: Sequence[int], layout: Layout, dtype: str) -> int:
    """The most LX bytes any core needs to hold one temporal tile of an operand's box (no
    tiles: its whole box). A tile's size depends only on its core's extents, so each distinct
    extent is sized once."""
    need = 0
    seen: set = set()
    for rng in ranges_by_core.values():
        ext = tuple(b - a for a, b in rng)
        if ext in seen:
            continue
        seen.add(ext)
        for tile in tile_ranges(op, [(0, e) for e in ext], temporal_tiles, granules):
            need = max(need, box_lx_bytes(operand_box(op, operand, tile, shape), layout, dtype))
    return need


def reduction_split(op: PrimOp, core_split: Mapping[str, int]) -> bool:
    return any(core_split.get(d.name, 1) > 1 for d in op.iter_dims if d.kind == "reduction")


def first_slice_spans(op: PrimOp, core_split: Mapping[str, int], granules: Mapping[int, int],
                      layouts: Mapping[str, Layout], shapes: Mapping[str, Sequence[int]],
                      dtypes: Mapping[str, str], copy_reads: bool = False) -> dict[int, int]:
    """Per operand (input index, -1 for the output), the device-memory byte span of the first
    work slice (slice 0 along every split dim: a full-size slice). Spans of the other slices
    differ at most by stick rounding, so this is what a planner compares with
    `hw.per_core_span_bytes` (the torch-spyre span-reduction view: the outermost dim a core
    touches times its stride). `copy_reads`: a copy's inputs in the box its slice reads, as
    the validator checks them (`operand_box`), instead of whole."""
    ranges = slice_ranges(op, {k: v for k, v in core_split.items() if v > 1}, {}, granules)
    out: dict[int, int] = {}
    for idx, acc in [(i, a) for i, a in enumerate(op.inputs)] + [(-1, op.output)]:
        t = acc.tensor
        box = operand_box(op, idx, ranges, shapes[t], copy_reads=copy_reads)
        out[idx] = box_span_bytes(box, layouts[t], dtypes[t])
    return out
