"""The repeated block of a graph and the copying of one copy's decisions to the others.

`find_repeats` finds the block: a structural signature per op (body, iteration dims, each
operand's access, shape, dtype and, for graph inputs, role; never ids or source names), the
period of the signature sequence (candidate periods are the distances between consecutive
ops of equal signature; each is checked in one vectorised pass over the sequence, so no
structure over pairs of ops is ever built), then an edge check per copy: every operand
produced inside the block comes from the op at the same position of the same copy,
everything else is a boundary input of the same shape, dtype and role.
`copy_decisions` renames one copy's decisions (ops, weight layouts, residencies, restickify
splits, bundle starts and op order) through another copy's op and tensor maps (`copy_map`);
`partial_edges` and `partial_copy` do the same for the ops just outside the copies that
repeat the block's end and start. `repeats.plan_depth` and `stacks.plan_stack` plan with them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Optional, Sequence

import numpy as np

from target.primitives import PrimGraph, body_to_json
from solver.plan import PlanDecisions
from solver.spyre import budget


@dataclass
class Repeats:
    """`copies` blocks of `period` consecutive ops starting at op index `start` (of the
    graph as given, in its op order) are isomorphic: op `start + c * period + j` of copy c
    corresponds to op j of every other copy."""
    start: int
    period: int
    copies: int

    def block(self, c: int) -> range:
        a = self.start + c * self.period
        return range(a, a + self.period)

    @property
    def stop(self) -> int:
        return self.start + self.copies * self.period


def _json_key(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def op_signatures(pg: PrimGraph, user_inputs_as_intermediates: bool = False) -> list[int]:
    """Per op, a small integer naming its structure (equal integers: equal structure): body,
    iteration dims, output and operand accesses with their tensors' shapes and dtypes, and
    the role of operands that are graph inputs (`user_inputs_as_intermediates`: a user input
    counts as an intermediate: the first layer reads the model's input where later ones read
    the layer before). Ids and source names are left out. Exact (a dictionary of the keys,
    no hash collisions)."""
    produced = {op.output.tensor for op in pg.ops}
    ids: dict[tuple, int] = {}
    out: list[int] = []
    body_cache: dict[int, str] = {}
    for op in pg.ops:
        bkey = body_cache.get(id(op.body))
        if bkey is None:
            bkey = body_cache[id(op.body)] = _json_key(body_to_json(op.body))
        ins = []
        for a in op.inputs:
            t = pg.tensors[a.tensor]
            plain = a.tensor in produced or (user_inputs_as_intermediates and t.role == "user_input")
            ins.append((a.dims, t.shape, t.dtype, "" if plain else t.role))
        o = pg.tensors[op.output.tensor]
        key = (bkey, op.iter_dims, op.output.dims, o.shape, o.dtype, tuple(ins))
        out.append(ids.setdefault(key, len(ids)))
    return out


def _candidate_periods(sig: np.ndarray, n: int) -> list[int]:
    last: dict[int, int] = {}
    count: dict[int, int] = {}
    for i, s in enumerate(sig.tolist()):
        j = last.get(s)
        if j is not None:
            p = i - j
            if budget.MIN_BLOCK_OPS <= p <= n // 2:
                count[p] = count.get(p, 0) + 1
        last[s] = i
    return [p for p, _ in sorted(count.items(), key=lambda kv: (-kv[1], kv[0]))[:budget.MAX_PERIODS]]


def _longest_run(eq: np.ndarray) -> tuple[int, int]:
    """(start, length) of the longest run of True in `eq` (first one on ties)."""
    if not eq.any():
        return 0, 0
    padded = np.concatenate(([False], eq, [False]))
    d = np.diff(padded.astype(np.int8))
    starts, ends = np.flatnonzero(d == 1), np.flatnonzero(d == -1)
    k = int(np.argmax(ends - starts))
    return int(starts[k]), int(ends[k] - starts[k])


def _edges(pg: PrimGraph, producer_idx: dict[str, int], block: range) -> Optional[list[tuple]]:
    """The block's internal wiring: per op, per operand, the position of its producer in
    the block, or None for a boundary input."""
    out = []
    for i in block:
        row = []
        for a in pg.ops[i].inputs:
            p = producer_idx.get(a.tensor)
            row.append(p - block.start if p is not None and p in block else None)
        out.append(tuple(row))
    return out


def find_repeats(pg: PrimGraph, min_copies: int = 2) -> Optional[Repeats]:
    """The repeated block covering the most ops of `pg` (module docstring), or None.
    Linear in ops per candidate period, at most `budget.MAX_PERIODS` periods."""
    n = len(pg.ops)
    if n < 2 * budget.MIN_BLOCK_OPS:
        return None
    sig = np.asarray(op_signatures(pg), dtype=np.int64)
    best: Optional[Repeats] = None
    span = 0
    for p in _candidate_periods(sig, n):
        start, length = _longest_run(sig[:-p] == sig[p:])
        copies = (length + p) // p   # a run of `length` matches covers length + p ops
        if copies < min_copies:
            continue
        cover = copies * p
        if best is None or cover > best.copies * best.period or (
                cover == best.copies * best.period and p < best.period):
            best, span = Repeats(start, p, copies), length + p
    if best is None:
        return None
    return _verified(pg, _aligned(pg, best, span, min_copies), min_copies)


def _aligned(pg: PrimGraph, rep: Repeats, span: int, min_copies: int) -> Repeats:
    """Any rotation of a repeated block repeats too (a block may start mid-layer); choose
    the one whose copies cut the fewest tensors (read across the block's start or end:
    layer boundaries cut the residual stream and little else), keeping the most copies.
    `span`: the ops the matching run covers from `rep.start`. O(period^2)."""
    producer_idx = {op.output.tensor: i for i, op in enumerate(pg.ops)}
    last_read: dict[str, int] = {}
    for i, op in enumerate(pg.ops):
        for a in op.inputs:
            last_read[a.tensor] = i
    outs = set(pg.outputs)

    def cut(a: int) -> int:
        b = a + rep.period
        into = {x.tensor for i in range(a, b) for x in pg.ops[i].inputs
                if producer_idx.get(x.tensor, b) < a}
        out = {pg.ops[i].output.tensor for i in range(a, b)
               if last_read.get(pg.ops[i].output.tensor, -1) >= b or pg.ops[i].output.tensor in outs}
        return len(into) + len(out)

    best = (rep.copies, -cut(rep.start + (rep.copies // 2) * rep.period), 0)
    for shift in range(1, rep.period):
        copies = (span - shift) // rep.period
        if copies < max(min_copies, rep.copies - 1):
            break
        key = (copies, -cut(rep.start + shift + (copies // 2) * rep.period), shift)
        if (key[1] > best[1] and key[0] >= rep.copies - 1) if key[0] < best[0] else key[:2] > best[:2]:
            best = key
    copies, _, shift = best
    return Repeats(rep.start + shift, rep.period, copies)


def _verified(pg: PrimGraph, rep: Repeats, min_copies: int) -> Optional[Repeats]:
    """The longest run of consecutive copies whose wiring matches (signatures match by
    construction; this checks the edges)."""
    producer_idx = {op.output.tensor: i for i, op in enumerate(pg.ops)}
    wiring = [_edges(pg, producer_idx, rep.block(c)) for c in range(rep.copies)]
    best_a, best_len, a = 0, 0, 0
    for c in range(1, rep.copies + 1):
        if c == rep.copies or wiring[c] != wiring[a]:
            if c - a > best_len:
                best_a, best_len = a, c - a
            a = c
    if best_len < min_copies:
        return None
    return Repeats(rep.start + best_a * rep.period, rep.period, best_len)


# -- copying a plan ---------------------------------------------------------------------------
@dataclass
class CopyMap:
    """Op and tensor renaming from the representative copy to another copy."""
    ops: dict[str, str] = field(default_factory=dict)
    tensors: dict[str, str] = field(default_factory=dict)


def copy_map(pg: PrimGraph, src: Sequence[int], dst: Sequence[int]) -> CopyMap:
    m = CopyMap()
    for i, j in zip(src, dst):
        a, b = pg.ops[i], pg.ops[j]
        m.ops[a.id] = b.id
        m.tensors[a.output.tensor] = b.output.tensor
        for x, y in zip(a.inputs, b.inputs):
            m.tensors.setdefault(x.tensor, y.tensor)
    return m


def _rename_restick(key: str, tmap: dict[str, str]) -> Optional[str]:
    """`tensor@stickN` renamed through tmap (None when the tensor is not in the map)."""
    t, sep, tail = key.rpartition("@stick")
    if not sep:
        return tmap.get(key)
    return f"{tmap[t]}@stick{tail}" if t in tmap else None


def copy_decisions(rep_d: PlanDecisions, m: CopyMap, boundary_inputs: set[str]) -> PlanDecisions:
    """The representative's decisions for another copy: every op plan, layout of the
    copy's weights, residency, restickify split, device dim order, bundle start and the op
    order, renamed.
    Boundary inputs produced outside the block keep their producers' layouts (not copied)."""
    out = PlanDecisions(planner=rep_d.planner)
    for o, p in rep_d.ops.items():
        if o in m.ops:
            out.ops[m.ops[o]] = replace(p, core_split=dict(p.core_split), temporal_tiles=dict(p.temporal_tiles))
    for t, s in rep_d.input_sticks.items():
        if t in m.tensors and t not in boundary_inputs:
            out.input_sticks[m.tensors[t]] = s
    for key, r in rep_d.resident.items():
        k2 = _rename_restick(key, m.tensors)
        if k2 is not None:
            out.resident[k2] = replace(r)
    for key, p in rep_d.restick_ops.items():
        k2 = _rename_restick(key, m.tensors)
        if k2 is not None:
            out.restick_ops[k2] = replace(p, core_split=dict(p.core_split))
    for key, order in rep_d.dim_orders.items():  # the planner's device dim orders
        k2 = _rename_restick(key, m.tensors)
        if k2 is not None and (key.rpartition("@stick")[0] or key) not in boundary_inputs:
            out.dim_orders[k2] = list(order)
    out.bundle_starts = [m.ops[o] for o in rep_d.bundle_starts if o in m.ops]
    out.op_order = [m.ops[o] for o in rep_d.op_order if o in m.ops]
    return out


def partial_edges(pg: PrimGraph, rep: Repeats, sig: Optional[list[int]] = None) -> tuple[int, int]:
    """How many ops right before the first copy and right after the last one repeat the
    block's end and start (a layer cut mid-way by the block boundary: the first layer's
    attention before the first copy, the last layer's MLP after the last; or a whole first
    layer that reads the model's input): (before, after), each at most a period. Equal signatures, op by op, outward from the copies."""
    sig = sig if sig is not None else op_signatures(pg, user_inputs_as_intermediates=True)
    before = 0
    while before < rep.period and rep.start - before - 1 >= 0 and \
            sig[rep.start - before - 1] == sig[rep.start + rep.period - before - 1]:
        before += 1
    after = 0
    while after < rep.period and rep.stop + after < len(pg.ops) and \
            sig[rep.stop + after] == sig[rep.start + after]:
        after += 1
    return before, after


def partial_copy(pg: PrimGraph, rep_d: PlanDecisions, src: list[int], dst: list[int],
                 readers: dict[str, list[int]]) -> PlanDecisions:
    """The representative's decisions for a part of a copy (`dst`, matching the block
    positions `src`): op plans and weight layouts; LX residencies only of tensors produced
    and read entirely inside `dst`; the part starts a bundle."""
    m = copy_map(pg, src, dst)
    produced_inside = {pg.ops[j].output.tensor for j in dst}
    produced_anywhere = {op.output.tensor for op in pg.ops}
    boundary = {t for t in m.tensors.values() if t in produced_anywhere and t not in produced_inside}
    d = copy_decisions(rep_d, m, {k for k, v in m.tensors.items() if v in boundary})
    inside = set(dst)

    outputs = set(pg.outputs)

    def whole(t: str) -> bool:
        base = t.rpartition("@stick")[0] or t
        return base in produced_inside and base not in outputs and all(r in inside for r in readers.get(base, ()))
    d.resident = {t: r for t, r in d.resident.items() if whole(t)}
    ids = [pg.ops[j].id for j in dst]
    order = [o for o in d.op_order if o in set(ids)]
    d.op_order = order if len(order) == len(ids) else ids
    d.bundle_starts = [o for o in d.bundle_starts if o in set(ids)]
    return d


def repeats_note(rep: Repeats, n_ops: int) -> str:
    return (f"repeats: {rep.copies} copies of a {rep.period}-op block from op {rep.start} "
            f"({rep.copies * rep.period} of {n_ops} ops); one copy solved, decisions reused")
