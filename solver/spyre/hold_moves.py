"""Residency moves for the CP-SAT planner's local search (`solver.spyre.local_search`): keep
one more intermediate in LX, moving its producer and readers to strategies that slice it
alike when they do not already.

The single and chain moves only ever drop residencies (a move that breaks one loses it);
adding them is left to CP-SAT, whose search on a model of a few hundred strategies ends far
from its bound in a deterministic budget (BERT tiny: gap 0.73 after 0.08 deterministic s,
1.5 s gave 0.64). A chain of small ops wants every intermediate in LX with the whole chain on
one core (`strategies._few_cores_strategy`): reached one tensor at a time, each step a move
that pays for itself on the model's own objective (on the timing model a small op on one
core keeps most of the bus, so moving it there costs little and the residency saves a
device-memory round trip).

A hold move of tensor t (a residency candidate of the model, not resident) offers, for its
producer p and readers R, in this order:
1. the current strategies, when they already slice t alike;
2. every op of p and R not already on one core moved to its stick choice on one core;
3. each reader that does not read p's slices moved to its cheapest strategy of the same
   stick choice that does;
4. p moved to its cheapest strategy of the same stick choice whose slices every reader reads.
Besides, a chain hold (`chain`: down the chain t leads to, readers aligned to producers)
and an upstream chain hold (`upstream`: up the chain feeding t, producers aligned to
readers, as far as each move broke a hand-off).
The buffer goes first-fit into LX over t's live window (the canonical placement of
`SpyreModel.canonical_addresses`), sized by p's strategy. The local search prices each
offer exactly (the residencies a move breaks dropped, bundle windows checked) and keeps
the best improving one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional

from solver.plan import Residency
from solver.spyre.cost_model import to_units
from solver.spyre.strategies import compatible_residency


# A chain hold tries the producer on this many of its strategies, and holds at most this
# many tensors along the chain (a softmax is 5-6 ops; a norm 8-10).
CHAIN_PRODUCER_OPTIONS = 3
CHAIN_MAX_HOLDS = 12


@dataclass(frozen=True)
class HoldMove:
    """Keep the tensors of `holds` in LX at their residencies, with new strategy indices
    for `picks`."""

    holds: tuple[tuple[str, Residency], ...]
    picks: tuple[tuple[str, int], ...]


class HoldMoves:
    """The residency candidates of one model (`SpyreModel`) and the hold moves they offer."""

    def __init__(self, sm):
        self.sm = sm
        # one-core strategy of each op per stick choice and orders (index into sm.S[op])
        self.one_core: dict[str, dict] = {}
        for o, S in sm.S.items():
            for k, s in enumerate(S):
                if not s.core_split and not s.alias:
                    self.one_core.setdefault(o, {}).setdefault((s.stick, s.orders), k)
        self.candidates = [t for t in sorted(sm.res, key=lambda t: (sm.window(t), t))]
        self.touching: dict[str, list[str]] = {
            op.id: [a.tensor for a in op.inputs] + [op.output.tensor] for op in sm.pg.ops}

    def _price(self, o: str, k: int) -> int:
        _, _, body = self.sm.combos[o]
        return body[k][0] + to_units(self.sm.S[o][k].parts.base.extra_ns)

    def _readers_aligned(self, sp, readers, picks: dict[str, int]) -> Optional[dict[str, int]]:
        """Each reader (op, slot) whose pick cannot read the output `sp` holds, moved to its
        cheapest strategy of the same stick and orders that can; None when one has none."""
        S = self.sm.S
        change: dict[str, int] = {}
        for r, slot in readers:
            now = S[r][change.get(r, picks[r])]
            if compatible_residency(sp, now, slot):
                continue
            ks = [k for k, s in enumerate(S[r]) if s.stick == now.stick and s.orders == now.orders
                  and compatible_residency(sp, s, slot)]
            if not ks:
                return None
            change[r] = min(ks, key=lambda k: (self._price(r, k), k))
        return change

    def _compatible(self, t: str, picks: dict[str, int]) -> bool:
        return self.sm.residency_ok(t, picks)

    def offers(self, t: str, picks: dict[str, int]) -> list[dict[str, int]]:
        """Strategy changes (op -> index) under which t can be held, in the module's order."""
        sm, S = self.sm, self.sm.S
        p = sm.producer[t].id
        readers = sm.readers[t]
        out: list[dict[str, int]] = []
        if self._compatible(t, picks):
            out.append({})
        # 2. the producer and readers on one core
        change = {}
        for o in [p] + [r for r, _ in readers]:
            s = S[o][picks[o]]
            if not s.core_split:
                continue
            k = self.one_core.get(o, {}).get((s.stick, s.orders))
            if k is None:
                change = None
                break
            change[o] = k
        if change:
            trial = dict(picks, **change)
            if self._compatible(t, trial):
                out.append(change)
        # 3. readers aligned to the producer
        sp = S[p][picks[p]]
        change = self._readers_aligned(sp, readers, picks)
        if change and self._compatible(t, dict(picks, **change)):
            out.append(change)
        # 4. the producer aligned to the readers
        ks = [k for k, s in enumerate(S[p]) if k != picks[p] and s.stick == sp.stick and s.orders == sp.orders
              and self._compatible(t, dict(picks, **{p: k}))]
        if ks:
            out.append({p: min(ks, key=lambda k: (self._price(p, k), k))})
        return out

    def place(self, t: str, size: int, resident: dict[str, Residency]) -> Optional[Residency]:
        """t's buffer of `size` bytes a core first-fit in LX over its live window, beside the
        resident buffers whose windows overlap it; None when it does not fit."""
        sm = self.sm
        a, b = sm.window(t)
        busy = []
        for u, r in resident.items():
            if u == t or u not in sm.res:
                continue
            c, d = sm.window(u)
            if c <= b and a <= d:
                busy.append((r.lx_address, r.lx_address + (r.size_per_core or 0)))
        addr = 0
        for lo, hi in sorted(busy):
            if addr + size <= lo:
                break
            addr = max(addr, hi)
        if addr + size > sm.hw.lx_capacity_bytes:
            return None
        return Residency(addr, size)

    def chain(self, t: str, picks: dict[str, int], resident: dict[str, Residency]) -> Iterator[HoldMove]:
        """Chain holds from t: t's producer on each of its `CHAIN_PRODUCER_OPTIONS` cheapest
        strategies of its stick choice that split no reduction dim (its current one first),
        then along the chain of candidates t leads to, each reader moved to its cheapest
        strategy of its stick choice that reads its producer's slices, each candidate on the
        way held (at most `CHAIN_MAX_HOLDS`): a softmax after a matmul held whole once the
        matmul and every op after it slice the rows alike."""
        sm, S = self.sm, self.sm.S
        p = sm.producer[t].id
        sp0 = S[p][picks[p]]
        ks = [k for k, s in enumerate(S[p]) if s.stick == sp0.stick and s.orders == sp0.orders
              and not s.reduction_split and not s.alias]
        ks.sort(key=lambda k: (k != picks[p], self._price(p, k), k))
        for k0 in ks[:CHAIN_PRODUCER_OPTIONS]:
            trial = dict(picks)
            trial[p] = k0
            placed = {u: r for u, r in resident.items() if u != t}
            holds: list = []
            frontier = [t]
            seen = set()
            while frontier and len(holds) < CHAIN_MAX_HOLDS:
                u = frontier.pop(0)
                if u in seen or u in resident:
                    continue
                seen.add(u)
                q = sm.producer[u].id
                sq = S[q][trial[q]]
                if sq.reduction_split or sq.alias:
                    continue
                moved = self._readers_aligned(sq, sm.readers[u], trial)
                if moved is None:
                    continue
                trial.update(moved)
                if not sm.residency_ok(u, trial):
                    continue
                res = self.place(u, sq.out_lx_bytes, placed)
                if res is None:
                    continue
                placed[u] = res
                holds.append((u, res))
                for r, _ in sm.readers[u]:
                    w = self.sm.ops[r].output.tensor
                    if w in sm.res and w not in seen:
                        frontier.append(w)
            if holds and holds[0][0] == t:
                change = tuple(sorted((o, k) for o, k in trial.items() if k != picks[o]))
                yield HoldMove(tuple(holds), change)

    def upstream(self, t: str, picks: dict[str, int], resident: dict[str, Residency]) -> Iterator[HoldMove]:
        """An upstream chain hold from t: t's producer moved to its cheapest strategy of its
        stick choice and orders whose slices t's readers read as they are, then, input by
        input, the producer of each candidate it reads moved the same way to hand that input
        on, each candidate on the way held (at most `CHAIN_MAX_HOLDS`). A reader whose split
        is set (a matmul split for tiling) pulls the chain feeding it into its slicing: the
        attention scores split by heads and rows read the scaled query held only once the
        scaling and the head permute before it slice alike."""
        if t in resident:
            return
        sm, S = self.sm, self.sm.S
        trial = dict(picks)
        placed = {u: r for u, r in resident.items() if u != t}
        holds: list = []
        frontier = [t]
        seen: set = set()
        while frontier and len(holds) < CHAIN_MAX_HOLDS:
            u = frontier.pop(0)
            if u in seen:
                continue
            seen.add(u)
            q = sm.producer[u].id
            moved = False
            if not sm.residency_ok(u, trial):
                sq = S[q][trial[q]]
                ks = [k for k, s in enumerate(S[q]) if s.stick == sq.stick and s.orders == sq.orders
                      and not s.reduction_split and not s.alias and sm.residency_ok(u, dict(trial, **{q: k}))]
                if not ks:
                    if u == t:
                        return
                    continue
                trial[q] = min(ks, key=lambda k: (self._price(q, k), k))
                moved = True
            if not moved and u == t:
                return        # t holds as it is: the hold moves above offer that
            if u not in placed:
                res = self.place(u, S[q][trial[q]].out_lx_bytes, placed)
                if res is None:
                    if u == t:
                        return
                    continue
                placed[u] = res
                holds.append((u, res))
            if not moved:
                continue      # its producer as it was: what it reads is held as before
            for a in sm.ops[q].inputs:
                if a.tensor in sm.res and a.tensor not in seen:
                    frontier.append(a.tensor)
        if holds and holds[0][0] == t:
            change = tuple(sorted((o, k) for o, k in trial.items() if k != picks[o]))
            yield HoldMove(tuple(holds), change)

    def replaced(self, mv: HoldMove, resident: dict[str, Residency]) -> Optional[HoldMove]:
        """`mv` with its buffers placed first-fit again beside `resident` (those that no
        longer fit left out; None when none does)."""
        placed = dict(resident)
        held = []
        for u, r in mv.holds:
            res = self.place(u, r.size_per_core, placed)
            if res is not None:
                placed[u] = res
                held.append((u, res))
        return HoldMove(tuple(held), mv.picks) if held else None

    def _on_one_core(self, u: str, trial: dict[str, int]) -> bool:
        S = self.sm.S
        ops = [self.sm.producer[u].id] + [r for r, _ in self.sm.readers[u]]
        return all(not S[o][trial[o]].core_split for o in ops)

    def moves(self, t: str, picks: dict[str, int], resident: dict[str, Residency]) -> Iterator[HoldMove]:
        """The hold moves of t from the plan (`picks`, `resident`). A move that puts ops on
        one core also holds every other candidate those ops touch whose producer and
        readers all end up on one core (a chain on one core is held whole: each step alone
        may not pay for itself)."""
        if t in resident:
            return
        sm = self.sm
        for change in self.offers(t, picks):
            trial = dict(picks, **change)
            placed = dict(resident)
            holds = []
            more = []
            if any(not sm.S[o][k].core_split for o, k in change.items()):
                near = {u for o in change for u in self.touching[o]}
                more = [u for u in self.candidates if u in near and u != t and u not in resident
                        and self._on_one_core(u, trial) and sm.residency_ok(u, trial)]
            for u in [t] + more:
                p = sm.producer[u].id
                res = self.place(u, sm.S[p][trial[p]].out_lx_bytes, placed)
                if res is None:
                    if u == t:
                        break
                    continue
                placed[u] = res
                holds.append((u, res))
            if holds and holds[0][0] == t:
                yield HoldMove(tuple(holds), tuple(sorted(change.items())))
        yield from self.chain(t, picks, resident)
        yield from self.upstream(t, picks, resident)


def region_moves(sm, holds: HoldMoves, picks: dict[str, int], resident: dict[str, Residency]
                 ) -> Iterator[HoldMove]:
    """Whole regions to one core at once: the ops whose stick choice on one core, with every
    operand it may hold in LX held, is priced below their strategy as it runs now, grouped
    by the residency candidates between them (a run of small ops: a norm, a rotary
    embedding); each region moves to one core and holds every candidate whose producer and
    readers then all run on one core. A hold move reaches such a region one tensor at a
    time only where each step pays for itself; a norm whose every op reads two of the
    others' results pays only whole."""
    S = sm.S
    eligible: dict[str, int] = {}
    for o in picks:
        s = S[o][picks[o]]
        if not s.core_split:
            continue
        k = holds.one_core.get(o, {}).get((s.stick, s.orders))
        if k is None:
            continue
        names, combos, body = sm.combos[o]
        now = tuple(t in resident for t in names)
        j_now = next((j for j, (key, _) in enumerate(combos) if key == now), 0)
        if body[k][-1] + to_units(S[o][k].parts.base.extra_ns) < \
                body[picks[o]][j_now] + to_units(s.parts.base.extra_ns):
            eligible[o] = k
    parent = {o: o for o in eligible}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x
    for t in holds.candidates:
        ops = [sm.producer[t].id] + [r for r, _ in sm.readers[t]]
        inside = [o for o in ops if o in eligible]
        for a, b in zip(inside, inside[1:]):
            ra, rb = find(a), find(b)
            if ra != rb:
                parent[max(ra, rb, key=sm.index.get)] = min(ra, rb, key=sm.index.get)
    groups: dict[str, list[str]] = {}
    for o in sorted(eligible, key=sm.index.get):
        groups.setdefault(find(o), []).append(o)
    for members in groups.values():
        if len(members) < 2:
            continue
        change = {o: eligible[o] for o in members}
        trial = dict(picks, **change)
        near = {u for o in members for u in holds.touching[o]}
        placed = dict(resident)
        held = []
        for u in holds.candidates:
            if u in near and u not in resident and holds._on_one_core(u, trial) and sm.residency_ok(u, trial):
                p = sm.producer[u].id
                res = holds.place(u, S[p][trial[p]].out_lx_bytes, placed)
                if res is not None:
                    placed[u] = res
                    held.append((u, res))
        if held:
            yield HoldMove(tuple(held), tuple(sorted(change.items())))
