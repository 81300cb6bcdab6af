"""The planner's cost model: predicted time per op strategy and residency combination,
in integer nanoseconds for CP-SAT.

One concept, one home: the time of one op under one set of decisions (layouts, split,
slices, which operands are LX-resident) is the simulator's own per-op analysis
(`simulator.timing`), run on a one-op program; nothing is re-derived here. Every strategy
is priced for each combination of its operands that may be resident (at most 2^3 for a
two-input op), so the CP-SAT model sees exact per-op times. What remains approximate in
the CP-SAT objective (and what `benchmarks/cost_model_fidelity.py` measures against the
whole-program simulation): a restickify is priced before its source layout and split are
known (the source's first layout option, the emitter's default split), and the sum over
ops ignores the timing model's fused coarse-tiled groups (temporal tiles are chosen after
the solve by `solver.spyre.fusion`, priced by whole-program simulation, not by this model) and
clone-in of resident graph inputs (never resident here).
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Mapping, Optional, Sequence

from target.primitives import PrimOp, op_to_json
from target.geometry import default_core_slices, parsed_prim
from target.superdsc import CoreSlice, HbmMemory, Layout, LxMemory, Program
from simulator.timing import OpTimer

GRAPH_INPUT_ROLES = ("user_input", "parameter", "buffer", "constant")


@dataclass(frozen=True)
class OpCost:
    memory_ns: float     # device-memory (and replicated-load) time of the slowest core
    compute_ns: float
    extra_ns: float      # ring combine + loop overhead (not overlapped)
    body_ns: float       # the timing model's overlapped body time

    @property
    def total_ns(self) -> float:
        return self.body_ns + self.extra_ns


@dataclass(frozen=True)
class OpCostParts:
    """An op strategy priced exactly for every residency combination of its operands that
    may be LX-resident: `combos[(in_lx..., out_lx)]`; operands that can never be resident
    are always False."""

    combos: dict

    @property
    def base(self) -> OpCost:
        return next(iter(self.combos.values()))

    def cost(self, in_lx: Sequence[bool], out_lx: bool, hw=None) -> OpCost:
        key = tuple(bool(x) for x in in_lx) + (bool(out_lx),)
        if key in self.combos:
            return self.combos[key]
        # a combination outside the priced ones: the closest priced one below it
        best = self.base
        for k, c in self.combos.items():
            if all(a <= b for a, b in zip(k, key)) and c.total_ns < best.total_ns:
                best = c
        return best


@dataclass(frozen=True)
class OpView:
    """What one op's cost depends on: its loop nest and kind, the operand tensors' shapes,
    dtypes, layouts and roles, its split and core slices, the free-alias flag."""

    prim: PrimOp
    kind: str
    shapes: Mapping[str, Sequence[int]]
    dtypes: Mapping[str, str]
    layouts: Mapping[str, Layout]
    core_split: Mapping[str, int]
    core_slices: Sequence[CoreSlice]
    alias: bool = False
    roles: Mapping[str, str] = None  # type: ignore[assignment]

    def __post_init__(self):
        if self.roles is None:
            object.__setattr__(self, "roles", {})


# The memory kinds the timing model tests with isinstance: one shared instance of each.
_IN_LX = LxMemory.model_construct(kind="lx", lx_address=0, size_per_core=0, live_from=0, live_to=0)
_IN_HBM = HbmMemory.model_construct(kind="hbm", offset=0, alias_of=None)


def _one_op_program(v: OpView, in_lx: Sequence[bool], out_lx: bool, prim_json: dict,
                    tiles: Optional[Mapping[str, int]] = None):
    """A program holding just this op (duck-typed: the timing model reads attributes
    only), its operands in device memory or LX as asked, with `tiles` temporal tiles."""
    split = {k: f for k, f in v.core_split.items() if f > 1}
    slices = list(v.core_slices) or (default_core_slices(v.prim, split) if split else
                                     [CoreSlice.model_construct(core=0, slice={})])
    tensors: dict = {}
    names = [a.tensor for a in v.prim.inputs] + [v.prim.output.tensor]
    for t, lx in zip(names, list(in_lx) + [out_lx]):
        if t in tensors and tensors[t].memory is _IN_LX:
            continue
        tensors[t] = SimpleNamespace(
            id=t, shape=list(v.shapes[t]), dtype=v.dtypes[t], role=v.roles.get(t, "intermediate"),
            layout=v.layouts[t], memory=_IN_LX if lx else _IN_HBM, is_output=False)
    op = SimpleNamespace(
        id=v.prim.id, kind=v.kind, opfunc="", ex_unit="sfp", prim=prim_json, src=None, dst=None,
        core_split=split, num_cores_used=len(slices), core_slices=slices, temporal_tiles=dict(tiles or {}),
        alias=v.alias, bundle=0)
    prog = SimpleNamespace(tensors=list(tensors.values()), ops=[op], tensor_map=lambda: dict(tensors))
    return prog, op


def op_time(v: OpView, in_lx: Sequence[bool], out_lx: bool, hw, prim_json: Optional[dict] = None,
            tiles: Optional[Mapping[str, int]] = None) -> OpCost:
    """The simulator's time of one op with the given operands LX-resident (and `tiles`
    temporal tiles: the fusion search's tile classes, `solver.spyre.fusion.prices`)."""
    prog, op = _one_op_program(v, in_lx, out_lx, prim_json or op_to_json(v.prim), tiles)
    return _cost_of(OpTimer(prog, hw).analyse(0, op, None))


def _cost_of(ot) -> OpCost:
    body = getattr(ot, "_body_ns", 0.0)
    return OpCost(ot.memory_us * 1e3, ot.compute_us * 1e3, (ot.ring_us + ot.overhead_us) * 1e3, body)


def op_cost_parts(v: OpView, hw, may_reside: Optional[Sequence[bool]] = None,
                  extremes_only: bool = False, tiles: Optional[Mapping[str, int]] = None) -> OpCostParts:
    """Price the op for every residency combination of the operands flagged in
    `may_reside` (per input, then the output; default none). The first combination is the
    all-device-memory one. Slots reading the same tensor share one flag. `extremes_only`:
    just none and all resident (enough to rank strategies before pruning). `tiles`: priced
    with these temporal tiles (the fusion search's tile classes)."""
    n_in = len(v.prim.inputs)
    pj = op_to_json(v.prim)
    names = [a.tensor for a in v.prim.inputs] + [v.prim.output.tensor]
    flags = list(may_reside) if may_reside is not None else [False] * (n_in + 1)
    free = []
    for t, f in zip(names, flags):
        if f and t not in free:
            free.append(t)
    combos: dict = {}
    if v.alias:
        free = []
    masks = range(1 << len(free))
    if extremes_only:
        masks = sorted({0, (1 << len(free)) - 1})
    # one program and one timer for every combination: only the operands' memory differs,
    # and the timer keeps the op's geometry between them
    prog, op = _one_op_program(v, [False] * n_in, False, pj, tiles)
    tensors = prog.tensor_map()
    timer = OpTimer(prog, hw)
    for mask in masks:
        on = {t for j, t in enumerate(free) if mask >> j & 1}
        key = tuple(t in on for t in names)
        for t in names:
            tensors[t].memory = _IN_LX if t in on else _IN_HBM
        timer.clone_in_done = set()
        combos[key] = _cost_of(timer.analyse(0, op, None))
    return OpCostParts(combos)


# -- whole programs ----------------------------------------------------------------------
def program_op_views(program: Program):
    """Each priced op of a program as (op, its OpView, inputs in LX, output in LX): what the
    planner's whole-program predictions walk."""
    tmap = program.tensor_map()
    shapes = {t.id: t.shape for t in program.tensors}
    dtypes = {t.id: t.dtype for t in program.tensors}
    layouts = {t.id: t.layout for t in program.tensors}
    roles = {t.id: t.role for t in program.tensors}
    for o in program.ops:
        if o.prim is None:
            continue
        prim = parsed_prim(o.prim)
        view = OpView(prim, o.kind, shapes, dtypes, layouts, o.core_split, o.core_slices, o.alias, roles)
        in_lx = [isinstance(tmap[a.tensor].memory, LxMemory) for a in prim.inputs]
        out_lx = isinstance(tmap[prim.output.tensor].memory, LxMemory)
        yield o, view, in_lx, out_lx


def predict_program_ns(program: Program, hw) -> float:
    """The planner's prediction of a program: each op priced with its actual operand
    residency, summed over ops, untiled (fused coarse-tiled groups are not seen here:
    `solver.spyre.fusion` prices them by simulation)."""
    return sum(op_time(view, in_lx, out_lx, hw, o.prim).total_ns
               for o, view, in_lx, out_lx in program_op_views(program))


def predict_program_us(program: Program, hw) -> float:
    return predict_program_ns(program, hw) / 1000.0


def to_units(ns: float) -> int:
    """Integer time units of the CP-SAT objective: nanoseconds."""
    return int(round(ns))
