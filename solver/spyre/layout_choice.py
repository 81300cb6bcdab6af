"""The non-stick dim order of intermediates as a decision of the CP-SAT planner.

A tensor's device layout is its stick dim (chosen with its producer's stick choice) and the
order of its other dims (`superdsc.Layout.dim_order`; the emitter's default is plain
row-major, `target.layout.default_dim_order`). The order changes what the timing model
charges: a batched matmul whose operand keeps a batch dim inside its row dims stalls its
feed or drain (`simulator.timing_terms.matmul_layout_stall`), and a reshape copy is a free
alias only between row-major layouts (`target.op_rules.copy_is_alias`). Where producer and
reader want different orders, one of them pays: the order the tensor takes is one, and the
reader that wanted the other is priced in it (a copy reading a non-row-major tensor moves
its data: the relayout, priced by the simulator like every op).

Candidates (`candidate_orders`), pruned per tensor: intermediates with one possible stick dim
(the producer's rule fixes it, as a matmul's output on n), not graph outputs; the default,
plus each order some op touching the tensor prefers on the timing model: for every op that
reads or writes it, the orders `target.layout.preferred_orders` proposes from the op's
access (its batch dims outermost; torch-spyre's default), and the order a hint gives it,
kept when one of that op's strategies prices strictly lower with the tensor in that order
than in the default (the judge charges a batch-inside operand only for the batches one
core's slice interleaves, so it depends on the split; `MAX_ALT_ORDERS` at most, the best
gain first).

Strategies (`order_variants`): every strategy of an op touching a candidate is repeated for
each combination of its candidates' orders (the default combination is the original), priced
in full by the simulator's per-op analysis (`cost_model.op_cost_parts`); an alias copy only
in the default (`copy_is_alias` needs it). A reader reading the tensor through a
restickified copy does not see its order (the copy is laid out in the default).

The model (`SpyreModel`) channels each candidate's order: one Boolean per order, exactly one
true, implied by every strategy of the producer and every reader that reads it directly;
local search moves a tensor's order with its producer and readers together (`order_moves`).
The choice reaches the emitter through `PlanDecisions.dim_orders`.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Iterator, Mapping, Optional

from target.layout import default_dim_order, preferred_orders
from target.primitives import PrimGraph
from solver.spyre.cost_model import op_cost_parts, to_units
from solver.spyre.strategies import GraphContext, Strategy, make_strategy

# Non-default orders offered per tensor (each multiplies its producer's and readers'
# strategies): the two best are enough for the cases the timing model distinguishes
# (batch outermost for a matmul feed or drain, row-major for an alias copy).
MAX_ALT_ORDERS = 2


def _reads_directly(s: Strategy, slot: int, ctx: GraphContext, t: str) -> bool:
    """Does strategy `s` read (or write, slot -1) tensor t in t's own layout (not through a
    restickified copy)?"""
    if slot < 0:
        return True
    want = s.input_sticks[slot]
    return want is None or want == ctx.possible_sticks[t][0]


def _slots(op, t: str) -> list[int]:
    """Operand slots of `op` naming t (inputs by index, the output as -1)."""
    out = [i for i, a in enumerate(op.inputs) if a.tensor == t]
    if op.output.tensor == t:
        out.append(-1)
    return out


def candidate_orders(pg: PrimGraph, ctx: GraphContext, strategies: Mapping[str, list[Strategy]],
                     hint_orders: Optional[Mapping[str, list[int]]] = None) -> dict[str, list[tuple]]:
    """Per intermediate whose order is worth deciding, its non-default candidate orders
    (module docstring), at most `MAX_ALT_ORDERS`, the largest gain first."""
    hw = ctx.hw
    outputs = set(pg.outputs)
    touching: dict[str, list] = {}
    for op in pg.ops:
        for a in list(op.inputs) + [op.output]:
            touching.setdefault(a.tensor, [])
            if op not in touching[a.tensor]:
                touching[a.tensor].append(op)
    produced = {op.output.tensor for op in pg.ops}
    out: dict[str, list[tuple]] = {}
    for t in sorted(produced):
        if t in outputs or len(ctx.possible_sticks[t]) != 1 or len(ctx.shapes[t]) < 2 \
                or ctx.pg.tensors[t].dim_order is not None:   # the graph fixes its order
            continue
        stick = ctx.possible_sticks[t][0]
        rank = len(ctx.shapes[t])
        default = tuple(default_dim_order(rank, stick))
        proposals: list[tuple] = []
        for op in touching[t]:
            for slot in _slots(op, t):
                acc = op.output if slot < 0 else op.inputs[slot]
                for order in preferred_orders(op, acc, ctx.shapes[t], stick):
                    if tuple(order) != default and tuple(order) not in proposals:
                        proposals.append(tuple(order))
        if hint_orders and t in hint_orders and tuple(hint_orders[t]) != default \
                and tuple(hint_orders[t]) not in proposals:
            proposals.append(tuple(hint_orders[t]))
        gains: dict[tuple, int] = {}
        for order in proposals:
            for op in touching[t]:
                # any of the op's strategies (a plan may run it on any): its best gain
                for base in [s for s in strategies[op.id] if not s.alias and not s.orders]:
                    slots = [sl for sl in _slots(op, t) if _reads_directly(base, sl, ctx, t)]
                    if not slots:
                        continue
                    orders = [None] * (len(op.inputs) + 1)
                    for sl in slots:
                        orders[sl] = order
                    v = make_strategy(op, ctx, base.stick, base.core_split, full_pricing=False,
                                      orders=tuple(orders))
                    if v is None:
                        continue
                    gain = to_units(base.cost_ns(hw)) - to_units(v.cost_ns(hw))
                    if gain > 0:
                        gains[order] = max(gains.get(order, 0), gain)
        kept = sorted(gains, key=lambda o: (-gains[o], o))[:MAX_ALT_ORDERS]
        if kept:
            out[t] = kept
    return out


def order_variants(pg: PrimGraph, ctx: GraphContext, strategies: Mapping[str, list[Strategy]]
                   ) -> dict[str, list[Strategy]]:
    """Every strategy of an op touching a candidate of `ctx.alt_orders`, repeated for each
    non-default combination of the orders of the candidates it touches directly (module
    docstring); the other ops' lists unchanged."""
    hw = ctx.hw
    out = {k: list(v) for k, v in strategies.items()}
    if not ctx.alt_orders:
        return out
    for op in pg.ops:
        names = [a.tensor for a in op.inputs] + [op.output.tensor]
        slots = [sl if sl < len(op.inputs) else -1 for sl, t in enumerate(names) if t in ctx.alt_orders]
        if not slots:
            continue
        seen = {s.key() for s in out[op.id]}
        for s in list(out[op.id]):
            if s.alias:
                continue
            direct = [sl for sl in slots if _reads_directly(s, sl, ctx, names[sl])]
            if not direct:
                continue
            choices = []
            for sl in direct:
                t = names[sl]
                choices.append([None] + list(ctx.alt_orders[t]))
            for combo in itertools.product(*choices):
                if all(o is None for o in combo):
                    continue
                orders = [None] * (len(op.inputs) + 1)
                for sl, o in zip(direct, combo):
                    orders[sl] = o
                # one tensor read in two slots takes one order
                by_t: dict[str, set] = {}
                for sl, o in zip(direct, combo):
                    by_t.setdefault(names[sl], set()).add(o)
                if any(len(v) > 1 for v in by_t.values()):
                    continue
                v = make_strategy(op, ctx, s.stick, s.core_split, s.temporal_tiles, full_pricing=False,
                                  orders=tuple(orders))
                if v is None or v.key() in seen:
                    continue
                seen.add(v.key())
                out[op.id].append(dataclasses.replace(v, parts=op_cost_parts(v.view, hw, v.may_reside)))
    return out


def strategy_order(s: Strategy, slot: int) -> Optional[tuple]:
    """The order strategy `s` assumes for operand `slot` (-1: output); None: the default."""
    return s.order_of(slot)


def order_moves(sm, t: str, picks: dict[str, int]) -> Iterator[dict[str, int]]:
    """Moves of candidate t to each other order: its producer and every reader reading it
    directly onto the variant of their current strategy with t in that order (same stick
    choice, split and alias), or where there is none (an alias copy), onto the op's
    cheapest strategy of the same stick choice with t in that order. Skipped where some op
    has neither."""
    ctx = sm.ctx
    current = sm.tensor_order(t, picks)
    for order in [None] + list(ctx.alt_orders.get(t, ())):
        if order == current:
            continue
        change = {}
        ok = True
        for o, slot in sm.order_users(t):
            s = sm.S[o][picks[o]]
            if not _reads_directly(s, slot, ctx, t):
                continue
            want = list(s.orders) if s.orders else [None] * (len(sm.ops[o].inputs) + 1)
            want[slot] = order
            want = tuple(want)
            if all(x is None for x in want):
                want = ()
            k = sm.variant_index(o, s, want)
            if k is None:
                # no such variant (an alias copy is one only in the default order): the op's
                # cheapest strategy of the same stick choice with t in that order
                ks = [j for j, x in enumerate(sm.S[o]) if x.stick == s.stick and not x.alias
                      and _reads_directly(x, slot, ctx, t) and x.order_of(slot) == order]
                if not ks:
                    ok = False
                    break
                _, _, body = sm.combos[o]
                k = min(ks, key=lambda j: (body[j][0] + to_units(sm.S[o][j].parts.base.extra_ns), j))
            if k != picks[o]:
                change[o] = k
        if ok and change:
            yield change
