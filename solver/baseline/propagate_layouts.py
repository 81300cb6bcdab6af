"""Stick layouts the torch-spyre way: candidate propagation, then beam search (width 64 as of
mid-2026, 200 now) over the candidates with cost = elements restickified.

Reimplements torch-spyre's `propagate_layouts.py` (which candidate output layouts an op
offers) and `optimize_restickify.py` (`beam_global_min_cost`) on our primitive ops; the
stick rules themselves come from `target.op_rules.stick_options`, never re-encoded here.

Upstream behaviour kept on purpose (it is the baseline):
- graph inputs have exactly one layout, the one they were transferred in (stick on the
  last dim);
- an op's candidate output layouts are *propagated* from its inputs' candidate layouts:
  a stick choice is offered when some constrained input could already arrive sticked that
  way; only when none can are all the op's choices offered (upstream's "try alternative
  layouts" fallback). Copies (upstream: clone) produce the generic row-major layout, stick
  on the last dim; fills (upstream: constants) offer every stick dim;
- the cost of a choice is, per input edge whose current layout does not satisfy the
  choice, the element count of that input's device layout (`prod(device_size)`, padding
  included). Edges are charged independently: two consumers that need the same
  restickify are charged twice, as upstream's `EdgeCostMap` does (the emitter still
  inserts one shared restickify);
- states are expanded op by op in program order and trimmed to the `width` cheapest (stable
  sort: on a tie the earlier-generated state, i.e. the earlier candidate, wins);
- now (`liveness_merge`, the `heuristic` planner): before trimming, of the states that agree
  on the stick of every produced tensor a later op still reads, only the cheapest is kept
  (upstream's documented "liveness merge": exact, the others cannot end cheaper). Upstream's
  other documented pruning, trimming by cost plus a backward-DP bound on the remaining
  cost, is not reimplemented (docs/baseline.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from target.op_rules import ANY, StickChoice, default_choice, stick_options
from target.primitives import PrimGraph, PrimOp
from target.geometry import make_layout

# Upstream's beam width as of the baseline's mid-2026 update (`BEAM_WIDTH = 64`), and the
# width its documentation gives now (the `heuristic` planner's).
BEAM_WIDTH = 64
UPSTREAM_BEAM_WIDTH = 200


@dataclass
class LayoutPlan:
    """The committed layouts: a stick choice per op and the stick dim of every tensor."""

    choices: dict[str, StickChoice]
    stick_of: dict[str, Optional[int]]
    restick_elements: int     # the beam's cost of the committed state
    max_states: int


def device_elements(shape: Sequence[int], dtype: str, stick_dim: Optional[int], stick_bytes: int) -> int:
    """Elements of a tensor's device layout (stick dim padded to whole sticks)."""
    n = 1
    for s in make_layout(shape, dtype, stick_dim, stick_bytes).device_size:
        n *= s
    return n


def _constrained(spec) -> bool:
    return spec is not None and spec != ANY


def candidate_choices(op: PrimOp, candidate_sticks: dict[str, set]) -> list[StickChoice]:
    """The stick choices `op` offers, propagated from its inputs' candidate layouts."""
    options = stick_options(op)
    if op.body.kind == "copy":
        return [default_choice(op)]
    if len(options) == 1 or op.body.kind == "fill":
        return options
    propagated = [ch for ch in options
                  if any(_constrained(spec) and spec in candidate_sticks.get(acc.tensor, ())
                         for spec, acc in zip(ch.inputs, op.inputs))]
    return propagated or options


def beam_search_layouts(pg: PrimGraph, stick_bytes: int, width: int = BEAM_WIDTH,
                        input_sticks: Optional[dict[str, Optional[int]]] = None,
                        liveness_merge: bool = False) -> LayoutPlan:
    """The committed stick layouts. `liveness_merge`: drop a state that agrees with a
    cheaper one on every tensor still to be read (upstream's beam now does; exact: it never
    drops a state that could end cheaper)."""
    produced = {op.output.tensor for op in pg.ops}
    slot: dict[str, int] = {}
    base: list[Optional[int]] = []
    candidate_sticks: dict[str, set] = {}
    for t in pg.tensors.values():
        if t.id in produced:
            continue
        rank = len(t.shape)
        s = (input_sticks or {}).get(t.id, rank - 1 if rank else None)
        slot[t.id] = len(base)
        base.append(s)
        candidate_sticks[t.id] = {s}

    op_choices: list[list[StickChoice]] = []
    for op in pg.ops:
        cands = candidate_choices(op, candidate_sticks)
        op_choices.append(cands)
        candidate_sticks.setdefault(op.output.tensor, set()).update(ch.output for ch in cands)

    # A beam state is (cost, node, live): `node` a chain of back-pointers, one per op (the
    # op's output stick, its candidate index, the previous op's node), to read the committed
    # assignment back at the end (copying whole assignments per state and op was quadratic
    # in the number of ops); `live` the sticks of the produced tensors a later op still
    # reads, the only ones the rest of the search looks at. Liveness merge (upstream's
    # documented pruning): of two states with the same `live`, only the cheaper can win.
    n_base = len(base)
    for i, op in enumerate(pg.ops):
        slot[op.output.tensor] = n_base + i
    last_read: dict[int, int] = {}
    for i, op in enumerate(pg.ops):
        for acc in op.inputs:
            if slot[acc.tensor] >= n_base:
                last_read[slot[acc.tensor]] = i
    states: list[tuple] = [(0.0, None, ())]
    live_slots: list[int] = []          # produced slots live before op i, in slot order
    cost_cache: dict[tuple, int] = {}
    max_states = 1

    for i, (op, cands) in enumerate(zip(pg.ops, op_choices)):
        position = {k: j for j, k in enumerate(live_slots)}
        keep = [j for j, k in enumerate(live_slots) if last_read[k] > i]
        out_live = last_read.get(n_base + i, -1) > i
        live_slots = [live_slots[j] for j in keep] + ([n_base + i] if out_live else [])
        reads = [(spec_i, slot[acc.tensor], acc.tensor) for spec_i, acc in enumerate(op.inputs)]
        nxt = []
        for cost, node, live in states:
            kept = tuple(live[j] for j in keep)
            for ci, ch in enumerate(cands):
                extra = 0
                for spec_i, k, tensor in reads:
                    spec = ch.inputs[spec_i]
                    if not _constrained(spec):
                        continue
                    have = base[k] if k < n_base else live[position[k]]
                    if have == spec:
                        continue
                    key = (tensor, have)
                    if key not in cost_cache:
                        t = pg.tensors[tensor]
                        cost_cache[key] = device_elements(t.shape, t.dtype, have, stick_bytes)
                    extra += cost_cache[key]
                nxt.append((cost + extra, (ch.output, ci, node), kept + (ch.output,) if out_live else kept))
        nxt.sort(key=lambda st: st[0])
        if liveness_merge:
            seen: set = set()
            merged = []
            for st in nxt:
                if st[2] not in seen:
                    seen.add(st[2])
                    merged.append(st)
            nxt = merged
        states = nxt[:width]
        max_states = max(max_states, len(states))

    best_cost, node, _ = states[0]
    picks: list[int] = []
    outs: list = []
    for _ in pg.ops:
        outs.append(node[0])
        picks.append(node[1])
        node = node[2]
    picks.reverse()
    outs.reverse()
    best_assign = tuple(base) + tuple(outs)
    choices = {op.id: cands[i] for op, cands, i in zip(pg.ops, op_choices, picks)}
    stick_of = {t: best_assign[k] for t, k in slot.items()}
    return LayoutPlan(choices=choices, stick_of=stick_of, restick_elements=int(best_cost),
                      max_states=max_states)
