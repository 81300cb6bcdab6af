"""The program validator: every validity rule of a SuperDSC program (docs/simulator.md), each with its own code.

`validate_program(program, hw) -> list[ProgramIssue]` ([] means valid). It never raises on a
bad program (a client may send anything); each issue names the op and/or tensor it concerns.

Codes (docs/simulator.md has the full table):
  version             format name or version is not sticksat.superdsc v3 (or v2 / v1, read as v3)
  schema              the document does not parse / duplicate ids / malformed loop nest
  hardware_mismatch   program targets another hardware name or digest
  unknown_tensor      an op, input or output names an undeclared tensor
  shape_mismatch      a loop nest's operand maps disagree with the declared tensor shapes
  read_before_write   a tensor is read (or is a program output) before it is produced/loaded
  multiple_producers  a tensor is written twice, or a program input is overwritten
  layout_invalid      dim_map/device_size do not describe the tensor (each dim once, the stick dim
                      twice: stick group anywhere, stick elements last)
  stick_alignment     stick elements not one stick, stick count not the stick dim in whole sticks,
                      or an address not stick aligned
  split_unknown_dim   core_split names a dim the loop nest does not have
  split_uneven        a split is not even / not in whole sticks (or splits a scan or a scatter's rows)
  cores_over_limit    more cores than the hardware has (split product or a core id)
  multi_reduction_split more than one reduction dim split across cores
  core_slices         coreIdToWkSlice_ is not a bijection cores <-> work slices of the split
  temporal_tiles      temporal tiles name unknown dims or outnumber a core's units along the dim
  op_rule             operand layouts violate the op's stick rule (target/op_rules.py)
  op_decl_mismatch    opfunc / ex_unit disagree with the op's loop nest (matmul on pt, the rest on sfp)
  restickify_invalid  a restickify/relayout whose src/dst are not one tensor in two layouts
  io_memory           a program input or output is not in device memory
  lx_capacity         LX live bytes per core exceed the allocator capacity, or a buffer ends past it
  lx_overlap          two LX buffers live at the same time overlap in address
  lx_size             an LX buffer is smaller than the slice (tile buffer: the tile) a core writes into it
  lx_live_range       an LX tensor written outside live_from or read outside its live range
  lx_cross_bundle     an LX value read in another bundle than the one that wrote it (only on hardware
                      whose LX contents do not survive a bundle boundary: hw.lx_persists_across_bundles)
  lx_slice_mismatch   a core reads from its LX a slice it did not write (different slicing; for a
                      tile buffer: a tile-j box outside the producer's tile-j box on that core)
  lx_reduction_split  the output of an op with a split reduction dim (cross-core partial sums) in LX
  kernel_tile_order   a fused kernel member reads an earlier member's result where its own core has not
                      written it by the same tile (another core's part, or a later tile's), or
                      reads the result of a member that tiles a reduction dim (a partial until the last tile)
  lx_tile_scope       a tile buffer (LxMemory.per_tile) not confined to one fused coarse-tiled kernel:
                      producer or a reader outside it, an op of another kernel inside its live range,
                      a program input/output, live_to not a reader, or a producer tiling a reduction dim
  hbm_overlap         two device-memory tensors live at the same time overlap in bytes
  device_memory       a device-memory tensor ends past the usable device memory
  span_exceeded       a core's access to one tensor spans more than the per-core span
  bundle_structure    bundles do not partition the ops into consecutive groups / wrong lists
  bundle_limit        a bundle takes more of the hardware's per-bundle tensor limit than it allows
                      (counted by hw.bundle_slots: the rule in the target file)
  alias_illegal       an alias claim whose bytes are not the output in its layout
  in_place            an in-place op (scatter) whose output is not its table's bytes in the table's
                      layout, or a read of the table's old value after the op updated it
"""
from __future__ import annotations

import itertools
import json
from dataclasses import asdict, dataclass
from typing import Optional, Union

from pydantic import ValidationError

from simulator.lx_checks import LxChecks
from target.op_rules import check_split, copy_is_alias, ex_unit, matching_choice, opfunc, split_units
from target.primitives import DTYPE_BYTES, PrimOp, in_place_table, scatter_problems
from target.geometry import (
    LRU, box_contains, caches_enabled, core_ranges, flag, flat_key, op_granules, operand_box, parsed_prim,
    prim_key, put_dict, put_slices, put_tensor, reduction_split, tile_iteration_ranges, tile_operand_boxes,
)
from target.layout import box_lx_bytes, box_span_bytes, layout_nbytes, layout_problems
from target.superdsc import (
    PROGRAM_FORMAT, PROGRAM_VERSION, READABLE_VERSIONS, HbmMemory, LxMemory, Program, TensorDecl, resolve_alias,
)


@dataclass(frozen=True)
class ProgramIssue:
    code: str
    message: str
    op: Optional[str] = None
    tensor: Optional[str] = None

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


def parse_program(program: Union[Program, dict, str, bytes]) -> tuple[Optional[Program], list[ProgramIssue]]:
    """A Program from any accepted form, or the version/schema issues that stop it."""
    if isinstance(program, Program):
        return program, []
    try:
        raw = json.loads(program) if isinstance(program, (str, bytes)) else program
    except (ValueError, TypeError) as e:
        return None, [ProgramIssue("schema", f"not JSON: {e}")]
    if not isinstance(raw, dict):
        return None, [ProgramIssue("schema", "a program is a JSON object")]
    version = raw.get("version")
    if raw.get("format") != PROGRAM_FORMAT or type(version) is not int or version not in READABLE_VERSIONS:
        return None, [ProgramIssue("version", f"expected format {PROGRAM_FORMAT!r} version {PROGRAM_VERSION} "
                                              f"(or {', '.join(map(str, READABLE_VERSIONS[:-1]))}, read as "
                                              f"{PROGRAM_VERSION}), got {raw.get('format')!r} version {version!r}")]
    try:
        return Program.model_validate(raw), []
    except ValidationError as e:
        return None, [ProgramIssue("schema", f"{err['loc']}: {err['msg']}") for err in e.errors()[:20]]


def external_tensors(program: Program, op_ids: list[str], tmap: Optional[dict] = None,
                     by_id: Optional[dict] = None) -> set[str]:
    """Device-memory tensors (alias roots) the given ops reference (`Bundle.external_tensors`);
    `hw.bundle_slots` says how much of the per-bundle limit they take."""
    tmap = program.tensor_map() if tmap is None else tmap
    by_id = {o.id: o for o in program.ops} if by_id is None else by_id
    out: set[str] = set()
    for oid in op_ids:
        o = by_id.get(oid)
        if o is None or o.prim is None:
            continue
        names = [a["tensor"] for a in o.prim.get("inputs", [])] + [o.prim.get("output", {}).get("tensor")]
        for t in names:
            if t in tmap and isinstance(tmap[t].memory, HbmMemory):
                out.add(resolve_alias(tmap, t))
    return out


def io_roots(program: Program, tmap: Optional[dict] = None) -> set[str]:
    """Alias roots of the program's inputs and outputs: its non-intermediate tensors."""
    tmap = program.tensor_map() if tmap is None else tmap
    return {resolve_alias(tmap, t) for t in list(program.inputs) + list(program.outputs)}


def bundle_slots_of(program: Program, hw, tmap: Optional[dict] = None) -> dict[int, int]:
    """Bundle id -> how much of `hw.bundle_tensor_limit` it takes (`hw.bundle_slots` over the
    device-memory tensors it references; the pool exists when any bundle references a
    device-memory intermediate)."""
    tmap = program.tensor_map() if tmap is None else tmap
    by_id = {o.id: o for o in program.ops}
    io = io_roots(program, tmap)
    usage = {b.id: external_tensors(program, b.ops, tmap, by_id) for b in program.bundles}
    pool = any(ext - io for ext in usage.values())
    return {b: hw.bundle_slots(ext, io, pool) for b, ext in usage.items()}


def core_slice_problems(o, real: dict[str, int], cores: int) -> list[tuple[str, str]]:
    """(code, message) for each way op `o`'s core slices do not realize its split `real`
    (dims split more than once): their count, core ids, a core or work slice used twice,
    slice names and indices. The first problem of a slice stops the per-slice checks."""
    out: list[tuple[str, str]] = []
    product = 1
    for f in real.values():
        product *= f
    ids = [cs.core for cs in o.core_slices]
    if o.num_cores_used != len(o.core_slices) or len(o.core_slices) != product:
        out.append(("core_slices", f"{o.id}: {len(o.core_slices)} core slices, num_cores_used "
                                   f"{o.num_cores_used}, split needs {product}"))
    if any(c < 0 or c >= cores for c in ids):
        out.append(("cores_over_limit", f"{o.id}: core id outside 0..{cores - 1}"))
    if len(set(ids)) != len(ids):
        out.append(("core_slices", f"{o.id}: a core runs two work slices"))
    seen = set()
    names = set(real)
    order = sorted(real)
    for cs in o.core_slices:
        if set(cs.slice) != names and not (not real and not cs.slice):
            out.append(("core_slices", f"{o.id}: core {cs.core} slice names {sorted(cs.slice)}, split dims "
                                       f"are {order}"))
            break
        if any(not (0 <= cs.slice[n] < real[n]) for n in real):
            out.append(("core_slices", f"{o.id}: core {cs.core} slice index out of range"))
            break
        key = tuple(cs.slice[n] for n in order)
        if key in seen:
            out.append(("core_slices", f"{o.id}: work slice {dict(cs.slice)} assigned to two cores"))
            break
        seen.add(key)
    return out


class _OpGeom:
    """What `_Checker._check_split_and_geometry` derives from one op's content alone (its
    loop nest, operand tensors' shapes, dtypes, layouts and memory kinds, split, core
    slices, temporal tiles, the hardware): the issues that need nothing else, in order, and
    the per-core geometry the checks that read other ops (live ranges, bundles, what an LX
    producer wrote) use. Shared between validations through `_GEOM` (keyed on that
    content); never modified once built, except for the lazily filled derived fields."""

    __slots__ = ("pre", "ok", "early", "gran", "ranges", "mid", "operands", "prim", "temporal_tiles",
                 "out_shape", "serial", "_out_boxes", "_order")

    def __init__(self):
        self.pre: list[tuple[str, str]] = []        # split and core-slice issues
        self.ok = False                              # split and core slices passed
        self.early = False                           # nothing below depends on per-core slices
        self.gran: dict = {}
        self.ranges: Optional[dict] = None
        self.mid: list[tuple[str, str, Optional[str]]] = []  # temporal tiles, lx_reduction_split
        self.operands: list[tuple] = []              # (idx, tensor, kind, data) per checked operand
        self._out_boxes = None
        # verdicts on this op reading another op's result, by (that op's record serial, ...):
        # a serial names one record (one content) for good, never reused
        self._order: dict = {}
        self.serial = next(_SERIALS)

    def out_boxes(self) -> dict:
        """Per core, the box of the op's output (what `_Checker.lx_boxes` computes)."""
        if self._out_boxes is None:
            self._out_boxes = {c: operand_box(self.prim, -1, rng, self.out_shape)
                               for c, rng in self.ranges.items()}
        return self._out_boxes

    def tile_boxes(self, operand: int, shape) -> tuple:
        """(cores, box_lo, box_hi) per (core, tile) of an operand (read-only arrays, held in
        `_TILES` by this record's serial: bounded in bytes)."""
        def boxes():
            cores, lo, hi = _TILES.get(("iter", self.serial), lambda: _frozen(
                tile_iteration_ranges(self.prim, self.ranges, self.temporal_tiles, self.gran)))
            return _frozen((cores, *tile_operand_boxes(self.prim, operand, lo, hi, shape, copy_reads=True)))
        return _TILES.get(("box", self.serial, operand, tuple(shape)), boxes)


def _frozen(t: tuple) -> tuple:
    for a in t[1:]:
        a.flags.writeable = False
    return t


_SERIALS = itertools.count()

# per-op geometry records of recent validations (bounded: a record holds per-core boxes and,
# for tiled ops, per-tile box arrays)
_GEOM = LRU(1024, "validate.op_geometry")
# the per-tile box arrays of those records' ops (cores x tiles x rank), by record serial
_TILES = LRU(4096, "validate.tile_boxes", max_bytes=48 << 20, weigh=lambda t: t[1].nbytes + t[2].nbytes)


class _Checker(LxChecks):
    def __init__(self, program: Program, hw):
        self.p = program
        self.hw = hw
        self.issues: list[ProgramIssue] = []
        self.tmap: dict[str, TensorDecl] = {}
        self.prims: dict[str, PrimOp] = {}
        self.geometry_ok: set[str] = set()  # ops whose split and core slices passed their checks
        self._ranges: dict[str, tuple] = {}
        self._tile_iter: dict[str, tuple] = {}
        # memoized per-op geometry (`_GEOM`): off when the caches are, and for a program that
        # reuses an op id (the reference path looks its ops' ranges up by id)
        ids = [o.id for o in program.ops]
        self.fast = caches_enabled() and len(set(ids)) == len(ids)
        self._rec: dict[str, _OpGeom] = {}     # op id -> its record (ops that passed the split checks)
        self._rec_at: dict[int, _OpGeom] = {}  # op index -> its record

    def add(self, code: str, message: str, op: Optional[str] = None, tensor: Optional[str] = None):
        self.issues.append(ProgramIssue(code, message, op, tensor))

    # -- tensors ------------------------------------------------------------------------------
    def check_tensors(self):
        hw = self.hw
        sb = hw.stick_bytes
        for t in self.p.tensors:
            if t.id in self.tmap:
                self.add("schema", f"tensor {t.id} declared twice", tensor=t.id)
                continue
            self.tmap[t.id] = t
            if t.dtype not in DTYPE_BYTES:
                self.add("schema", f"unknown dtype {t.dtype!r}", tensor=t.id)
                continue
            for code, msg in layout_problems(t.layout, t.shape, t.dtype, sb):
                self.add(code, f"{t.id}: {msg}", tensor=t.id)
            m = t.memory
            if isinstance(m, HbmMemory):
                if m.offset % sb:
                    self.add("stick_alignment", f"{t.id}: device-memory offset {m.offset} not stick aligned", tensor=t.id)
                end = m.offset + layout_nbytes(t.layout, t.dtype) if t.dtype in DTYPE_BYTES else 0
                if m.offset < 0 or end > hw.device_memory_usable_bytes:
                    self.add("device_memory", f"{t.id}: bytes [{m.offset}, {end}) outside usable device memory",
                             tensor=t.id)
            else:
                if m.lx_address % sb or m.size_per_core % sb:
                    self.add("stick_alignment", f"{t.id}: LX address {m.lx_address} / size {m.size_per_core} "
                                                f"not stick aligned", tensor=t.id)
                if m.lx_address < 0 or m.lx_address + m.size_per_core > hw.lx_capacity_bytes:
                    self.add("lx_capacity", f"{t.id}: LX buffer [{m.lx_address}, {m.lx_address + m.size_per_core}) "
                                            f"ends past the capacity {hw.lx_capacity_bytes}", tensor=t.id)
                if m.live_to < m.live_from:
                    self.add("lx_live_range", f"{t.id}: live range [{m.live_from}, {m.live_to}] is empty", tensor=t.id)
        for t in self.tmap.values():
            if isinstance(t.memory, HbmMemory) and t.memory.alias_of is not None:
                src = self.tmap.get(t.memory.alias_of)
                if src is None or not isinstance(src.memory, HbmMemory):
                    self.add("alias_illegal", f"{t.id}: alias of {t.memory.alias_of}, which is not in device memory",
                             tensor=t.id)
                elif src.memory.offset != t.memory.offset:
                    self.add("alias_illegal", f"{t.id}: alias of {src.id} at another offset", tensor=t.id)
        for role, names in (("input", self.p.inputs), ("output", self.p.outputs)):
            for n in names:
                if n not in self.tmap:
                    self.add("unknown_tensor", f"program {role} {n} is not declared", tensor=n)
                elif not isinstance(self.tmap[n].memory, HbmMemory):
                    self.add("io_memory", f"program {role} {n} must be in device memory", tensor=n)

    # -- ops ----------------------------------------------------------------------------------
    def check_ops(self):
        hw = self.hw
        p = self.p
        written: dict[str, int] = {t: -1 for t in p.inputs if t in self.tmap}
        bundle_of_op: dict[int, int] = {}
        seen_ids = set()
        for k, o in enumerate(p.ops):
            bundle_of_op[k] = o.bundle
            if o.id in seen_ids:
                self.add("schema", f"op id {o.id} used twice", op=o.id)
            seen_ids.add(o.id)
            if o.prim is None:
                self.add("schema", f"{o.id}: op has no loop nest", op=o.id)
                continue
            try:
                prim = parsed_prim(o.prim)
            except (KeyError, ValueError, TypeError) as e:
                self.add("schema", f"{o.id}: malformed loop nest: {e}", op=o.id)
                continue
            names = [a.tensor for a in prim.inputs] + [prim.output.tensor]
            missing = [n for n in names if n not in self.tmap]
            if missing:
                for n in missing:
                    self.add("unknown_tensor", f"{o.id}: references undeclared tensor {n}", op=o.id, tensor=n)
                continue
            if not self._check_shapes(o.id, prim):
                continue
            self.prims[o.id] = prim
            for a in prim.inputs:
                if a.tensor not in written:
                    self.add("read_before_write", f"{o.id}: reads {a.tensor} before it is produced or loaded",
                             op=o.id, tensor=a.tensor)
            out = prim.output.tensor
            if out in written:
                self.add("multiple_producers", f"{o.id}: writes {out}, already "
                                               f"{'a program input' if written[out] < 0 else 'written'}",
                         op=o.id, tensor=out)
            else:
                written[out] = k
            self._check_kind(o, prim)
            self._check_split_and_geometry(k, o, prim)
        for t in p.outputs:
            if t in self.tmap and t not in written:
                self.add("read_before_write", f"program output {t} is never produced", tensor=t)
        # an alias claim must come from an alias op
        alias_ops = {self.prims[o.id].output.tensor for o in p.ops if o.id in self.prims
                     and (o.alias or in_place_table(self.prims[o.id]) is not None)}
        for t in self.tmap.values():
            if isinstance(t.memory, HbmMemory) and t.memory.alias_of and t.id not in alias_ops:
                self.add("alias_illegal", f"{t.id}: declared an alias but no alias copy or in-place op produces it",
                         tensor=t.id)
        self.written = written
        self._check_in_place_hazards()

    def _check_in_place(self, o, prim: PrimOp, table: str) -> None:
        """An in-place op's output is its table's bytes: both in device memory, the output
        declared `alias_of` the table's root, in the table's layout and dtype; the op's other
        operands are not those bytes (a row read while rows are stored)."""
        tm = self.tmap
        tt, out = tm[table], tm[prim.output.tensor]
        if not (isinstance(tt.memory, HbmMemory) and isinstance(out.memory, HbmMemory)):
            self.add("in_place", f"{o.id}: an in-place op needs its table {table} and output {out.id} in device "
                                 f"memory", op=o.id, tensor=out.id)
            return
        root = resolve_alias(tm, table)
        if out.memory.alias_of != root or out.memory.offset != tt.memory.offset:
            self.add("in_place", f"{o.id}: output {out.id} must be declared alias_of {root} (the table's bytes)",
                     op=o.id, tensor=out.id)
        if out.dtype != tt.dtype or out.layout != tt.layout:
            self.add("in_place", f"{o.id}: output {out.id} must have its table {table}'s dtype and layout",
                     op=o.id, tensor=out.id)
        for a in prim.inputs[1:]:
            if resolve_alias(tm, a.tensor) == root:
                self.add("in_place", f"{o.id}: operand {a.tensor} shares the bytes the op updates", op=o.id,
                         tensor=a.tensor)

    def _check_in_place_hazards(self) -> None:
        """After an in-place op updates a tensor's bytes, its old value is gone: no later op
        reads it (nor any other view of those bytes made before the update), and no program
        output names it (the host reads outputs after the program)."""
        tm = self.tmap
        stale: dict[str, str] = {}   # tensor -> the op whose update made it stale
        for k, o in enumerate(self.p.ops):
            prim = self.prims.get(o.id)
            if prim is None:
                continue
            for a in prim.inputs:
                if a.tensor in stale:
                    self.add("in_place", f"{o.id}: reads {a.tensor} after {stale[a.tensor]} updated its bytes in "
                                         f"place", op=o.id, tensor=a.tensor)
            table = in_place_table(prim)
            if table is None or not isinstance(tm[table].memory, HbmMemory):
                continue
            root = resolve_alias(tm, table)
            for t in tm.values():   # every earlier view of those bytes (the new value is the output)
                if t.id != prim.output.tensor and self.written.get(t.id, k) < k and \
                        isinstance(t.memory, HbmMemory) and resolve_alias(tm, t.id) == root:
                    stale.setdefault(t.id, o.id)
        for t in self.p.outputs:
            if t in stale:
                self.add("in_place", f"program output {t} is the value {stale[t]} overwrote in place", tensor=t)

    def _check_shapes(self, op_id: str, prim: PrimOp) -> bool:
        ok = True
        n_it = len(prim.iter_dims)
        if prim.kind == "scatter":
            for msg in scatter_problems(prim):
                self.add("schema", f"{op_id}: malformed scatter: {msg}", op=op_id)
                ok = False
            if not ok:
                return False
        for role, acc in [("input", a) for a in prim.inputs] + [("output", prim.output)]:
            t = self.tmap[acc.tensor]
            if len(acc.dims) != len(t.shape):
                self.add("shape_mismatch", f"{op_id}: {role} {acc.tensor} has rank {len(t.shape)}, "
                                           f"loop nest maps {len(acc.dims)} dims", op=op_id, tensor=acc.tensor)
                ok = False
                continue
            if prim.kind == "copy" and role == "input":
                if any(d is not None and not (0 <= d < n_it) for d in acc.dims):
                    self.add("shape_mismatch", f"{op_id}: copy input {acc.tensor} maps dims {list(acc.dims)}, "
                                               f"the loop nest has {n_it}", op=op_id, tensor=acc.tensor)
                    ok = False
                continue  # read whole through the copy's strided maps
            table_like = (prim.kind == "gather" and role == "input" and acc is prim.inputs[0]) or \
                (prim.kind == "scatter" and (role == "output" or acc is prim.inputs[0]))
            for j, d in enumerate(acc.dims):
                if d is None:
                    if t.shape[j] != 1 and not (table_like and j in prim.body.table_axes):
                        self.add("shape_mismatch", f"{op_id}: {acc.tensor} dim {j} unmapped but size {t.shape[j]}",
                                 op=op_id, tensor=acc.tensor)
                        ok = False
                elif not (0 <= d < n_it):
                    self.add("shape_mismatch", f"{op_id}: {acc.tensor} dim {j} maps to no iteration dim",
                             op=op_id, tensor=acc.tensor)
                    ok = False
                elif prim.kind in ("copy",) and role == "input":
                    continue
                elif table_like and j in prim.body.table_axes:
                    continue
                elif prim.iter_dims[d].size != t.shape[j]:
                    self.add("shape_mismatch", f"{op_id}: {acc.tensor} dim {j} has size {t.shape[j]}, "
                                               f"iteration dim {prim.iter_dims[d].name} {prim.iter_dims[d].size}",
                             op=op_id, tensor=acc.tensor)
                    ok = False
        return ok

    def _check_kind(self, o, prim: PrimOp):
        tm = self.tmap
        ins = [tm[a.tensor].layout.stick_dim for a in prim.inputs]
        out = tm[prim.output.tensor].layout.stick_dim
        if o.kind == "compute":
            want_unit = "dma" if o.alias else ex_unit(prim)
            if o.opfunc != opfunc(prim) or o.ex_unit != want_unit:
                self.add("op_decl_mismatch", f"{o.id}: declared {o.opfunc} on {o.ex_unit}, its loop nest is "
                                             f"{opfunc(prim)} on {want_unit}", op=o.id)
            if matching_choice(prim, ins, out) is None:
                self.add("op_rule", f"{o.id}: operand sticks {ins} -> {out} match none of the {prim.kind} "
                                    f"op's stick options", op=o.id)
            table = in_place_table(prim)
            if table is not None:
                self._check_in_place(o, prim, table)
            if o.alias:
                src = prim.inputs[0].tensor if prim.inputs else None
                dst = prim.output.tensor
                if prim.kind != "copy" or src is None:
                    self.add("alias_illegal", f"{o.id}: only a copy can be an alias", op=o.id)
                    return
                s, d = tm[src], tm[dst]
                legal = copy_is_alias(prim, s.shape, s.layout.dim_order, d.shape, d.layout.dim_order,
                                      s.dtype, d.dtype, self.hw.stick_bytes)
                if not legal:
                    self.add("alias_illegal", f"{o.id}: the bytes of {src} in its layout are not {dst} in its layout",
                             op=o.id, tensor=dst)
                elif not (isinstance(d.memory, HbmMemory) and isinstance(s.memory, HbmMemory)
                          and d.memory.alias_of == resolve_alias(tm, src)):
                    self.add("alias_illegal", f"{o.id}: alias output {dst} must be declared alias_of "
                                              f"{resolve_alias(tm, src)} in device memory", op=o.id, tensor=dst)
            return
        # restickify / relayout
        if o.opfunc != o.kind:
            self.add("op_decl_mismatch", f"{o.id}: a {o.kind} op declares opfunc {o.opfunc}", op=o.id)
        if len(prim.inputs) != 1 or o.src != prim.inputs[0].tensor or o.dst != prim.output.tensor:
            self.add("restickify_invalid", f"{o.id}: src/dst do not match its loop nest", op=o.id)
            return
        s, d = tm[o.src], tm[o.dst]
        if list(s.shape) != list(d.shape) or s.dtype != d.dtype or prim.kind != "pointwise" \
                or list(prim.inputs[0].dims) != list(range(len(s.shape))) \
                or list(prim.output.dims) != list(range(len(s.shape))):
            self.add("restickify_invalid", f"{o.id}: {o.src} -> {o.dst} is not one tensor in two layouts",
                     op=o.id)
        if o.kind == "relayout" and not (isinstance(s.memory, LxMemory) and isinstance(d.memory, LxMemory)):
            self.add("restickify_invalid", f"{o.id}: an LX relayout needs both tensors LX-resident", op=o.id)

    def _check_lx_write(self, k: int, o, tname: str, m, need) -> None:
        """Op `k` writes LX tensor `tname`: its live range starts there and, unless it is
        sized per tile (check_tile_buffers), the largest box a core writes (`need()`, bytes)
        fits the buffer."""
        if k != m.live_from:
            self.add("lx_live_range", f"{o.id} (op {k}) writes LX tensor {tname} whose live range "
                                      f"starts at {m.live_from}", op=o.id, tensor=tname)
        if m.per_tile:
            return
        need = need()
        if need > m.size_per_core:
            self.add("lx_size", f"{o.id}: a core writes {need} bytes of {tname} into an LX buffer of "
                                f"{m.size_per_core}", op=o.id, tensor=tname)

    def _check_lx_read(self, k: int, o, tname: str, m) -> None:
        """Op `k` reads LX tensor `tname`: inside its live range, and in the bundle that wrote
        it unless the hardware keeps LX contents across bundles."""
        if not (m.live_from < k <= m.live_to):
            self.add("lx_live_range", f"{o.id} (op {k}) reads LX tensor {tname} outside its live range "
                                      f"[{m.live_from}, {m.live_to}]", op=o.id, tensor=tname)
        if not self.hw.lx_persists_across_bundles and 0 <= m.live_from < len(self.p.ops) and \
                self.p.ops[m.live_from].bundle != o.bundle:
            self.add("lx_cross_bundle", f"{o.id} (bundle {o.bundle}) reads LX tensor {tname} written in "
                                        f"bundle {self.p.ops[m.live_from].bundle}", op=o.id, tensor=tname)

    def _check_split_and_geometry(self, k: int, o, prim: PrimOp):
        if not self.fast:
            return self._check_split_and_geometry_ref(k, o, prim)
        tm = self.tmap
        pk = prim_key(prim)
        if pk is None:
            return self._check_split_and_geometry_ref(k, o, prim)
        # the op's content: everything `_op_geometry` reads (an LX buffer's size and live
        # range are checked against the record on every call, not part of it)
        f = [o.id, o.num_cores_used]
        for n in [a.tensor for a in prim.inputs] + [prim.output.tensor]:
            t = tm[n]
            put_tensor(f, t)
            if isinstance(t.memory, HbmMemory):
                f.append("hbm")
            else:
                f.append("lx")
                f.append(flag(t.memory.per_tile))
        put_dict(f, o.core_split)
        put_slices(f, o.core_slices)
        put_dict(f, o.temporal_tiles)
        fk = flat_key(f)
        if fk is None:
            return self._check_split_and_geometry_ref(k, o, prim)
        key = (pk, self.hw, fk)
        try:
            rec = _GEOM.get(key, lambda: self._op_geometry(o, prim))
        except Exception:
            # a malformed op the pure part trips on: the reference path reports it as it would
            return self._check_split_and_geometry_ref(k, o, prim)
        for code, msg in rec.pre:
            self.add(code, msg, op=o.id)
        if not rec.ok:
            return
        self.geometry_ok.add(o.id)
        self._rec[o.id] = rec
        self._rec_at[k] = rec
        if rec.early:
            return
        self._ranges[o.id] = (rec.gran, rec.ranges)
        for code, msg, tensor in rec.mid:
            self.add(code, msg, op=o.id, tensor=tensor)
        for idx, tname, kind, data in rec.operands:
            if kind == "hbm":
                if data is not None:
                    self.add("span_exceeded", data, op=o.id, tensor=tname)
                continue
            m = tm[tname].memory
            if kind == "lx_out":
                self._check_lx_write(k, o, tname, m, lambda: data)
                continue
            self._check_lx_read(k, o, tname, m)
            if m.per_tile:
                continue
            prec = self._rec_at.get(m.live_from) if 0 <= m.live_from < len(self.p.ops) else None
            held_key = None
            if prec is not None and (pprim := self.prims.get(self.p.ops[m.live_from].id)) is not None \
                    and pprim.output.tensor == tname:
                # what the producer wrote is its record's output boxes (`lx_boxes`)
                held_key = ("held", prec.serial, idx)
            bad = rec._order.get(held_key, False) if held_key is not None else False
            if bad is False:
                held = self.lx_boxes(tname)
                bad = None
                for c, b in data.items():
                    if held is None or c not in held or not box_contains(held[c], b):
                        bad = c
                        break
                if held_key is not None:
                    rec._order[held_key] = bad
            if bad is not None:
                self.add("lx_slice_mismatch", f"{o.id}: core {bad} reads a slice of {tname} its LX does not "
                                              f"hold (written with another per-core slicing)",
                         op=o.id, tensor=tname)

    def _op_geometry(self, o, prim: PrimOp) -> _OpGeom:
        """The part of `_check_split_and_geometry_ref` that depends on the op's content alone
        (same checks, same order; the reference stays the definition)."""
        hw = self.hw
        tm = self.tmap
        rec = _OpGeom()
        rec.prim = prim
        rec.temporal_tiles = dict(o.temporal_tiles)
        rec.out_shape = tuple(tm[prim.output.tensor].shape)
        layouts = {n: tm[n].layout for n in [a.tensor for a in prim.inputs] + [prim.output.tensor]}
        dtypes = {n: tm[n].dtype for n in layouts}
        gran = op_granules(prim, layouts, dtypes, hw.stick_bytes)
        rec.gran = gran
        split = {n: f for n, f in o.core_split.items()}
        split_issues = check_split(prim, split, gran, hw.cores)
        rec.pre.extend(split_issues)
        if split_issues:
            return rec
        real = {n: f for n, f in split.items() if f > 1}
        slice_problems = core_slice_problems(o, real, hw.cores)
        rec.pre.extend(slice_problems)
        slices_ok = not slice_problems
        if not slices_ok:
            return rec
        rec.ok = True
        span = hw.per_core_span_bytes
        names = [a.tensor for a in prim.inputs] + [prim.output.tensor]
        ranges = core_ranges(prim, real, o.core_slices, gran)
        rec.ranges = ranges
        if not o.temporal_tiles and all(
                isinstance(tm[n].memory, HbmMemory) and layout_nbytes(tm[n].layout, tm[n].dtype) <= span
                for n in names):
            rec.early = True
            return rec
        by_name = {d.name: i for i, d in enumerate(prim.iter_dims)}
        for n, f in o.temporal_tiles.items():
            if n not in by_name or not isinstance(f, int) or f < 1:
                rec.mid.append(("temporal_tiles", f"{o.id}: temporal tiles {n}={f!r} invalid", None))
                continue
            i = by_name[n]
            for rng in ranges.values():
                units = split_units(rng[i][1] - rng[i][0], gran.get(i, 1))
                if f > max(units, 1):
                    rec.mid.append(("temporal_tiles", f"{o.id}: {f} tiles along {n} exceed the {units} units a "
                                                      f"core has", None))
                    break
        out_t = tm[prim.output.tensor]
        if isinstance(out_t.memory, LxMemory) and reduction_split(prim, real):
            rec.mid.append(("lx_reduction_split", f"{o.id}: splits a reduction dim across cores, so its output "
                                                  f"{out_t.id} (summed across cores) cannot stay in LX", out_t.id))
        operands = [(i, a.tensor) for i, a in enumerate(prim.inputs)] + [(-1, prim.output.tensor)]
        for idx, tname in operands:
            t = tm[tname]
            if isinstance(t.memory, HbmMemory) and layout_nbytes(t.layout, t.dtype) <= span:
                continue
            boxes = {c: operand_box(prim, idx, rng, t.shape, copy_reads=True) for c, rng in ranges.items()}
            if isinstance(t.memory, HbmMemory):
                worst = max(box_span_bytes(b, t.layout, t.dtype) for b in set(boxes.values()))
                rec.operands.append((idx, tname, "hbm", None if worst <= span else
                                     f"{o.id}: a core's access to {tname} spans {worst} bytes > {span}"))
                continue
            if idx < 0:
                need = 0 if t.memory.per_tile else \
                    max(box_lx_bytes(b, t.layout, t.dtype) for b in set(boxes.values()))
                rec.operands.append((idx, tname, "lx_out", need))
                if not rec._out_boxes:
                    rec._out_boxes = boxes
                continue
            rec.operands.append((idx, tname, "lx_in", boxes))
        return rec

    def _check_split_and_geometry_ref(self, k: int, o, prim: PrimOp):
        hw = self.hw
        tm = self.tmap
        layouts = {n: tm[n].layout for n in [a.tensor for a in prim.inputs] + [prim.output.tensor]}
        dtypes = {n: tm[n].dtype for n in layouts}
        gran = op_granules(prim, layouts, dtypes, hw.stick_bytes)
        split = {n: f for n, f in o.core_split.items()}
        split_issues = check_split(prim, split, gran, hw.cores)
        for code, msg in split_issues:
            self.add(code, msg, op=o.id)
        if split_issues:
            return
        real = {n: f for n, f in split.items() if f > 1}
        slice_problems = core_slice_problems(o, real, hw.cores)
        for code, msg in slice_problems:
            self.add(code, msg, op=o.id)
        slices_ok = not slice_problems
        if not slices_ok:
            return
        self.geometry_ok.add(o.id)
        span = hw.per_core_span_bytes
        names = [a.tensor for a in prim.inputs] + [prim.output.tensor]
        if not o.temporal_tiles and all(
                isinstance(tm[n].memory, HbmMemory) and layout_nbytes(tm[n].layout, tm[n].dtype) <= span
                for n in names):
            return  # nothing below depends on the per-core slices of this op
        ranges = core_ranges(prim, real, o.core_slices, gran)
        self._ranges[o.id] = (gran, ranges)
        # temporal tiles divide each core's slice (in whole granules)
        by_name = {d.name: i for i, d in enumerate(prim.iter_dims)}
        for n, f in o.temporal_tiles.items():
            if n not in by_name or not isinstance(f, int) or f < 1:
                self.add("temporal_tiles", f"{o.id}: temporal tiles {n}={f!r} invalid", op=o.id)
                continue
            i = by_name[n]
            for rng in ranges.values():
                units = split_units(rng[i][1] - rng[i][0], gran.get(i, 1))
                if f > max(units, 1):
                    self.add("temporal_tiles", f"{o.id}: {f} tiles along {n} exceed the {units} units a core has",
                             op=o.id)
                    break
        out_t = tm[prim.output.tensor]
        if isinstance(out_t.memory, LxMemory) and reduction_split(prim, real):
            self.add("lx_reduction_split", f"{o.id}: splits a reduction dim across cores, so its output "
                                           f"{out_t.id} (summed across cores) cannot stay in LX", op=o.id,
                     tensor=out_t.id)
        operands = [(i, a.tensor) for i, a in enumerate(prim.inputs)] + [(-1, prim.output.tensor)]
        for idx, tname in operands:
            t = tm[tname]
            if isinstance(t.memory, HbmMemory) and layout_nbytes(t.layout, t.dtype) <= span:
                continue  # no access to this tensor can span more than the whole tensor
            boxes = {c: operand_box(prim, idx, rng, t.shape, copy_reads=True) for c, rng in ranges.items()}
            if isinstance(t.memory, HbmMemory):
                worst = max(box_span_bytes(b, t.layout, t.dtype) for b in boxes.values())
                if worst > span:
                    self.add("span_exceeded", f"{o.id}: a core's access to {tname} spans {worst} bytes "
                                              f"> {span}", op=o.id, tensor=tname)
                continue
            m = t.memory
            if idx < 0:
                self._check_lx_write(k, o, tname, m,
                                     lambda: max(box_lx_bytes(b, t.layout, t.dtype) for b in boxes.values()))
                continue
            self._check_lx_read(k, o, tname, m)
            if m.per_tile:
                continue  # contained tile by tile: check_tile_buffers
            held = self.lx_boxes(tname)
            for c, b in boxes.items():
                if held is None or c not in held or not box_contains(held[c], b):
                    self.add("lx_slice_mismatch", f"{o.id}: core {c} reads a slice of {tname} its LX does not "
                                                  f"hold (written with another per-core slicing)",
                             op=o.id, tensor=tname)
                    break

    def op_ranges(self, o, prim: PrimOp) -> tuple[dict, dict]:
        """(granules, per-core iteration ranges) of op `o`, computed once."""
        if o.id not in self._ranges and o.id in self._rec:
            rec = self._rec[o.id]
            self._ranges[o.id] = (rec.gran, rec.ranges)
        if o.id not in self._ranges:
            tm = self.tmap
            layouts = {n: tm[n].layout for n in [a.tensor for a in prim.inputs] + [prim.output.tensor]}
            dtypes = {n: tm[n].dtype for n in layouts}
            gran = op_granules(prim, layouts, dtypes, self.hw.stick_bytes)
            real = {n: f for n, f in o.core_split.items() if f > 1}
            self._ranges[o.id] = (gran, core_ranges(prim, real, o.core_slices, gran))
        return self._ranges[o.id]

    # -- bundles ------------------------------------------------------------------------------------
    def check_bundles(self):
        p = self.p
        order = {o.id: k for k, o in enumerate(p.ops)}
        by_id = {o.id: o for o in p.ops}
        covered: list[str] = []
        prev_end = -1
        io = io_roots(p, self.tmap)
        exts = {b.id: external_tensors(p, [oid for oid in b.ops if oid in order], self.tmap, by_id)
                for b in p.bundles}
        pool = any(ext - io for ext in exts.values())
        limit = self.hw.bundle_tensor_limit
        for b in p.bundles:
            idx = [order.get(oid) for oid in b.ops]
            if any(i is None for i in idx):
                self.add("bundle_structure", f"bundle {b.id} lists unknown ops")
                continue
            if idx != list(range(prev_end + 1, prev_end + 1 + len(idx))):
                self.add("bundle_structure", f"bundle {b.id} is not the next consecutive group of ops")
            if idx:
                prev_end = idx[-1]
            for oid in b.ops:
                if p.ops[order[oid]].bundle != b.id:
                    self.add("bundle_structure", f"op {oid} is listed in bundle {b.id} but says bundle "
                                                 f"{p.ops[order[oid]].bundle}", op=oid)
            covered += b.ops
            ext = exts[b.id]
            if ext != set(b.external_tensors):
                self.add("bundle_structure", f"bundle {b.id} declares external tensors "
                                             f"{sorted(b.external_tensors)}, references {sorted(ext)}")
            used = self.hw.bundle_slots(ext, io, pool)
            if used > limit:
                counted = sorted(ext) if self.hw.bundle_tensor_limit_rule == "device_memory" else \
                    sorted(ext & io) + (["<intermediate pool>"] if pool else [])
                self.add("bundle_limit", f"bundle {b.id} takes {used} of its {limit} tensor slots "
                                         f"({self.hw.bundle_tensor_limit_rule}): {counted}")
        if sorted(covered) != sorted(o.id for o in p.ops) or len(covered) != len(set(covered)):
            self.add("bundle_structure", "bundles do not cover every op exactly once")


def validate_program(program: Union[Program, dict, str, bytes], hw) -> list[ProgramIssue]:
    """Every validity rule (docs/simulator.md); [] when the program is valid on `hw`."""
    prog, issues = parse_program(program)
    if prog is None:
        return issues
    ck = _Checker(prog, hw)
    if prog.hardware != hw.name or prog.stats.hardware_digest != hw.digest:
        ck.add("hardware_mismatch", f"program targets {prog.hardware!r} digest {prog.stats.hardware_digest[:12]}, "
                                    f"hardware is {hw.name!r} digest {hw.digest[:12]}")
    ck.check_tensors()
    if any(i.code == "schema" for i in ck.issues):
        return ck.issues  # the later checks read every tensor's dtype and declaration
    for check in (ck.check_ops, ck.check_tile_buffers, ck.check_kernel_order, ck.check_memory, ck.check_bundles):
        try:
            check()
        except (KeyError, IndexError, TypeError, ValueError, AttributeError, ArithmeticError, AssertionError) as e:
            # A malformed program a check did not foresee: still a verdict, never a crash.
            ck.add("schema", f"malformed program ({check.__name__.removeprefix('check_')} check: "
                             f"{type(e).__name__}: {e})")
            break
    return ck.issues
