"""Repeated structure: whole models at full depth planned by solving one layer (issue 14).

A 32-layer decoder stack is the same layer 32 times. Planning it as one CP-SAT model makes
the model, and the search it needs, 32 times a layer's; here the planner instead
1. finds the repeated block (`blocks.find_repeats`: a structural signature per op, its
   period, an edge check per copy);
2. solves one representative copy (`plan_depth`): the block as a graph of its own
   (`subgraph`: boundary inputs become graph inputs, tensors read after the block become
   graph outputs), planned by the ordinary CP-SAT pipeline, with its real boundary
   conditions: tensors made before the copies (mask, rotary tables) arrive in the layout
   the whole graph's hint writes them in, and the input from the previous copy in the
   layout the block writes its own counterpart in (a fixed point: solved again with that
   layout when the first solve writes another one, time permitting);
3. copies its decisions to every copy (`blocks.copy_decisions`: ops, weight layouts, residencies,
   restickify splits, bundle starts and op order renamed through the copy's op and tensor
   maps) and to the ops just outside the copies that repeat the block's end and start
   (`blocks.partial_edges`, `blocks.partial_copy`), plans what does not repeat by `solver.spyre.depth.windows`,
   and composes one plan (`merge`): each segment starts a bundle (no LX residency crosses a
   seam) and the emitter inserts the restickifies the layouts on both sides of a seam need;
4. emits and validates the whole program once (repairs at seams: tile buffers a seam
   restickify lands in go to device memory, a seam restickify whose split does not divide
   runs on one core, else the hint's plan for the edges), lets segments the hint runs
   faster take its decisions (`hybrid`), and returns the result only when it simulates no
   slower than the whole graph's hint (validated; the naive plan when it is invalid);
   otherwise the hint, with status HINT.
The CP-SAT models solved are one copy's and the windows', so their size follows the number
of distinct layers, not the depth.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Optional

from target.primitives import PrimGraph
from simulator.timing import time_program
from solver.oracle import checked_program
from solver.plan import OpPlan, PlanDecisions
from solver.spyre import budget
from solver.spyre.depth.hint import checked_hint, reserve_s, timed_hint_report, whole_hint
from solver.spyre.depth.segments import keep_part, merge, out_stick, reader_index, solve_segment
from solver.spyre.depth.core_search import plan_pieces, uses_core_search
from solver.spyre.depth.windows import plan_windows
from solver.spyre.depth.blocks import (Repeats, copy_decisions, copy_map, find_repeats, partial_copy,
                                       partial_edges, repeats_note)
from solver.spyre.depth.stacks import plan_stack, stack_of


def hybrid(pg: PrimGraph, hw, composed: PlanDecisions, parts: list, report, hint_d: PlanDecisions, hint_report,
           readers: dict, us: float, compose) -> tuple[Optional[tuple[PlanDecisions, float]], Optional[str]]:
    """Segments (a copy, an edge, a window) whose ops the hint runs faster (simulated, op by
    op) take the hint's decisions; the result is emitted, validated and simulated once and
    returned (with its simulated us) when faster than `us`, else None; and a note when it
    was tried."""
    mine = {o.op_id: o.end_us - o.start_us for o in report.ops}
    theirs = {o.op_id: o.end_us - o.start_us for o in hint_report.ops}
    pos = {op.id: i for i, op in enumerate(pg.ops)}
    out, swapped, gain = [], 0, 0.0
    for part, ids in parts:
        t_mine, t_theirs = sum(mine.get(o, 0.0) for o in ids), sum(theirs.get(o, 0.0) for o in ids)
        if t_theirs < t_mine * (1 - 1e-6):
            gain += t_mine - t_theirs
            hp = keep_part(pg, hint_d, sorted(pos[o] for o in ids), readers)
            out.append((hp, hp.op_order))
            swapped += 1
        else:
            out.append((part, ids))
    if not swapped or gain < budget.HYBRID_MIN_GAIN * us:
        return None, None   # not worth another emit, validation and simulation of the whole graph
    cand = compose(out)
    prog, _ = checked_program(pg, hw, cand)
    if prog is None:
        return None, f"hybrid with the hint on {swapped} segments: invalid, not taken"
    cand_us = time_program(prog, hw).total_us
    note = (f"hybrid with the hint on {swapped} of {len(parts)} segments: simulated {cand_us:.1f} us "
            f"({'taken' if cand_us < us else 'not taken'}, was {us:.1f})")
    return ((cand, cand_us) if cand_us < us else None), note


def covered_ops(pg: PrimGraph, rep: Repeats) -> int:
    """Ops of `pg` in copies: the block's, and those of the stacks of their own around it
    (`stacks.stack_of`): two stacks of about equal size each cover less than half of an
    encoder-decoder, both together most of it."""
    n = len(pg.ops)
    out = rep.copies * rep.period
    if out >= budget.MIN_COVERAGE * n:
        return out     # (enough: the ranges around it need not be searched)
    before, after = partial_edges(pg, rep)
    for idx in (list(range(0, rep.start - before)), list(range(rep.stop + after, n))):
        st = stack_of(pg, idx) if idx else None
        out += st.copies * st.period if st is not None else 0
    return out


def split_time(pg: PrimGraph, rep: Repeats, rest_idx: list[list[int]], avail: float,
               op_us: Optional[dict] = None) -> tuple[list[tuple[float, Optional[Repeats]]], float, float]:
    """The depth step's solving seconds `avail` split between the representative and the
    pieces that do not repeat (`rest_idx`), each in proportion to what it needs. Plain pieces
    get their share of the op decisions the solves make (the representative decides
    `copies` times its ops), at most 1 - `budget.REPRESENTATIVE_SHARE` together. A piece that
    is a stack of its own (`stacks.stack_of`: the other part of an encoder-decoder) solves
    one copy as the representative does: the two share what is left by what their solves
    stand to gain, the time the whole graph's hint spends in the ops each decides (`op_us`,
    op id -> simulated us; by their blocks' ops when not given): at the default limit T5's
    encoder takes 24 of the hint's 32 ms and its decoder stack 7. A share below
    `budget.MIN_WINDOW_S` goes to the others (that part keeps its heuristic plan). Returns
    ((seconds, its stack or None) per piece, the pieces' total, the representative's
    seconds)."""
    stacks = [stack_of(pg, idx) if idx else None for idx in rest_idx]
    plain_ops = sum(len(idx) for idx, st in zip(rest_idx, stacks) if st is None)
    plain_s = avail * min(1.0 - budget.REPRESENTATIVE_SHARE, plain_ops / (plain_ops + rep.copies * rep.period)) \
        if plain_ops else 0.0
    if plain_s < budget.MIN_WINDOW_S:
        plain_s = 0.0
    solve_s = avail - plain_s
    rest_set = {i for idx in rest_idx for i in idx}

    def need(ops: list[int], period: int) -> float:
        if op_us is None:
            return float(period)
        return sum(op_us.get(pg.ops[i].id, 0.0) for i in ops) or 1e-9
    weights = {-1: need([i for i in range(len(pg.ops)) if i not in rest_set], rep.period)}
    for k, (idx, st) in enumerate(zip(rest_idx, stacks)):
        if st is not None:
            weights[k] = need(idx, st.period)
    # a share too short for a solve goes to the others, the smallest first
    while len(weights) > 1:
        k_min = min(weights, key=weights.get)
        if solve_s * weights[k_min] / sum(weights.values()) >= budget.MIN_WINDOW_S:
            break
        del weights[k_min]
    total = sum(weights.values())
    shares = []
    for k, (idx, st) in enumerate(zip(rest_idx, stacks)):
        if st is not None:
            shares.append((solve_s * weights[k] / total if k in weights else 0.0, st))
        else:
            shares.append((plain_s * len(idx) / plain_ops if plain_ops else 0.0, None))
    rest_s = sum(s for s, _ in shares)
    return shares, rest_s, avail - rest_s


def plan_depth(pg: PrimGraph, hw, *, time_limit_s: float, deterministic: bool, t0: float,
               rep: Optional[Repeats] = None, hint_d: Optional[PlanDecisions] = None,
               seed: int = 1) -> Optional[PlanDecisions]:
    """The repeated-structure plan of `pg` (module docstring), or None when `pg` has no
    repeated block covering `budget.MIN_COVERAGE` of its ops (with the other stack of a
    two-part model, `covered_ops`). `pg` is in the planner's op order;
    `t0` is when the whole compile started (the time limit covers everything from there,
    `planners.plan()`'s own emit, validation and bound included). `hint_d`: the whole
    graph's starting plan (the heuristic's when None). `seed`: the representative's CP-SAT
    seed (wall clock: its first draw's, the next draws take the seeds after it;
    deterministic: the single-graph pipeline's draws, `single.plan_graph`)."""
    n = len(pg.ops)
    rep = rep or find_repeats(pg, min_copies=budget.MIN_COPIES)
    if rep is None or covered_ops(pg, rep) < budget.MIN_COVERAGE * n:
        return None
    notes = [repeats_note(rep, n)]
    limit = float(time_limit_s)
    hint_d = whole_hint(pg, hw, hint_d)
    hint_us, hint_report, post_s = timed_hint_report(pg, hw, hint_d)
    # the reserve keeps the wall-clock limit (composing, checking and validating after the
    # solves); a deterministic plan's wall is not bounded by its limit, so there the solves'
    # shares are of the whole limit: the representative of a 32-layer stack gets the budget a
    # one-layer graph's plan gets at the same limit (before 2026-12-05 it got the limit less
    # 4.3 s, and its draws 0.43 deterministic units each against the one-layer plan's 0.75)
    reserve = reserve_s(n, None if deterministic else post_s)
    notes.append(f"budget: {limit:g} s for the whole compile, {reserve:.1f} s of it kept for composing, "
                 "checking and validating the whole program" + (
                     " (deterministic: not taken from the solves' shares)" if deterministic else ""))
    before, after = partial_edges(pg, rep)
    # deterministic: shares of the limit from counts only; else what is left of the wall clock
    avail = limit if deterministic else limit - reserve - (time.perf_counter() - t0)
    avail = max(0.0, avail)
    rest_idx = [list(range(0, rep.start - before)), list(range(rep.stop + after, n))]
    op_us = {o.op_id: o.end_us - o.start_us for o in hint_report.ops} if hint_report is not None else None
    piece_s, rest_s, rep_s = split_time(pg, rep, rest_idx, avail, op_us)
    readers = reader_index(pg)

    # 0. a prologue that is a stack of its own with the larger stake is planned first (it
    # needs nothing the representative decides): in wall-clock mode a representative solve
    # that overruns its share would otherwise take the stack's (T5 at 30 s, load 14: 7.0 s
    # for a 2.8 s share). Deterministic plans do not depend on the order.
    early = None
    if not deterministic and rest_idx[0] and piece_s[0][1] is not None and piece_s[0][0] > rep_s:
        early = plan_stack(pg, rest_idx[0], hw, deadline=t0 + limit - reserve - rep_s - piece_s[1][0],
                           budget_s=piece_s[0][0], deterministic=False, input_sticks={}, name="prologue",
                           readers=readers, rep=piece_s[0][1], seed=seed)
        rep_s = min(rep_s, max(0.0, t0 + limit - reserve - time.perf_counter() - piece_s[1][0]))

    # 1. one representative copy, from the middle (its inputs come from a copy before it)
    c_r = rep.copies // 2
    block = list(rep.block(c_r))
    t_rep = time.perf_counter()
    # the boundary condition of a stack: what the previous copy hands over arrives in the
    # layout this copy writes its own counterpart in (solved again when it does not)
    nxt = copy_map(pg, rep.block(c_r + 1), rep.block(c_r)) if c_r + 1 < rep.copies else None
    pairs: list[tuple[str, str]] = []     # (boundary input of the representative, its output counterpart)
    if nxt is not None:
        block_set = set(rep.block(c_r))
        producer_idx = {op.output.tensor: i for i, op in enumerate(pg.ops)}
        for i in rep.block(c_r + 1):
            for a in pg.ops[i].inputs:
                if producer_idx.get(a.tensor, -1) in block_set:
                    b = nxt.tensors.get(a.tensor)
                    if b is not None and b != a.tensor and (b, a.tensor) not in pairs:
                        pairs.append((b, a.tensor))
    producer = {op.output.tensor: op for op in pg.ops}
    producer_pos = {op.output.tensor: i for i, op in enumerate(pg.ops)}
    # tensors made before the copies and read by them (an attention mask, rotary tables):
    # the representative reads them in the layout the whole graph's hint writes them in, and
    # the composed plan keeps the hint's plan for their producers where it would differ (an
    # op reading ANY layout took its split under that layout)
    shared_in = {a.tensor: out_stick(producer[a.tensor], hint_d.ops.get(producer[a.tensor].id))
                 for i in block for a in pg.ops[i].inputs
                 if a.tensor in producer and producer_pos[a.tensor] < rep.start}
    rep_notes: list[str] = []
    # deterministic: one solve of the whole share, whose pipeline makes its own draws as it
    # would for a graph of its own (`single.draw_count` of its budget: four for a prefill
    # layer's block at 10 s, counts only); wall clock: draws here while the share lasts
    # (below)
    draws = None if deterministic else 1
    draw_s = rep_s
    rep_inputs = shared_in
    rep_d, note = solve_segment(pg, block, hw, time_limit_s=draw_s, deterministic=deterministic,
                                input_sticks=rep_inputs, name="representative",
                                limit_share=budget.REPRESENTATIVE_LIMIT_SHARE, seed=seed, draws=draws)
    rep_notes.append(note)

    def mismatched(d: PlanDecisions) -> dict:
        out = {}
        for b, u in pairs:
            want = out_stick(producer[u], d.ops.get(producer[u].id))
            rank = len(pg.tensors[b].shape)
            have = d.input_sticks.get(b, rank - 1 if rank else None)
            if want != have:
                out[b] = want
        return out

    def pred_us(d: PlanDecisions) -> float:
        return d.stats.get("predicted_us") or float("inf")
    fix = mismatched(rep_d)
    if fix:
        # deterministic: half a draw's share again (counts only); wall clock: what the first
        # solve left of its share
        left = 0.5 * draw_s if deterministic else rep_s - (time.perf_counter() - t_rep)
        if left >= 1.0:
            again, note = solve_segment(pg, block, hw, time_limit_s=left, deterministic=deterministic,
                                        input_sticks={**shared_in, **fix}, name="representative (periodic inputs)",
                                        limit_share=budget.REPRESENTATIVE_LIMIT_SHARE, seed=seed, draws=draws)
            rep_notes.append(note)
            if not mismatched(again) and pred_us(again) <= pred_us(rep_d) * 1.05:
                rep_d, rep_inputs = again, {**shared_in, **fix}
        else:
            rep_notes.append(f"representative writes {len(fix)} boundary tensors in another layout than it "
                             "reads them: restickified at every seam (no time to solve it again)")
    # wall clock: more draws (another CP-SAT seed: another plan, which the fusion search
    # turns into a program up to 20% faster or slower) while the share lasts; the fastest is
    # kept
    drawn = 1
    while not deterministic and drawn < budget.REPRESENTATIVE_MAX_DRAWS:
        t_draw = time.perf_counter()
        left = rep_s - (t_draw - t_rep)
        if left < max(budget.MIN_WINDOW_S, budget.REPRESENTATIVE_DRAW_FACTOR * (t_draw - t_rep) / drawn):
            break
        again, note = solve_segment(pg, block, hw, time_limit_s=left, deterministic=deterministic,
                                    input_sticks=rep_inputs, name=f"representative (seed {seed + drawn})",
                                    limit_share=budget.REPRESENTATIVE_LIMIT_SHARE, seed=seed + drawn)
        drawn += 1
        rep_notes.append(note)
        if not mismatched(again) and pred_us(again) < pred_us(rep_d):
            rep_d = again
    if drawn > 1:
        rep_notes.append(f"representative: {drawn} draws, kept predicted {pred_us(rep_d):.1f} us")
    notes += rep_notes

    # 2. the copies
    # tensors the block reads that other ops of the graph produce (their layouts are their
    # producers'); the block's weights are not among them: their layouts are copied
    boundary = ({a.tensor for i in block for a in pg.ops[i].inputs} - {pg.ops[i].output.tensor for i in block}) \
        & set(producer)
    parts: list[tuple[PlanDecisions, list[str]]] = []
    copies = []
    for c in range(rep.copies):
        m = copy_map(pg, rep.block(c_r), rep.block(c))
        cd = copy_decisions(rep_d, m, boundary)
        ids = [pg.ops[i].id for i in rep.block(c)]
        if len(cd.op_order) != len(ids):
            cd.op_order = ids
        copies.append((cd, cd.op_order))

    # 3. the ops just outside the copies that repeat the block's end or start (a layer the
    # block boundary cuts): the representative's decisions for them too
    head: list = []
    tail: list = []
    if before:
        dst = list(range(rep.start - before, rep.start))
        src = [i - rep.start + rep.block(c_r).start + rep.period for i in dst]
        head = [(lambda d: (d, d.op_order))(partial_copy(pg, rep_d, src, dst, readers))]
    if after:
        dst = list(range(rep.stop, rep.stop + after))
        src = [i - rep.stop + rep.block(c_r).start for i in dst]
        tail = [(lambda d: (d, d.op_order))(partial_copy(pg, rep_d, src, dst, readers))]
    if before or after:
        notes.append(f"repeats: {before} ops before the first copy and {after} after the last repeat the "
                     "block's end and start: decisions reused")

    # 4. what does not repeat: windows, boundary layouts from what precedes them
    sticks: dict = {}
    t_rest = time.perf_counter()
    pre, post = [], []
    for k, idx in enumerate(rest_idx):
        if not idx:
            continue
        if k == 1:
            for part, ids in copies + tail:
                idset = set(ids)
                sticks.update({op.output.tensor: out_stick(op, part.ops.get(op.id))
                               for op in pg.ops if op.id in idset})
        share, stack = piece_s[k]
        if not deterministic:
            later = sum(piece_s[j][0] for j in range(k + 1, len(rest_idx)))
            share = min(share, max(0.0, t0 + limit - reserve - time.perf_counter() - later))
        plan_rest = plan_pieces if uses_core_search(deterministic) else plan_windows
        if stack is not None:
            plan_rest = plan_stack   # the other part of a two-part model, a stack of its own
        if k == 0 and early is not None:
            got, window_notes = early
        else:
            got, window_notes = plan_rest(pg, idx, hw, deadline=None if deterministic else t0 + limit - reserve,
                                          budget_s=share, deterministic=deterministic, input_sticks=sticks,
                                          name="prologue" if k == 0 else "epilogue", readers=readers, rep=stack,
                                          seed=seed)
        notes += window_notes
        (pre if k == 0 else post).extend(got)
        for part, ids in got:
            idset = set(ids)
            sticks.update({op.output.tensor: out_stick(op, part.ops.get(op.id))
                           for op in pg.ops if op.id in idset})
    inputs = set(pg.inputs)

    def compose(parts) -> PlanDecisions:
        d = merge(parts)
        d.input_sticks = {t: s for t, s in d.input_sticks.items() if t in inputs}
        pinned = 0
        for t, want in shared_in.items():
            # the copies read it from device memory, as the representative did (a graph
            # input there): a restickify of it split as in the copy must find it there
            d.resident.pop(t, None)
            op = producer[t]
            if out_stick(op, d.ops.get(op.id)) != want and op.id in hint_d.ops:
                p = hint_d.ops[op.id]
                d.ops[op.id] = replace(p, core_split=dict(p.core_split), temporal_tiles=dict(p.temporal_tiles))
                d.resident.pop(t, None)
                pinned += 1
        if pinned:
            notes.append(f"seams: {pinned} tensors the copies share kept in the hint's layout")
        return d
    phase = {"representative": t_rest - t_rep, "rest": time.perf_counter() - t_rest}

    # 5. one program, validated, never slower than the whole graph's hint; when the edges'
    # reused decisions do not validate, the edges are planned as the rest is (heuristic)
    t_check = time.perf_counter()
    composed = compose(pre + head + copies + tail + post)
    prog, issues = checked_program(pg, hw, composed)
    for _ in range(3):
        # a seam can put a restickify inside a reused fused kernel: such tile buffers go
        # to device memory (the kernel stays); a restickify a seam adds whose default split
        # does not divide runs on one core; then the program is checked again
        bad = {i.tensor for i in issues if getattr(i, "code", "") in ("lx_tile_scope", "kernel_tile_order")
               and getattr(i, "tensor", None) in composed.resident}
        resticks = {i.op.split(":", 1)[1] for i in issues if getattr(i, "code", "") == "split_uneven"
                    and (getattr(i, "op", None) or "").startswith("restick:")}
        if prog is not None or not (bad or resticks):
            break
        if bad:
            notes.append(f"seams: {len(bad)} reused tile buffers moved to device memory ({', '.join(sorted(bad)[:3])})")
        if resticks:
            notes.append(f"seams: {len(resticks)} restickifies on one core ({', '.join(sorted(resticks)[:3])})")
        # (a one-core restickify reads its source from device memory)
        sources = {k.rpartition("@stick")[0] for k in resticks}
        composed = replace(composed, resident={t: r for t, r in composed.resident.items()
                                               if t not in bad and t not in sources},
                           restick_ops={**composed.restick_ops, **{k: OpPlan() for k in resticks}})
        prog, issues = checked_program(pg, hw, composed)
    if prog is None and (head or tail):
        notes.append("composed plan invalid (" + "; ".join(
            f"{getattr(i, 'code', '')}: {getattr(i, 'message', i)}" for i in issues[:3]) +
            "): edges planned by the hint")
        valid_hint, _, hint_note = checked_hint(pg, hw, hint_d, 0.0)
        notes += [hint_note] if hint_note else []
        edge = [(keep_part(pg, valid_hint, list(range(0, rep.start)), readers), None),
                (keep_part(pg, valid_hint, list(range(rep.stop, n)), readers), None)]
        composed = compose([(p_, p_.op_order) for p_, _ in edge[:1] if p_.ops] + copies +
                           [(p_, p_.op_order) for p_, _ in edge[1:] if p_.ops])
        prog, issues = checked_program(pg, hw, composed)
    if prog is None and composed.resident:
        notes.append("composed plan invalid (" + "; ".join(
            f"{getattr(i, 'code', '')}: {getattr(i, 'message', i)}" for i in issues[:3]) + "): LX residencies dropped")
        composed = replace(composed, resident={}, restick_ops={})
        prog, issues = checked_program(pg, hw, composed)
    seam = ""
    if prog is None:
        notes.append("composed plan failed validation: " + "; ".join(
            f"{getattr(i, 'code', '')}: {getattr(i, 'message', i)}" for i in issues[:3]))
        us = float("inf")
    else:
        report = time_program(prog, hw)
        us = report.total_us
        per_copy = rep_d.stats.get("predicted_us")
        seam = f", representative predicted {per_copy:.1f} us x {rep.copies}" if per_copy else ""
        if hint_report is not None and (deterministic or time.perf_counter() < t0 + limit - 0.6 * reserve):
            better, hybrid_note = hybrid(pg, hw, composed, pre + head + copies + tail + post, report, hint_d,
                                         hint_report, readers, us, compose)
            notes += [hybrid_note] if hybrid_note else []
            if better is not None:
                composed, us = better
    phase["compose and check"] = time.perf_counter() - t_check
    if us > hint_us:
        hint_d, hint_us, hint_note = checked_hint(pg, hw, hint_d, hint_us)
        notes += [hint_note] if hint_note else []
    if us <= hint_us:
        out = composed
        notes.append(f"repeated-structure plan simulated {us:.1f} us (hint {hint_us:.1f} us{seam})")
        status = rep_d.stats.get("solver_status") or "UNKNOWN"
    else:
        out = replace(hint_d, planner="cpsat", stats={})
        out.op_order = []
        notes.append(f"repeated-structure plan simulated {us:.1f} us > hint {hint_us:.1f} us: returning the hint")
        us, status = hint_us, "HINT"
    notes.append("time: " + ", ".join(f"{k} {v:.2f} s" for k, v in phase.items()))
    out.stats = dict(predicted_us=us, solver_status=status, objective=None, bound=None, gap=None,
                     solve_seconds=time.perf_counter() - t0, notes=notes)
    return out


# Graphs without a repeated block and more ops than this are planned in windows.
