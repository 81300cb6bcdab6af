"""The joint CP-SAT model of one graph (`SpyreModel`, built by `build_model`): stick dims,
non-stick dim orders, restickify placement, core split and LX residency chosen together,
objective = predicted
total time (integer ns, `solver.spyre.cost_model`).

Variables and constraints:
- `pick[o][k]`: op o runs strategy k of `solver.spyre.strategies.op_strategies` (stick choice x
  core split, pruned); exactly one per op.
- `lay[t][l]`: tensor t is sticked on dim l: fixed by its producer's pick; a weight
  (parameter, buffer, constant) chooses freely (laid out once at load time); a user input
  arrives sticked on its last dim.
- `order[t][o]`: an intermediate some op prefers in another non-stick dim order
  (`solver.spyre.layout_choice`) takes order o (None: row-major), exactly one; every
  strategy of its producer and of each reader reading it directly was priced in one order
  and implies it. Emitted as `PlanDecisions.dim_orders`.
- `mat[t][l]`: t is also materialized sticked on l by ONE restickify through device memory,
  paid once however many consumers read it; every strategy that reads t on l needs
  `lay[t][l] or mat[t][l]`.
- `res[t]`: an intermediate stays in LX from its producer to its last reader. Allowed only
  when every reader's strategy reads each core's slice from the one that core wrote (same
  layout, per-core box inside the written box: `strategies.compatible_residency`), the
  producer does not split a reduction dim, no restickify reads it (the model prices
  restickifies through device memory; `solver.spyre.relayout` tries on-chip relayouts after the
  solve), and the ops of its live window reference at most the bundle limit of
  device-memory tensors (the tensors resident there do not count).
- fused hand-offs (`budget.FUSED_HANDOFFS`, off by default): a `res[t]` candidate the
  fusion search could hand from member to member of one kernel (`_handoff_candidates`) is
  charged one tile of LX (`lx_bytes`) and needs its producer and readers on one core count
  (`handoff_ok`); the read-back keeps it whole only where it fits (`full_size_residencies`).
- LX addresses per core in whole sticks: an optional interval over op steps x an optional
  interval over [addr, addr + size) per resident tensor, `AddNoOverlap2D`, so capacity and
  fragmentation are both real. Size = the producer strategy's per-core box.
- time[o] >= the priced time (`solver.spyre.cost_model`: the timing model's own per-op analysis)
  of the picked strategy under the residency combination of its operands that holds (one
  enforced constraint per strategy x combination).
- objective = sum time[o] + ring combine / loop overhead + restickify times, + 1 ns per
  idle core per op as a tie-break toward splits on more cores.
Bundles: chosen by a partition step after the solve: each group of overlapping resident
windows starts a bundle; the emitter cuts elsewhere at the external-tensor limit. A group
whose bundle still breaks the limit gets a no-good (not all of these together) and the
model is solved again, warm-started.

The model also reads a plan as a complete hint (`add_hint`), prices an assignment by its own
objective (`objective_of`, used by `solver.spyre.local_search`) and reads a solution back as
decisions (`decisions`, with canonical first-fit LX addresses).
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Optional

from ortools.sat.python import cp_model

from target.op_rules import default_choice, outermost_split, restickify_prim, split_granules
from target.primitives import PrimGraph
from solver.naive import plan_naive
from solver.plan import OpPlan, PlanDecisions, Residency
from solver.spyre.cost_model import OpView, op_time, to_units
from solver.spyre import budget
from solver.spyre import strategies as strategy_space
from solver.spyre.fusion.prices import with_tile_classes
from solver.spyre.layout_choice import candidate_orders, order_variants
from solver.spyre.strategies import (
    GraphContext, Strategy, align_strategies, compatible_residency, drop_dominated, op_strategies, required_from,
)


def first_fit_in_windows(order: list[str], window, sizes: dict[str, int], cap: int) -> dict[str, Residency]:
    """LX addresses for the buffers in `order`, each at the lowest address clear of every
    buffer placed before it whose op window (`window(t)`, an inclusive op-index span)
    overlaps its own; a buffer past `cap` is left out."""
    placed: list[tuple[int, int, int, int]] = []
    out: dict[str, Residency] = {}
    for t in order:
        a, b = window(t)
        size = sizes[t]
        addr = 0
        for s0, e0, ad, sz in sorted(placed, key=lambda x: x[2]):
            if s0 <= b and a <= e0 and addr < ad + sz and ad < addr + size:
                addr = ad + sz
        if addr + size > cap:
            continue
        placed.append((a, b, addr, size))
        out[t] = Residency(addr, size)
    return out


class SpyreModel:
    def __init__(self, pg: PrimGraph, hw, ctx: GraphContext, strategies: dict[str, list[Strategy]]):
        self.pg, self.hw, self.ctx, self.S = pg, hw, ctx, strategies
        self.m = cp_model.CpModel()
        self.index = {op.id: k for k, op in enumerate(pg.ops)}
        self.producer = {op.output.tensor: op for op in pg.ops}
        self.readers: dict[str, list[tuple[str, int]]] = {}
        for op in pg.ops:
            for i, a in enumerate(op.inputs):
                self.readers.setdefault(a.tensor, []).append((op.id, i))
        self.pick: dict[str, list] = {}
        self.lay: dict[str, dict] = {}
        self.mat: dict[tuple[str, Optional[int]], cp_model.IntVar] = {}
        self.mat_cost: dict[tuple[str, Optional[int]], int] = {}
        self.res: dict[str, cp_model.IntVar] = {}
        self.addr: dict[str, cp_model.IntVar] = {}
        self.size: dict[str, cp_model.IntVar] = {}
        self.yend: dict[str, cp_model.IntVar] = {}
        self.time: dict[str, cp_model.IntVar] = {}
        self.combos: dict[str, tuple] = {}
        self.objective_terms: list = []
        self.ops = {op.id: op for op in pg.ops}
        self.ordv: dict[str, dict] = {}
        self._build()
        self._order_constraints()

    # layout literal: a var, or a Python bool for graph inputs
    def lay_lit(self, t: str, stick):
        if t in self.lay:
            return self.lay[t].get(stick, False)
        return self.ctx.input_sticks.get(t) == stick

    def _build(self) -> None:
        m, hw, ctx = self.m, self.hw, self.ctx
        stick_bytes = hw.stick_bytes
        cap_sticks = hw.lx_capacity_bytes // stick_bytes
        outputs = set(self.pg.outputs)
        for t in sorted(ctx.free_inputs):
            self.lay[t] = {s: m.NewBoolVar(f"lay[{t}][{s}]") for s in ctx.possible_sticks[t]}
            m.AddExactlyOne(self.lay[t].values())
        for op in self.pg.ops:
            vs = [m.NewBoolVar(f"pick[{op.id}][{k}]") for k in range(len(self.S[op.id]))]
            m.AddExactlyOne(vs)
            self.pick[op.id] = vs
            t = op.output.tensor
            self.lay[t] = {}
            for stick in ctx.possible_sticks[t]:
                lv = m.NewBoolVar(f"lay[{t}][{stick}]")
                m.Add(lv == sum(v for v, s in zip(vs, self.S[op.id]) if s.out_stick == stick))
                self.lay[t][stick] = lv
            # ANY operands whose layout would change this strategy's split granules
            for v, s in zip(vs, self.S[op.id]):
                for i, bad in s.any_forbidden.items():
                    src = op.inputs[i].tensor
                    for stick in bad:
                        lit = self.lay_lit(src, stick)
                        if lit is True:
                            m.Add(v == 0)
                        elif lit is not False:
                            m.AddBoolOr([v.Not(), lit.Not()])
        # restickify: one per (tensor, stick dim), shared by every reader that needs it
        for op in self.pg.ops:
            for i, a in enumerate(op.inputs):
                t = a.tensor
                by_stick: dict = {}
                for v, s in zip(self.pick[op.id], self.S[op.id]):
                    want = s.input_sticks[i]
                    if want is not None:
                        by_stick.setdefault(want, []).append(v)
                for stick, vs in by_stick.items():
                    lit = self.lay_lit(t, stick)
                    if lit is True:
                        continue
                    key = (t, stick)
                    if key not in self.mat:
                        self.mat[key] = m.NewBoolVar(f"mat[{t}][{stick}]")
                        self.mat_cost[key] = self._restick_cost(t, stick)
                        self.objective_terms.append(self.mat_cost[key] * self.mat[key])
                    rhs = [self.mat[key]] + ([lit] if lit is not False else [])
                    m.Add(sum(vs) <= sum(rhs))
        # residency candidates
        self.handoffs = self._handoff_candidates() if budget.FUSED_HANDOFFS else set()
        for t, readers in self.readers.items():
            p = self.producer.get(t)
            if p is None or t in outputs or not readers:
                continue
            S_p = self.S[p.id]
            ok = [k for k, s in enumerate(S_p) if not s.reduction_split and not s.alias
                  and self.lx_bytes(t, s) <= hw.lx_capacity_bytes]
            if not ok:
                continue
            if any(all(s.alias for s in self.S[o]) for o, _ in readers):
                continue
            r = m.NewBoolVar(f"res[{t}]")
            self.res[t] = r
            for k, (v, s) in enumerate(zip(self.pick[p.id], S_p)):
                if k not in ok:
                    m.AddBoolOr([r.Not(), v.Not()])
            for (key, mv) in self.mat.items():
                if key[0] == t:
                    m.AddImplication(r, mv.Not())
            for o, slot in readers:
                for k in ok:
                    compat = [v for v, s in zip(self.pick[o], self.S[o])
                              if self.handoff_ok(t, S_p[k], s, slot)]
                    m.AddBoolOr([r.Not(), self.pick[p.id][k].Not()] + compat)
            sticks = [self.lx_bytes(t, s) // stick_bytes for s in S_p]
            size = m.NewIntVar(0, max(sticks), f"size[{t}]")
            m.Add(size == sum(n * v for n, v in zip(sticks, self.pick[p.id])))
            addr = m.NewIntVar(0, cap_sticks, f"addr[{t}]")
            yend = m.NewIntVar(0, cap_sticks + max(sticks), f"yend[{t}]")
            m.Add(yend <= cap_sticks).OnlyEnforceIf(r)
            self.size[t], self.addr[t], self.yend[t] = size, addr, yend
        xs, ys = [], []
        for t, r in self.res.items():
            start = self.index[self.producer[t].id]
            last = max(self.index[o] for o, _ in self.readers[t])
            xs.append(m.NewOptionalFixedSizeIntervalVar(start, last - start + 1, r, f"x[{t}]"))
            ys.append(m.NewOptionalIntervalVar(self.addr[t], self.size[t], self.yend[t], r, f"y[{t}]"))
        if xs:
            m.AddNoOverlap2D(xs, ys)
        self._bundle_constraints()
        # op times
        for op in self.pg.ops:
            S_o = self.S[op.id]
            vs = self.pick[op.id]
            n_in = len(op.inputs)
            free = []
            for a in list(op.inputs) + [op.output]:
                if a.tensor in self.res and a.tensor not in free:
                    free.append(a.tensor)
            names = [a.tensor for a in op.inputs] + [op.output.tensor]
            combos = []
            for mask in range(1 << len(free)):
                on = {t for j, t in enumerate(free) if mask >> j & 1}
                lits = [self.res[t] if t in on else self.res[t].Not() for t in free]
                combos.append((tuple(t in on for t in names), lits))
            body = [[to_units(s.parts.cost(key[:-1], key[-1]).body_ns) for key, _ in combos] for s in S_o]
            extra = [to_units(s.parts.base.extra_ns) for s in S_o]
            tv = m.NewIntVar(0, max(max(b) for b in body), f"time[{op.id}]")
            self.time[op.id] = tv
            self.combos[op.id] = (names, combos, body)
            # exact time of the picked strategy under the residency combination that holds,
            # plus the weakest combination as an always-valid bound (helps the LP)
            m.Add(tv >= sum(min(b) * v for b, v in zip(body, vs)))
            if len(combos) > 1:
                for k, v in enumerate(vs):
                    for j, (_, lits) in enumerate(combos):
                        if body[k][j] > min(body[k]):
                            m.Add(tv >= body[k][j]).OnlyEnforceIf([v] + lits)
            else:
                m.Add(tv >= sum(b[0] * v for b, v in zip(body, vs)))
            self.objective_terms.append(tv)
            if any(extra):
                self.objective_terms.append(sum(c * v for c, v in zip(extra, vs)))
            # ties go to the strategy leaving fewer cores idle (1 ns a core): the solve prices
            # ops one by one, and only ops on one core count can later share a fused kernel
            idle = [max(0, self.hw.cores - math.prod(s.core_split.values())) for s in S_o]
            if any(idle):
                self.objective_terms.append(sum(c * v for c, v in zip(idle, vs)))

    # -- the non-stick dim order (solver.spyre.layout_choice) -------------------------------
    def order_users(self, t: str) -> list[tuple[str, int]]:
        """(op, slot) of the producer (slot -1) and the readers of t."""
        return [(self.producer[t].id, -1)] + list(self.readers.get(t, ()))

    def _directly(self, s: Strategy, slot: int, t: str) -> bool:
        if slot < 0:
            return True
        want = s.input_sticks[slot]
        return want is None or want == self.ctx.possible_sticks[t][0]

    def _order_constraints(self) -> None:
        """Each candidate of `ctx.alt_orders` takes one order, the one its producer's and
        its direct readers' picked strategies were priced with."""
        m = self.m
        for t in sorted(self.ctx.alt_orders):
            opts = [None] + list(self.ctx.alt_orders[t])
            vs = {o: m.NewBoolVar(f"order[{t}][{n}]") for n, o in enumerate(opts)}
            m.AddExactlyOne(vs.values())
            self.ordv[t] = vs
            for o, slot in self.order_users(t):
                for v, s in zip(self.pick[o], self.S[o]):
                    if self._directly(s, slot, t):
                        m.AddImplication(v, vs[s.order_of(slot)])

    def tensor_order(self, t: str, picks: dict[str, int]) -> Optional[tuple]:
        """The order candidate t takes under `picks` (its producer's strategy's)."""
        p = self.producer[t].id
        return self.S[p][picks[p]].order_of(-1)

    def orders_ok(self, picks: dict[str, int], moved_ops) -> bool:
        """Every candidate the moved ops touch is priced in one order by its producer and
        its direct readers."""
        for o in moved_ops:
            op = self.ops[o]
            for a in list(op.inputs) + [op.output]:
                t = a.tensor
                if t not in self.ordv:
                    continue
                want = self.tensor_order(t, picks)
                for u, slot in self.order_users(t):
                    s = self.S[u][picks[u]]
                    if self._directly(s, slot, t) and s.order_of(slot) != want:
                        return False
        return True

    def variant_index(self, o: str, s: Strategy, orders: tuple) -> Optional[int]:
        """Index of the strategy of `o` equal to `s` but for its orders."""
        key = (s.stick, tuple(sorted(s.core_split.items())), s.alias, orders)
        return next((k for k, x in enumerate(self.S[o]) if x.key() == key), None)

    def dim_orders(self, picks: dict[str, int]) -> dict[str, list[int]]:
        """The non-default orders of the candidates under `picks` (`PlanDecisions.dim_orders`)."""
        out = {}
        for t in sorted(self.ordv):
            order = self.tensor_order(t, picks)
            if order is not None:
                out[t] = list(order)
        return out

    def _restick_cost(self, t: str, stick) -> int:
        """Restickify of t onto `stick` through device memory, split as the emitter does by
        default (outermost dim evenly)."""
        hw, ctx = self.hw, self.ctx
        rid = f"{t}@restick"
        src_stick = ctx.possible_sticks[t][0]
        prim = restickify_prim(f"restick:{rid}", t, rid, ctx.shapes[t])
        gran = split_granules(prim, [src_stick], stick, [ctx.dtypes[t]] * 2, hw.stick_bytes)
        split = outermost_split(prim, gran, hw.cores)
        shapes = {t: ctx.shapes[t], rid: ctx.shapes[t]}
        dtypes = {t: ctx.dtypes[t], rid: ctx.dtypes[t]}
        layouts = {t: ctx.layout(t, src_stick), rid: ctx.layout(t, stick, own=False)}
        view = OpView(prim, "restickify", shapes, dtypes, layouts, split, [])
        return to_units(op_time(view, (False,), False, hw).total_ns)

    # -- LX hand-offs between the members of a fused kernel -----------------------------------
    def _handoff_candidates(self) -> set[str]:
        """Intermediates the fusion search can hand from one kernel member to the next on
        chip: made by a pointwise, reduce or matmul op and read only by pointwise or reduce
        ops, every op after the producer up to the last reader one too (a fused run is
        consecutive compute ops, a matmul only at its head; a matmul handing on its result
        is priced untiled there, `fusion.prices`: K-tiled it is a partial sum until the
        kernel's last tile). A matmul counts only with the tile classes on
        (`budget.TILE_CLASSES`): priced untiled, its hand-off looks free, while the search
        K-tiles a prefill-sized matmul, which breaks it (llama prefill, 2026-12-05: the
        model priced the up projection's hand-off to the SiLU chain at 1.2 us, the fused
        program read it from device memory, 161.8 us)."""
        fusable = {"pointwise", "reduce"}
        heads = fusable | {"matmul"} if budget.TILE_CLASSES else fusable
        out = set()
        outputs = set(self.pg.outputs)
        for t, readers in self.readers.items():
            p = self.producer.get(t)
            if p is None or t in outputs or not readers or p.kind not in heads:
                continue
            a, b = self.window(t)
            if all(op.kind in fusable for op in self.pg.ops[a + 1:b + 1]):
                out.add(t)
        return out

    def lx_bytes(self, t: str, s: Strategy) -> int:
        """The LX a residency of t made by strategy `s` takes per core in the model: its
        per-core box, or for a fused hand-off one tile of it at `budget.HANDOFF_TILES`
        tiles (the fusion search keeps such a result as a per-tile buffer; the read-back
        keeps it whole where it fits, `full_size_residencies`)."""
        if t not in self.handoffs:
            return s.out_lx_bytes
        sb = self.hw.stick_bytes
        sticks = -(-s.out_lx_bytes // sb)
        return -(-sticks // budget.HANDOFF_TILES) * sb

    def handoff_ok(self, t: str, producer: Strategy, reader: Strategy, slot: int) -> bool:
        """`compatible_residency`, and for a fused hand-off also one core count (a fused
        run is on one)."""
        if not compatible_residency(producer, reader, slot):
            return False
        if t in self.handoffs:
            return math.prod(producer.core_split.values()) == math.prod(reader.core_split.values())
        return True

    def full_size_residencies(self, resident: dict[str, Residency],
                              sizes: dict[str, int]) -> dict[str, Residency]:
        """`resident` with every fused hand-off at its whole per-core size (`sizes`), placed
        first-fit after the other residencies in window order; a hand-off that does not
        fit whole is left to the fusion search (device memory in the plan as solved, a
        per-tile buffer once its run is a kernel)."""
        if not any(t in self.handoffs for t in resident):
            return resident
        kept = {t: r for t, r in resident.items() if t not in self.handoffs}
        placed = self.canonical_addresses(kept)
        if placed is kept and kept:   # first-fit failed: keep the model's packing, no hand-offs
            return kept
        for t in sorted((t for t in resident if t in self.handoffs), key=lambda t: (self.window(t), t)):
            trial = self.canonical_addresses(dict(placed, **{t: Residency(0, sizes[t])}))
            if all(trial[u].lx_address + trial[u].size_per_core <= self.hw.lx_capacity_bytes for u in trial) \
                    and self._first_fit_ok(trial):
                placed = trial
        return placed

    def _first_fit_ok(self, resident: dict[str, Residency]) -> bool:
        """No two residencies with overlapping windows overlap in LX."""
        items = [(self.window(t), r.lx_address, r.lx_address + r.size_per_core) for t, r in resident.items()]
        for i, ((a, b), x0, x1) in enumerate(items):
            for (c, d), y0, y1 in items[i + 1:]:
                if a <= d and c <= b and x0 < y1 and y0 < x1:
                    return False
        return True

    def window(self, t: str) -> tuple[int, int]:
        """Op-index span [producer, last reader] of a residency candidate."""
        return (self.index[self.producer[t].id], max(self.index[o] for o, _ in self.readers[t]))

    def _span_limit(self, a: int, b: int, when_t: list[str]) -> None:
        """If all tensors of `when_t` stay resident, ops a..b form (part of) one bundle: the
        device-memory tensors they reference stay within the bundle limit (a resident
        tensor does not count; a restickified copy of any of them counts, conservatively)."""
        limit = self.hw.bundle_tensor_limit
        refs: set[str] = set()
        for k in range(a, b + 1):
            op = self.pg.ops[k]
            refs.update(x.tensor for x in op.inputs)
            refs.add(op.output.tensor)
        mats = [key for key in self.mat if key[0] in refs]
        cands = [u for u in refs if u in self.res]
        fixed = len(refs) - len(cands)
        self.span_checks.append((tuple(when_t), fixed, tuple(cands), tuple(mats)))
        when = [self.res[t] for t in when_t]
        if fixed > limit:
            self.m.AddBoolOr([w.Not() for w in when])
        else:
            terms = [self.mat[key] for key in mats] + [1 - self.res[u] for u in cands]
            self.m.Add(sum(terms) <= limit - fixed).OnlyEnforceIf(when)

    def repair_spans(self, resident: dict, needed: set, protect: frozenset = frozenset()) -> dict:
        """Drop residencies until every bundle-window constraint holds (dropping one can
        push another window over the limit, so this iterates). The `protect`ed ones are
        dropped only when a window of theirs alone breaks the limit."""
        resident = dict(resident)
        limit = self.hw.bundle_tensor_limit
        changed = True
        while changed:
            changed = False
            for when_t, fixed, cands, mats in self.span_checks:
                if all(t in resident for t in when_t):
                    n = fixed + sum(1 for u in cands if u not in resident) + sum(1 for k in mats if k in needed)
                    if n > limit:
                        drop = [t for t in when_t if t not in protect] or list(when_t)
                        for t in drop:
                            resident.pop(t, None)
                        changed = True
        return resident

    def spans_ok(self, resident: set[str], needed: set) -> bool:
        """The bundle-window constraints of the model, checked for an assignment."""
        limit = self.hw.bundle_tensor_limit
        for when_t, fixed, cands, mats in self.span_checks:
            if all(t in resident for t in when_t):
                n = fixed + sum(1 for u in cands if u not in resident) + sum(1 for k in mats if k in needed)
                if n > limit:
                    return False
        return True

    def _bundle_constraints(self) -> None:
        """Every resident window, and every two overlapping ones (they share a bundle), fit
        the bundle limit; longer chains are checked after the solve (lazy no-goods)."""
        self.span_checks: list[tuple] = []
        spans = sorted((self.window(t), t) for t in self.res)
        for i, ((a, b), t) in enumerate(spans):
            self._span_limit(a, b, [t])
            for (c, d), u in spans[i + 1:]:
                if c > b:
                    break
                self._span_limit(min(a, c), max(b, d), [t, u])

    # -- hint and read-back ------------------------------------------------------------------
    def strategy_index(self, op_id: str, plan: OpPlan, dim_orders: Optional[dict] = None) -> Optional[int]:
        """The strategy of `plan` (stick choice, split, alias); with `dim_orders` (a plan's
        `PlanDecisions.dim_orders`), the one priced in those orders when there is one."""
        op = self.pg.ops[self.index[op_id]]
        ch = plan.stick or default_choice(op)
        split = {k: v for k, v in plan.core_split.items() if v > 1}
        found = None
        for k, s in enumerate(self.S[op_id]):
            if s.stick == ch and s.core_split == split and s.alias == plan.alias:
                if dim_orders is None or self._orders_match(op, s, dim_orders):
                    return k
                found = k if found is None else found
        return found

    def _orders_match(self, op, s: Strategy, dim_orders: dict) -> bool:
        for slot, a in [(i, a) for i, a in enumerate(op.inputs)] + [(-1, op.output)]:
            t = a.tensor
            if t in self.ordv and self._directly(s, slot, t):
                have = dim_orders.get(t)
                have = tuple(have) if have is not None else None
                if have not in self.ordv[t]:
                    have = None
                if s.order_of(slot) != have:
                    return False
        return True

    def feasible_hint(self, d: PlanDecisions, input_sticks: dict) -> PlanDecisions:
        """`d` with the residencies the model would reject dropped: a candidate its picks
        cannot keep resident (`residency_ok` at the model's size), then those in a bundle
        window over the limit (`repair_spans`), the rest placed again first-fit at the
        model's sizes. CP-SAT repairs a complete hint that breaks a constraint by a search
        of its own, seeded: a plan whose residency the model's bundle windows forbid (the
        heuristic's causal-mask rows held across a prefill layer) left every seed a
        different start (llama prefill, 2026-12-05: 55 window constraints broken)."""
        picks = {op.id: self.strategy_index(op.id, d.ops.get(op.id, OpPlan())) for op in self.pg.ops}
        if any(k is None for k in picks.values()):
            return d
        sizes = {t: self.S[self.producer[t].id][picks[self.producer[t].id]].out_lx_bytes for t in self.res}
        kept = {t: r for t, r in d.resident.items() if t in self.res and self.residency_ok(t, picks)
                and sizes[t] <= self.hw.lx_capacity_bytes}
        sticks = dict(self.ctx.input_sticks)
        sticks.update(input_sticks)
        sticks.update(d.input_sticks)
        kept = self.repair_spans(kept, self.needed_resticks(picks, sticks))
        unplaced = {t: Residency(0, sizes[t]) for t in kept}
        placed = self.canonical_addresses(unplaced)
        if placed is unplaced:   # first-fit failed: no residency in the hint
            placed = {}
        resident = {t: r for t, r in d.resident.items() if t not in self.res}
        resident.update(placed)
        if resident == d.resident:
            return d
        return replace(d, resident=resident)

    def add_hint(self, d: PlanDecisions) -> None:
        m, hw = self.m, self.hw
        chosen: dict[str, int] = {}
        for op in self.pg.ops:
            k = self.strategy_index(op.id, d.ops.get(op.id, OpPlan()), d.dim_orders)
            if k is None:
                k = 0
            chosen[op.id] = k
            for j, v in enumerate(self.pick[op.id]):
                m.AddHint(v, j == k)
            for stick, lv in self.lay[op.output.tensor].items():
                m.AddHint(lv, self.S[op.id][k].out_stick == stick)
        out_stick = {op.output.tensor: self.S[op.id][chosen[op.id]].out_stick for op in self.pg.ops}
        for t in sorted(self.ctx.free_inputs):  # hint order steers the search: keep it fixed
            have = d.input_sticks.get(t, self.ctx.input_sticks.get(t))
            out_stick[t] = have
            for s, v in self.lay[t].items():
                m.AddHint(v, s == have)
        needed = set()
        for op in self.pg.ops:
            s = self.S[op.id][chosen[op.id]]
            for i, a in enumerate(op.inputs):
                want = s.input_sticks[i]
                have = out_stick.get(a.tensor, self.ctx.input_sticks.get(a.tensor))
                if want is not None and want != have:
                    needed.add((a.tensor, want))
        for key, v in self.mat.items():
            m.AddHint(v, key in needed)
        for t, vs in self.ordv.items():
            order = self.tensor_order(t, chosen)
            for o, v in vs.items():
                m.AddHint(v, o == order)
        resident = {t for t in d.resident if t in self.res}
        for t, r in self.res.items():
            on = t in resident
            m.AddHint(r, on)
            p = self.producer[t].id
            sz = self.lx_bytes(t, self.S[p][chosen[p]]) // hw.stick_bytes
            addr = d.resident[t].lx_address // hw.stick_bytes if on else 0
            m.AddHint(self.size[t], sz)
            m.AddHint(self.addr[t], addr)
            m.AddHint(self.yend[t], addr + sz)
        for op in self.pg.ops:
            s = self.S[op.id][chosen[op.id]]
            names, combos, body = self.combos[op.id]
            key = tuple(t in resident for t in names)
            j = next((j for j, (k, _) in enumerate(combos) if k == key), 0)
            m.AddHint(self.time[op.id], body[chosen[op.id]][j])

    def objective_of(self, picks: dict[str, int], resident: set[str],
                     input_sticks: Optional[dict] = None) -> float:
        """The model's objective (ns) for an assignment: per op the priced time of its
        strategy under its residency combination, plus every restickify it needs."""
        total = 0.0
        out_stick = {op.output.tensor: self.S[op.id][picks[op.id]].out_stick for op in self.pg.ops}
        out_stick.update(input_sticks or {})
        needed = set()
        for op in self.pg.ops:
            k = picks[op.id]
            names, combos, body = self.combos[op.id]
            key = tuple(t in resident for t in names)
            j = next((j for j, (kk, _) in enumerate(combos) if kk == key), 0)
            total += body[k][j] + to_units(self.S[op.id][k].parts.base.extra_ns)
            for i, a in enumerate(op.inputs):
                want = self.S[op.id][k].input_sticks[i]
                have = out_stick.get(a.tensor, self.ctx.input_sticks.get(a.tensor))
                if want is not None and want != have:
                    needed.add((a.tensor, want))
        return total + sum(self.restick_cost(*key) for key in needed)

    def residency_ok(self, t: str, picks: dict[str, int], size_per_core: Optional[int] = None) -> bool:
        """Can t stay resident under these picks (slicing, no split reduction, fits its
        reserved size)?"""
        sp = self.S[self.producer[t].id][picks[self.producer[t].id]]
        if sp.reduction_split or sp.alias:
            return False
        if size_per_core is not None and sp.out_lx_bytes > size_per_core:
            return False
        return all(self.handoff_ok(t, sp, self.S[o][picks[o]], slot) for o, slot in self.readers[t])

    def needed_resticks(self, picks: dict[str, int], input_sticks: dict) -> set:
        out_stick = {op.output.tensor: self.S[op.id][picks[op.id]].out_stick for op in self.pg.ops}
        out_stick.update(input_sticks)
        needed = set()
        for op in self.pg.ops:
            s = self.S[op.id][picks[op.id]]
            for i, a in enumerate(op.inputs):
                want = s.input_sticks[i]
                if want is not None and want != out_stick.get(a.tensor, self.ctx.input_sticks.get(a.tensor)):
                    needed.add((a.tensor, want))
        return needed

    def restick_cost(self, t: str, stick) -> int:
        """Price of the restickify of t onto `stick` (the model's, or priced once on demand)."""
        key = (t, stick)
        if key not in self.mat_cost:
            self.mat_cost[key] = self._restick_cost(t, stick)
        return self.mat_cost[key]

    def decisions_of(self, picks: dict[str, int], resident: dict[str, Residency],
                     input_sticks: dict) -> PlanDecisions:
        d = PlanDecisions(planner="cpsat", input_sticks=dict(input_sticks))
        for op in self.pg.ops:
            s = self.S[op.id][picks[op.id]]
            d.ops[op.id] = OpPlan(stick=s.stick, core_split=dict(s.core_split),
                                  temporal_tiles=dict(s.temporal_tiles), alias=s.alias)
        d.resident = dict(resident)
        d.bundle_starts = self.bundle_starts(set(resident))
        d.dim_orders = self.dim_orders(picks)
        return d

    def decisions(self, solver: cp_model.CpSolver, input_sticks: dict) -> PlanDecisions:
        hw = self.hw
        d = PlanDecisions(planner="cpsat", input_sticks=dict(input_sticks))
        for t in sorted(self.ctx.free_inputs):
            d.input_sticks[t] = next(s for s, v in self.lay[t].items() if solver.BooleanValue(v))
        picks = {}
        for op in self.pg.ops:
            k = next(j for j, v in enumerate(self.pick[op.id]) if solver.BooleanValue(v))
            picks[op.id] = k
            s = self.S[op.id][k]
            d.ops[op.id] = OpPlan(stick=s.stick, core_split=dict(s.core_split),
                                  temporal_tiles=dict(s.temporal_tiles), alias=s.alias)
        d.dim_orders = self.dim_orders(picks)
        for t, r in self.res.items():
            if solver.BooleanValue(r):
                d.resident[t] = Residency(lx_address=solver.Value(self.addr[t]) * hw.stick_bytes,
                                          size_per_core=solver.Value(self.size[t]) * hw.stick_bytes)
        d.resident = self.canonical_addresses(d.resident)
        sizes = {t: self.S[self.producer[t].id][picks[self.producer[t].id]].out_lx_bytes for t in d.resident}
        d.resident = self.full_size_residencies(d.resident, sizes)
        d.bundle_starts = self.bundle_starts(set(d.resident))
        return d

    def canonical_addresses(self, resident: dict[str, Residency]) -> dict[str, Residency]:
        """Re-place the chosen buffers first-fit (windows in order, then by name): the
        solver's addresses are one of many equivalent packings, and this one does not depend
        on which the search met first. Keeps the solver's packing when first-fit fails."""
        order = sorted(resident, key=lambda t: (self.window(t), t))
        out = first_fit_in_windows(order, self.window, {t: r.size_per_core for t, r in resident.items()},
                                   self.hw.lx_capacity_bytes)
        return out if len(out) == len(resident) else resident

    def windows(self, resident: set[str]) -> list[tuple[int, int, list[str]]]:
        """Groups of overlapping resident live windows, as (first op, last op, tensors)."""
        spans = sorted((*self.window(t), t) for t in resident)
        groups: list[tuple[int, int, list[str]]] = []
        for a, b, t in spans:
            if groups and a <= groups[-1][1]:
                ga, gb, ts = groups[-1]
                groups[-1] = (ga, max(gb, b), ts + [t])
            else:
                groups.append((a, b, [t]))
        return groups

    def bundle_starts(self, resident: set[str]) -> list[str]:
        return [self.pg.ops[a].id for a, _, _ in self.windows(resident)]


def stick_split_pieces(op, strategy) -> int:
    """Into how many pieces `strategy` splits the iteration dim `op`'s output sticks run
    along (1: each core's slice holds whole rows of sticks)."""
    st = strategy.stick.output if strategy.stick is not None else None
    if st is None or st >= len(op.output.dims) or op.output.dims[st] is None:
        return 1
    return int(strategy.core_split.get(op.iter_dims[op.output.dims[st]].name, 1))


def add_tie_break(sm: "SpyreModel") -> int:
    """A second, lexicographic objective among strategies the cost model prices alike:
    `budget.STICK_SPLIT_TIE_NS` per halving of the output's stick dim by the core split
    (log2 of `stick_split_pieces`), so that of two tied splits (a matmul's m8 x n4 and
    m4 x n8 price the same; so do an elementwise op's d1 8 x d2 4 and 4 x 8) every seed's
    solve prefers the one that splits rows rather than sticks, and a chain of aligned
    slices follows it. Measured why (llama31_8b_prefill512, 10 s deterministic, judge
    1f6d2d1): the MLP's up projection, SiLU product and down projection priced alike under
    both, and the fusion search turned the rows-first chain into a split-K kernel reading
    the product from LX (2955 us for the MLP) and the other into 3326 us; which one a seed
    landed on made seeds 1-4 spread 8.5%. The term is a few ns against microsecond costs
    (the idle-core tie-break is 1 ns a core): it never outweighs a priced difference.
    Returns the number of ops given the term."""
    unit = int(budget.STICK_SPLIT_TIE_NS)
    if unit <= 0:
        return 0
    n = 0
    for op_id, lits in sm.pick.items():
        op = sm.ops[op_id]
        pen = [unit * max(0, stick_split_pieces(op, s).bit_length() - 1) for s in sm.S[op_id]]
        if any(pen):
            sm.objective_terms.append(sum(c * v for c, v in zip(pen, lits) if c))
            n += 1
    return n


def build_model(pg: PrimGraph, hw, hint_d: PlanDecisions, keep: int = 4,
                keep_resident: int = 2) -> tuple[GraphContext, dict[str, list[Strategy]], SpyreModel]:
    """Strategy space and CP-SAT model of a graph. The hint's and the naive plan's
    strategies are always in the space, so the model's optimum is never worse than either."""
    ctx = GraphContext.build(pg, hw, hint_d.input_sticks)
    naive_d = plan_naive(pg, hw)
    strategies = {}
    required = {}
    for op in pg.ops:
        req = required_from(op, (hint_d, naive_d))
        required[op.id] = {(ch, tuple(sorted(sp.items())), al, ()) for ch, sp, _, al in req}
        strategies[op.id] = op_strategies(op, ctx, keep=keep, keep_resident=keep_resident, required=req)
    strategies = align_strategies(pg, ctx, strategies)
    # the non-stick dim order of the intermediates some op prefers in another order
    ctx.alt_orders = candidate_orders(pg, ctx, strategies, hint_d.dim_orders)
    strategies = order_variants(pg, ctx, strategies)
    if strategy_space.DROP_DOMINATED:
        strategies = drop_dominated(pg, strategies, required)
    # the objective prices each op as the fusion search will run it (its tile class)
    if budget.TILE_CLASSES:
        strategies = with_tile_classes(strategies, hw)
    return ctx, strategies, SpyreModel(pg, hw, ctx, strategies)
