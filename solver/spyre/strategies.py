"""Strategy space of each primitive op: stick choice x core split x temporal tiling
(x free-alias for copies), with its per-core slices and its cost parts.

All rules come from `target.op_rules` (stick options, split granules, legal core splits,
alias test) and all geometry from `target.geometry`; nothing is re-encoded here.

- Core splits: `legal_core_splits` (whole sticks on stick dims, even, product <= cores, at
  most one reduction dim), at most two split dims, using at least a quarter of the most
  cores any split of the op can use; at most `max_candidates` of them are priced per stick
  choice (most cores first, then the fewest input bytes a core reads, then fewer split dims).
  Besides, every stick choice keeps its one-core strategy (`_few_cores_strategy`): a chain
  of small ops on one core can hold every intermediate in LX.
- An operand the stick choice reads whole (`ANY`) keeps the layout its producer wrote; a
  layout of it that would change the split granules of a split dim is recorded in
  `any_forbidden` so the planner forbids that combination (the emitter derives granules from
  the actual layouts).
- Temporal tiles: none. In the timing model a temporal tile loop only adds loop overhead
  and, past the LX knee, spill derates, so an untiled strategy is never slower.
- Pruning: each candidate is priced with every operand in device memory; per stick choice
  the `keep` cheapest and the `keep_resident` most compute-bound (what a plan keeping the
  operands in LX wants) are kept and priced for every residency combination; any
  `required` strategy (the hint's, the naive plan's) is added.
- Alignment (`align_strategies`, over the whole graph): for residency candidates, the reader
  and producer strategies that slice the tensor like a kept neighbour strategy are added,
  along chains, so a chain can stay in LX even when each op alone kept other, equally
  cheap splits.
"""
from __future__ import annotations

import dataclasses
import threading
import weakref
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from target.op_rules import (
    ANY, StickChoice, check_split, copy_is_alias, default_choice, legal_core_splits, split_granules, stick_options,
)
from target.primitives import DTYPE_BYTES, PrimGraph, PrimOp
from target.geometry import (
    box_lx_bytes, core_ranges, default_core_slices, dim_chunk, first_slice_spans, layout_nbytes, make_layout,
    operand_box, padded, reduction_split,
)
from solver.spyre.cost_model import OpCostParts, OpView, op_cost_parts

Box = tuple
# A one-core strategy is kept when, with its operands held in LX, it is priced within this
# factor of the op's cheapest strategy in device memory: only there can it pay. Measured
# 2026-12-05 (deterministic): without the filter a gated MLP of 4096-wide matmuls got one-core
# strategies it never uses, and the solve returned another of its tied optima, which fused
# 1.9x slower (3021 vs 1626 us, tests/test_split_k_hold.py); at 2.0 the same for its
# pointwise ops; at 1.0 BERT tiny, llama tiny prefill and the layers keep their gains.
ONE_CORE_MAX_SLOWDOWN = 1.0
# Graph inputs the runtime places in device memory once, at load time (weights).
_LOAD_TIME_ROLES = ("parameter", "buffer", "constant")


@dataclass
class Strategy:
    stick: StickChoice
    core_split: dict[str, int]
    temporal_tiles: dict[str, int]
    alias: bool
    input_sticks: tuple[Optional[int], ...]  # layout each input is read in; None: whatever it has
    out_stick: Optional[int]
    out_lx_bytes: int                        # per-core LX bytes of the output (whole sticks)
    reduction_split: bool
    parts: OpCostParts
    any_forbidden: dict[int, frozenset] = field(default_factory=dict)  # input -> stick dims not allowed
    view: Optional[OpView] = field(default=None, repr=False, compare=False)  # what `parts` priced
    may_reside: tuple = ()
    # per core, the iteration ranges of its work slice: the operand boxes follow from them,
    # computed when a residency question first needs them (most candidates are pruned first)
    core_ranges: dict = field(default_factory=dict, repr=False, compare=False)
    _boxes: Optional[tuple] = field(default=None, repr=False, compare=False)
    # per operand (inputs, then the output): the device dim order priced for it, None for
    # the plain row-major default (`solver.spyre.layout_choice`)
    orders: tuple = ()

    def _operand_boxes(self) -> tuple:
        if self._boxes is None:
            op, shapes = self.view.prim, self.view.shapes
            out = {c: operand_box(op, -1, r, shapes[op.output.tensor]) for c, r in self.core_ranges.items()}
            ins = tuple({c: operand_box(op, i, r, shapes[a.tensor]) for c, r in self.core_ranges.items()}
                        for i, a in enumerate(op.inputs))
            self._boxes = (out, ins)
        return self._boxes

    @property
    def out_boxes(self) -> dict[int, Box]:
        """Core -> the output box it writes."""
        return self._operand_boxes()[0]

    @property
    def in_boxes(self) -> tuple[dict[int, Box], ...]:
        """Per input: core -> the box it reads."""
        return self._operand_boxes()[1]

    def key(self) -> tuple:
        return (self.stick, tuple(sorted(self.core_split.items())), self.alias, self.orders)

    def order_of(self, slot: int) -> Optional[tuple]:
        """The dim order priced for operand `slot` (-1: the output); None: the default."""
        return self.orders[slot] if self.orders else None

    def cost_ns(self, hw, in_lx: Sequence[bool] | None = None, out_lx: bool = False) -> float:
        # one flag per input (not len(self.in_boxes): that would compute every core's boxes)
        in_lx = in_lx or (False,) * len(self.input_sticks)
        return self.parts.cost(in_lx, out_lx, hw).total_ns


@dataclass
class GraphContext:
    """Shapes, dtypes and the stick dims each tensor may take (a produced tensor: its
    producer's output options; a user input: the layout it arrives in, its last dim; a
    weight (parameter, buffer, constant): any dim, since the runtime lays weights out once
    at load time in the layout the program declares — a one-time cost outside the
    program's time, like torch-spyre's weight conversion when a model moves to the
    device)."""

    pg: PrimGraph
    hw: object
    shapes: dict[str, tuple]
    dtypes: dict[str, str]
    possible_sticks: dict[str, list[Optional[int]]]
    input_sticks: dict[str, Optional[int]]
    roles: dict[str, str] = field(default_factory=dict)
    candidates: set = field(default_factory=set)  # tensors that may stay LX-resident
    free_inputs: set = field(default_factory=set)  # graph inputs whose stick dim is chosen
    cache: dict = field(default_factory=dict)  # structure key -> strategy list
    # intermediates whose device dim order is a decision: their non-default candidate orders
    # (`solver.spyre.layout_choice.candidate_orders`)
    alt_orders: dict = field(default_factory=dict)

    @classmethod
    def build(cls, pg: PrimGraph, hw, input_sticks: Optional[Mapping[str, Optional[int]]] = None,
              free_params: bool = True) -> "GraphContext":
        shapes = {t.id: tuple(t.shape) for t in pg.tensors.values()}
        dtypes = {t.id: t.dtype for t in pg.tensors.values()}
        produced = {op.output.tensor: op for op in pg.ops}
        possible: dict[str, list[Optional[int]]] = {}
        fixed: dict[str, Optional[int]] = {}
        free: set = set()
        for t in pg.tensors.values():
            if t.id not in produced:
                rank = len(t.shape)
                s = (input_sticks or {}).get(t.id, rank - 1 if rank else None)
                fixed[t.id] = s
                possible[t.id] = [s]
                if free_params and rank >= 1 and t.role in _LOAD_TIME_ROLES and t.dim_order is None:
                    # weights are placed in device memory at load time, in the layout the
                    # program declares: their stick dim is a decision, not a given
                    possible[t.id] += [d for d in range(rank) if d != s]
                    free.add(t.id)
        for op in pg.ops:
            outs: list[Optional[int]] = []
            for ch in stick_options(op):
                if ch.output not in outs:
                    outs.append(ch.output)
            possible[op.output.tensor] = outs
        roles = {t.id: t.role for t in pg.tensors.values()}
        read = {a.tensor for op in pg.ops for a in op.inputs}
        candidates = {t for t in produced if t in read and t not in set(pg.outputs)}
        return cls(pg, hw, shapes, dtypes, possible, fixed, roles, candidates, free)

    def layout(self, t: str, stick: Optional[int], own: bool = True):
        """The layout of tensor `t` sticked on `stick`: in the device dim order the graph
        fixes for it (`PrimTensor.dim_order`, a paged KV cache: the emitter lays it out so
        whatever the plan asks), else the default. `own` False: a restickified copy of `t`,
        which the emitter lays out in the default order."""
        fixed = self.pg.tensors[t].dim_order if own and t in self.pg.tensors else None
        return make_layout(self.shapes[t], self.dtypes[t], stick, self.hw.stick_bytes, fixed)


class NoLegalStrategy(ValueError):
    """No stick choice of the op has any legal core split (not even one core): a defect
    of the op rules, reported with the op's id."""

    def __init__(self, op_id: str):
        self.op = op_id
        super().__init__(f"{op_id}: no legal strategy")


def _granules(op: PrimOp, ctx: GraphContext, in_sticks: Sequence, out_stick) -> dict[int, int]:
    dts = [ctx.dtypes[a.tensor] for a in op.inputs] + [ctx.dtypes[op.output.tensor]]
    return split_granules(op, list(in_sticks), out_stick, dts, ctx.hw.stick_bytes)


def make_strategy(op: PrimOp, ctx: GraphContext, ch: StickChoice, split: dict[str, int],
                  tiles: Optional[dict[str, int]] = None, alias: bool = False,
                  full_pricing: bool = True, orders: tuple = ()) -> Optional[Strategy]:
    """The strategy (stick choice, split, tiles) of `op` with its slices and cost parts,
    or None when the split is not legal for this stick choice. Without `full_pricing` only
    the no-residency and all-residency combinations are priced (for pruning). `orders`:
    per operand (inputs, then the output) a device dim order to price it in, None for the
    default (empty: every operand in the default)."""
    hw = ctx.hw
    orders = tuple(orders) if any(o is not None for o in orders) else ()
    split = {k: v for k, v in split.items() if v > 1}
    in_sticks = tuple(None if (s is None or s == ANY) else s for s in ch.inputs)
    base = _granules(op, ctx, [ANY if s is None else s for s in in_sticks], ch.output)
    # layouts the op sees: ANY operands as their producer's default (first) option
    layouts = {}
    for acc, s in zip(op.inputs, ch.inputs):
        t = acc.tensor
        st = s if (s is not None and s != ANY) else ctx.possible_sticks[t][0]
        # a stick the tensor cannot take is read from a restickified copy (default order)
        layouts[t] = ctx.layout(t, st, own=st in ctx.possible_sticks[t])
    layouts[op.output.tensor] = ctx.layout(op.output.tensor, ch.output)
    for acc, order in zip(list(op.inputs) + [op.output], orders):
        if order is not None:
            layouts[acc.tensor] = make_layout(ctx.shapes[acc.tensor], ctx.dtypes[acc.tensor],
                                              layouts[acc.tensor].stick_dim, hw.stick_bytes, order)
    any_forbidden: dict[int, frozenset] = {}
    split_dims = {i for i, d in enumerate(op.iter_dims) if d.name in split}
    for i, (acc, s) in enumerate(zip(op.inputs, ch.inputs)):
        if s != ANY:
            continue
        bad = set()
        for cand in ctx.possible_sticks[acc.tensor]:
            trial = [ANY if x is None else x for x in in_sticks]
            trial[i] = cand
            g = _granules(op, ctx, trial, ch.output)
            # a coarser granule is harmless where the split stays legal and cuts the same
            # slices (the emitter and the validator derive both from the actual layouts)
            if any(g.get(d, 1) != base.get(d, 1) for d in split_dims) and (
                    check_split(op, split, g, hw.cores) or any(
                        dim_chunk(op.iter_dims[d].size, split[op.iter_dims[d].name], g.get(d, 1))
                        != dim_chunk(op.iter_dims[d].size, split[op.iter_dims[d].name], base.get(d, 1))
                        for d in split_dims)):
                bad.add(cand)
        if bad:
            if set(ctx.possible_sticks[acc.tensor]) <= bad:
                return None
            any_forbidden[i] = frozenset(bad)
            ok = [c for c in ctx.possible_sticks[acc.tensor] if c not in bad]
            layouts[acc.tensor] = ctx.layout(acc.tensor, ok[0])
    if not _spans_fit(op, ctx, split, base, layouts):
        return None
    slices = default_core_slices(op, split) if split else []
    ranges = core_ranges(op, split, slices, base)
    out_t = op.output.tensor
    # slices of one extent write boxes of one size: the largest is the first slice's
    out_lx = box_lx_bytes(operand_box(op, -1, next(iter(ranges.values())), ctx.shapes[out_t]),
                          layouts[out_t], ctx.dtypes[out_t])
    view = OpView(op, "compute", ctx.shapes, ctx.dtypes, layouts, split, slices, alias, ctx.roles)
    may = [a.tensor in ctx.candidates for a in op.inputs] + [out_t in ctx.candidates]
    parts = op_cost_parts(view, hw, may if full_pricing else None)
    return Strategy(ch, split, dict(tiles or {}), alias, in_sticks, ch.output,
                    padded(out_lx, hw.stick_bytes), reduction_split(op, split), parts, any_forbidden,
                    view, tuple(may), ranges, orders=tuple(orders))


def _spans_fit(op: PrimOp, ctx: GraphContext, split: dict[str, int], gran: dict[int, int],
               layouts: dict) -> bool:
    """A split whose first core would span more than `per_core_span_bytes` of an operand is
    no strategy (the validator refuses it): mixture-of-experts weights (Mixtral-8x7B: 1.8 GB),
    a batch-32, 8k-context KV cache (537 MB) that a concat or attention reads. Only operands
    larger than the span can break it; a copy's inputs count with the box its slice reads,
    as the validator counts them."""
    limit = ctx.hw.per_core_span_bytes
    names = [a.tensor for a in op.inputs] + [op.output.tensor]
    if all(layout_nbytes(layouts[n], ctx.dtypes[n]) <= limit for n in names):
        return True
    spans = first_slice_spans(op, split, gran, {n: layouts[n] for n in names},
                              {n: ctx.shapes[n] for n in names}, {n: ctx.dtypes[n] for n in names},
                              copy_reads=True)
    return max(spans.values()) <= limit


def alias_strategy(op: PrimOp, ctx: GraphContext) -> Optional[Strategy]:
    """A copy that is a reshape keeping the natural dim order: free when its input is
    sticked on its last dim and the output too."""
    if op.body.kind != "copy" or len(op.inputs) != 1:
        return None
    src, dst = op.inputs[0].tensor, op.output.tensor
    rs, rd = len(ctx.shapes[src]), len(ctx.shapes[dst])
    if rs == 0 or rd == 0 or (rs - 1) not in ctx.possible_sticks[src]:
        return None
    ch = next((c for c in stick_options(op) if c.output == rd - 1), None)
    if ch is None:
        return None
    in_order = ctx.layout(src, rs - 1).dim_order
    out_order = ctx.layout(dst, rd - 1).dim_order
    if not copy_is_alias(op, ctx.shapes[src], in_order, ctx.shapes[dst], out_order,
                         ctx.dtypes[src], ctx.dtypes[dst], ctx.hw.stick_bytes):
        return None
    s = make_strategy(op, ctx, ch, {}, None, alias=True)
    if s is None:
        return None
    others = frozenset(x for x in ctx.possible_sticks[src] if x != rs - 1)
    if others:
        s.any_forbidden = {0: others}
    return s


def _input_bytes_per_core(op: PrimOp, ctx: GraphContext, split: Mapping[str, int]) -> int:
    """Bytes of its inputs one core of `split` reads (logical, largest slice): small when
    the split cuts every operand, large when it leaves one whole on every core."""
    total = 0
    for acc in op.inputs:
        shape = ctx.shapes[acc.tensor]
        n = 1
        for j, d in enumerate(acc.dims):
            size = shape[j]
            f = split.get(op.iter_dims[d].name, 1) if d is not None else 1
            n *= -(-size // f)
        total += n * DTYPE_BYTES[ctx.dtypes[acc.tensor]]
    return total


def required_from(op: PrimOp, plans: Sequence) -> list[tuple]:
    """`op_strategies`' `required` entries for the plans (PlanDecisions) whose strategies
    the space must hold (the hint's and the naive plan's): each plan's stick choice, split
    and alias of `op`."""
    req = []
    for d in plans:
        p = d.ops.get(op.id)
        if p is None:
            req.append((default_choice(op), {}, {}, False))
        else:
            req.append((p.stick or default_choice(op), {k: v for k, v in p.core_split.items() if v > 1},
                        {}, p.alias))
    return req


def op_strategies(op: PrimOp, ctx: GraphContext, keep: int = 4, keep_resident: int = 2,
                  max_split_dims: int = 2, required: Sequence[tuple] = (),
                  max_candidates: int = 12) -> list[Strategy]:
    """The pruned strategy list of `op`; `required` lists (StickChoice, split, tiles, alias)
    that must be present (the hint's). Ops of identical structure (same loop nest, body,
    operand shapes, dtypes and possible layouts: the repeated layers of a transformer) share
    one computed list."""
    key = (structure_key(op, ctx), keep, keep_resident, max_split_dims,
           tuple((ch, tuple(sorted(sp.items())), al) for ch, sp, _, al in required), max_candidates)
    cached = ctx.cache.get(key)
    if cached is None:
        shared = _shared_cache(ctx.hw)
        skey = (key, ONE_CORE_MAX_SLOWDOWN)
        cached = shared.get(skey) if shared is not None else None
        if cached is None:
            cached = _op_strategies(op, ctx, keep, keep_resident, max_split_dims, required, max_candidates)
            if shared is not None:
                with _SHARED_LOCK:
                    if len(shared) >= SHARED_CACHE_MAX:
                        shared.clear()
                    shared[skey] = cached
        ctx.cache[key] = cached
    return cached


# Strategy lists shared between the graph contexts of one target (`op_strategies`): the
# depth step prices the same layer's ops in several contexts (the representative's draws
# and re-solves, the core's search on what does not repeat, each a graph of its own), and
# a list depends only on its structure key (no tensor names) and the target. Callers copy
# the lists before changing them (`align_strategies`, `order_variants`), as they must for
# ops of one context sharing a list. At most SHARED_CACHE_MAX lists per target (then
# emptied: the lists of one model's distinct ops are a few hundred). The timing model is the
# target's (a changed target file loads a new target, with a cache of its own); code that
# swaps a pricing function at run time (a test) calls `clear_shared_cache` around it.
SHARED_CACHE_MAX = 4096
_SHARED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_SHARED_LOCK = threading.Lock()


def _shared_cache(hw) -> Optional[dict]:
    try:
        with _SHARED_LOCK:
            got = _SHARED.get(hw)
            if got is None:
                got = _SHARED[hw] = {}
            return got
    except TypeError:      # a target that cannot be weakly referenced: per context only
        return None


def clear_shared_cache() -> None:
    """Forget every shared strategy list (tests compare against fresh pricing)."""
    with _SHARED_LOCK:
        _SHARED.clear()


def structure_key(op: PrimOp, ctx: GraphContext) -> tuple:
    """Everything a strategy list depends on, without tensor names."""
    def acc_key(a) -> tuple:
        t = a.tensor
        return (a.dims, ctx.shapes[t], ctx.dtypes[t], tuple(ctx.possible_sticks[t]),
                t in ctx.candidates, ctx.roles.get(t), tuple(ctx.alt_orders.get(t, ())),
                ctx.pg.tensors[t].dim_order if t in ctx.pg.tensors else None)
    return (op.iter_dims, op.body, tuple(acc_key(a) for a in op.inputs), acc_key(op.output))


def _op_strategies(op: PrimOp, ctx: GraphContext, keep: int, keep_resident: int,
                   max_split_dims: int, required: Sequence[tuple], max_candidates: int) -> list[Strategy]:
    hw = ctx.hw
    out: list[Strategy] = []
    seen: set = set()

    def add(s: Optional[Strategy]) -> None:
        if s is not None and s.key() not in seen:
            seen.add(s.key())
            out.append(s)

    add(alias_strategy(op, ctx))
    few: list = []
    for ch in stick_options(op):
        in_sticks = [ANY if (s is None or s == ANY) else s for s in ch.inputs]
        gran = _granules(op, ctx, in_sticks, ch.output)
        splits = legal_core_splits(op, gran, hw.cores, max_split_dims=max_split_dims)

        def used(sp: dict[str, int]) -> int:
            n = 1
            for f in sp.values():
                n *= f
            return n
        # price at most `max_candidates`: the ones using the most cores, then the ones making
        # each core load the fewest operand bytes (a split an operand does not index has
        # every core of it load the operand's box), fewer split dims first
        splits.sort(key=lambda sp: (-used(sp), _input_bytes_per_core(op, ctx, sp), len(sp)))
        most = used(splits[0])
        wide = [sp for sp in splits if used(sp) * 4 >= most][:max_candidates]
        cands = [s for s in (make_strategy(op, ctx, ch, sp, full_pricing=False) for sp in wide)
                 if s is not None]
        if not cands:
            # Every many-core split is illegal for some operand's possible layouts (e.g. a
            # broadcast index vector whose dim cannot be cut in whole sticks): take the
            # widest split that is legal, down to one core, so no op is left without one.
            narrow = (make_strategy(op, ctx, ch, sp, full_pricing=False) for sp in splits if sp not in wide)
            cands = [s for s in narrow if s is not None][:1]
        if not cands:
            continue
        n_in = len(op.inputs)
        by_hbm = sorted(cands, key=lambda s: s.cost_ns(hw))
        # compute-bound candidates (what a plan that keeps operands in LX wants)
        by_res = sorted(cands, key=lambda s: (s.parts.base.compute_ns + s.parts.base.extra_ns,
                                              s.cost_ns(hw)))
        for s in by_hbm[:keep] + by_res[:keep_resident]:
            if s.key() not in seen:
                add(dataclasses.replace(s, parts=op_cost_parts(s.view, hw, s.may_reside)))
        few.append((ch, splits, by_hbm[0].cost_ns(hw)))
    for ch, split, tiles, alias in required:
        if alias:
            add(alias_strategy(op, ctx))
        else:
            add(make_strategy(op, ctx, ch, split, tiles))
    # last, so the strategies above keep their places (the solver's search order)
    for ch, splits, best_ns in few:
        add(_few_cores_strategy(op, ctx, ch, splits, seen, best_ns))
    if not out:
        raise NoLegalStrategy(op.id)
    return out


def _few_cores_strategy(op: PrimOp, ctx: GraphContext, ch: StickChoice, splits: Sequence[dict[str, int]],
                        seen: set, best_ns: float) -> Optional[Strategy]:
    """The stick choice on one core, priced in full, unless already kept, or unless even
    with every operand it may hold in LX it is priced above `ONE_CORE_MAX_SLOWDOWN` times
    `best_ns` (the choice's cheapest strategy in device memory: a large op, which one core
    never serves). On the
    timing model a small op on one core is nearly as fast as on all of them (a streaming
    kernel on part of the machine keeps most of the bus), and a chain of one-core ops can
    keep every intermediate in LX whatever their shapes (each reader reads the whole tensor
    its producer wrote on the same core), where wider splits stay resident only along
    aligned slicings. Without it a chain of small ops has no all-resident plan in the space."""
    if {} not in splits:
        return None
    s = make_strategy(op, ctx, ch, {}, full_pricing=False)
    if s is None or s.key() in seen or \
            min(c.total_ns for c in s.parts.combos.values()) > ONE_CORE_MAX_SLOWDOWN * best_ns:
        return None
    return dataclasses.replace(s, parts=op_cost_parts(s.view, ctx.hw, s.may_reside))


def compatible_residency(producer: Strategy, consumer: Strategy, slot: int) -> bool:
    """Can `consumer` read input `slot` from the LX slices `producer` wrote? Same layout
    (no restickify) and every core reads a box inside the one it holds."""
    if consumer.alias or producer.alias or producer.reduction_split:
        return False
    want = consumer.input_sticks[slot]
    if want is not None and want != producer.out_stick:
        return False
    held = producer.out_boxes
    for c, box in consumer.in_boxes[slot].items():
        h = held.get(c)
        if h is None or len(h) != len(box):
            return False
        for (ha, hb), (a, b) in zip(h, box):
            if b > a and not (ha <= a and b <= hb):
                return False
    return True


# -- aligned strategies: residency needs neighbours that slice a tensor alike ---------------
def _tensor_split(acc, op: PrimOp, split: Mapping[str, int]) -> Optional[dict[int, int]]:
    """Tensor dim -> factor that `split` cuts the tensor `acc` reads or writes into; None
    when the split also runs along an iteration dim the tensor does not index (every core
    of it needs the same slice: a replicated read, which LX residency cannot serve)."""
    indexed = {}
    for j, d in enumerate(acc.dims):
        if d is not None:
            indexed[op.iter_dims[d].name] = j
    out = {}
    for name, f in split.items():
        if f <= 1:
            continue
        if name not in indexed:
            return None
        out[indexed[name]] = f
    return out


def _split_from_tensor(acc, op: PrimOp, tsplit: Mapping[int, int]) -> Optional[dict[str, int]]:
    """The split of `op` that cuts the tensor `acc` like `tsplit` and nothing else."""
    out = {}
    for j, f in tsplit.items():
        d = acc.dims[j] if j < len(acc.dims) else None
        if d is None:
            return None
        out[op.iter_dims[d].name] = f
    return out


def align_strategies(pg: PrimGraph, ctx: GraphContext, strategies: Mapping[str, list[Strategy]],
                     seeds: int = 2, per_round: int = 12, max_added: int = 32,
                     max_rounds: int = 12, share_by_structure: bool = True) -> dict[str, list[Strategy]]:
    """Each op's pruned list holds its cheapest splits in isolation, and a tensor can stay in
    LX only where its producer and a reader slice it alike: a chain whose ops each kept
    other (equally cheap) splits could never be resident. For every residency candidate,
    add the reader strategy that reads exactly the slices a kept producer strategy writes,
    and the producer strategy that writes what a kept reader strategy reads (same layout,
    legal split, `compatible_residency`), spreading along chains from the strategies added
    in the round before, starting from each op's `seeds` cheapest; per op at most `per_round`
    a round (so a chain reaching an op late still gets in) and `max_added` in all, the
    cheapest in device memory first. `share_by_structure`: ops of one structure share their
    offers and their pricing (the same lists as pricing each op alone; off: each op alone,
    what tests compare with)."""
    hw = ctx.hw
    by_id = {op.id: op for op in pg.ops}
    out = {k: list(v) for k, v in strategies.items()}
    keys = {k: {s.key() for s in v} for k, v in out.items()}
    added = {k: 0 for k in out}
    producer = {op.output.tensor: op for op in pg.ops}
    readers: dict[str, list[tuple[PrimOp, int]]] = {}
    for op in pg.ops:
        for slot, a in enumerate(op.inputs):
            if a.tensor in ctx.candidates and op.body.kind != "copy":
                readers.setdefault(a.tensor, []).append((op, slot))
    legal_cache: dict[tuple, set] = {}
    # ops of one structure (the layers of a stack) share their offers and their pricing, as
    # they share their strategy lists (`op_strategies`): same strategies, each priced once
    skeys: dict[str, tuple] = {}

    def skey(op: PrimOp) -> tuple:
        k = skeys.get(op.id)
        if k is None:
            k = skeys[op.id] = structure_key(op, ctx) if share_by_structure else (op.id,)
        return k

    def legal(op: PrimOp, ch: StickChoice, split: dict[str, int]) -> bool:
        key = (skey(op), ch)
        if key not in legal_cache:
            in_sticks = [ANY if (s is None or s == ANY) else s for s in ch.inputs]
            legal_cache[key] = {tuple(sorted(sp.items())) for sp in
                                legal_core_splits(op, _granules(op, ctx, in_sticks, ch.output), hw.cores)}
        return tuple(sorted(split.items())) in legal_cache[key]

    made: dict[tuple, Optional[Strategy]] = {}
    priced: dict[int, tuple[Strategy, Strategy]] = {}   # id(offered) -> (offered, priced in full)

    def in_full(s: Strategy) -> Strategy:
        if not share_by_structure:
            return dataclasses.replace(s, parts=op_cost_parts(s.view, hw, s.may_reside))
        got = priced.get(id(s))
        if got is None:
            got = priced[id(s)] = (s, dataclasses.replace(s, parts=op_cost_parts(s.view, hw, s.may_reside)))
        return got[1]

    def offer(op: PrimOp, ch: StickChoice, split: dict[str, int], fits) -> Optional[Strategy]:
        key = (skey(op), ch, tuple(sorted(split.items())))
        if key not in made:
            # priced in full only once accepted (below)
            made[key] = (make_strategy(op, ctx, ch, split, full_pricing=False)
                         if split and legal(op, ch, split) else None)
        s = made[key]
        return s if s is not None and s.key() not in keys[op.id] and fits(s) else None

    # chains grow from each op's cheapest strategies (growing them from all would fill the
    # per-op allowance with aligned copies of strategies no plan wants)
    frontier = {k: sorted(v, key=lambda s: s.cost_ns(hw))[:seeds] for k, v in out.items()}
    for _ in range(max_rounds):
        offers: dict[str, list[Strategy]] = {}
        for t, rs in readers.items():
            p = producer[t]
            if p.body.kind == "copy":
                continue
            for c, slot in rs:
                acc_in = c.inputs[slot]
                for sp in frontier[p.id]:
                    if sp.alias or sp.reduction_split:
                        continue
                    ts = _tensor_split(p.output, p, sp.core_split)
                    split = _split_from_tensor(acc_in, c, ts) if ts is not None else None
                    if split is None:
                        continue
                    for ch in stick_options(c):
                        if ch.inputs[slot] not in (None, ANY, sp.out_stick):
                            continue
                        s = offer(c, ch, split, lambda s, sp=sp: compatible_residency(sp, s, slot))
                        if s is not None:
                            offers.setdefault(c.id, []).append(s)
                for sc in frontier[c.id]:
                    if sc.alias:
                        continue
                    ts = _tensor_split(acc_in, c, sc.core_split)
                    split = _split_from_tensor(p.output, p, ts) if ts is not None else None
                    if split is None:
                        continue
                    for ch in stick_options(p):
                        if sc.input_sticks[slot] not in (None, ch.output):
                            continue
                        s = offer(p, ch, split, lambda s, sc=sc: compatible_residency(s, sc, slot))
                        if s is not None:
                            offers.setdefault(p.id, []).append(s)
        frontier = {k: [] for k in out}
        for op_id, cands in offers.items():
            this_round = 0
            for s in sorted(cands, key=lambda s: s.cost_ns(hw)):
                if added[op_id] >= max_added or this_round >= per_round or s.key() in keys[op_id]:
                    continue
                this_round += 1
                s = in_full(s)
                keys[op_id].add(s.key())
                out[op_id].append(s)
                frontier[op_id].append(s)
                added[op_id] += 1
        if not any(frontier.values()):
            break
    return out


# -- dominated strategies -------------------------------------------------------------------
# A strategy is dropped only when another of its op, of the same stick choice and operand
# orders, prices below it by at least this share in every residency combination.
DOMINANCE_MARGIN = 0.02
# read as `strategies.DROP_DOMINATED` by `model.build_model` (a test or benchmark may turn it off)
DROP_DOMINATED = False


def _dominates(a: Strategy, b: Strategy) -> bool:
    """Is `a` cheaper than `b` by `DOMINANCE_MARGIN` in every residency combination `b` may
    run in, with the same stick choice, operand orders and residency candidates? A
    combination holding an operand `a` slices otherwise than `b` is compared with `a`
    reading (or writing) that operand in device memory: what lets `b` hold it (a neighbour
    slicing it alike) need not let `a`."""
    if a.alias or b.alias or a.stick != b.stick or a.orders != b.orders or a.may_reside != b.may_reside:
        return False
    ca, cb = a.parts.combos, b.parts.combos
    if ca.keys() != cb.keys():
        return False
    n_in = len(b.may_reside) - 1
    alike = [not b.may_reside[i] or (a.in_boxes[i] == b.in_boxes[i] if i < n_in else a.out_boxes == b.out_boxes)
             for i in range(len(b.may_reside))]
    for k, cost in cb.items():
        held = tuple(x and same for x, same in zip(k, alike))
        if held not in ca or ca[held].total_ns > (1 - DOMINANCE_MARGIN) * cost.total_ns:
            return False
    return True


def drop_dominated(pg: PrimGraph, strategies: Mapping[str, list[Strategy]],
                   required: Mapping[str, set] = None) -> dict[str, list[Strategy]]:
    """Each op's strategies without those another strategy of the same op dominates (same
    stick choice and orders, cheaper in every residency combination by `DOMINANCE_MARGIN`):
    whatever a plan holds in LX around it, the dominating one costs less. `required[op]`:
    keys (`Strategy.key()`) kept regardless (the hint's and the naive plan's)."""
    required = required or {}
    out: dict[str, list[Strategy]] = {}
    for op_id, ss in strategies.items():
        keep_keys = required.get(op_id, set())
        out[op_id] = [s for s in ss if s.key() in keep_keys or not any(_dominates(o, s) for o in ss if o is not s)]
    return out
