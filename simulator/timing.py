"""Timing model: how long a SuperDSC program takes on the target, op by op, core by core.

`time_program(program, hw) -> TimingReport`. Analytic per *tile class*: the cores of an op
whose work slices have the same extents cost the same, so an op is priced once per class
(usually one or two classes), never per element — a real-size decoder layer times in well
under a second. Every rate comes from the hardware file (`target.hardware`); nothing
here is keyed on a shape, an op name or a published measurement. docs/simulator-timing.md
derives each term.

Per op (all cores of an op start together after a barrier; the next op starts when the
slowest core is done):
- device-memory traffic: every operand that lives in device memory moves its per-core
  box in whole sticks; the bytes of all cores share one bus (`dram_oneway_gbps`) and a
  kernel that both reads and writes pays the read/write turnaround on min(R, W) when
  several cores interleave their streams. LX-resident operands move no device-memory bytes;
  graph inputs and outputs cross device memory once even when resident (clone in/out).
- access patterns measured on device: a pointwise op with a broadcast operand (loaded
  once, not per core) streams at `broadcast_op_gbps`; a restickify at `restickify_gbps`;
  a reduction along the stick dim reads at the rows-dependent `reduction_read_curve`, one
  across rows at `cross_row_reduction_gbps`.
- the bus rate a kernel reaches is capped by what its active cores can issue
  (`dram_core_count_curve`): a kernel on few cores streams slower.
- a matmul operand the core split does not index is needed by every core of that split
  (its fan-out f): it crosses the bus once, like any other byte, and is delivered to up
  to `shared_read_free_fanout` cores at no extra cost; a wider fan-out pays a delivery
  term that grows as (f / free)^`shared_read_fanout_exponent` (fitted on device data,
  docs/simulator-timing.md "Calibration").
- compute: matmul on the PT array at the sustained rate, or the default-layout /
  batch-outer bmm rate, derated for short per-core M slices; pointwise/reduce on the SFP
  at whole sticks per cycle.
- temporal tiles: loads overlap compute when double buffering fits in LX (the back-end's
  working reserve plus the LX the plan leaves free); each tile iteration costs
  `loop_overhead_us`; a small per-core tile underfills the stream (`underfill_curve`); a
  per-tile working set past `lx_spill_knee_bytes` spills and runs slower. Consecutive ops
  of one bundle with the same temporal tiling form one coarse-tiled fused kernel: each
  core loads each box of an external tensor once (a later member reads it free only where
  each of its cores reads inside a box that core loaded), a member's result is on chip for
  later members (each tile is computed on chip, on its core: a later member whose every
  core reads inside the box that core wrote reads nothing from device memory; a result
  stored in device memory is still written there), and it pays the loop overhead once.
- a split reduction dim combines partial sums over the ring.
- grouped (mixture-of-experts) matmuls are priced by their own terms
  (simulator/timing_terms.py, "grouped matmul") on the matmul PT rate: only routed rows are computed, only the experts a
  core's rows reach are loaded, a split over experts writes disjoint rows (no ring).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from target.primitives import (Const, In, MatmulBody, PointwiseBody, PrimOp, ReduceBody)
from target.geometry import (LRU, box_contains, box_lx_bytes, caches_enabled, core_ranges, dim_chunk,
                                flat_key, op_granules, operand_box, parsed_prim, prim_key, put_dict, put_layout, put_slices,
                                put_tensor)
from simulator.timing_terms import (grouped_compute_ns, grouped_operand_bytes, grouped_rows, grouped_weight_floor,
                                    matmul_batch_dims, matmul_layout_stall, partials_combined_per_output_tile,
                                    reduction_tiles, tile_rereads, tile_share)
from target.hardware import Hardware, load_target
from target.interpreter import scatter_target
from target.superdsc import LxMemory, OpDecl, Program, TensorDecl, fused_group_key, lx_live_spans, tile_count
from simulator.timing_report import OpTiming, TimingReport

_GRAPH_INPUT_ROLES = ("user_input", "parameter", "buffer", "constant")
_TRANSCENDENTAL = frozenset({"exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "sin",
                             "cos", "gelu", "gelu_tanh", "silu", "pow", "div", "reciprocal",
                             "erfc", "log1p", "expm1", "log2", "log10", "tan", "atan", "asin", "acos", "sinh",
                             "cosh", "asinh", "acosh", "atanh", "atan2", "fmod"})


# -- per-op analysis -------------------------------------------------------------------------
@dataclass
class _Operand:
    tensor: TensorDecl
    is_output: bool
    in_lx: bool
    indexes_all_splits: bool
    replication: int            # cores of the split that load their own copy
    per_core: dict[int, int]  # tile class -> bytes one core moves (whole sticks)
    first_read: bool = True     # graph-input clone-in / fused-group first read


@dataclass
class _OpGeometry:
    prim: PrimOp
    classes: list
    split: dict[str, int]
    n_cores: int
    operands: list      # per input, then the output: (index, tensor id, replication, per-class bytes)
    # per operand (input index, -1 the output): per core, the box it touches (`OpTimer._core_boxes`)
    core_boxes: dict = field(default_factory=dict)
    memo: bool = False  # shared through `_GEOM`: read only


# per-op geometry shared between timers (the planners time many programs that differ in a
# few ops): keyed on everything `OpTimer._geometry` reads (`OpTimer._geometry_key`)
_GEOM = LRU(1024, "timing.op_geometry")


@dataclass
class _Class:
    extents: tuple[int, ...]    # per iteration dim, elements of one core's slice
    cores: list[int]


def overlapped_ns(mem: float, comp: float, tiles: int, hw: Hardware) -> float:
    """A double-buffered kernel's loads and compute: the longer of the two, plus the pipeline
    fill, the shorter one's first piece. The back end streams each tile (an untiled kernel
    is one tile) through its working buffer in `untiled_overlap_chunks` pieces (fitted: the
    device overlaps little), so a kernel of T tiles fills over one of T x chunks pieces."""
    return max(mem, comp) + min(mem, comp) / (max(1, tiles) * hw.untiled_overlap_chunks)


def _n_expr_ops(e) -> tuple[int, int]:
    """(arithmetic ops, transcendental ops) in a scalar expression."""
    if isinstance(e, (In, Const)):
        return 0, 0
    a, t = (0, 1) if e.fn in _TRANSCENDENTAL else (1, 0)
    for x in e.args:
        xa, xt = _n_expr_ops(x)
        a += xa
        t += xt
    return a, t


def _tile_classes(prim: PrimOp, op: OpDecl, granules: dict[int, int]) -> list[_Class]:
    """Group the op's cores by the extents of their work slices."""
    split = op.core_split
    chunks = []
    for i, d in enumerate(prim.iter_dims):
        f = split.get(d.name, 1)
        chunks.append(d.size if f <= 1 else dim_chunk(d.size, f, granules.get(i, 1)))
    slices = op.core_slices or []
    if not slices:
        return [_Class(tuple(chunks), [0])]
    # per dim, the extent of each slice index (the last slices of a padded dim are short)
    per_dim = []
    for i, d in enumerate(prim.iter_dims):
        f = split.get(d.name, 1)
        per_dim.append((d.name, d.size, None if f <= 1 else
                        [min((k + 1) * chunks[i], d.size) - min(k * chunks[i], d.size) for k in range(f)]))
    classes: dict[tuple[int, ...], list[int]] = {}
    for cs in slices:
        sl = cs.slice
        ext = tuple(size if ks is None else ks[sl.get(name, 0)] for name, size, ks in per_dim)
        classes.setdefault(ext, []).append(cs.core)
    return [_Class(e, c) for e, c in classes.items()]


def _box(prim: PrimOp, operand: int, extents: tuple[int, ...], shape: list[int]) -> tuple:
    """Per tensor dim (0, length) of the region one core touches (lengths only matter)."""
    acc = prim.output if operand < 0 else prim.inputs[operand]
    box = []
    for j, d in enumerate(acc.dims):
        if d is None or d >= len(extents):
            box.append((0, shape[j]))
        else:
            box.append((0, min(extents[d], shape[j])))
    return tuple(box)


class OpTimer:
    """Prices one op of a program at a time (`analyse`). time_program walks a program with
    it; the CP-SAT cost model (solver/spyre/cost_model.py) prices candidate strategies with it,
    so planner and simulator share one timing of every op."""

    def __init__(self, program: Program, hw: Hardware):
        self.p = program
        self.hw = hw
        self.tensors = program.tensor_map()
        self.layouts = {t: d.layout for t, d in self.tensors.items()}
        self.dtypes = {t: d.dtype for t, d in self.tensors.items()}
        n = len(program.ops)
        # LX bytes per core held by resident tensors at each op (difference array)
        diff = [0] * (n + 1)
        spans = lx_live_spans(program)
        for t in program.tensors:
            m = t.memory
            if isinstance(m, LxMemory):
                lo, hi = max(0, spans[t.id][0]), min(n - 1, spans[t.id][1])
                if lo <= hi:
                    diff[lo] += m.size_per_core
                    diff[hi + 1] -= m.size_per_core
        self.resident_live = []
        acc = 0
        for k in range(n):
            acc += diff[k]
            self.resident_live.append(acc)
        self.clone_in_done: set[str] = set()
        # tensors produced in the current fused group: per core, the box that core wrote
        self.group_produced: dict[str, dict] = {}
        self._geom: dict[str, _OpGeometry] = {}
        # whole programs share op geometry through `_GEOM`; the cost model's one-op programs
        # (a duck-typed Program per candidate strategy, rarely seen twice) keep it per timer:
        # there the keys cost more than the few hits save
        self._shared = isinstance(program, Program)

    def _core_boxes(self, prim: PrimOp, op: OpDecl, operand: int, td: TensorDecl) -> dict:
        """Per core, the box of `td` the op's operand touches (read only)."""
        g = self._geom.get(op.id)
        if g is not None and g.memo and g.prim is prim:
            got = g.core_boxes.get(operand)
            if got is None:
                got = g.core_boxes[operand] = self._core_boxes_ref(prim, op, operand, td)
            return got
        return self._core_boxes_ref(prim, op, operand, td)

    def _core_boxes_ref(self, prim: PrimOp, op: OpDecl, operand: int, td: TensorDecl) -> dict:
        gran = op_granules(prim, self.layouts, self.dtypes, self.hw.stick_bytes)
        split = {n: f for n, f in op.core_split.items() if f > 1}
        ranges = core_ranges(prim, split, op.core_slices or [], gran)
        return {c: operand_box(prim, operand, r, td.shape) for c, r in ranges.items()}

    def _served_on_chip(self, prim: PrimOp, op: OpDecl, operand: int, td: TensorDecl) -> bool:
        """A fused-group member's read of a tensor an earlier member produced is served on
        chip when every core reads only inside the box it produced itself."""
        made = self.group_produced[td.id]
        need = self._core_boxes(prim, op, operand, td)
        return all(c in made and box_contains(made[c], b) for c, b in need.items())

    def _loaded_on_chip(self, prim: PrimOp, op: OpDecl, operand: int, td: TensorDecl,
                        group_loaded: dict[str, dict]) -> bool:
        """A fused-group member's read of an external tensor is served on chip when every
        core reads only inside a box that core itself loaded earlier in the kernel; either
        way the boxes this read needs are on its cores afterwards. (A core never sees what
        another core loaded: data reaches a core's LX from device memory or from its own
        compute.) Copies and gathers read scattered pieces, not a box: never served."""
        if prim.body.kind in ("copy", "gather"):
            return False
        need = self._core_boxes(prim, op, operand, td)
        loaded = group_loaded.setdefault(td.id, {})
        served = bool(loaded) and all(any(box_contains(b, nb) for b in loaded.get(c, ()))
                                      for c, nb in need.items())
        if not served:
            for c, nb in need.items():
                loaded.setdefault(c, []).append(nb)
        return served

    def dram_ns(self, r: float, w: float, cores: int, gbps: Optional[float] = None) -> float:
        return self.hw.dram_ns(r, w, gbps=gbps, cores=cores)

    def _geometry(self, op: OpDecl) -> "_OpGeometry":
        """What of an op's timing does not depend on where its operands live: its loop nest,
        tile classes and per-core operand boxes. Memoized per op: the cost model prices one
        op under several residency combinations with one timer."""
        g = self._geom.get(op.id)
        if g is not None:
            return g
        prim = parsed_prim(op.prim)
        key = self._geometry_key(op, prim) if self._shared and caches_enabled() else None
        if key is None:
            g = self._geometry_of(op, prim)
        else:
            g = _GEOM.get(key, lambda: self._geometry_of(op, prim))
            g.memo = True
        self._geom[op.id] = g
        return g

    def _geometry_key(self, op: OpDecl, prim: PrimOp) -> Optional[tuple]:
        """What `_geometry_of` (and `_core_boxes`) read: the loop nest, the operand tensors'
        shapes, dtypes and layouts (as the timer holds them), the split, the core slices,
        the hardware. None: not keyable exactly (then computed afresh)."""
        pk = prim_key(prim)
        if pk is None:
            return None
        f = []
        for acc in list(prim.inputs) + [prim.output]:
            n = acc.tensor
            td = self.tensors[n]
            put_tensor(f, td)
            tl = self.layouts[n]
            if tl is td.layout:
                f.append(0)
            else:
                f.append(1)
                put_layout(f, tl)
            f.append(self.dtypes[n])
        put_dict(f, op.core_split)
        put_slices(f, op.core_slices or [])
        fk = flat_key(f)
        return None if fk is None else (pk, self.hw, fk)

    def _geometry_of(self, op: OpDecl, prim: PrimOp) -> "_OpGeometry":
        hw = self.hw
        granules = op_granules(prim, self.layouts, self.dtypes, hw.stick_bytes)
        classes = _tile_classes(prim, op, granules)
        split = {n: f for n, f in op.core_split.items() if f > 1}
        name_of = {i: d.name for i, d in enumerate(prim.iter_dims)}
        body = prim.body
        operands = []
        for idx, acc in list(enumerate(prim.inputs)) + [(-1, prim.output)]:
            td = self.tensors[acc.tensor]
            indexed = {name_of[d] for d in acc.dims if d is not None}
            repl = 1
            if not (idx >= 0 and body.kind == "copy") and not (idx == 0 and body.kind == "gather"):
                for nme, f in split.items():
                    if nme not in indexed:
                        repl *= f
            per_core = {}
            for ci, cl in enumerate(classes):
                if idx >= 0 and body.kind == "copy":
                    # a copy core reads the share of its piece (the elements the piece's
                    # strided map takes from this input) that its output slice needs
                    oshape = self.tensors[prim.output.tensor].shape
                    frac = 1.0
                    for (a, b), sz in zip(_box(prim, -1, cl.extents, oshape), oshape):
                        frac *= (b - a) / max(1, sz)
                    piece = body.maps[idx] if idx < len(body.maps) else None
                    elems = math.prod(piece.shape) if piece is not None else math.prod(td.shape)
                    per_core[ci] = int(math.ceil(elems * frac)) * hw.dtype_size(td.dtype)
                elif idx == 0 and body.kind == "gather":
                    # a gather core reads one table row per output row it writes
                    out_td = self.tensors[prim.output.tensor]
                    per_core[ci] = box_lx_bytes(_box(prim, -1, cl.extents, out_td.shape),
                                                out_td.layout, td.dtype)
                else:
                    per_core[ci] = box_lx_bytes(_box(prim, idx, cl.extents, td.shape), td.layout, td.dtype)
            if body.kind == "grouped_matmul" and idx in (0, 1):
                per_core = {ci: grouped_operand_bytes(prim, idx, cl.extents, b) for (ci, b), cl
                            in zip(per_core.items(), classes)}
            operands.append((idx, acc.tensor, repl, per_core))
        return _OpGeometry(prim, classes, split, sum(len(c.cores) for c in classes), operands)

    def analyse(self, k: int, op: OpDecl, group_loaded: Optional[dict[str, dict]]) -> OpTiming:
        """Times op `k`. `group_loaded` is None outside a fused kernel; inside one it maps each
        external tensor the kernel has read to the boxes each core loaded (updated here)."""
        hw = self.hw
        ot = OpTiming(op_id=op.id, opfunc=op.opfunc, ex_unit=op.ex_unit, kind=op.kind,
                      bundle=op.bundle, cores=max(1, op.num_cores_used))
        tiles = tile_count(op)
        ot.temporal_tiles = tiles
        if op.prim is None or op.alias:
            ot.bound_by = "none"
            if op.alias:
                ot.effects.append("alias: no data moves")
            return ot

        if op.kind == "compute" and parsed_prim(op.prim).body.kind == "scatter":
            return scatter_store_timing(self, op, parsed_prim(op.prim), ot)
        g = self._geometry(op)
        prim, classes, split, n_cores = g.prim, g.classes, g.split, g.n_cores
        ot.cores = n_cores
        body = prim.body
        is_matmul = isinstance(body, MatmulBody)
        is_grouped = body.kind == "grouped_matmul"

        # operands
        operands: list[_Operand] = []
        acc_idx: dict[int, int] = {}   # id(operand) -> input index, -1 for the output
        accesses = list(enumerate(prim.inputs)) + [(-1, prim.output)]
        for idx, tid, repl, per_core in g.operands:
            td = self.tensors[tid]
            operands.append(_Operand(td, idx < 0, isinstance(td.memory, LxMemory),
                                     repl == 1, repl, per_core))
            acc_idx[id(operands[-1])] = idx

        # ---- bytes --------------------------------------------------------------------
        read_unique: dict[int, float] = {}   # id(operand) -> its bytes over the bus (inputs read from device memory)
        r_shared = 0.0      # read bytes over the shared bus (aggregate)
        w_shared = 0.0
        delivery_ns = 0.0   # fan-out delivery of shared matmul operands beyond the free fan-out
        lx_core_bytes = 0.0    # per core bytes read/written in LX (worst class)
        core_bytes = {ci: 0.0 for ci in range(len(classes))}  # per-core device bytes per class
        red_split = 1
        for nme, f in split.items():
            if prim.iter_dims[[d.name for d in prim.iter_dims].index(nme)].kind == "reduction":
                red_split *= f
        for o in operands:
            tid = o.tensor.id
            graph_input = o.tensor.role in _GRAPH_INPUT_ROLES
            total_core = sum(o.per_core[ci] * len(cl.cores) for ci, cl in enumerate(classes))
            if o.is_output:
                if group_loaded is not None and red_split == 1:
                    # in a fused kernel each tile of a result is produced on chip, on the
                    # core that computed it: a later member reads it there when it needs
                    # no other core's part (whatever memory the result is stored in)
                    self.group_produced[tid] = self._core_boxes(prim, op, -1, o.tensor)
                unique = total_core / red_split
                if o.in_lx:
                    lx_core_bytes = max(lx_core_bytes, max(o.per_core.values()))
                    ot.lx_bytes += int(total_core)
                    if o.tensor.is_output:  # clone-out: a graph output still reaches device memory
                        w_shared += unique
                        ot.effects.append(f"clone-out {tid}")
                        for ci in core_bytes:
                            core_bytes[ci] += o.per_core[ci] / red_split
                else:
                    w_shared += unique
                    for ci in core_bytes:
                        core_bytes[ci] += o.per_core[ci] / red_split
                continue
            if o.in_lx:
                lx_core_bytes = max(lx_core_bytes, max(o.per_core.values()))
                ot.lx_bytes += int(total_core)
                if graph_input and tid not in self.clone_in_done:
                    # one clone serves every reader: its load is charged to the first
                    self.clone_in_done.add(tid)
                    whole = box_lx_bytes(tuple((0, s) for s in o.tensor.shape), o.tensor.layout,
                                         o.tensor.dtype)
                    r_shared += whole
                    ot.effects.append(f"clone-in {tid}")
                continue
            if group_loaded is not None:
                if tid in self.group_produced and self._served_on_chip(prim, op, acc_idx[id(o)], o.tensor):
                    ot.effects.append(f"fused: {tid} produced on chip")
                    continue
                if self._loaded_on_chip(prim, op, acc_idx[id(o)], o.tensor, group_loaded):
                    ot.effects.append(f"fused: {tid} already on chip")
                    continue
            if (is_matmul or is_grouped) and o.replication > 1:
                # one read on the bus, delivered to the f cores that share it
                unique = total_core / o.replication
                if is_grouped and acc_idx[id(o)] == 1:
                    unique = max(unique, grouped_weight_floor(prim, o.tensor))
                delivery_ns += hw.shared_read_delivery_ns(unique, o.replication)
                ot.effects.append(f"shared x{o.replication}: {tid}")
                r_shared += unique
                read_unique[id(o)] = unique
                for ci in core_bytes:
                    core_bytes[ci] += o.per_core[ci] / o.replication
                continue
            if o.replication > 1:
                # a broadcast operand is loaded once, not once per core
                unique = total_core / o.replication
                if body.kind != "copy":
                    ot.effects.append(f"broadcast once: {tid}")
            else:
                unique = total_core
            r_shared += unique
            read_unique[id(o)] = unique
            for ci in core_bytes:
                core_bytes[ci] += o.per_core[ci] / max(1, o.replication)

        # temporal tiles: an input the tiled dims do not index is the same box every tile,
        # and it is read again each tile (the loop's body reloads its operands; only an LX
        # resident escapes). Reading from device memory what a kernel of the program wrote
        # there (an intermediate) pays the write drain (`dram_raw_turnaround_ns_per_byte`):
        # on the device the dependent read follows its producer; the charge stays with the
        # reading op so the planner's per-op cost model sees it too.
        raw_bytes = 0.0
        for o in operands:
            unique = read_unique.get(id(o))
            if unique is None:
                continue
            again = tile_rereads(prim, op, acc_idx[id(o)])
            if again > 1:
                extra = unique * (again - 1)
                r_shared += extra
                ot.effects.append(f"re-read x{again}: {o.tensor.id}")
                for ci in core_bytes:
                    core_bytes[ci] += o.per_core[ci] / max(1, o.replication) * (again - 1)
            if o.tensor.role not in _GRAPH_INPUT_ROLES:
                raw_bytes += unique
        # K tiles: the output is revisited every tile; its fp32 partial sums stay on chip
        # when they fit in the LX the plan leaves free, else each further K tile reads and
        # writes them through device memory
        k_tiles = reduction_tiles(prim, op)
        if is_matmul and k_tiles > 1:
            out = operands[-1]
            out_core = max(out.per_core.values()) / hw.dtype_size(out.tensor.dtype)
            psum_core = out_core * hw.psum_bytes_per_element
            if psum_core > max(0, hw.lx_capacity_bytes - self.resident_live[k]):
                traffic = psum_core * n_cores * (k_tiles - 1)
                r_shared += traffic
                w_shared += traffic
                ot.effects.append(f"k-tile partial sums x{k_tiles - 1}: {psum_core / 2**20:.2f} MiB/core")
        ot.hbm_read_bytes += int(r_shared)
        ot.hbm_write_bytes = int(w_shared)

        # ---- memory time ----------------------------------------------------------------
        mem_ns = 0.0
        if op.kind == "relayout" or (op.kind == "restickify" and r_shared == 0 and w_shared == 0):
            # on-chip relayout: each core walks its LX slice
            mem_ns = lx_core_bytes * 2 / hw.lx_relayout_gbps_per_core
            ot.effects.append("lx relayout")
        elif op.kind == "restickify":
            mem_ns = min(self.dram_ns(r_shared, w_shared, n_cores),
                         (r_shared + w_shared) / hw.restickify_gbps)
            ot.effects.append("restickify")
        elif isinstance(body, ReduceBody) and body.fn != "cumsum" and r_shared > 0:
            red_dims = {i for i, d in enumerate(prim.iter_dims) if d.kind == "reduction"}
            src = prim.inputs[0]
            st = self.layouts[src.tensor].stick_dim
            stick_iter = src.dims[st] if st is not None and st < len(src.dims) else None
            if stick_iter in red_dims:
                rows = 1
                for i, d in enumerate(prim.iter_dims):
                    if d.kind == "parallel":
                        rows *= d.size
                gbps = hw.reduction_read_curve.gbps(rows)
                ot.effects.append(f"row reduction read {gbps:.0f} GB/s")
            else:
                gbps = hw.cross_row_reduction_gbps
                ot.effects.append("cross-row reduction")
            mem_ns = self.hw.dram_ns(r_shared, w_shared, gbps=gbps, cores=n_cores, access="reduction")
        else:
            mem_ns = self.dram_ns(r_shared, w_shared, n_cores)
            if isinstance(body, PointwiseBody) and w_shared > 0 and _is_broadcast_op(prim, operands):
                mem_ns = min(mem_ns, (r_shared + w_shared) / hw.broadcast_op_gbps)
                ot.effects.append("broadcast-operand op")

        # what limited the device-memory time on part of the machine (for the report)
        if mem_ns > 0 and r_shared + w_shared > 0:
            if r_shared / (n_cores * hw.dram_core_read_gbps) >= mem_ns * (1 - 1e-9):
                ot.effects.append(f"core-read cap {hw.dram_core_read_gbps:.0f} GB/s x{n_cores}")
            elif n_cores < hw.cores and "row reduction" not in " ".join(ot.effects) \
                    and "cross-row reduction" not in ot.effects:
                ot.effects.append(f"partial machine x{hw.dram_partial_machine_fraction:.2f}")

        # streamed-tile efficiency (non-matmul): small per-core tiles underfill the stream.
        # The tile is the largest operand's per-core box for one temporal tile: its rows are
        # everything outside the stick dim, its width the stick-dim extent.
        if not (is_matmul or is_grouped) and mem_ns > 0 and op.kind == "compute":
            cand = [(i, o) for i, o in zip([i for i, _ in accesses], operands)
                    if not (body.kind in ("copy", "gather") and not o.is_output)]
            idx, big = max(cand, key=lambda io: max(io[1].per_core.values()))
            worst = max(range(len(classes)), key=lambda ci: big.per_core[ci])
            box = _box(prim, idx, classes[worst].extents, big.tensor.shape)
            st = big.tensor.layout.stick_dim
            cols = (box[st][1] - box[st][0]) if st is not None else 1
            elems = 1
            for a, b in box:
                elems *= (b - a)
            rows = elems / max(1, cols) / tiles
            eff = hw.underfill_curve.efficiency(rows, cols)
            if eff < 1.0:
                mem_ns /= eff
                ot.effects.append(f"underfill x{eff:.2f}")

        # working set per tile per core
        # (an input the tiled dims do not index is streamed whole each tile by the back end,
        # like an untiled kernel's operand: it is not part of the tile's working set)
        share_of = {id(o): tile_share(prim, op, acc_idx[id(o)], tiles) for o in operands}
        ws_tile = sum(max(o.per_core.values()) * share_of[id(o)] for o in operands)
        streamed_tile = sum(max(o.per_core.values()) * share_of[id(o)] for o in operands if not o.in_lx)
        if tiles > 1 and mem_ns > 0:
            derate = hw.spill_derate(ws_tile)
            if derate < 1.0:
                mem_ns /= derate
                ot.effects.append(f"spill x{derate:.3f}")

        if raw_bytes > 0 and mem_ns > 0:
            mem_ns += raw_bytes * hw.dram_raw_turnaround_ns_per_byte
            ot.effects.append(f"read-after-write {raw_bytes / 2**20:.1f} MiB")

        repl_ns = delivery_ns
        # ---- compute time per class -------------------------------------------------------
        comp_ns = {}
        macs_total = 0
        dtype_in = self.dtypes[prim.inputs[0].tensor] if prim.inputs else self.dtypes[prim.output.tensor]
        if is_matmul:
            # the stall follows the batches one core's slice interleaves (per tile class)
            stalls = {ci: matmul_layout_stall(prim, self.tensors, hw, cl.extents) for ci, cl in enumerate(classes)}
            stall, inside = max(stalls.values(), key=lambda s: s[0]) if stalls else (0.0, [])
            if stall > 0:
                kind = " (projection)" if matmul_batch_dims(prim)[0] == [] or not [
                    i for i in matmul_batch_dims(prim)[0] if prim.iter_dims[i].size > 1] else ""
                ot.effects.append(f"batch-inside {'+'.join(inside)}{kind} +{stall * 1e3:.2f} ps/MAC")
            rate = hw.pt_mac_per_ns(dtype_in, "sustained")
            stick = hw.elems_per_stick(dtype_in)
            for ci, cl in enumerate(classes):
                stall = stalls[ci][0]
                # the array computes whole sticks: K and N run padded
                ext = [(-(-e // stick) * stick) if i in (body.k, body.n) else e
                       for i, e in enumerate(cl.extents)]
                macs = math.prod(ext)
                macs_total += math.prod(cl.extents) * len(cl.cores)
                eff = hw.pt_pass_efficiency(cl.extents[body.m])
                comp_ns[ci] = macs / (rate * eff) + macs * stall
            ot.macs = int(macs_total)
        elif body.kind in ("pointwise", "reduce") and op.kind == "compute":
            if isinstance(body, PointwiseBody):
                a, t = _n_expr_ops(body.expr)
            else:
                a, t = _n_expr_ops(body.expr)
                a += 1  # the fold
            cycles = max(1, a) + t * hw.sfp_transcendental_cycles
            stick_iter = None
            for acc in list(prim.inputs) + [prim.output]:
                st = self.layouts[acc.tensor].stick_dim
                if st is not None and st < len(acc.dims) and acc.dims[st] is not None:
                    stick_iter = acc.dims[st]
                    break
            per_stick = hw.elems_per_stick(dtype_in)
            for ci, cl in enumerate(classes):
                pts = 1
                for i, e in enumerate(cl.extents):
                    pts *= (-(-e // per_stick) * per_stick) if i == stick_iter else e
                sticks = pts / per_stick
                comp_ns[ci] = sticks * cycles / hw.sfp_sticks_per_ns_per_core
        elif is_grouped and op.kind == "compute":
            comp_ns = grouped_compute_ns(prim, classes, hw, dtype_in)
            ot.macs = int(sum(grouped_rows(prim, cl.extents) * cl.extents[body.n] * cl.extents[body.k]
                              * len(cl.cores) for cl in classes))
        elif body.kind in ("copy", "gather") and op.kind == "compute":
            # LX-to-LX data movement is an on-chip shuffle
            if lx_core_bytes > 0:
                for ci in range(len(classes)):
                    comp_ns[ci] = lx_core_bytes / hw.lx_relayout_gbps_per_core
        for ci in range(len(classes)):
            comp_ns.setdefault(ci, 0.0)

        # split-K partial sums are combined with the other K collaborators' output tile by
        # output tile (`partials_combined_per_output_tile`): nothing is held past the tile, so
        # nothing spills, but each tile's combine holds up the next tile's loads
        tile_combine = is_matmul and red_split > 1 and partials_combined_per_output_tile(prim, op)
        if tile_combine:
            ot.effects.append(f"partial sums combined per output tile x{red_split}")

        # ring: a split reduction dim sums partials across the cores of the split
        ring_ns = 0.0
        if is_grouped and red_split > 1 and split.get(prim.iter_dims[body.g].name, 1) == red_split:
            # a split over experts only: each core writes the rows routed to its experts,
            # disjoint from every other core's (nothing to sum)
            ot.effects.append(f"expert split x{red_split}: disjoint rows")
        elif red_split > 1:
            out = operands[-1]
            part = max(out.per_core.values())
            ring_ns = hw.ring_combine_ns(red_split, part)
            ot.ring_bytes = int((red_split - 1) * part * (n_cores // red_split))
            ot.effects.append(f"ring combine x{red_split}")

        # ---- overlap ------------------------------------------------------------------------
        reserve = hw.lx_bytes_per_core - hw.lx_capacity_bytes
        free_lx = max(0, hw.lx_capacity_bytes - self.resident_live[k])
        double_buffered = tiles == 1 or 2 * streamed_tile <= reserve + free_lx
        # a core whose partial sums are combined with other cores' output tile by output tile
        # waits for each tile's combine before it loads the next: loads and compute in series
        double_buffered = double_buffered and not tile_combine
        ot.double_buffered = double_buffered
        if not double_buffered:
            ot.effects.append("no double buffering")

        max_core_bytes = max(core_bytes.values()) if core_bytes else 0.0
        worst_ns = 0.0
        worst_mem = worst_comp = 0.0
        for ci, cl in enumerate(classes):
            share = (core_bytes[ci] / max_core_bytes) if max_core_bytes > 0 else 1.0
            m = mem_ns * share + repl_ns
            c = comp_ns[ci]
            if double_buffered:
                t = overlapped_ns(m, c, tiles, hw)
            else:
                t = m + c
            for core in cl.cores:
                ot.per_core[core] = (m / 1e3, c / 1e3)
            if t >= worst_ns:
                worst_ns, worst_mem, worst_comp = t, m, c
        overhead_ns = hw.loop_overhead_us * 1e3 * tiles if tiles > 1 else 0.0
        # a fused kernel overlaps its members' loads and compute (close_group): each member
        # brings its slowest core's of both, even when they are different cores
        worst_mem = max(m for m, _ in ot.per_core.values()) * 1e3 if ot.per_core else worst_mem
        worst_comp = max(c for _, c in ot.per_core.values()) * 1e3 if ot.per_core else worst_comp
        ot.memory_us = worst_mem / 1e3
        ot.compute_us = worst_comp / 1e3
        ot.ring_us = ring_ns / 1e3
        ot.overhead_us = overhead_ns / 1e3
        ot._body_ns = worst_ns  # type: ignore[attr-defined]
        ot.bound_by = _bound_by(worst_mem - repl_ns, repl_ns, worst_comp, ring_ns, overhead_ns)
        return ot


def scatter_store_timing(timer: OpTimer, op: OpDecl, prim: PrimOp, ot: OpTiming) -> OpTiming:
    """An in-place row store (`scatter`): its output is its table's bytes, so it moves only
    the rows it writes. Each core reads its slice of the values and the whole of the indices
    it needs, and writes its part of every row (in whole sticks: a row part is stored as the
    sticks it covers). Priced as one device-memory kernel of those bytes on the op's cores
    (`hw.dram_ns`); an operand held in LX moves no device-memory bytes. The rows actually
    written are the index positions (every row is stored: duplicates and out-of-range rows
    are data the timing does not see)."""
    hw = timer.hw
    tensors = timer.tensors
    split = {n: f for n, f in op.core_split.items() if f > 1}
    gran = op_granules(prim, timer.layouts, timer.dtypes, hw.stick_bytes)
    ranges = core_ranges(prim, split, op.core_slices or [], gran)
    n_rows = 1
    for d in {d for a in prim.inputs[2:] for d in a.dims if d is not None}:
        n_rows *= prim.iter_dims[d].size
    out = tensors[prim.output.tensor]
    dests = (0,) * len(prim.body.table_axes)
    read = write = 0.0
    per_core: dict[int, float] = {}
    for core, rng in ranges.items():
        b = 0.0
        if any(hi <= lo for lo, hi in rng):
            per_core[core] = 0.0
            continue
        row = box_lx_bytes(scatter_target(prim, dests, rng), out.layout, out.dtype)
        write += n_rows * row
        b += n_rows * row
        for i in range(1, len(prim.inputs)):
            td = tensors[prim.inputs[i].tensor]
            if isinstance(td.memory, LxMemory):
                continue
            nb = box_lx_bytes(operand_box(prim, i, rng, td.shape), td.layout, td.dtype)
            read += nb
            b += nb
        per_core[core] = b
    n_cores = max(1, len(ranges))
    mem_ns = timer.dram_ns(read, write, n_cores)
    worst = max(per_core.values()) or 1.0
    for core, b in per_core.items():
        ot.per_core[core] = (mem_ns * b / worst / 1e3, 0.0)
    ot.cores = n_cores
    ot.hbm_read_bytes, ot.hbm_write_bytes = int(read), int(write)
    ot.memory_us = mem_ns / 1e3
    ot._body_ns = mem_ns  # type: ignore[attr-defined]
    ot.bound_by = "memory" if mem_ns > 0 else "none"
    ot.effects.append(f"in-place row store: {n_rows} rows")
    return ot


def _bound_by(mem: float, repl: float, comp: float, ring: float, overhead: float) -> str:
    """What limits an op: the larger of its data movement and compute (overlapped), unless
    ring or loop overhead outweighs both."""
    move = mem + repl
    if max(move, comp, ring, overhead) <= 0:
        return "none"
    if ring > max(move, comp, overhead):
        return "ring"
    if overhead > max(move, comp):
        return "overhead"
    if comp > move:
        return "compute"
    return "shared_delivery" if repl > mem else "memory"


def _is_broadcast_op(prim: PrimOp, operands: list) -> bool:
    """A pointwise op streaming a full input plus a smaller broadcast operand (one that
    does not index every iteration dim), both read from device memory."""
    full = bcast = False
    n = len(prim.iter_dims)
    for acc, o in zip(prim.inputs, operands):
        if o.in_lx:
            continue
        if len({d for d in acc.dims if d is not None}) == n:
            full = True
        else:
            bcast = True
    return full and bcast


def time_program(program: Program, hw: Optional[Hardware] = None) -> TimingReport:
    """Simulated time of a (validated) program on `hw` (default: the program's target)."""
    if hw is None:
        hw = load_target(program.hardware)
    timer = OpTimer(program, hw)
    ops: list[OpTiming] = []
    core_busy = [0.0] * hw.cores
    clock = 0.0
    group_id = -1
    prev_key = None
    group_loaded: Optional[dict[str, dict]] = None   # per external tensor, per core: boxes loaded
    group_members: list[OpTiming] = []

    def close_group() -> None:
        nonlocal clock
        if not group_members:
            return
        # one fused kernel: loads and compute of all member ops overlap across the tile
        # loop, and the loop overhead is paid once
        tiles = group_members[0].temporal_tiles
        mem = sum(o.memory_us for o in group_members)
        comp = sum(o.compute_us for o in group_members)
        ring = sum(o.ring_us for o in group_members)
        dbl = all(o.double_buffered for o in group_members)
        body = overlapped_ns(mem, comp, tiles, hw) if dbl else mem + comp
        overhead = hw.loop_overhead_us * tiles
        total = body + ring + overhead
        weights = [max(o.memory_us, o.compute_us) + o.ring_us for o in group_members]
        wsum = sum(weights) or 1.0
        t = clock
        for o, wgt in zip(group_members, weights):
            o.start_us = t
            t += total * wgt / wsum
            o.end_us = t
            o.overhead_us = overhead * wgt / wsum
        clock = clock + total
        group_members.clear()

    for k, op in enumerate(program.ops):
        key = fused_group_key(op)
        if key is None or key != prev_key:
            close_group()
            group_loaded = None
            timer.group_produced = {}
            if key is not None:
                group_id += 1
                group_loaded = {}
        prev_key = key
        ot = timer.analyse(k, op, group_loaded)
        ops.append(ot)
        for core, (m, c) in ot.per_core.items():
            if 0 <= core < hw.cores:
                core_busy[core] += max(m, c)
        if key is not None:
            ot.fused_group = group_id
            group_members.append(ot)
            continue
        body_us = getattr(ot, "_body_ns", 0.0) / 1e3
        ot.start_us = clock
        clock += body_us + ot.ring_us + ot.overhead_us
        ot.end_us = clock
    close_group()
    for o in ops:
        if hasattr(o, "_body_ns"):
            delattr(o, "_body_ns")

    return TimingReport(
        total_us=clock, ops=ops, core_busy_us=core_busy,
        hbm_read_bytes=sum(o.hbm_read_bytes for o in ops),
        hbm_write_bytes=sum(o.hbm_write_bytes for o in ops),
        lx_bytes=sum(o.lx_bytes for o in ops), ring_bytes=sum(o.ring_bytes for o in ops),
        hardware=hw.name, hardware_digest=hw.digest)
