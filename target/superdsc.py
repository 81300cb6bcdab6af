"""The SuperDSC program, format v2 (documented in docs/superdsc.md; v1 documents still load).

What a planner emits and the simulator judges. It mirrors the concepts of torch-spyre's
SuperDSC (codegen/superdsc.py) so a Spyre engineer recognizes them:

| here                         | torch-spyre SuperDSC                 |
|------------------------------|--------------------------------------|
| OpDecl.num_cores_used        | numCoresUsed_                        |
| OpDecl.core_split            | numWkSlicesPerDim_                   |
| OpDecl.core_slices           | coreIdToWkSlice_                     |
| Layout.dim_map/device_size   | SpyreTensorLayout dim_map / device_size |
| Memory(kind=lx|hbm)          | scheduleTree_ allocate, component_   |
| OpDecl.ex_unit               | computeOp_ exUnit pt|sfp             |

Every op carries its full primitive loop nest, so a program can be run and timed without
the graph it came from.
"""
from __future__ import annotations

import json
from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

PROGRAM_FORMAT = "sticksat.superdsc"
PROGRAM_VERSION = 3
# Versions a reader accepts: a v1 document is read as its v3 equivalent (`upgrade_v1`), a v2
# document as it is (v3 added the in-place `scatter` op; nothing a v2 program says changed).
READABLE_VERSIONS = (1, 2, 3)

_MAX = 200_000


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Layout(_Model):
    """Device layout of a tensor: torch-spyre's SpyreTensorLayout (`device_size`, `dim_map`).

    Device dims run outermost first. `dim_map[i]` is the logical dim device dim i walks. The
    LAST device dim holds the elements of one stick of the stick dim (`stick_elems` of them);
    the stick dim appears exactly once more, as its stick-group dim (which stick), anywhere
    before; every other logical dim appears exactly once. `device_size[i]` is the extent of
    device dim i: a non-stick dim's size, the stick dim's stick count (its size padded up to
    whole sticks), `stick_elems`. Bytes are row-major over `device_size`. A rank-0 tensor has
    empty lists and occupies one stick. The geometry (strides, offsets, spans, sticks) lives
    in `target.layout`."""

    dim_map: Annotated[list[int], Field(max_length=9)]
    device_size: Annotated[list[int], Field(max_length=9)]
    stick_elems: int

    @property
    def stick_dim(self) -> Optional[int]:
        return self.dim_map[-1] if self.dim_map else None

    @property
    def dim_order(self) -> list[int]:
        """The logical dims in device order, each once: the stick dim stands where its
        stick-group dim is (last for the plain row-major layout, what format v1 could say)."""
        return self.dim_map[:-1]


def upgrade_v1_layout(d):
    """A format-v1 layout (`dim_order` with the stick dim last, `device_size` with the stick
    dim padded to whole sticks, row-major) as the v2 layout of the same bytes: the stick dim's
    stick-group dim right before its stick elements. Anything malformed stays malformed (the
    validator names it): a stick extent that is not whole sticks becomes one group of that
    many elements, which the stick-element check rejects."""
    if not isinstance(d, dict):
        return d
    out = {k: v for k, v in d.items() if k not in ("dim_order", "device_size", "dim_map")}
    if "dim_map" in d:
        out["dim_map_in_a_v1_layout"] = d["dim_map"]  # a v2 field in a v1 document: a schema error
    order, size, se = d.get("dim_order"), d.get("device_size"), d.get("stick_elems")
    if not isinstance(order, list) or not isinstance(size, list) or not order or not size:
        out["dim_map"], out["device_size"] = order, size  # rank 0 (empty lists) or malformed
        return out
    last = size[-1]
    whole = type(se) is int and se > 0 and type(last) is int and last % se == 0
    groups, elems = (last // se, se) if whole else (1, last)
    out["dim_map"] = list(order) + [order[-1]]
    out["device_size"] = list(size[:-1]) + [groups, elems]
    return out


def upgrade_v1(doc):
    """A format-v1 program document read as the current version: every layout re-expressed
    (`upgrade_v1_layout`), nothing else changes. A v2 document reads as it is (v3 only added
    the in-place `scatter`). Any other document is returned as it is."""
    if isinstance(doc, dict) and type(doc.get("version")) is int and doc["version"] == 2:
        return dict(doc, version=PROGRAM_VERSION)
    if not isinstance(doc, dict) or type(doc.get("version")) is not int or doc["version"] != 1:
        return doc  # (True == 1 and 1.0 == 1 in Python: only the integer 1 is v1)
    out = dict(doc)
    out["version"] = PROGRAM_VERSION
    tensors = doc.get("tensors")
    if isinstance(tensors, list):
        out["tensors"] = [dict(t, layout=upgrade_v1_layout(t["layout"])) if isinstance(t, dict) and "layout" in t
                          else t for t in tensors]
    return out


class HbmMemory(_Model):
    kind: Literal["hbm"] = "hbm"
    offset: int  # bytes from the start of the program's device-memory segment
    # Shares another tensor's bytes (same offset): the output of a free alias copy (its own
    # layout) or of an in-place op (its table's layout: the table's bytes after the update).
    alias_of: Optional[str] = None


class LxMemory(_Model):
    """Resident in scratchpad: each core holds its own slice at the same `lx_address`
    (bytes, stick aligned) from op index `live_from` (the producer) to `live_to` (the
    last reader), inclusive. The slice a core holds is the one the producer wrote.

    `per_tile`: a tile buffer of one fused coarse-tiled kernel (`fused_group_key`). The
    producer and every reader belong to that one kernel, whose tile loop runs all members
    on tile j before tile j+1; the buffer holds only the current tile's box of the core's
    slice (`size_per_core` is per tile), so each reader's tile-j box on a core must lie
    inside the box the producer wrote there in tile j. The tensor never exists whole."""

    kind: Literal["lx"] = "lx"
    lx_address: int
    size_per_core: int  # bytes reserved per core
    live_from: int
    live_to: int
    per_tile: bool = False


Memory = Annotated[Union[HbmMemory, LxMemory], Field(discriminator="kind")]


class TensorDecl(_Model):
    id: str
    shape: Annotated[list[int], Field(max_length=8)]
    dtype: str
    role: Literal["user_input", "parameter", "buffer", "constant", "intermediate"]
    layout: Layout
    memory: Memory
    is_output: bool = False


class CoreSlice(_Model):
    """coreIdToWkSlice_: core `core` runs slice index `slice[d]` along each split dim d
    (names of iteration dims; unsplit dims are whole)."""

    core: int
    slice: dict[str, int]


class OpDecl(_Model):
    id: str
    kind: Literal["compute", "restickify", "relayout"]
    # opfunc: matmul, pointwise fn name, reduce fn, gather, copy, fill, restickify, relayout
    opfunc: str
    ex_unit: Literal["pt", "sfp", "dma"]
    # The primitive loop nest (target.primitives.op_to_json form). Restickify/relayout
    # ops carry the identity nest over dims d0, d1, ... from src to dst
    # (target.op_rules.restickify_prim), so splits and slices work the same for them.
    prim: Optional[dict] = None
    # restickify/relayout ops: src -> dst, same logical tensor in another layout.
    src: Optional[str] = None
    dst: Optional[str] = None
    # numWkSlicesPerDim_: iteration-dim name -> number of slices across cores.
    core_split: dict[str, int] = {}
    num_cores_used: int = 1
    core_slices: Annotated[list[CoreSlice], Field(max_length=1024)] = []
    # Temporal tiles per core: iteration-dim name -> number of tiles each core loops over.
    temporal_tiles: dict[str, int] = {}
    # A copy op the planner declares free: its output aliases its input's bytes.
    alias: bool = False
    bundle: int = 0


def resolve_alias(tmap: dict[str, "TensorDecl"], t: str) -> str:
    """The tensor whose bytes `t` views: an alias's chain of `alias_of` followed to its root
    (at most 64 steps: a malformed cycle stops there, the validator reports it)."""
    seen = 0
    while t in tmap and isinstance(tmap[t].memory, HbmMemory) and tmap[t].memory.alias_of and seen < 64:
        t = tmap[t].memory.alias_of
        seen += 1
    return t


def tile_count(op: OpDecl) -> int:
    """Temporal tiles each core of `op` loops over (the product over tiled dims)."""
    n = 1
    for v in op.temporal_tiles.values():
        n *= max(1, int(v))
    return n


def fused_group_key(op: OpDecl, bundle: bool = True) -> Optional[tuple]:
    """Consecutive ops with equal non-None keys form one coarse-tiled fused kernel: compute
    ops of one bundle with the same temporal tile count (> 1) on the same number of cores.
    The kernel's tile loop runs every member on tile j before any member on tile j+1.
    `bundle=False` leaves the bundle out (for a planner about to re-cut bundles)."""
    if op.kind != "compute" or op.alias:
        return None
    tiles = tile_count(op)
    if tiles <= 1:
        return None
    return (op.bundle if bundle else None, tiles, op.num_cores_used)


def lx_live_spans(program: "Program") -> dict[str, tuple[int, int]]:
    """Per LX tensor, the op-index span over which its bytes must stay intact (what the
    capacity and overlap rules check). A tile buffer: [live_from, live_to], inside its one
    kernel, where every tile runs the members in op order. Any other LX tensor: its live
    range widened to every fused kernel the range touches, because a kernel's tile loop
    runs all members on every tile: a whole-slice result written by a member in tile 0 is
    still needed after the last tile, and one read by a member is read again in every
    tile, so no buffer of another member may reuse its bytes in between."""
    kernels: list[tuple[int, int]] = []
    prev, start = None, 0
    for k, op in enumerate(program.ops + [None]):  # type: ignore[operator]
        key = fused_group_key(op) if op is not None else None
        if key != prev:
            if prev is not None:
                kernels.append((start, k - 1))
            start = k
        prev = key
    spans: dict[str, tuple[int, int]] = {}
    for t in program.tensors:
        m = t.memory
        if not isinstance(m, LxMemory):
            continue
        a, b = m.live_from, m.live_to
        if not m.per_tile:
            for ka, kb in kernels:
                if ka <= b and a <= kb:
                    a, b = min(a, ka), max(b, kb)
        spans[t.id] = (a, b)
    return spans


class Bundle(_Model):
    """A device program (one kernel launch): LX contents persist between its ops, and across
    bundles where the hardware says so (`hw.lx_persists_across_bundles`).
    `external_tensors` are the tensors (alias roots) it references in device memory;
    `hw.bundle_slots` says how much of the per-bundle limit they take."""

    id: int
    ops: list[str]
    external_tensors: list[str]


class PlanStats(_Model):
    planner: str
    predicted_us: Optional[float] = None
    solver_status: Optional[str] = None
    objective: Optional[float] = None
    bound: Optional[float] = None
    gap: Optional[float] = None
    solve_seconds: Optional[float] = None
    lower_bound_us: Optional[float] = None
    # Set when the requested planner failed and this plan comes from the next one of the
    # fallback chain: the planner asked for and what went wrong.
    fallback_from: Optional[str] = None
    fallback_reason: Optional[str] = None
    hardware_digest: str
    compiler_version: str
    notes: list[str] = []


class Program(_Model):
    format: Literal["sticksat.superdsc"] = PROGRAM_FORMAT
    version: Literal[3] = PROGRAM_VERSION
    graph_name: str = ""
    graph_hash: str = ""
    hardware: str  # target name
    tensors: Annotated[list[TensorDecl], Field(max_length=_MAX)]
    ops: Annotated[list[OpDecl], Field(max_length=_MAX)]  # in execution order
    bundles: list[Bundle]
    inputs: list[str]
    outputs: list[str]
    stats: PlanStats

    @model_validator(mode="before")
    @classmethod
    def _read_v1(cls, data):
        # a stored v1 program loads as its v2 equivalent, on every path that parses one
        return upgrade_v1(data)

    def tensor_map(self) -> dict[str, TensorDecl]:
        return {t.id: t for t in self.tensors}

    def to_json(self, indent: int | None = None) -> str:
        return self.model_dump_json(indent=indent)

    @classmethod
    def from_json(cls, text: str | bytes) -> "Program":
        return cls.model_validate_json(text)

    def to_dict(self) -> dict:
        return json.loads(self.model_dump_json())
