"""Large neighbourhoods: CP-SAT on a window of groups with everything else fixed, and
min-sum windows (a ball re-decoded by message passing, then repaired and descended)."""
from __future__ import annotations

import random
import time
from typing import Optional

import numpy as np
from ortools.sat.python import cp_model

from solver.core.group_state import GroupState, ball, costly_group
from solver.core.minsum import window_minsum
from solver.core.problem import FORBIDDEN_COST


def minsum_window_search(st: GroupState, deadline: float, rng: random.Random,
                         nrng: np.random.Generator, penalty: Optional[np.ndarray]) -> tuple[int, int]:
    """Large moves by message passing: a ball of groups around one drawn by what it costs
    now (30-120 groups) is re-decoded by min-sum with the rest fixed (fixed neighbours as
    costs, usage priced by a scaled copy of the Lagrangian penalties, a little noise), then
    memory is repaired, the surroundings descended, and the result kept when no worse."""
    tried = improved = 0
    while time.perf_counter() < deadline:
        tried += 1
        size = rng.choice((30, 60, 120))
        win = [g for g in ball(st, [costly_group(st, rng)], size, rng) if len(st.cost[g]) > 1]
        if not win:
            continue
        scale = rng.choice((0.0, 0.5, 1.0)) if penalty is not None else 0.0
        k = window_minsum(st, win, penalty * scale if scale else None,
                          noise=rng.choice((0.0, 0.02, 0.05)), rng=nrng)
        st.journal = []
        before = st.cur
        for g, s in zip(win, k):
            if s != st.k[g]:
                st.move(g, s)
        ok = st.repair(deadline)
        if ok:
            st.descent(deadline, groups=ball(st, win, 2 * size, rng), max_passes=3)
        if ok and st.cur <= before and st.feasible_memory():
            improved += int(st.cur < before)
        else:
            st.undo(0)
        st.journal = None
    return tried, improved


# -- CP-SAT on a window of groups ------------------------------------------------------------
def window_model(st: GroupState, window: list[int], pair_limit: int):
    """CP-SAT model of the window with every other group fixed at its current strategy;
    returns (model, picks) where picks[i][s] is the boolean of window[i] taking strategy s.
    Objective: the window's cost minus a constant (fixed neighbours fold into group costs)."""
    gp = st.gp
    inw = {g: i for i, g in enumerate(window)}
    model = cp_model.CpModel()
    picks = []
    obj_vars, obj_coefs = [], []
    for g in window:
        vs = [model.NewBoolVar("") for _ in range(len(gp.cost[g]))]
        model.AddExactlyOne(vs)
        picks.append(vs)
    for i, g in enumerate(window):
        c = st.cost[g].copy()
        for o, t in st.inc[g]:
            if o not in inw:
                c += t[:, st.k[o]]
        fin = np.isfinite(c)
        lo = c[fin].min() if fin.any() else 0.0
        for s, v in enumerate(picks[i]):
            if not fin[s]:
                model.Add(v == 0)
            elif c[s] > lo:
                obj_vars.append(v)
                obj_coefs.append(int(c[s] - lo))
    for e, (a, b) in enumerate(gp.edges):
        if a not in inw or b not in inw:
            continue
        ia, ib = inw[a], inw[b]
        t = gp.tables[e]
        forb = t >= FORBIDDEN_COST
        lo = int(t[~forb].min()) if (~forb).any() else 0
        inv_r, inv_c, R = st.reduced(e)
        rforb = R >= FORBIDDEN_COST
        if int((~rforb).sum()) <= pair_limit:
            # pair booleans over the table's distinct rows x distinct columns (strategies
            # with equal rows act alike on this edge: a follower merged into a group keeps
            # its own small table), with marginal equalities to both ends (the tight local
            # polytope)
            z = {}
            rows: list[list] = [[] for _ in range(R.shape[0])]
            cols: list[list] = [[] for _ in range(R.shape[1])]
            for x, y in zip(*np.nonzero(~rforb)):
                var = model.NewBoolVar("")
                rows[x].append(var)
                cols[y].append(var)
                if R[x, y] > lo:
                    obj_vars.append(var)
                    obj_coefs.append(int(R[x, y] - lo))
                z[int(x), int(y)] = var
            ra = [[] for _ in range(R.shape[0])]
            for s_, r in enumerate(inv_r):
                ra[r].append(picks[ia][s_])
            cb = [[] for _ in range(R.shape[1])]
            for s_, c in enumerate(inv_c):
                cb[c].append(picks[ib][s_])
            for x in range(R.shape[0]):
                model.Add(cp_model.LinearExpr.Sum(rows[x]) == cp_model.LinearExpr.Sum(ra[x]))
            for y in range(R.shape[1]):
                model.Add(cp_model.LinearExpr.Sum(cols[y]) == cp_model.LinearExpr.Sum(cb[y]))
            key = (int(inv_r[st.k[a]]), int(inv_c[st.k[b]]))
            if key in z:
                model.AddHint(z[key], True)
        else:
            ka = model.NewIntVar(0, t.shape[0] - 1, "")
            kb = model.NewIntVar(0, t.shape[1] - 1, "")
            model.Add(ka == cp_model.LinearExpr.WeightedSum(picks[ia], list(range(t.shape[0]))))
            model.Add(kb == cp_model.LinearExpr.WeightedSum(picks[ib], list(range(t.shape[1]))))
            idx = model.NewIntVar(0, t.size - 1, "")
            model.Add(idx == cp_model.LinearExpr.WeightedSum([ka, kb], [t.shape[1], 1]))
            vals = np.where(forb, -1, t - lo).reshape(-1)
            allowed = sorted(set(int(v) for v in vals if v >= 0))
            cost = model.NewIntVarFromDomain(cp_model.Domain.FromValues(allowed), "")
            model.AddElement(idx, [int(v) for v in vals], cost)
            obj_vars.append(cost)
            obj_coefs.append(1)
    if st.has_limit:
        _window_memory(st, window, picks, model)
    model.Minimize(cp_model.LinearExpr.WeightedSum(obj_vars, obj_coefs))
    for i, g in enumerate(window):
        for s, v in enumerate(picks[i]):
            model.AddHint(v, s == st.k[g])
    return model, picks


def _window_memory(st: GroupState, window: list[int], picks, model: cp_model.CpModel) -> None:
    """Fixed groups' usage is a per-step background; one row per distinct live signature
    (which segment of which window group is live) with the tightest budget over the steps it
    covers, kept only when the window's highest usages could exceed it."""
    gp = st.gp
    n_steps = gp.tl.n_steps
    diff = np.zeros(n_steps + 1, dtype=np.int64)
    segs = []  # (start, end, window index, segment index)
    for i, g in enumerate(window):
        W = gp.W[g]
        if not len(W):
            continue
        cur = W[:, st.k[g]]
        np.add.at(diff, gp.seg_start[g], cur)
        np.add.at(diff, gp.seg_end[g], -cur)
        for j, (a, b) in enumerate(zip(gp.seg_start[g], gp.seg_end[g])):
            segs.append((int(a), int(b), i, j))
    if not segs:
        return
    bg = st.prof - np.cumsum(diff)[:n_steps]
    pts = sorted({p for a, b, _, _ in segs for p in (a, b)})
    # sweep: live segments between consecutive points
    starts: dict[int, list] = {}
    ends: dict[int, list] = {}
    for sg in segs:
        starts.setdefault(sg[0], []).append(sg)
        ends.setdefault(sg[1], []).append(sg)
    live: dict[tuple[int, int], None] = {}
    rows: dict[tuple, int] = {}
    for p, q in zip(pts[:-1], pts[1:]):
        for sg in ends.get(p, []):
            live.pop((sg[2], sg[3]), None)
        for sg in starts.get(p, []):
            live[(sg[2], sg[3])] = None
        if not live:
            continue
        sig = tuple(sorted(live))
        budget = st.limit - int(bg[p:q].max())
        if sig not in rows or budget < rows[sig]:
            rows[sig] = budget
    for sig, budget in rows.items():
        lows = highs = 0
        for i, j in sig:
            w = gp.W[window[i]][j]
            lows += int(w.min())
            highs += int(w.max())
        if highs <= budget:
            continue
        vs, cs = [], []
        for i, j in sig:
            w = gp.W[window[i]][j]
            m = int(w.min())
            for s in np.flatnonzero(w > m):
                vs.append(picks[i][int(s)])
                cs.append(int(w[s] - m))
        model.Add(cp_model.LinearExpr.WeightedSum(vs, cs) <= budget - lows)
