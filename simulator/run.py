"""Functional run: execute a SuperDSC program with numpy, byte for byte.

The machine has one device-memory byte array and one LX byte array per core (the allocator
capacity, `hw.lx_capacity_bytes`). Every tensor is stored in its dtype in its device layout
(`target.layout`: device dims in `dim_map` order, the stick dim split into stick groups and
stick elements): in device memory at its offset; in LX as each core's own slice at
`lx_address`, the box the producer wrote on that core laid out the same way over the box's
own extents (stick dim padded to whole sticks). Every read and write goes through the
layout, element by element where the stick dim is not one stride, so the numbers never
depend on the layout, only on reading with the layout that wrote. Each op runs per core on its work
slice (`core_slices`): the core reads its operand boxes from device memory or from ITS LX
bytes (addresses computed from the producer's slicing), computes its slice with the
reference semantics (target.interpreter.run_op on the local loop nest: float32 compute,
float32 matmul accumulation; a grouped matmul core holding experts [g0, g1) shifts the
per-row expert ids by g0, so it computes exactly the rows routed to its experts), and
writes its output box back in the output's layout. A split
reduction dim is combined across cores (partials kept in float32, rounded once).

A fused coarse-tiled kernel (consecutive ops with equal `superdsc.fused_group_key`) that
holds a tile buffer (an `LxMemory` with `per_tile`) runs tile-major, as its tile loop does
on the device: for each tile j, each member in order, every core computes its tile-j ranges
(`geometry.tile_ranges` of its work slice) and reads/writes the tile-j boxes of its operands.
A tile buffer's bytes on a core hold the box the producer wrote there in its CURRENT tile
(stored like any LX box, at `lx_address`), so a reader tiled or sliced unlike its producer
reads another tile's or another slice's bytes. A member that tiles a reduction dim folds its
tiles' partials in float32 (written after every tile: complete after the last one), on top of
the cross-core combine of a split reduction dim. Every other op, in a kernel without a tile
buffer or in none, runs op-major on its whole work slice (tiling there changes only timing).

LX contents cross a bundle boundary only where the hardware says they do
(`hw.lx_persists_across_bundles`); otherwise every core's LX is filled with 0xFF bytes (NaN
in every float dtype) before each bundle after the first, as a new kernel launch may find it.

Nothing here consults the validator: a wrong core->slice map leaves slices unwritten or
written twice, an LX reader sliced differently from its producer reads another slice's
bytes, overlapping live LX buffers clobber each other, an LX value read in a later bundle
on hardware that wipes LX is NaN — each shows up as wrong numbers.
Reads that fall outside a memory raise `RunError`.
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence, Union

import numpy as np

from target.interpreter import (
    InterpreterError, to_iter_space, run_op as reference_op, scatter_row_value, scatter_rows, scatter_target,
)
from target.primitives import DTYPE_BYTES, Access, IterDim, PrimOp, PrimTensor
from target.geometry import (
    Box, core_ranges, op_granules, parsed_prim, operand_box, reduction_split, tile_ranges,
)
from target.layout import box_offsets, layout_nbytes, logical_strides
from target.superdsc import HbmMemory, LxMemory, Program, TensorDecl, fused_group_key, tile_count

_NP_DTYPES = {
    "float32": np.float32, "float16": np.float16, "float64": np.float64, "bfloat16": np.float32,
    "int64": np.int64, "int32": np.int32, "int16": np.int16, "int8": np.int8, "uint8": np.uint8,
    "bool": np.bool_,
}

# Refuse to allocate a device-memory image larger than this for a functional run (timing-only
# simulation of real-size models never allocates).
MAX_RUN_BYTES = 2 << 30


class RunError(RuntimeError):
    pass


def storage_dtype(dtype: str):
    return np.uint16 if dtype == "bfloat16" else _NP_DTYPES[dtype]


def to_storage(values: np.ndarray, dtype: str) -> np.ndarray:
    """Round computed values to the tensor's storage dtype (bfloat16: round to nearest even)."""
    if dtype == "bfloat16":
        bits = np.asarray(values, dtype=np.float32).view(np.uint32)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    if dtype == "bool":
        return np.asarray(values).astype(bool)
    nd = _NP_DTYPES[dtype]
    v = np.asarray(values)
    if np.issubdtype(nd, np.integer) and v.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            v = np.nan_to_num(v, nan=0, posinf=0, neginf=0)
            return np.trunc(v).astype(nd)
    with np.errstate(over="ignore", invalid="ignore"):
        return v.astype(nd)


def from_storage(raw: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return np.array(raw)


def user_dtype(dtype: str):
    """The numpy dtype outputs are returned in (bfloat16 as float32)."""
    return np.float32 if dtype == "bfloat16" else _NP_DTYPES[dtype]


class Machine:
    """Device memory + per-core LX byte arrays, and tensor views into them."""

    def __init__(self, program: Program, hw):
        self.p = program
        self.hw = hw
        self.tmap = program.tensor_map()
        end = 0
        for t in program.tensors:
            if isinstance(t.memory, HbmMemory):
                end = max(end, t.memory.offset + layout_nbytes(t.layout, t.dtype))
        if end > MAX_RUN_BYTES:
            raise RunError(f"device-memory image of {end} bytes is too large for a functional run")
        self.hbm = np.zeros(-(-end // 8) * 8 + 8, dtype=np.uint8)
        self.lx_bytes = -(-hw.lx_capacity_bytes // 8) * 8
        self.lx: dict[int, np.ndarray] = {}
        self.op_index = {o.id: k for k, o in enumerate(program.ops)}
        self._held: dict[str, dict[int, Box]] = {}
        # tile buffer -> core -> the box its producer wrote there in the current tile
        self._tile_held: dict[str, dict[int, Box]] = {}
        self._prims: dict[str, PrimOp] = {}
        self._geometry: dict[int, tuple[dict, dict]] = {}

    def prim(self, k: int) -> PrimOp:
        o = self.p.ops[k]
        if o.id not in self._prims:
            self._prims[o.id] = parsed_prim(o.prim)
        return self._prims[o.id]

    def geometry(self, k: int) -> tuple[dict, dict]:
        """(granules, per-core iteration ranges) of op k."""
        if k not in self._geometry:
            o = self.p.ops[k]
            prim = self.prim(k)
            names = [a.tensor for a in prim.inputs] + [prim.output.tensor]
            layouts = {n: self.tmap[n].layout for n in names}
            dtypes = {n: self.tmap[n].dtype for n in names}
            gran = op_granules(prim, layouts, dtypes, self.hw.stick_bytes)
            real = {n: f for n, f in o.core_split.items() if f > 1}
            self._geometry[k] = (gran, core_ranges(prim, real, o.core_slices, gran))
        return self._geometry[k]

    def ranges(self, k: int) -> dict[int, list]:
        return self.geometry(k)[1]

    def held_box(self, t: TensorDecl, core: int, fallback: Box) -> Box:
        """The box of an LX tensor the producer wrote on `core` (what its bytes hold); for a
        tile buffer, the box of the producer's latest tile there."""
        if t.memory.per_tile:
            return self._tile_held.get(t.id, {}).get(core, fallback)
        if t.id not in self._held:
            m = t.memory
            held: dict[int, Box] = {}
            if 0 <= m.live_from < len(self.p.ops):
                prim = self.prim(m.live_from)
                if prim.output.tensor == t.id:
                    held = {c: operand_box(prim, -1, rng, t.shape)
                            for c, rng in self.ranges(m.live_from).items()}
            self._held[t.id] = held
        return self._held[t.id].get(core, fallback)

    def _place(self, t: TensorDecl, core: Optional[int], box: Box):
        """(buffer, base byte, logical extents of the stored data or None for the whole
        tensor, box relative to the stored data's origin) of `box` of tensor `t`."""
        if isinstance(t.memory, HbmMemory):
            return self.hbm, t.memory.offset, None, box
        if core is None:
            raise RunError(f"{t.id} is LX-resident: no device-memory image")
        if core not in self.lx:
            self.lx[core] = np.zeros(self.lx_bytes, dtype=np.uint8)
        held = self.held_box(t, core, box)
        rel = tuple((a - h, b - h) for (a, b), (h, _) in zip(box, held))
        return self.lx[core], t.memory.lx_address, tuple(b - a for a, b in held), rel

    def _where(self, buf) -> str:
        return "device memory" if buf is self.hbm else "LX"

    def view(self, t: TensorDecl, core: Optional[int], box: Box):
        """How to reach `box` of tensor `t` as stored (on `core`'s LX if resident): a writable
        numpy view when every dim of the layout is one stride, else (flat storage, element
        offsets) for `read` / `write` to gather and scatter."""
        item = DTYPE_BYTES[t.dtype]
        buf, base, extents, rel = self._place(t, core, box)
        shape = tuple(b1 - b0 for b0, b1 in rel)
        strides = logical_strides(t.layout, extents)
        if strides is not None:
            start = base + sum(b0 * s for (b0, _), s in zip(rel, strides)) * item
            if start < 0:
                raise RunError(f"{t.id}: access before the start of {self._where(buf)}")
            try:
                return np.ndarray(shape, dtype=storage_dtype(t.dtype), buffer=buf, offset=start,
                                  strides=tuple(s * item for s in strides))
            except (TypeError, ValueError) as e:
                raise RunError(f"{t.id}: access outside {self._where(buf)}: {e}") from e
        # the memory as elements of this dtype, in the element grid the tensor's base is on
        shift = base % item
        flat = buf[shift: shift + (buf.size - shift) // item * item].view(storage_dtype(t.dtype))
        idx = (base - shift) // item + box_offsets(t.layout, rel, extents)
        if idx.size and int(idx.min()) < 0:
            raise RunError(f"{t.id}: access before the start of {self._where(buf)}")
        if idx.size and int(idx.max()) >= flat.size:
            raise RunError(f"{t.id}: access outside {self._where(buf)}")
        return flat, idx

    def read(self, t: TensorDecl, core: Optional[int], box: Box) -> np.ndarray:
        """The stored values of `box` of tensor `t` (storage dtype, the box's shape)."""
        v = self.view(t, core, box)
        return v[0][v[1]] if isinstance(v, tuple) else v

    def write(self, t: TensorDecl, core: Optional[int], box: Box, values) -> None:
        """Store `values` (the box's shape, storage dtype) as `box` of tensor `t`."""
        v = self.view(t, core, box)
        if isinstance(v, tuple):
            v[0][v[1]] = values
        else:
            v[...] = values

    def copy_input(self, t: TensorDecl, core: int, box: Box) -> np.ndarray:
        """A copy's input as the whole tensor its strided maps index: from device memory
        whole; from LX, the box the core reads (`geometry.copy_read_box`) in place, zeros
        elsewhere (the maps take nothing outside that box)."""
        if isinstance(t.memory, HbmMemory):
            return from_storage(self.read(t, core, tuple((0, s) for s in t.shape)), t.dtype)
        part = from_storage(self.read(t, core, box), t.dtype)
        full = np.zeros(tuple(t.shape), dtype=part.dtype)
        if all(b > a for a, b in box):
            full[tuple(slice(a, b) for a, b in box)] = part
        return full

    # -- execution ------------------------------------------------------------------------------
    def load_inputs(self, inputs: Mapping[str, np.ndarray]):
        for name in dict.fromkeys(self.p.inputs):
            if name not in inputs:
                raise RunError(f"missing program input {name}")
            t = self.tmap[name]
            arr = np.asarray(inputs[name])
            if tuple(arr.shape) != tuple(t.shape):
                raise RunError(f"input {name} has shape {arr.shape}, program expects {tuple(t.shape)}")
            full = tuple((0, s) for s in t.shape)
            self.write(t, None, full, to_storage(arr, t.dtype))

    def touches(self, k: int, names: set[str]) -> bool:
        """Whether op k reads or writes any of the tensors `names`."""
        o = self.p.ops[k]
        if o.prim is None:
            return False
        prim = self.prim(k)
        return prim.output.tensor in names or any(a.tensor in names for a in prim.inputs)

    def run_kernel(self, ks: Sequence[int]):
        """Run the fused kernel of ops `ks` tile-major: tile j of every member before tile j+1."""
        n_tiles = tile_count(self.p.ops[ks[0]])
        folds: dict[int, dict] = {k: {} for k in ks}
        for j in range(n_tiles):
            for k in ks:
                self.run_op(k, tile=j, fold=folds[k])

    def run_op(self, k: int, tile: Optional[int] = None, fold: Optional[dict] = None):
        """Run op k on every core: its whole work slice, or (`tile`) only that temporal tile of
        it, folding a tiled reduction's partials into `fold` (output box -> float32 so far)."""
        o = self.p.ops[k]
        if o.alias:
            return  # the output shares its input's bytes: nothing moves
        prim = self.prim(k)
        if prim.body.kind == "scatter":
            return self.run_scatter(k, tile)
        tm = self.tmap
        out_t = tm[prim.output.tensor]
        gran, ranges = self.geometry(k)
        split = {n: f for n, f in o.core_split.items() if f > 1}
        partial = reduction_split(prim, split)
        tiled_reduction = False
        if tile is not None:
            n_tiles = tile_count(o)
            per_core = {}
            for core, rng in ranges.items():
                tiles = tile_ranges(prim, rng, o.temporal_tiles, gran)
                if len(tiles) != n_tiles:
                    raise RunError(f"{o.id}: temporal tiles {o.temporal_tiles} name dims its loop nest "
                                   f"does not have")
                per_core[core] = tiles[tile]
            ranges = per_core
            tiled_reduction = any(int(o.temporal_tiles.get(d.name, 1)) > 1
                                  for d in prim.iter_dims if d.kind == "reduction")
            if fold is None:
                fold = {}
        results = []
        for core, rng in ranges.items():
            if any(b <= a for a, b in rng) and prim.iter_dims:
                continue
            arrays = []
            for i, acc in enumerate(prim.inputs):
                t = tm[acc.tensor]
                if prim.body.kind == "copy":
                    arrays.append(self.copy_input(t, core, operand_box(prim, i, rng, t.shape, copy_reads=True)))
                    continue
                raw = self.read(t, core, operand_box(prim, i, rng, t.shape))
                arrays.append(from_storage(raw, t.dtype))
            try:
                out = compute_slice(prim, rng, arrays, [tm[a.tensor].dtype for a in prim.inputs],
                                    out_t, partial or tiled_reduction)
            except (InterpreterError, ValueError, IndexError) as e:
                raise RunError(f"{o.id}: {e}") from e
            results.append((core, operand_box(prim, -1, rng, out_t.shape), out))
        if partial or tiled_reduction:
            fn = "matmul" if prim.body.kind in ("matmul", "grouped_matmul") else prim.body.fn
            groups: dict[Box, list] = {}
            for core, box, out in results:
                groups.setdefault(box, []).append((core, out))
            results = []
            for box, members in groups.items():
                total = combine_partials(fn, [m[1] for m in members])
                if tiled_reduction:
                    # this tile's partial over the reduction dim, folded into the earlier tiles'
                    if box in fold:
                        total = combine_partials(fn, [fold[box], total])
                    fold[box] = total
                results += [(core, box, total) for core, _ in members]
        if isinstance(out_t.memory, LxMemory) and out_t.memory.per_tile:
            # the tile buffer now holds this tile's box on each core that wrote one
            held = self._tile_held.setdefault(out_t.id, {})
            for core, box, _ in results:
                held[core] = box
        for core, box, out in results:
            self.write(out_t, core, box, to_storage(out, out_t.dtype))

    def run_scatter(self, k: int, tile: Optional[int] = None):
        """An in-place row store: each core reads its slice of the values and the indices and
        writes only the rows (its part of each row) into the output's bytes, which are the
        table's (the validator's `in_place` rule): the rest of the table is not touched. In a
        fused kernel's tile loop (`tile`), only that temporal tile of each core's slice."""
        prim = self.prim(k)
        tm = self.tmap
        out_t = tm[prim.output.tensor]
        gran, ranges = self.geometry(k)
        if tile is not None:
            ranges = {core: tile_ranges(prim, rng, self.p.ops[k].temporal_tiles, gran)[tile]
                      for core, rng in ranges.items()}
        for core, rng in ranges.items():
            if any(b <= a for a, b in rng):
                continue
            sizes = [b - a for a, b in rng]
            its = []
            for i in range(1, len(prim.inputs)):
                t = tm[prim.inputs[i].tensor]
                raw = from_storage(self.read(t, core, operand_box(prim, i, rng, t.shape)), t.dtype)
                its.append(to_iter_space(raw, prim.inputs[i], sizes))
            try:
                values = np.broadcast_to(its[0], tuple(sizes))
                rows = scatter_rows(prim, [a.astype(np.int64) for a in its[1:]], out_t.shape, sizes)
            except (InterpreterError, ValueError, IndexError) as e:
                raise RunError(f"{prim.id}: {e}") from e
            for point, dest in rows:
                box = scatter_target(prim, dest, rng)
                row = scatter_row_value(prim, values, point).reshape([b - a for a, b in box])
                self.write(out_t, core, box, to_storage(row, out_t.dtype))

    def read_output(self, name: str) -> np.ndarray:
        t = self.tmap[name]
        full = tuple((0, s) for s in t.shape)
        raw = self.read(t, None, full)
        return from_storage(raw, t.dtype).astype(user_dtype(t.dtype))


def _local_name(tensor: str, i: int) -> str:
    return f"{tensor}#{i}"


def compute_slice(prim: PrimOp, ranges, arrays: list, in_dtypes: list[str], out_t: TensorDecl,
                  partial: bool) -> np.ndarray:
    """One core's output box: the op's loop nest restricted to `ranges`, evaluated with the
    reference semantics on the core's operand boxes. Copy and fill build the whole output
    (their inputs are read whole) and cut the box. With `partial` (a split reduction dim)
    the result stays float32 so partials are combined before the one rounding."""
    out_box = [(0, 1) if d is None else ranges[d] for d in prim.output.dims]
    out_dtype = out_t.dtype
    if partial and out_dtype in ("float16", "bfloat16"):
        out_dtype = "float32"
    names = [_local_name(a.tensor, i) for i, a in enumerate(prim.inputs)]
    env = dict(zip(names, arrays))
    tensors = {n: PrimTensor(n, tuple(a.shape), dt) for n, a, dt in zip(names, arrays, in_dtypes)}
    inputs = tuple(Access(n, a.dims) for n, a in zip(names, prim.inputs))
    if prim.body.kind in ("copy", "fill"):
        tensors[out_t.id] = PrimTensor(out_t.id, tuple(out_t.shape), out_dtype)
        full = reference_op(PrimOp(prim.id, prim.iter_dims, inputs, prim.output, prim.body), env, tensors)
        return np.asarray(full)[tuple(slice(a, b) for a, b in out_box)]
    if prim.body.kind == "grouped_matmul":
        # the group ids are global expert numbers; a core holding experts [g0, g1) (its w
        # box) computes the rows routed to them, numbered from 0 in its local loop nest
        g0 = ranges[prim.body.g][0]
        if g0:
            env[names[2]] = np.asarray(env[names[2]]).astype(np.int64) - g0
            tensors[names[2]] = PrimTensor(names[2], tuple(arrays[2].shape), "int64")
    local = PrimOp(prim.id, tuple(IterDim(d.name, b - a, d.kind) for d, (a, b) in zip(prim.iter_dims, ranges)),
                   inputs, prim.output, prim.body)
    tensors[out_t.id] = PrimTensor(out_t.id, tuple(b - a for a, b in out_box), out_dtype)
    return reference_op(local, env, tensors)


def combine_partials(fn: str, parts: list[np.ndarray]) -> np.ndarray:
    """Fold per-core partial results of a split reduction dim (the cross-core combine)."""
    out = np.asarray(parts[0])
    for p in parts[1:]:
        if fn in ("sum", "matmul"):
            out = out + p
        elif fn == "max":
            out = np.maximum(out, p)
        elif fn == "min":
            out = np.minimum(out, p)
        elif fn == "prod":
            out = out * p
        else:
            raise RunError(f"{fn} cannot be split across cores")
    return out


def run_program(program: Program, inputs: Mapping[str, np.ndarray], hw) -> list[np.ndarray]:
    """Execute `program` on `inputs` (program input id -> array); one array per
    `program.outputs` entry, in order, in the tensors' dtypes (bfloat16 returned as float32)."""
    m = Machine(program, hw)
    m.load_inputs(inputs)
    tile_buffers = {t.id for t in program.tensors if isinstance(t.memory, LxMemory) and t.memory.per_tile}
    bundle = program.ops[0].bundle if program.ops else 0
    for ks in fused_kernels(program):
        if program.ops[ks[0]].bundle != bundle:
            bundle = program.ops[ks[0]].bundle
            if not hw.lx_persists_across_bundles:
                for arr in m.lx.values():
                    arr.fill(0xFF)   # a new kernel launch: LX holds whatever it held
        if tile_buffers and fused_group_key(program.ops[ks[0]]) is not None and any(
                m.touches(k, tile_buffers) for k in ks):
            m.run_kernel(ks)
        else:
            for k in ks:
                m.run_op(k)
    return [m.read_output(name) for name in program.outputs]


def fused_kernels(program: Program) -> list[list[int]]:
    """The program's ops as consecutive runs: each fused coarse-tiled kernel (maximal run of
    equal non-None `fused_group_key`) is one run, every other op a run of its own."""
    runs: list[list[int]] = []
    prev = None
    for k, o in enumerate(program.ops):
        key = fused_group_key(o)
        if key is not None and key == prev:
            runs[-1].append(k)
        else:
            runs.append([k])
        prev = key
    return runs

