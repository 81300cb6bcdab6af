"""Windows along the op order: what does not repeat, planned in pieces of bounded size
(issue 14).

A graph too large for one CP-SAT model within its time limit (an irregular model, or the
prologue and epilogue of a repeated stack) is planned in windows of about `WINDOW_OPS`
consecutive ops, each kept range ending where the fewest tensors cross (`aligned_windows`)
(`plan_windows`):
- each window is a graph of its own (`solver.spyre.repeats.subgraph`) planned by the
  ordinary CP-SAT pipeline; its boundary inputs arrive in the layouts the windows before it
  chose (so the plan on both sides of a window boundary agrees on every layout), and
  consecutive windows overlap by `OVERLAP_OPS`: an op in the overlap is decided by the
  later window, which sees what the op feeds; LX residencies are kept only when every
  reader of the tensor is decided by the same window, and every window starts a bundle;
- then a large-neighbourhood search over the whole graph (`improve_windows`), warm-started
  from that plan: windows straddling the first pass's boundaries are planned again with
  everything outside fixed, and a new window plan is kept only when the whole program,
  emitted, validated and simulated, is faster; it stops at the deadline.
Every CP-SAT model solved is one window's, so memory and model size are bounded by the
window, not the graph.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Optional

from target.op_rules import default_choice
from target.primitives import PrimGraph
from solver.plan import OpPlan, PlanDecisions

WINDOW_OPS = 120
# In wall-clock mode a window's CP-SAT pipeline gets this share of the window's seconds:
# the pipeline overruns a short limit (its model build and the checks after its deadline:
# 5-15% at 10 s, up to 60% at 3 s on a loaded 2-core machine).
SEGMENT_LIMIT_SHARE = 0.8
OVERLAP_OPS = 16
# Below this many seconds a window is not worth a CP-SAT solve (hint, strategies, local
# search and fusion alone take about that on a 50-op window): its heuristic plan is kept.
MIN_WINDOW_S = 1.5


def out_stick(op, plan: Optional[OpPlan]):
    ch = (plan.stick if plan is not None and plan.stick is not None else None) or default_choice(op)
    return ch.output


def solve_segment(pg: PrimGraph, idx: list[int], hw, *, time_limit_s: float, deterministic: bool,
                  input_sticks: Optional[dict] = None, name: str = "segment",
                  notes: Optional[list] = None, limit_share: float = SEGMENT_LIMIT_SHARE,
                  seed: int = 1) -> PlanDecisions:
    """The ops `idx` of `pg` planned as a graph of their own by the CP-SAT pipeline (or the
    heuristic when the time is below `MIN_WINDOW_S`); `input_sticks` fixes the layouts of
    its boundary inputs (tensors produced before it). Keys are `pg`'s ids. In wall-clock
    mode the pipeline is given `limit_share` of `time_limit_s`; `seed`: CP-SAT's."""
    from solver.baseline.passes import plan_heuristic
    from solver.spyre.cpsat_planner import _program_or_none, plan_cpsat
    from solver.spyre.repeats import subgraph

    sub = subgraph(pg, idx, f"{pg.name}#{name}")
    fixed = {t: s for t, s in (input_sticks or {}).items() if t in sub.tensors and t in sub.inputs}
    # the heuristic plans around the boundary's layouts (an op reading ANY layout splits
    # under the layout it gets)
    hint = plan_heuristic(sub, hw, input_sticks=fixed)
    if fixed:
        if _program_or_none(sub, hw, hint)[0] is None:
            from solver.naive import plan_naive

            hint = plan_naive(sub, hw, input_sticks=fixed)
    if time_limit_s < MIN_WINDOW_S or len(idx) < 2:
        if notes is not None:
            notes.append(f"{name}: {len(idx)} ops, heuristic plan ({time_limit_s:.2f} s left)")
        return replace(hint, planner="cpsat", op_order=[])
    limit = time_limit_s if deterministic else limit_share * time_limit_s
    d = plan_cpsat(sub, hw, time_limit_s=limit, deterministic=deterministic, hint=hint, depth=False, seed=seed)
    if notes is not None:
        st = d.stats
        model = next((n.split()[1] for n in st.get("notes", []) if n.startswith("strategies:")), "?")
        notes.append(f"{name}: {len(idx)} ops, {st.get('solver_status')} in {st.get('solve_seconds', 0):.1f} s "
                     f"of {time_limit_s:.1f}, predicted {st.get('predicted_us', float('nan')):.1f} us "
                     f"(CP-SAT model: {model} strategies)")
    return d


def _last(pg: PrimGraph, t: str):
    rank = len(pg.tensors[t].shape)
    return rank - 1 if rank else None


def windows_of(n: int, window: Optional[int] = None, overlap: Optional[int] = None) -> list[tuple[int, int, int, int]]:
    """Windows over positions 0..n-1 as (start, stop, keep_from, keep_to): each window is
    solved over [start, stop) and decides [keep_from, keep_to); the kept ranges tile 0..n.
    Defaults: `WINDOW_OPS`, `OVERLAP_OPS`."""
    window = window or WINDOW_OPS
    overlap = OVERLAP_OPS if overlap is None else overlap
    if n <= window:
        return [(0, n, 0, n)]
    step = window - overlap
    starts = list(range(0, n - overlap, step))
    out = []
    for k, a in enumerate(starts):
        b = min(n, a + window)
        keep_from = 0 if k == 0 else out[-1][3]
        keep_to = n if k == len(starts) - 1 or b >= n else b - overlap
        out.append((a, b, keep_from, keep_to))
        if b >= n:
            break
    return out


def aligned_windows(crossing: list[int], window: Optional[int] = None,
                    overlap: Optional[int] = None) -> list[tuple[int, int, int, int]]:
    """Like `windows_of`, with each kept range ending where the fewest tensors cross:
    `crossing[i]` counts the tensors produced before position i and read at or after it.
    Each boundary moves at most `overlap` // 2 positions from where `windows_of` puts it
    (layer boundaries of an irregular stack, where a window's plan loses least), so a
    window spans at most `window` + `overlap` // 2 ops. On the 8-layer Llama with the block
    detection off (30 s): 55.0 ms against 72.6 ms with the fixed grid."""
    window = window or WINDOW_OPS
    overlap = OVERLAP_OPS if overlap is None else overlap
    n = len(crossing)
    if n <= window:
        return [(0, n, 0, n)]
    step, slack = window - overlap, overlap // 2
    out = []
    start = 0
    while True:
        if n - start <= window:
            out.append((start, n, start, n))
            return out
        nominal = start + step
        lo, hi = max(start + 1, nominal - slack), min(n - 1, nominal + slack)
        cut = min(range(lo, hi + 1), key=lambda i: (crossing[i], abs(i - nominal)))
        out.append((start, min(n, cut + overlap), start, cut))
        start = cut


def crossings(pg: PrimGraph, idx: list[int]) -> list[int]:
    """Per position j of `idx`, the tensors produced at positions before j and read at or
    after j (one sweep over a difference array)."""
    diff = [0] * (len(idx) + 1)
    last: dict[str, int] = {}
    born: dict[str, int] = {}
    for j, i in enumerate(idx):
        op = pg.ops[i]
        for a in op.inputs:
            if a.tensor in born:
                last[a.tensor] = j
        born[op.output.tensor] = j
    for t, p in born.items():
        q = last.get(t)
        if q is not None and q > p:
            diff[p + 1] += 1
            diff[q + 1] -= 1
    out, acc = [], 0
    for j in range(len(idx)):
        acc += diff[j]
        out.append(acc)
    return out


def _stick_map(pg: PrimGraph, d: PlanDecisions, ids: list[int]) -> dict:
    return {pg.ops[i].output.tensor: out_stick(pg.ops[i], d.ops.get(pg.ops[i].id)) for i in ids}


def keep_part(pg: PrimGraph, d: PlanDecisions, kept: list[int], readers: dict[str, list[int]]) -> PlanDecisions:
    """The decisions of `d` for the ops `kept` (positions in pg.ops): their op plans, LX
    residencies only of tensors all of whose readers are kept too (and restickified copies
    of those), their bundle starts (the first kept op starts one), in the op order of `d`."""
    keep_ids = {pg.ops[i].id for i in kept}
    keep_set = set(kept)
    out = PlanDecisions(planner=d.planner)
    out.ops = {o: p for o, p in d.ops.items() if o in keep_ids}
    out.input_sticks = dict(d.input_sticks)
    produced_here = {pg.ops[i].output.tensor for i in kept}

    outputs = set(pg.outputs)

    def whole(t: str) -> bool:
        base = t.rpartition("@stick")[0] or t
        return base in produced_here and base not in outputs and all(r in keep_set for r in readers.get(base, ()))
    out.resident = {t: r for t, r in d.resident.items() if whole(t)}
    out.restick_ops = {k: p for k, p in d.restick_ops.items() if (k.rpartition("@stick")[0] or k) in produced_here}
    out.bundle_starts = [o for o in d.bundle_starts if o in keep_ids]
    order = [o for o in d.op_order if o in keep_ids]
    out.op_order = order if len(order) == len(kept) else [pg.ops[i].id for i in kept]
    if out.op_order and out.op_order[0] not in out.bundle_starts:
        out.bundle_starts.insert(0, out.op_order[0])
    return out


def reader_index(pg: PrimGraph) -> dict[str, list[int]]:
    readers: dict[str, list[int]] = {}
    for i, op in enumerate(pg.ops):
        for a in op.inputs:
            readers.setdefault(a.tensor, []).append(i)
    return readers


def plan_windows(pg: PrimGraph, idx: list[int], hw, *, deadline: Optional[float], budget_s: float,
                 deterministic: bool, input_sticks: Optional[dict] = None, notes: Optional[list] = None,
                 name: str = "window", readers: Optional[dict] = None,
                 window: Optional[int] = None, overlap: Optional[int] = None) -> list[tuple[PlanDecisions, list[str]]]:
    """Plan the consecutive ops `idx` of `pg` window by window (module docstring) within
    `budget_s` (each window its share by ops; in wall-clock mode also never past
    `deadline`). Returns (decisions, op ids) per kept part, in op order, for
    `solver.spyre.repeats.merge`. `input_sticks`: layouts of tensors produced before idx."""
    readers = readers if readers is not None else reader_index(pg)
    sticks = dict(input_sticks or {})
    parts: list[tuple[PlanDecisions, list[str]]] = []
    wins = aligned_windows(crossings(pg, idx), window, overlap)
    total = sum(b - a for a, b, _, _ in wins)
    for k, (a, b, kf, kt) in enumerate(wins):
        share = budget_s * (b - a) / total
        if deadline is not None and not deterministic:
            share = min(share, max(0.0, deadline - time.perf_counter()) * (b - a) /
                        max(1, sum(y - x for x, y, _, _ in wins[k:])))
        ids = idx[a:b]
        d = solve_segment(pg, ids, hw, time_limit_s=share, deterministic=deterministic, input_sticks=sticks,
                          name=f"{name} {k}" if len(wins) > 1 else name, notes=notes)
        kept = idx[kf:kt]
        part = keep_part(pg, d, kept, readers)
        parts.append((part, part.op_order))
        sticks.update(_stick_map(pg, part, kept))
    return parts


def improve_windows(pg: PrimGraph, hw, d: PlanDecisions, evaluate: Callable[[PlanDecisions], Optional[float]],
                    current_us: float, *, deadline: Optional[float], deterministic: bool,
                    rounds_budget_s: float, notes: list, window: Optional[int] = None,
                    max_windows: Optional[int] = None) -> tuple[PlanDecisions, float]:
    """Large-neighbourhood search over the whole plan `d` (ops of `pg` in `d.op_order`):
    windows of `window` ops centred on the boundaries of the first pass are planned again
    with their boundary inputs in the layouts `d` gives them, and a window's plan replaces
    the old one only when `evaluate` (the whole program's simulated time, None when
    invalid) says it is faster. Stops at `deadline` or after `max_windows`."""
    from solver.spyre.repeats import merge

    window = window or WINDOW_OPS
    pos = {op.id: i for i, op in enumerate(pg.ops)}
    order = [pos[o] for o in d.op_order] if len(d.op_order) == len(pg.ops) else list(range(len(pg.ops)))
    n = len(order)
    if n <= window:
        return d, current_us
    readers = reader_index(pg)
    centres = [c for _, _, _, c in aligned_windows(crossings(pg, order), window, OVERLAP_OPS)][:-1]
    tried = accepted = 0
    for c in centres:
        if max_windows is not None and tried >= max_windows:
            break
        if deadline is not None and time.perf_counter() > deadline:
            break
        a, b = max(0, c - window // 2), min(n, c + window // 2)
        ids = order[a:b]
        before = {pg.ops[i].output.tensor: out_stick(pg.ops[i], d.ops.get(pg.ops[i].id)) for i in order[:a]}
        share = rounds_budget_s / max(1, len(centres))
        if deadline is not None and not deterministic:
            share = min(share, max(0.0, deadline - time.perf_counter()))
        tried += 1
        trial = solve_segment(pg, ids, hw, time_limit_s=share, deterministic=deterministic, input_sticks=before,
                              name=f"lns window {tried}")
        part = keep_part(pg, trial, ids, readers)
        head = keep_part(pg, d, order[:a], readers) if a else None
        tail = keep_part(pg, d, order[b:], readers) if b < n else None
        cand = merge([p for p in ((head, head.op_order if head else []), (part, part.op_order),
                                  (tail, tail.op_order if tail else [])) if p[0] is not None], planner=d.planner)
        cand.input_sticks = {**d.input_sticks, **{t: s for t, s in cand.input_sticks.items()
                                                  if t not in d.input_sticks}}
        us = evaluate(cand)
        if us is not None and us < current_us:
            d, current_us = cand, us
            accepted += 1
    notes.append(f"windows LNS: {accepted} of {tried} windows improved the whole plan")
    return d, current_us
