"""A stack inside what does not repeat: the other part of a model made of two parts (issue 30).

An encoder-decoder (T5), a vision encoder feeding a text decoder (ViT -> GPT-2): the repeated
block `find_repeats` picks is one stack's layer (the larger stack's); the other stack lies
in what does not repeat, hundreds of ops that the large-graph path (`core_search.plan_pieces`)
plans whole, which takes more time than the default limit leaves it. Planned alone, the
same part is a stack of its own and goes through the repeated path (one layer solved,
copied). `plan_stack` plans such a piece that way inside the whole graph's plan:
1. what precedes its copies keeps its heuristic plan around the boundary layouts
   (`segments.solve_segment` below its solve threshold);
2. its middle copy, as a graph of its own, is solved by the CP-SAT pipeline
   (`segments.solve_segment`), reading the tensors made before it in the layouts their
   producers write (the previous copy's hand-over in its default layout: where the copy
   writes its own counterpart otherwise, the emitter restickifies at each seam);
3. its decisions go to every copy and to the ops just outside the copies that repeat the
   block's end and start (`blocks.copy_decisions`, `blocks.partial_copy`);
4. what follows the copies keeps its heuristic plan around the layouts the copies write;
5. when the piece's time leaves the core's search what it needs on the piece after the
   copy's solve (`core_search.MIN_CORE_S` + `CORE_S_PER_OP` per op), that search plans the
   piece whole from the stack's plan (`finish`; never slower than it): at 30 s it finds
   what no one layer shows, a restickify shared by the 12 layers' readers of T5's position
   bias (docs/depth.md).
The parts are returned as `core_search.plan_pieces` returns its one part (a list of (plan,
op ids) in op order, keys of the whole graph); `repeats.plan_depth` composes them with the
rest and emits, validates and simulates the whole program once, so no check of the piece
alone is paid for. `stack_of`: whether a piece is such a stack.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Optional

from target.primitives import PrimGraph
from solver.oracle import checked_program
from solver.plan import PlanDecisions
from solver.spyre import budget
from solver.spyre.depth import core_search
from solver.spyre.depth.blocks import copy_decisions, copy_map, find_repeats, partial_copy, partial_edges
from solver.spyre.depth.segments import keep_part, merge, out_stick, reader_index, solve_segment, subgraph


# The core's search on a stack's piece is kept this multiple of its threshold
# (`core_search.MIN_CORE_S` + `CORE_S_PER_OP` per op): T5 at 30 s, load 13, the copy's solve
# ended 0.6 s past its limit and left the search 7.10 s of the 7.16 it needs.
SEARCH_MARGIN = 1.2


def stack_of(pg: PrimGraph, idx: list[int]):
    """The repeated block of the contiguous ops `idx` of `pg` as a graph of their own
    (`blocks.Repeats`, positions relative to idx[0]) when it has more than
    `budget.WINDOWS_ABOVE_OPS` ops and a block of at least `budget.MIN_COPIES` copies covers
    `budget.MIN_COVERAGE` of them; else None."""
    if len(idx) <= budget.WINDOWS_ABOVE_OPS or list(idx) != list(range(idx[0], idx[0] + len(idx))):
        return None
    sub = subgraph(pg, idx, f"{pg.name}#stack")
    rep = find_repeats(sub, min_copies=budget.MIN_COPIES)
    if rep is None or rep.copies * rep.period < budget.MIN_COVERAGE * len(idx):
        return None
    return rep


def plan_stack(pg: PrimGraph, idx: list[int], hw, *, deadline: Optional[float], budget_s: float,
               deterministic: bool, input_sticks: Optional[dict] = None, name: str = "piece",
               readers: Optional[dict] = None, rep=None, seed: int = 1,
               **_) -> tuple[list[tuple[PlanDecisions, list[str]]], list[str]]:
    """The contiguous ops `idx` of `pg`, a stack of their own (`stack_of`, or `rep`), planned
    by one copy's solve within `budget_s` (never past `deadline`), as parts in op order
    (module docstring). `input_sticks`: layouts of the tensors produced before `idx` (not
    changed; the caller reads the layouts the parts write from them)."""
    t0 = time.perf_counter()
    rep = rep or stack_of(pg, idx)
    if rep is None:
        raise ValueError(f"{name}: not a stack")
    readers = readers if readers is not None else reader_index(pg)
    sticks = dict(input_sticks or {})
    base = idx[0]
    sub = subgraph(pg, idx, f"{pg.name}#{name}")
    before, after = partial_edges(sub, rep)
    notes = [f"{name}: a stack of its own, {rep.copies} copies of a {rep.period}-op block "
             f"({before} ops before the first copy and {after} after the last repeat its end and start)"]
    parts: list[tuple[PlanDecisions, list[str]]] = []

    def wrote(part: PlanDecisions, ids: list[str]) -> None:
        idset = set(ids)
        sticks.update({op.output.tensor: out_stick(op, part.ops.get(op.id))
                       for op in pg.ops[base:base + len(idx)] if op.id in idset})

    def heuristic(lo: int, hi: int, label: str) -> None:
        if hi <= lo:
            return
        at = list(range(base + lo, base + hi))
        d, note = solve_segment(pg, at, hw, time_limit_s=0.0, deterministic=deterministic,
                                input_sticks=sticks, name=f"{name} {label}")
        part = keep_part(pg, d, at, readers)
        parts.append((part, part.op_order))
        wrote(part, part.op_order)
        notes.append(note)

    # 1. what precedes the copies
    heuristic(0, rep.start - before, "head")
    # 2. the middle copy (its inputs come from a copy)
    c_r = rep.copies // 2
    block = [base + i for i in rep.block(c_r)]
    left = budget_s - (time.perf_counter() - t0)
    if deadline is not None and not deterministic:
        left = min(left, deadline - time.perf_counter())
    # with time for the core's search on the whole piece after the copy's solve, that
    # search starts from the stack's plan (`finish`): the copy gets what the search leaves
    # (with a fifth more: the copy's pipeline may end a little past its limit, and the search
    # below its threshold would not run at all)
    search_s = SEARCH_MARGIN * (core_search.MIN_CORE_S + core_search.CORE_S_PER_OP * len(idx))
    searched = core_search.uses_core_search(deterministic) and left - search_s >= budget.MIN_WINDOW_S
    if searched:
        left -= search_s
    rep_d, note = solve_segment(pg, block, hw, time_limit_s=max(0.0, left), deterministic=deterministic,
                                input_sticks=sticks, name=f"{name} representative",
                                limit_share=budget.REPRESENTATIVE_LIMIT_SHARE, seed=seed)
    notes.append(note)
    # 3. the copies and the partial copies around them (positions of pg)
    produced = {op.output.tensor for op in pg.ops}
    boundary = ({a.tensor for i in block for a in pg.ops[i].inputs} - {pg.ops[i].output.tensor for i in block}) \
        & produced
    if before:
        dst = list(range(base + rep.start - before, base + rep.start))
        src = [i - base - rep.start + rep.block(c_r).start + rep.period + base for i in dst]
        d = partial_copy(pg, rep_d, src, dst, readers)
        parts.append((d, d.op_order))
        wrote(d, d.op_order)
    for c in range(rep.copies):
        at = [base + i for i in rep.block(c)]
        cd = copy_decisions(rep_d, copy_map(pg, block, at), boundary)
        ids = [pg.ops[i].id for i in at]
        if len(cd.op_order) != len(ids):
            cd.op_order = ids
        parts.append((cd, cd.op_order))
        wrote(cd, cd.op_order)
    if after:
        dst = list(range(base + rep.stop, base + rep.stop + after))
        src = [i - base - rep.stop + rep.block(c_r).start + base for i in dst]
        d = partial_copy(pg, rep_d, src, dst, readers)
        parts.append((d, d.op_order))
        wrote(d, d.op_order)
    # 4. what follows the copies
    heuristic(rep.stop + after, len(idx), "tail")
    notes.append(f"{name}: planned as a stack in {time.perf_counter() - t0:.2f} s of {budget_s:.2f}")
    if searched:
        return finish(pg, idx, hw, parts, notes, budget_s=budget_s - (time.perf_counter() - t0),
                      deadline=deadline, input_sticks=input_sticks, name=name, readers=readers, seed=seed)
    return parts, notes


def finish(pg: PrimGraph, idx: list[int], hw, parts: list, notes: list[str], *, budget_s: float,
           deadline: Optional[float], input_sticks: Optional[dict], name: str, readers: dict,
           seed: int) -> tuple[list[tuple[PlanDecisions, list[str]]], list[str]]:
    """The core's search on the whole piece (`core_search.plan_piece`) from the stack's plan
    `parts`: never slower (simulated) than that start, which it returns when it is."""
    start = merge(parts)
    sub = subgraph(pg, idx, f"{pg.name}#{name}")
    fixed = {t: v for t, v in (input_sticks or {}).items() if t in sub.inputs}
    if checked_program(sub, hw, replace(start, input_sticks={**start.input_sticks, **fixed}, op_order=[]))[0] is None:
        # (the search would start from the naive plan and could end slower than the stack)
        return parts, notes + [f"{name}: the stack's plan does not validate alone: no core search from it"]
    left = budget_s if deadline is None else min(budget_s, deadline - time.perf_counter())
    d, _, note = core_search.plan_piece(pg, idx, hw, time_limit_s=max(0.0, left), input_sticks=input_sticks,
                                        hint_d=start, name=f"{name} (core search from the stack's plan)",
                                        seed=seed)
    part = keep_part(pg, d, idx, readers)
    return [(part, part.op_order)], notes + [note]
