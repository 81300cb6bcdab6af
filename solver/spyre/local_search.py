"""Best-single-move local search on the CP-SAT model's own objective (`local_search`): the
start's sharpening before the solve, and the solve's polish after it.

Moves: a weight's stick dim, one op's strategy (residencies the move breaks are dropped and
the bundle-window constraints must keep holding), a candidate's non-stick dim order with its
producer and readers (`solver.spyre.layout_choice.order_moves`), one more residency with the
strategy changes that let it hold and whole regions of small ops to one core with their
intermediates held (`solver.spyre.hold_moves`), and each pass the best improving chain
move (`solver.spyre.chain_moves`: a stick-connected run of ops relabelled together). Priced
incrementally and exactly (integer ns): the same moves, in the same order, with the same
result as `SpyreModel.objective_of` on every trial.
"""
from __future__ import annotations

import time
from typing import Optional

from solver.plan import OpPlan, PlanDecisions
from solver.spyre.chain_moves import ChainMoves, any_operands_ok
from solver.spyre.cost_model import to_units
from solver.spyre.hold_moves import HoldMoves, region_moves
from solver.spyre.layout_choice import order_moves
from solver.spyre.model import SpyreModel


def local_search(sm: SpyreModel, d: PlanDecisions, deadline: Optional[float], max_passes: int = 50,
                 chains: bool = True, hold_moves: bool = True, movable: Optional[frozenset] = None) -> PlanDecisions:
    """Best single moves on the model's own objective until none improves or the
    deadline: a weight's stick dim, or one op's strategy (residencies the move breaks
    are dropped; the bundle-window constraints must keep holding); then, each pass, the
    best improving chain move (`chains`: a stick-connected run of ops relabelled
    together, `solver.spyre.chain_moves`), priced the same way. The result is a better
    complete hint for CP-SAT.

    Moves are priced incrementally (exact: the objective is integer nanoseconds): a
    move re-prices only the ops touching a tensor whose residency it changes and the
    restickifies of the tensors the moved op reads and writes. Same moves, same order,
    same result as `objective_of` on every trial, without its pass over the graph.

    `movable`: when given, only these ops' strategies may change (and no weight's stick
    dim): the search around a part of the plan set from outside (`steps.realigned`)."""
    ops = {op.id: op for op in sm.pg.ops}
    picks = {op.id: (sm.strategy_index(op.id, d.ops.get(op.id, OpPlan()), d.dim_orders) or 0) for op in sm.pg.ops}
    inputs = {t: d.input_sticks.get(t, sm.ctx.input_sticks.get(t)) for t in sorted(sm.ctx.free_inputs)}
    resident = {t: r for t, r in d.resident.items() if t in sm.res}
    touching: dict[str, list[str]] = {}
    ops_of: dict[str, set[str]] = {}  # tensor -> ops reading or writing it
    for op in sm.pg.ops:
        touching[op.id] = [a.tensor for a in op.inputs] + [op.output.tensor]
        for t in touching[op.id]:
            ops_of.setdefault(t, set()).add(op.id)
    extra = {o: [to_units(s.parts.base.extra_ns) for s in S] for o, S in sm.S.items()}
    combo_index = {o: {key: j for j, (key, _) in reversed(list(enumerate(c[1])))} for o, c in sm.combos.items()}

    def op_cost(o: str, k: int, res: dict) -> int:
        names, _, body = sm.combos[o]
        j = combo_index[o].get(tuple(t in res for t in names), 0)
        return body[k][j] + extra[o][k]

    def have(t: str, pk: dict, ins: dict):
        p = sm.producer.get(t)
        if p is not None:
            return sm.S[p.id][pk[p.id]].out_stick
        return ins[t] if t in ins else sm.ctx.input_sticks.get(t)

    def needs(t: str, pk: dict, ins: dict) -> frozenset:
        h = have(t, pk, ins)
        out = set()
        for o, i in sm.readers.get(t, ()):
            want = sm.S[o][pk[o]].input_sticks[i]
            if want is not None and want != h:
                out.add((t, want))
        return frozenset(out)

    def restick(keys) -> int:
        return sum(sm.restick_cost(*key) for key in keys)

    need = {t: needs(t, picks, inputs) for t in sm.readers}
    cost = {o: op_cost(o, picks[o], resident) for o in ops}
    best = sum(cost.values()) + sum(restick(v) for v in need.values())

    def all_needed(changed: dict) -> set:
        out = set()
        for t, v in need.items():
            out.update(changed.get(t, v))
        return out

    def out_of_time() -> bool:
        return deadline is not None and time.perf_counter() > deadline
    def best_of(candidates):
        """The best of the candidate moves (trial picks, moved ops, `HoldMove` or None) that
        beats the incumbent, as (objective, picks, residencies, op costs, needs); else None."""
        found = None
        for trial, moved_ops, hold in candidates:
            val, res2, new_cost, new_need = try_move(trial, moved_ops, inputs, (), hold=hold)
            if val is not None and val < (best if found is None else found[0]):
                found = (val, trial, res2, new_cost, new_need)
        return found

    def try_move(trial: dict, moved_ops, trial_inputs: dict, moved_inputs, hold=None):
        """(objective, residencies, op costs, restickify needs) after the move, or
        (None, ...) when it breaks a bundle window or an ANY operand's forbidden
        stick dims (`chain_moves.any_operands_ok`). Re-prices only the ops touching a
        tensor whose residency it changes and the restickifies of the tensors the moved
        ops and weights touch. `hold`: a `HoldMove` whose tensors the move also keeps in
        LX (none when one's slicing does not hold under the move)."""
        if movable is not None and any(o not in movable and trial[o] != picks[o] for o in moved_ops) or \
                not any_operands_ok(sm, trial, trial_inputs, moved_ops, moved_inputs) or \
                not sm.orders_ok(trial, moved_ops):
            return None, None, None, None
        touched = {t for o in moved_ops for t in touching[o]}
        res2 = {t: r for t, r in resident.items()
                if t not in touched or sm.residency_ok(t, trial, r.size_per_core)}
        new_need = {t: needs(t, trial, trial_inputs) for t in touched | set(moved_inputs) if t in need}
        needed = None
        if len(res2) < len(resident):
            needed = all_needed(new_need)
            res2 = sm.repair_spans(res2, needed)
        moved = set(moved_ops)
        if hold is not None:
            for t, r in hold.holds:
                # the model holds no tensor a restickify reads (it prices those through device
                # memory)
                if not sm.residency_ok(t, trial, r.size_per_core) or needs(t, trial, trial_inputs):
                    return None, None, None, None
                res2 = dict(res2, **{t: r})
                moved |= ops_of.get(t, set())
            # the bundle windows the new buffers join: other residencies give way to them
            needed = all_needed(new_need)
            held = {t for t, _ in hold.holds}
            res2 = sm.repair_spans(res2, needed, protect=held)
            if not held <= set(res2):
                return None, None, None, None
        for t in resident:
            if t not in res2:
                moved |= ops_of.get(t, set())
        new_cost = {o: op_cost(o, trial[o], res2) for o in moved}
        val = (best + sum(c - cost[o] for o, c in new_cost.items())
               + sum(restick(v) - restick(need[u]) for u, v in new_need.items()))
        if val < best and sm.spans_ok(set(res2), needed if needed is not None else all_needed(new_need)):
            return val, res2, new_cost, new_need
        return None, None, None, None

    moves = ChainMoves(sm) if chains else None
    holds = HoldMoves(sm) if hold_moves else None
    improved = True
    passes = 0
    while improved and passes < max_passes and not out_of_time():
        improved = False
        passes += 1
        for t in (sorted(sm.ctx.free_inputs) if movable is None else ()):
            for s in sm.ctx.possible_sticks[t]:
                if s == inputs[t]:
                    continue
                trial = dict(inputs, **{t: s})
                new_need = {t: needs(t, picks, trial)} if t in need else {}
                val = best + sum(restick(v) - restick(need[u]) for u, v in new_need.items())
                if val < best and sm.spans_ok(set(resident), all_needed(new_need)) and \
                        any_operands_ok(sm, picks, trial, (), (t,)):
                    best, inputs, improved = val, trial, True
                    need.update(new_need)
        for op in sm.pg.ops:
            if out_of_time():
                break
            if movable is not None and op.id not in movable:
                continue
            for k in range(len(sm.S[op.id])):
                if k == picks[op.id]:
                    continue
                trial = dict(picks)
                trial[op.id] = k
                val, res2, new_cost, new_need = try_move(trial, (op.id,), inputs, ())
                if val is not None and val < best:
                    best, picks, resident, improved = val, trial, res2, True
                    cost.update(new_cost)
                    need.update(new_need)
        # a candidate's dim order moved with its producer and readers
        # (`solver.spyre.layout_choice`), the best of its orders kept when it improves
        for t in sorted(sm.ordv):
            if out_of_time():
                break
            best_order = best_of((dict(picks, **change), list(change), None)
                                 for change in order_moves(sm, t, picks))
            if best_order is not None:
                best, picks, resident, new_cost, new_need = best_order
                improved = True
                cost.update(new_cost)
                need.update(new_need)
        # residencies added one at a time, each with the strategy changes that let it hold
        # (`solver.spyre.hold_moves`), the best offer of each tensor kept when it improves
        for t in (holds.candidates if holds is not None else ()):
            if out_of_time():
                break
            if movable is not None and sm.producer[t].id not in movable and \
                    not any(r in movable for r, _ in sm.readers[t]):
                continue
            best_hold = best_of((dict(picks, **dict(mv.picks)), [o for o, _ in mv.picks], mv)
                                for mv in holds.moves(t, picks, resident))
            if best_hold is not None:
                best, picks, resident, new_cost, new_need = best_hold
                improved = True
                cost.update(new_cost)
                need.update(new_need)
        # whole regions of small ops to one core with their intermediates held (disjoint:
        # each kept when it improves)
        for mv in (list(region_moves(sm, holds, picks, resident)) if holds is not None else ()):
            if out_of_time():
                break
            mv = holds.replaced(mv, resident)  # first-fit again beside what earlier regions hold
            if mv is None:
                continue
            trial = dict(picks, **dict(mv.picks))
            val, res2, new_cost, new_need = try_move(trial, [o for o, _ in mv.picks], inputs, (), hold=mv)
            if val is not None and val < best:
                best, picks, resident = val, trial, res2
                improved = True
                cost.update(new_cost)
                need.update(new_need)
        if moves is None or out_of_time():
            continue
        found = None
        for mv in moves.moves(picks, inputs, resident):
            if out_of_time():
                break
            trial = dict(picks, **dict(mv.picks))
            trial_inputs = dict(inputs, **dict(mv.inputs))
            val, res2, new_cost, new_need = try_move(trial, [o for o, _ in mv.picks], trial_inputs,
                                                     [t for t, _ in mv.inputs])
            if val is not None and val < (best if found is None else found[0]):
                found = (val, trial, trial_inputs, res2, new_cost, new_need)
        if found is not None:
            best, picks, inputs, resident, new_cost, new_need = found
            improved = True
            cost.update(new_cost)
            need.update(new_need)
    out = sm.decisions_of(picks, resident, dict(sm.ctx.input_sticks, **inputs))
    return out

