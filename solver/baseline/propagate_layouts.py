"""Stick layouts the torch-spyre way: candidate propagation, then beam search (width 64)
over the candidates with cost = elements restickified.

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
- states are expanded op by op in program order and trimmed to the 64 cheapest (stable
  sort: on a tie the earlier-generated state, i.e. the earlier candidate, wins).
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
                        input_sticks: Optional[dict[str, Optional[int]]] = None) -> LayoutPlan:
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

    # A beam state is a chain of back-pointers, one node per op: (cost, the op's output
    # stick, its candidate index, the node of the previous op). Copying whole assignments
    # per state and op was quadratic in the number of ops (0.64 s of the 32-layer Llama's
    # 2.1 s heuristic plan); a tensor's stick is found by walking back to its producer.
    n_base = len(base)
    states: list[tuple] = [(0.0, None, None, None)]
    cost_cache: dict[tuple, int] = {}
    max_states = 1

    def stick_in(node, k: int, at: int):
        """The stick of slot `k` in the state whose newest node is op `at`'s."""
        if k < n_base:
            return base[k]
        for _ in range(at - (k - n_base)):
            node = node[3]
        return node[1]

    for i, (op, cands) in enumerate(zip(pg.ops, op_choices)):
        slot[op.output.tensor] = n_base + i
        nxt = []
        for state in states:
            cost = state[0]
            for ci, ch in enumerate(cands):
                extra = 0
                for spec, acc in zip(ch.inputs, op.inputs):
                    if not _constrained(spec):
                        continue
                    have = stick_in(state, slot[acc.tensor], i - 1)
                    if have == spec:
                        continue
                    key = (acc.tensor, have)
                    if key not in cost_cache:
                        t = pg.tensors[acc.tensor]
                        cost_cache[key] = device_elements(t.shape, t.dtype, have, stick_bytes)
                    extra += cost_cache[key]
                nxt.append((cost + extra, ch.output, ci, state))
        nxt.sort(key=lambda s: s[0])
        states = nxt[:width]
        max_states = max(max_states, len(states))

    best = states[0]
    best_cost = best[0]
    picks: list[int] = []
    outs: list = []
    node = best
    for _ in pg.ops:
        picks.append(node[2])
        outs.append(node[1])
        node = node[3]
    picks.reverse()
    outs.reverse()
    best_assign = tuple(base) + tuple(outs)
    choices = {op.id: cands[i] for op, cands, i in zip(pg.ops, op_choices, picks)}
    stick_of = {t: best_assign[k] for t, k in slot.items()}
    return LayoutPlan(choices=choices, stick_of=stick_of, restick_elements=int(best_cost),
                      max_states=max_states)
