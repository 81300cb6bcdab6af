"""Multi-op stick moves for the CP-SAT planner's start (`SpyreModel.local_search`).

The local search moves one op's strategy (or one weight's stick dim) at a time. Some better
plans need several ops to change their stick dim together: a run of pointwise ops that all
cost the same on two stick dims, whose result a reshape copy reads, can make that copy a
free alias only when the whole run moves (llama's rotary query chain before the GQA
regroup). Moving any one op of the run alone adds restickifies on both sides, so no single
move finds it.

A chain move relabels a *stick-connected component* at once:

- Edges: a tensor joins its producer to a reader when the reader's strategies constrain
  that operand's stick (a fixed input stick dim, or stick dims an `ANY` operand must not
  have: an alias copy's input). Ops with a single stick option (matmuls) join no
  component: they cannot be relabelled, and stopping there keeps components to the
  pointwise / reduce / copy chains between them.
- Two families of components: over all such edges, and over the edges of tensors with one
  reader only (a tensor read by several ops is where a plan can already pay one
  restickify and let the branches differ: llama's cos table feeds both the query and the
  key chain, which want different stick dims). A chain component equal to a full one is
  tried once.
- Options of a component: for every op of it (graph order) and each of its stick choices,
  the choices that follow for the others (propagated along the edges: a reader takes the
  choice reading the tensor on its stick dim, a producer the one writing it there,
  preferring exact matches, then the op's current choice, then the rule's order; an op
  with no consistent choice keeps its strategy and stops the propagation: the move pays a
  restickify there). Distinct assignments only, at most `max_options` per component.
- Strategies per op of a moved assignment: the current one when its stick choice stays,
  else among the op's strategies with the new choice (an alias strategy included, where
  its operand's new stick allows it) either the cheapest in device memory, or the one that
  keeps most of the op's current LX residencies compatible with its already-chosen
  neighbours (graph order), then the cheapest: two variants per assignment.
- Weights (free inputs) a moved op reads on a fixed stick dim follow it.

Each move is priced by the local search itself on the model's objective (the evaluation
single moves use: residencies the move breaks dropped, bundle windows checked), and the
best improving move of a pass is kept. Everything is in a fixed order (graph order, the op
rules' option order, strategy index), so deterministic mode stays deterministic; the caller
checks its deadline between moves.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional

from target.op_rules import ANY, StickChoice, stick_options
from solver.spyre.cost_model import to_units
from solver.spyre.strategies import compatible_residency

# Per component, at most this many distinct stick assignments are tried (a chain of
# rank-4 pointwise ops has 3-4; a reduce or copy in it adds a few).
MAX_OPTIONS = 16
# Components larger than this are not moved whole (a move re-prices every op of it).
MAX_COMPONENT_OPS = 64


@dataclass(frozen=True)
class ChainMove:
    """A multi-op move: new strategy index per moved op, new stick dim per moved weight."""

    picks: tuple[tuple[str, int], ...]
    inputs: tuple[tuple[str, Optional[int]], ...]
    component: int


def _fixed(spec) -> bool:
    return spec is not None and spec != ANY


def any_operands_ok(sm, trial: dict[str, int], inputs: dict, moved_ops, moved_inputs=()) -> bool:
    """The model's `any_forbidden` constraints (an `ANY` operand that must not arrive on
    some stick dims: an alias copy's input, a split whose granules a layout would change)
    hold for the moved ops and for every reader of what they write and of the moved
    weights, under `trial` (op -> strategy index) and `inputs` (free input -> stick dim).
    A move breaking one makes a hint infeasible in the model and a plan that fails to emit
    or validate (measured: an alias copy reading its input off its last dim)."""
    def have(t: str):
        p = sm.producer.get(t)
        if p is not None:
            return sm.S[p.id][trial[p.id]].out_stick
        return inputs[t] if t in inputs else sm.ctx.input_sticks.get(t)

    def ok(o: str) -> bool:
        s = sm.S[o][trial[o]]
        if not s.any_forbidden:
            return True
        op = sm.pg.ops[sm.index[o]]
        return all(have(op.inputs[i].tensor) not in bad for i, bad in s.any_forbidden.items())

    for o in moved_ops:
        if not ok(o):
            return False
        for r, _ in sm.readers.get(sm.pg.ops[sm.index[o]].output.tensor, ()):
            if not ok(r):
                return False
    for t in moved_inputs:
        for r, _ in sm.readers.get(t, ()):
            if not ok(r):
                return False
    return True


class ChainMoves:
    """The components of one model (`SpyreModel`) and the moves they offer from a plan."""

    def __init__(self, sm, max_options: int = MAX_OPTIONS, max_component_ops: int = MAX_COMPONENT_OPS):
        self.sm = sm
        self.max_options = max_options
        pg = sm.pg
        self.order = [op.id for op in pg.ops]
        self.pos = {o: n for n, o in enumerate(self.order)}
        self.ops = {op.id: op for op in pg.ops}
        self.options: dict[str, list[StickChoice]] = {op.id: stick_options(op) for op in pg.ops}
        movable = {o for o, opts in self.options.items() if len(opts) > 1}
        # edges: (producer, reader, slot, tensor) where the reader constrains the slot's stick
        self.edges: list[tuple[str, str, int, str]] = []
        for op in pg.ops:
            for i, a in enumerate(op.inputs):
                p = sm.producer.get(a.tensor)
                if p is None or p.id not in movable or op.id not in movable:
                    continue
                if any(_fixed(s.input_sticks[i]) or i in s.any_forbidden for s in sm.S[op.id]):
                    self.edges.append((p.id, op.id, i, a.tensor))
        n_readers = {t: len(rs) for t, rs in sm.readers.items()}
        full = self._components(self.edges)
        chains = self._components([e for e in self.edges if n_readers.get(e[3], 0) == 1])
        seen: set[tuple[str, ...]] = set()
        self.components: list[tuple[str, ...]] = []
        for comp in full + chains:
            if 2 <= len(comp) <= max_component_ops and comp not in seen:
                seen.add(comp)
                self.components.append(comp)
        # per component, its edges (for propagation) in graph order
        self.comp_edges: list[list[tuple[str, str, int, str]]] = []
        for comp in self.components:
            members = set(comp)
            self.comp_edges.append([e for e in self.edges if e[0] in members and e[1] in members])
        # free inputs (weights) read on a fixed stick dim
        self.free = set(sm.ctx.free_inputs)

    def _components(self, edges) -> list[tuple[str, ...]]:
        parent: dict[str, str] = {}

        def find(x: str) -> str:
            while parent.get(x, x) != x:
                parent[x] = parent.get(parent[x], parent[x])
                x = parent[x]
            return x
        for p, r, _, _ in edges:
            a, b = find(p), find(r)
            if a != b:
                # the root is the earlier op: components come out in graph order
                if self.pos[a] < self.pos[b]:
                    parent[b] = a
                else:
                    parent[a] = b
        nodes = {p for p, _, _, _ in edges} | {r for _, r, _, _ in edges}
        groups: dict[str, list[str]] = {}
        for o in self.order:
            if o in nodes:
                groups.setdefault(find(o), []).append(o)
        return [tuple(g) for g in groups.values() if len(g) >= 2]

    # -- assignments ------------------------------------------------------------------------
    def assignments(self, c: int, current: dict[str, StickChoice]) -> list[dict[str, StickChoice]]:
        """Distinct consistent stick assignments of component `c` (op -> choice), other
        than the current one, in a fixed order."""
        comp, edges = self.components[c], self.comp_edges[c]
        by_op: dict[str, list[tuple[str, str, int, str]]] = {o: [] for o in comp}
        for e in edges:
            by_op[e[0]].append(e)
            by_op[e[1]].append(e)
        out: list[dict[str, StickChoice]] = []
        seen = {tuple(current[o] for o in comp)}
        for seed in comp:
            for ch in self.options[seed]:
                a = self._propagate(comp, by_op, seed, ch, current)
                key = tuple(a.get(o, current[o]) for o in comp)
                if key in seen:
                    continue
                seen.add(key)
                out.append(dict(zip(comp, key)))
                if len(out) >= self.max_options:
                    return out
        return out

    def _propagate(self, comp, by_op, seed: str, ch: StickChoice,
                   current: dict[str, StickChoice]) -> dict[str, StickChoice]:
        choice = {seed: ch}
        frontier = [seed]
        while frontier:
            nxt = []
            for o in frontier:
                for p, r, i, t in by_op[o]:
                    other = r if o == p else p
                    if other in choice:
                        continue
                    pick = self._fit(other, by_op[other], choice, current)
                    if pick is not None:
                        choice[other] = pick
                        nxt.append(other)
            frontier = sorted(set(nxt), key=self.pos.__getitem__)
        return choice

    def _fit(self, o: str, edges, choice: dict[str, StickChoice],
             current: dict[str, StickChoice]) -> Optional[StickChoice]:
        """The stick choice of `o` consistent with its decided neighbours, or None."""
        want_out = None
        want_in: dict[int, int] = {}
        for p, r, i, t in edges:
            if p == o and r in choice:
                spec = choice[r].inputs[i]
                if _fixed(spec):
                    if want_out is not None and want_out != spec:
                        return None
                    want_out = spec
            elif r == o and p in choice:
                want_in[i] = choice[p].output
        best, best_key = None, None
        for n, ch in enumerate(self.options[o]):
            if want_out is not None and ch.output != want_out:
                continue
            if any(_fixed(ch.inputs[i]) and ch.inputs[i] != s for i, s in want_in.items()):
                continue
            exact = sum(1 for i, s in want_in.items() if ch.inputs[i] == s)
            key = (-exact, ch != current[o], n)
            if best_key is None or key < best_key:
                best, best_key = ch, key
        return best

    # -- moves ------------------------------------------------------------------------------
    def moves(self, picks: dict[str, int], inputs: dict, resident) -> Iterator[ChainMove]:
        """Every move of every component from the plan (`picks`: op -> strategy index,
        `inputs`: free input -> stick dim, `resident`: the LX-resident tensors), in a
        fixed order; legal under the model's ANY-operand constraints."""
        S = self.sm.S
        current = {o: S[o][k].stick for o, k in picks.items()}
        seen: set = set()
        for c in range(len(self.components)):
            for a in self.assignments(c, current):
                for aligned in (False, True):
                    mv = self._move(c, a, picks, inputs, resident, aligned)
                    if mv is None or (mv.picks, mv.inputs) in seen:
                        continue
                    seen.add((mv.picks, mv.inputs))
                    yield mv

    def _move(self, c: int, a: dict[str, StickChoice], picks: dict[str, int], inputs: dict,
              resident, aligned: bool) -> Optional[ChainMove]:
        sm, S = self.sm, self.sm.S
        comp = self.components[c]
        trial = dict(picks)
        new_inputs: dict[str, Optional[int]] = {}
        for o in comp:
            if S[o][picks[o]].stick == a[o]:
                continue
            op = self.ops[o]
            for i, acc in enumerate(op.inputs):
                spec = a[o].inputs[i]
                if acc.tensor in self.free and _fixed(spec) and spec in sm.ctx.possible_sticks[acc.tensor]:
                    new_inputs[acc.tensor] = spec
        ins = dict(inputs, **new_inputs)
        moved = []
        for o in comp:  # graph order: producers before readers
            k0 = picks[o]
            same = S[o][k0].stick == a[o]
            if same and not any(self._have(x.tensor, trial, ins) != self._have(x.tensor, picks, inputs)
                                for x in self.ops[o].inputs):
                continue  # nothing this op reads or writes moves
            cands = [k for k, s in enumerate(S[o]) if s.stick == a[o] and self._legal_inputs(o, s, trial, ins)]
            if not cands:
                return None
            if same and aligned and k0 in cands:
                continue  # keeps its strategy (the other variant tries the cheapest)
            if aligned:
                k = min(cands, key=lambda k: (-self._kept(o, k, trial, resident), self._price(o, k), k != k0, k))
            else:
                k = min(cands, key=lambda k: (self._price(o, k), k != k0, k))
            if k != k0:
                trial[o] = k
                moved.append(o)
        if not moved and not new_inputs:
            return None
        if not any_operands_ok(sm, trial, ins, moved, new_inputs):
            return None
        changed_inputs = tuple((t, s) for t, s in sorted(new_inputs.items()) if s != inputs.get(t))
        return ChainMove(tuple((o, trial[o]) for o in moved), changed_inputs, c)

    def _have(self, t: str, trial: dict[str, int], ins: dict):
        p = self.sm.producer.get(t)
        if p is not None:
            return self.sm.S[p.id][trial[p.id]].out_stick
        return ins[t] if t in ins else self.sm.ctx.input_sticks.get(t)

    def _legal_inputs(self, o: str, s, trial: dict[str, int], ins: dict) -> bool:
        """The model's `any_forbidden` constraints of strategy `s` of `o` hold."""
        op = self.ops[o]
        return all(self._have(op.inputs[i].tensor, trial, ins) not in bad for i, bad in s.any_forbidden.items())

    def _price(self, o: str, k: int) -> int:
        """Device-memory price of strategy k of o (the model's no-residency combination)."""
        _, _, body = self.sm.combos[o]
        return body[k][0] + to_units(self.sm.S[o][k].parts.base.extra_ns)

    def _kept(self, o: str, k: int, trial: dict[str, int], resident) -> int:
        """How many of o's currently resident operands stay compatible with strategy k,
        given its neighbours' strategies in `trial`."""
        sm, S = self.sm, self.sm.S
        op, s = self.ops[o], self.sm.S[o][k]
        n = 0
        for i, acc in enumerate(op.inputs):
            p = sm.producer.get(acc.tensor)
            if acc.tensor in resident and p is not None and compatible_residency(S[p.id][trial[p.id]], s, i):
                n += 1
        t = op.output.tensor
        if t in resident and not s.reduction_split and not s.alias and all(
                compatible_residency(s, S[r][trial[r]], slot) for r, slot in sm.readers.get(t, ())):
            n += 1
        return n
