"""Plan decisions -> SuperDSC program.

`emit_program(pg, hw, decisions)` derives everything a planner does not decide:
- each tensor's layout (the producer's stick choice; graph inputs from `input_sticks`), its
  dims in the device order `dim_orders` gives (default: plain row-major);
- restickify ops where a consumer's stick choice needs another layout: ONE per
  (tensor, stick dim), placed right before its first consumer and shared by all; a
  restickify between two LX-resident tensors is an on-chip LX relayout;
- memory: LX-resident tensors get their lx_address and live range [producer, last reader];
  everything else a stick-aligned device-memory offset (a free alias copy shares its
  input's offset);
- core slices (coreIdToWkSlice_), num_cores_used;
- bundles: the shared partition step (solver.bundles.partition): consecutive ops, cut where
  the planner asked and wherever the next op would push the bundle past the hardware's
  per-bundle tensor limit, never inside a live range the hardware forbids cutting (every LX
  range when LX does not persist across bundles; tile buffers always);
- stats: planner, hardware digest, compiler version and whatever the planner measured.

It does not judge legality: the validator does (solver.planners.plan always runs it).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from target.op_rules import (
    ANY, StickChoice, copy_is_alias, default_choice, ex_unit, opfunc, outermost_split,
    restickify_prim, stick_options,
)
from target.primitives import PrimGraph, PrimOp, in_place_table, op_to_json
from lowering.version import COMPILER_VERSION
from target.geometry import (
    LRU, caches_enabled, core_ranges, default_core_slices, flat_key, largest_tile_lx_bytes, op_granules, prim_key,
    put_dict, put_layout, put_slices,
)
from target.layout import layout_nbytes, make_layout, padded
from target.superdsc import (
    Bundle, CoreSlice, HbmMemory, Layout, LxMemory, OpDecl, PlanStats, Program, TensorDecl,
)
from solver.bundles import OpSequence, fit_residencies, kernel_key, partition
from solver.plan import OpPlan, PlanDecisions, restick_id

# Device-memory allocations are aligned to this many bytes (a multiple of the stick).
HBM_ALIGN = 4096


class EmitError(ValueError):
    """The decisions cannot be turned into a program (not a validation failure: those are
    reported by the validator)."""


class _Item:
    """One op of the program being built."""

    def __init__(self, prim: PrimOp, kind: str, plan: OpPlan, src: Optional[str] = None,
                 dst: Optional[str] = None):
        self.prim = prim
        self.kind = kind
        self.plan = plan
        self.src = src
        self.dst = dst


def _choice(op: PrimOp, plan: OpPlan) -> StickChoice:
    if plan.stick is None:
        return default_choice(op)
    if plan.stick not in stick_options(op):
        raise EmitError(f"{op.id}: stick choice {plan.stick} is not one of the op's options")
    return plan.stick


def _ordered_ops(pg: PrimGraph, order: list[str]) -> list[PrimOp]:
    """The graph's ops in the planner's `op_order` (checked: every op once, producers first)."""
    if not order:
        return list(pg.ops)
    by_id = {op.id: op for op in pg.ops}
    if len(order) != len(by_id) or set(order) != set(by_id):
        raise EmitError("op_order must list every op of the graph exactly once")
    producer = {op.output.tensor: op.id for op in pg.ops}
    seen: set[str] = set()
    for oid in order:
        for a in by_id[oid].inputs:
            p = producer.get(a.tensor)
            if p is not None and p not in seen:
                raise EmitError(f"op_order runs {oid} before {p}, which produces its input {a.tensor}")
        seen.add(oid)
    return [by_id[oid] for oid in order]


def _layout(t: str, shape, dtype: str, stick: Optional[int], stick_bytes: int, orders: dict) -> Layout:
    """Tensor `t`'s layout: sticked on `stick`, its dims in the planner's order (if any)."""
    order = orders.get(t)
    try:
        return make_layout(shape, dtype, stick, stick_bytes, order)
    except ValueError as e:
        raise EmitError(f"{t}: {e}") from e


class _Build:
    """The program's ops in order (restickify ops included) and the tensors' layouts."""

    def __init__(self, items, restick_made, consumers_of_restick, shapes, dtypes, roles, layouts,
                 produced, resident):
        self.items: list[_Item] = items
        self.restick_made: dict[str, str] = restick_made   # restick tensor id -> source tensor id
        self.consumers_of_restick: dict[str, list[tuple[PrimOp, int]]] = consumers_of_restick
        self.shapes, self.dtypes, self.roles, self.layouts = shapes, dtypes, roles, layouts
        self.produced: set[str] = produced
        self.resident: dict = resident


def _build_items(pg: PrimGraph, hw, decisions: PlanDecisions) -> _Build:
    stick_bytes = hw.stick_bytes
    op_ids = {op.id for op in pg.ops}
    unknown = sorted(set(decisions.ops) - op_ids)
    if unknown:
        raise EmitError(f"decisions name ops the graph does not have: {unknown[:5]}")
    ordered = _ordered_ops(pg, decisions.op_order)
    shapes = {t.id: tuple(t.shape) for t in pg.tensors.values()}
    dtypes = {t.id: t.dtype for t in pg.tensors.values()}
    roles = {t.id: t.role for t in pg.tensors.values()}

    produced = {op.output.tensor for op in pg.ops}
    stick_of: dict[str, Optional[int]] = {}
    for t in pg.tensors.values():
        if t.id not in produced:
            rank = len(t.shape)
            s = decisions.input_sticks.get(t.id, rank - 1 if rank else None)
            stick_of[t.id] = s
    choices: dict[str, StickChoice] = {}
    for op in pg.ops:
        ch = _choice(op, decisions.ops.get(op.id, OpPlan()))
        choices[op.id] = ch
        stick_of[op.output.tensor] = ch.output
    # the orders the graph fixes (`PrimTensor.dim_order`: a layout that outlives the
    # program is a contract, like a shape) over the planner's
    orders = {**decisions.dim_orders,
              **{t.id: list(t.dim_order) for t in pg.tensors.values() if t.dim_order is not None}}
    layouts: dict[str, Layout] = {
        t: _layout(t, shapes[t], dtypes[t], s, stick_bytes, orders) for t, s in stick_of.items()}

    # -- op order with restickify ops ----------------------------------------------------
    items: list[_Item] = []
    restick_made: dict[str, str] = {}  # restick tensor id -> source tensor id
    consumers_of_restick: dict[str, list[tuple[PrimOp, int]]] = {}
    for op in ordered:
        plan = decisions.ops.get(op.id, OpPlan())
        ch = choices[op.id]
        new_inputs = []
        for i, acc in enumerate(op.inputs):
            spec = ch.inputs[i]
            t = acc.tensor
            if spec is None or spec == ANY or spec == stick_of[t]:
                new_inputs.append(acc)
                continue
            rid = restick_id(t, spec)
            if rid not in restick_made:
                restick_made[rid] = t
                shapes[rid], dtypes[rid], roles[rid] = shapes[t], dtypes[t], "intermediate"
                layouts[rid] = _layout(rid, shapes[t], dtypes[t], spec, stick_bytes, orders)
                items.append(_Item(restickify_prim(f"restick:{rid}", t, rid, shapes[t]),
                                   "restickify", decisions.restick_ops.get(rid), src=t, dst=rid))
            consumers_of_restick.setdefault(rid, []).append((op, i))
            new_inputs.append(type(acc)(rid, acc.dims))
        prim = op if tuple(new_inputs) == op.inputs else PrimOp(
            op.id, op.iter_dims, tuple(new_inputs), op.output, op.body, op.source)
        items.append(_Item(prim, "compute", plan))

    for it in items:
        table = in_place_table(it.prim) if it.kind == "compute" else None
        if table is None:
            continue
        # an in-place op's output is its table's bytes: the table's layout whatever order
        # a planner gave it (the op rule gives both one stick)
        layouts[it.prim.output.tensor] = layouts[table]
    unknown = sorted(set(decisions.restick_ops) - set(restick_made))
    if unknown:
        raise EmitError(f"restickify plans for copies no consumer needs: {unknown[:5]}")
    unknown = sorted(t for t in orders if t not in layouts)
    if unknown:
        raise EmitError(f"dim orders for tensors the program does not have (nor any restickified copy a "
                        f"consumer needs): {unknown[:5]}")
    resident = dict(decisions.resident)
    for t in resident:
        if t in pg.inputs or t not in shapes or t not in produced and t not in restick_made:
            raise EmitError(f"{t}: only tensors produced by the program can be LX-resident")
    for it in items:
        if it.kind == "restickify" and it.src in resident and it.dst in resident:
            it.kind = "relayout"
    return _Build(items, restick_made, consumers_of_restick, shapes, dtypes, roles, layouts, produced,
                  resident)


def _live_ranges(items: list[_Item], resident) -> dict[str, tuple[int, int]]:
    """LX-resident tensor -> (producer index, last reader index): its LX live range."""
    producer_index: dict[str, int] = {}
    last_reader: dict[str, int] = {}
    for k, it in enumerate(items):
        producer_index[it.prim.output.tensor] = k
        for acc in it.prim.inputs:
            last_reader[acc.tensor] = k
    return {t: (producer_index[t], max(last_reader.get(t, producer_index[t]), producer_index[t]))
            for t in resident if t in producer_index}


def _bundle_starts(items: list[_Item], decisions: PlanDecisions) -> set[int]:
    """Op indices of the planner's bundle starts (moved back over restickify ops that feed
    the op, so a copy runs in its consumer's bundle)."""
    item_index = {it.prim.id: k for k, it in enumerate(items)}
    starts = set()
    for op_id in decisions.bundle_starts:
        k = item_index.get(op_id)
        if k is None:
            raise EmitError(f"bundle start {op_id!r} is not an op")
        while k > 0 and items[k - 1].kind in ("restickify", "relayout") and \
                items[k - 1].dst in (a.tensor for a in items[k].prim.inputs):
            k -= 1
        starts.add(k)
    return starts


def _cores(plan: Optional[OpPlan]) -> int:
    if plan is None:
        return 1
    if plan.core_slices is not None:
        return max(1, len(plan.core_slices))
    n = 1
    for f in plan.core_split.values():
        n *= max(1, int(f))
    return n


def _op_sequence(pg: PrimGraph, items: list[_Item], alias_of: dict[str, str], resident,
                 lx_ranges: dict[str, tuple[int, int]]) -> OpSequence:
    root = lambda t: alias_of.get(t, t)  # noqa: E731
    refs = [frozenset(root(t) for t in [a.tensor for a in it.prim.inputs] + [it.prim.output.tensor])
            for it in items]
    io = frozenset(root(t) for t in list(pg.inputs) + list(pg.outputs))
    per_tile = frozenset(t for t, r in resident.items() if getattr(r, "per_tile", False))
    keys = [kernel_key(it.kind, it.plan.temporal_tiles if it.plan is not None else {}, _cores(it.plan),
                       alias=bool(it.plan is not None and it.plan.alias)) for it in items]
    return OpSequence(refs=refs, io=io, lx_ranges=dict(lx_ranges), per_tile=per_tile & set(lx_ranges),
                      kernel_key=keys)


def op_sequence(pg: PrimGraph, hw, decisions: PlanDecisions) -> tuple[OpSequence, set[int]]:
    """The program `emit_program` would make of `decisions`, as the partition step sees it
    (solver.bundles.OpSequence), and the op indices where the planner asks for a bundle start."""
    b = _build_items(pg, hw, decisions)
    alias_of: dict[str, str] = {}
    for it in b.items:
        if it.kind == "compute" and (it.plan.alias or in_place_table(it.prim)) and it.prim.inputs:
            src = it.prim.inputs[0].tensor
            alias_of[it.prim.output.tensor] = alias_of.get(src, src)
    seq = _op_sequence(pg, b.items, alias_of, b.resident, _live_ranges(b.items, b.resident))
    return seq, _bundle_starts(b.items, decisions)


def emit_program(pg: PrimGraph, hw, decisions: PlanDecisions) -> Program:
    stick_bytes = hw.stick_bytes
    build = _build_items(pg, hw, decisions)
    items, restick_made, consumers_of_restick = build.items, build.restick_made, build.consumers_of_restick
    shapes, dtypes, roles, layouts = build.shapes, build.dtypes, build.roles, build.layouts
    produced, resident = build.produced, build.resident

    # -- splits and slices -----------------------------------------------------------------
    splits: dict[str, dict[str, int]] = {}
    slices: dict[str, list[CoreSlice]] = {}
    slice_keys: dict[str, tuple] = {}  # what each op's slices were made from (`_lx_need`'s key)
    slice_cache: dict[tuple, list[CoreSlice]] = {}
    producer_item: dict[str, _Item] = {}
    for it in items:
        producer_item[it.prim.output.tensor] = it
        if it.plan is None:  # restickify without an explicit plan
            gran = op_granules(it.prim, layouts, dtypes, stick_bytes)
            plan = _default_restick_plan(it, consumers_of_restick.get(it.dst, []), decisions,
                                         resident, gran, hw.cores, producer_item.get(it.src),
                                         splits, slices)
            it.plan = plan
        split = {k: v for k, v in it.plan.core_split.items() if v != 1}
        splits[it.prim.id] = split
        if it.plan.core_slices is not None:
            slices[it.prim.id] = _given_slices(it.plan.core_slices)
            slice_keys[it.prim.id] = ("given",)  # keyed on the slices themselves
        elif split:
            # identical splits share one (immutable) slice list: emitting stays linear in ops
            key = tuple((d.name, split[d.name]) for d in it.prim.iter_dims if d.name in split)
            if key not in slice_cache:
                slice_cache[key] = default_core_slices(it.prim, split)
            slices[it.prim.id] = slice_cache[key]
            # the natural order of the split (a function of the split and the loop nest)
            slice_keys[it.prim.id] = ("natural",)
        else:
            slices[it.prim.id] = [CoreSlice(core=0, slice={})]
            slice_keys[it.prim.id] = ("core 0",)

    # -- memory -------------------------------------------------------------------------------
    live = _live_ranges(items, resident)
    alias_of: dict[str, str] = {}
    for it in items:
        if it.kind == "compute" and it.plan.alias:
            src = it.prim.inputs[0].tensor if it.prim.inputs else None
            dst = it.prim.output.tensor
            if src is None or src in resident or dst in resident:
                raise EmitError(f"{it.prim.id}: an alias copy needs both tensors in device memory")
            if not copy_is_alias(it.prim, shapes[src], layouts[src].dim_order, shapes[dst],
                                 layouts[dst].dim_order, dtypes[src], dtypes[dst], hw.stick_bytes):
                raise EmitError(f"{it.prim.id}: copy is not a free alias in these layouts")
            alias_of[dst] = alias_of.get(src, src)
        elif it.kind == "compute" and in_place_table(it.prim) is not None:
            src, dst = in_place_table(it.prim), it.prim.output.tensor
            if src in resident or dst in resident:
                raise EmitError(f"{it.prim.id}: an in-place op updates device memory: neither {src} nor {dst} "
                                f"can be LX-resident")
            alias_of[dst] = alias_of.get(src, src)

    memories: dict[str, object] = {}
    offset = 0
    tensor_order = [t for t in pg.tensors] + list(restick_made)
    for t in tensor_order:
        if t in resident:
            r = resident[t]
            k, last = live[t]
            it = items[k]
            gran = op_granules(it.prim, layouts, dtypes, stick_bytes)
            tiles = it.plan.temporal_tiles if (r.per_tile and it.plan is not None) else {}
            need = _lx_need(it.prim, splits[it.prim.id], slices[it.prim.id], slice_keys[it.prim.id], tiles, gran,
                            shapes[t], layouts[t], dtypes[t])
            size = r.size_per_core if r.size_per_core is not None else padded(need, stick_bytes)
            memories[t] = LxMemory(lx_address=r.lx_address, size_per_core=size,
                                   live_from=k, live_to=last,
                                   per_tile=r.per_tile)
        elif t in alias_of:
            continue
        else:
            memories[t] = HbmMemory(offset=offset)
            offset += padded(layout_nbytes(layouts[t], dtypes[t]), HBM_ALIGN)
    for t, root in alias_of.items():
        memories[t] = HbmMemory(offset=memories[root].offset, alias_of=root)

    outputs = set(pg.outputs)
    tensors = [TensorDecl(id=t, shape=list(shapes[t]), dtype=dtypes[t], role=roles[t],
                          layout=layouts[t], memory=memories[t], is_output=t in outputs)
               for t in tensor_order]

    # -- ops and bundles -----------------------------------------------------------------------
    lx_ranges = {t: (m.live_from, m.live_to) for t, m in memories.items() if isinstance(m, LxMemory)}
    seq = _op_sequence(pg, items, alias_of, resident, lx_ranges)
    bundle_of = partition(seq, hw, _bundle_starts(items, decisions)).bundle_of

    ops: list[OpDecl] = []
    for k, it in enumerate(items):
        is_alias = it.kind == "compute" and it.plan.alias
        if it.kind == "compute":
            func, unit = opfunc(it.prim), ("dma" if is_alias else ex_unit(it.prim))
        elif it.kind == "relayout":
            func, unit = "relayout", "sfp"
        else:
            func, unit = "restickify", "dma"
        sl = slices[it.prim.id]
        ops.append(OpDecl(
            id=it.prim.id, kind=it.kind, opfunc=func, ex_unit=unit, prim=op_to_json(it.prim),
            src=it.src, dst=it.dst, core_split=splits[it.prim.id], num_cores_used=len(sl),
            core_slices=sl, temporal_tiles=dict(it.plan.temporal_tiles), alias=is_alias,
            bundle=bundle_of[k]))
    members: dict[int, list[int]] = {}
    for k, b in enumerate(bundle_of):
        members.setdefault(b, []).append(k)
    bundles = []
    for b, member in sorted(members.items()):
        bundles.append(Bundle(id=b, ops=[items[k].prim.id for k in member],
                              external_tensors=sorted(_external(items, member, memories, alias_of))))

    stats = dict(decisions.stats)
    stats.setdefault("notes", [])
    return Program(
        graph_name=pg.name, graph_hash=pg.source_hash, hardware=hw.name, tensors=tensors,
        ops=ops, bundles=bundles, inputs=list(pg.inputs), outputs=list(pg.outputs),
        stats=PlanStats(planner=decisions.planner, hardware_digest=hw.digest,
                        compiler_version=COMPILER_VERSION, **stats))


# The core -> slice maps plans give (`OpPlan.core_slices`) as CoreSlice lists: the fusion
# steps give most ops of a layer one and trials re-emit them over and over (building the
# CoreSlice objects was a fifth of an emit), so equal maps share one list, immutable by
# convention like the list ops of one split share within a program
_GIVEN_SLICES = LRU(2048, "emit.given_slices")


def _given_slices(core_slices) -> list[CoreSlice]:
    def make() -> list[CoreSlice]:
        return [CoreSlice(core=c, slice=dict(s)) for c, s in core_slices]
    if not caches_enabled():
        return make()
    return _GIVEN_SLICES.get(tuple((c, tuple(s.items())) for c, s in core_slices), make)


# LX bytes per core of a resident tensor, by its producer's content (trials re-emit the same
# producers over and over)
_LX_NEED = LRU(4096, "emit.lx_need")


def _lx_need(prim: PrimOp, split: dict, core_slices, made_from: tuple, tiles: dict, gran: dict, shape,
             layout: Layout, dtype: str) -> int:
    """The most LX bytes a core needs for the output of `prim` (one tile of it for a tile
    buffer: `largest_tile_lx_bytes`), memoized on everything that reads. `made_from` says
    how emit_program made `core_slices`: ("natural",) / ("core 0",) when they follow from
    the split and the loop nest (both in the key), ("given",) when the plan gave them
    (then their content is in the key)."""
    pk = prim_key(prim) if caches_enabled() else None
    fk = None
    if pk is not None:
        f = [made_from[0], dtype, len(shape)]
        f.extend(shape)
        put_layout(f, layout)
        put_dict(f, split)
        put_dict(f, tiles)
        put_dict(f, gran)
        if made_from[0] == "given":
            put_slices(f, core_slices)
        fk = flat_key(f)
    if fk is None:
        return largest_tile_lx_bytes(prim, -1, core_ranges(prim, split, core_slices, gran), tiles, gran,
                                     shape, layout, dtype)
    return _LX_NEED.get((pk, fk), lambda: largest_tile_lx_bytes(
        prim, -1, core_ranges(prim, split, core_slices, gran), tiles, gran, shape, layout, dtype))


def _follow(op: PrimOp, access, split: dict[str, int], core_slices: list) -> Optional[OpPlan]:
    """The restickify plan that slices a tensor the way `op` slices it through `access`:
    an op split f along iteration dim d that indexes tensor dim j becomes d{j}: f, with the
    same core -> slice map. None when the op's split does not index the tensor."""
    name = {i: d.name for i, d in enumerate(op.iter_dims)}
    out: dict[str, int] = {}
    rename: dict[str, str] = {}
    for j, d in enumerate(access.dims):
        if d is not None and split.get(name[d], 1) > 1:
            out[f"d{j}"] = split[name[d]]
            rename[name[d]] = f"d{j}"
    if not out:
        return None
    cs = [(c.core, {rename[n]: v for n, v in c.slice.items() if n in rename}) for c in core_slices]
    if len({tuple(sorted(s.items())) for _, s in cs}) != len(cs):
        return None  # op split along dims the tensor does not have: cores would share slices
    return OpPlan(core_split=out, core_slices=cs)


def _default_restick_plan(it: _Item, consumers: list[tuple[PrimOp, int]], decisions: PlanDecisions,
                          resident: dict, gran: dict[int, int], cores: int,
                          producer: Optional[_Item], splits: dict, slices: dict) -> OpPlan:
    """A restickify with no explicit plan: when its output stays in LX, slice it the way its
    first consumer reads it (so each core writes what it will read); when its source is in LX,
    the way the source's producer wrote it (so each core reads what it holds); otherwise
    split the outermost dim evenly."""
    if it.dst in resident and consumers:
        cons, idx = consumers[0]
        cplan = decisions.ops.get(cons.id, OpPlan())
        csplit = {k: v for k, v in cplan.core_split.items() if v > 1}
        if cplan.core_slices is not None:
            cs = [CoreSlice(core=c, slice=dict(s)) for c, s in cplan.core_slices]
        else:
            cs = default_core_slices(cons, csplit)
        plan = _follow(cons, cons.inputs[idx], csplit, cs)
        if plan is not None:
            return plan
    if it.src in resident and producer is not None:
        plan = _follow(producer.prim, producer.prim.output, splits[producer.prim.id], slices[producer.prim.id])
        if plan is not None:
            return plan
    return OpPlan(core_split=outermost_split(it.prim, gran, cores))


def _hbm_refs(it: _Item, memories: dict, alias_of: dict[str, str]) -> set[str]:
    out = set()
    for t in [a.tensor for a in it.prim.inputs] + [it.prim.output.tensor]:
        if isinstance(memories[t], HbmMemory):
            out.add(alias_of.get(t, t))
    return out


def _external(items: list[_Item], member: list[int], memories: dict, alias_of: dict[str, str]) -> set[str]:
    out: set[str] = set()
    for k in member:
        out |= _hbm_refs(items[k], memories, alias_of)
    return out


def fit_bundles(pg, hw, decisions):
    """`decisions` with the residencies `fit_residencies` drops removed, and the dropped
    tensor ids: the program the emitter makes of it keeps every bundle within the limit
    wherever a cut can do it (only a single op past the limit cannot be helped)."""
    seq, starts = op_sequence(pg, hw, decisions)
    drop = fit_residencies(seq, hw, starts)
    if not drop:
        return decisions, []
    resident = {t: r for t, r in decisions.resident.items() if t not in set(drop)}
    return replace(decisions, resident=resident), drop
