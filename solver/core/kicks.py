"""Ejection chains on groups (kicks) with record-to-record travel."""
from __future__ import annotations

import random
import time
from typing import Sequence

import numpy as np

from solver.core.group_state import INF, GroupState, ball, costly_group


def kick_search(st: GroupState, deadline: float, rng: random.Random, max_kicks: int = 10**9,
                widen: bool = True, depth: Sequence[int] = (1, 2, 3, 5, 8),
                slack: float = 0.0) -> tuple[int, int]:
    """Ejection chains: move a group (drawn by what it costs now) to its cheapest strategy
    ignoring memory, repair memory elsewhere by the cheapest usage-reducing moves (the
    kicked group tabu), descend around everything that moved, and keep the result when the
    total is no worse; otherwise undo. Returns (kicks tried, kicks that improved)."""
    tried = improved = 0
    best = None  # (k, prof, cost) of the best state while walking on a worse one
    st.journal = []
    cur = st.cur
    while tried < max_kicks and time.perf_counter() < deadline:
        tried += 1
        g = costly_group(st, rng) if rng.random() < 0.7 else rng.randrange(st.gp.num_groups)
        if len(st.cost[g]) < 2:
            continue
        lc = st.local_cost(g)
        lc[st.k[g]] = INF
        finite = np.flatnonzero(np.isfinite(lc))
        if not len(finite):
            continue
        mark = len(st.journal)
        if rng.random() < 0.5:
            order = finite[np.argsort(lc[finite])]
            s = int(order[min(len(order) - 1, int(rng.random() ** 2 * min(4, len(order))))])
            st.move(g, s)
        else:
            # a chain: g takes a random allowed strategy, then its neighbours (and theirs,
            # up to `depth` steps) their best responses, memory ignored until the repair
            st.move(g, int(finite[rng.randrange(len(finite))]))
            frontier, seen = [g], {g}
            for _ in range(rng.choice(depth)):
                nxt = []
                for x in frontier:
                    for y, _ in st.inc[x]:
                        if y in seen or len(st.cost[y]) < 2:
                            continue
                        seen.add(y)
                        ly = st.local_cost(y)
                        sy = int(np.argmin(ly))
                        if np.isfinite(ly[sy]) and sy != st.k[y]:
                            st.move(y, sy)
                            nxt.append(y)
                frontier = nxt
        ok = st.repair(deadline, tabu={x for x, _ in st.journal[mark:]})
        if ok:
            moved = {x for x, _ in st.journal[mark:]}
            region = ball(st, list(moved), len(moved) * 4 + 8, rng) if widen else list(moved)
            st.descent(deadline, groups=region, max_passes=3)
            new = st.cur
            if new <= cur and st.feasible_memory():
                if new < cur:
                    improved += 1
                cur = new
                st.journal = []
                continue
            # the kick's end state, to redo after taking a snapshot of the state before it
            redo = [(x, int(st.k[x])) for x in {x for x, _ in st.journal[mark:]}]
            if slack and new <= cur * (1 + slack) and st.feasible_memory():
                # record-to-record travel: a slightly worse state is kept to walk on from,
                # the best one is kept aside
                if best is None:
                    st.undo(mark)
                    best = st.copy_choice()
                    for x, sx in redo:
                        st.move(x, sx)
                cur = new
                st.journal = []
                continue
        st.undo(mark)
        st.journal = st.journal[:mark]
        if best is not None and st.cur < best[2]:
            best = None
    if best is not None and best[2] < st.cur:
        st.restore(best)
    st.journal = None
    return tried, improved
