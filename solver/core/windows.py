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
    covers, kept only when the window's highest usages could exceed it.

    Vectorized over the window's segments (a sweep building each step's signature as a
    sorted tuple took 0.8-1.0 s per 120-group window on S, whose merged groups have hundreds
    of segments): the elementary intervals between segment end points get their budget and
    highest window usage by running sums; only those that can bind are grouped by their live
    set (two 64-bit random keys per segment summed, then the set itself compared)."""
    gp = st.gp
    n_steps = gp.tl.n_steps
    seg_i, seg_j, seg_a, seg_b = [], [], [], []
    for i, g in enumerate(window):
        if not len(gp.W[g]):
            continue
        n = len(gp.seg_start[g])
        seg_i.append(np.full(n, i))
        seg_j.append(np.arange(n))
        seg_a.append(gp.seg_start[g])
        seg_b.append(gp.seg_end[g])
    if not seg_i:
        return
    si, sj = np.concatenate(seg_i), np.concatenate(seg_j)
    sa, sb = np.concatenate(seg_a).astype(np.int64), np.concatenate(seg_b).astype(np.int64)
    cur = np.array([gp.W[window[i]][j, st.k[window[i]]] for i, j in zip(si.tolist(), sj.tolist())],
                   dtype=np.int64)
    hi = np.array([gp.W[window[i]][j].max() for i, j in zip(si.tolist(), sj.tolist())], dtype=np.int64)

    def running(vals: np.ndarray) -> np.ndarray:  # per step: the sum over segments live there
        d = np.zeros(n_steps + 1, dtype=vals.dtype)
        np.add.at(d, sa, vals)
        np.add.at(d, sb, -vals)
        return np.cumsum(d)[:n_steps]

    bg = st.prof - running(cur)
    pts = np.unique(np.concatenate([sa, sb]))
    p = pts[:-1]  # the elementary intervals [p[x], pts[x + 1])
    budget = st.limit - np.maximum.reduceat(bg[:pts[-1]], p) if len(p) else np.zeros(0, np.int64)
    highs = running(hi)[p]
    bind = np.flatnonzero(highs > budget)
    if not len(bind):
        return
    rng = np.random.default_rng(len(sa))
    keys = rng.integers(0, 1 << 62, size=(2, len(sa)), dtype=np.int64)
    key = []
    for r in range(2):
        d = np.zeros(len(pts) + 1, dtype=np.uint64)
        np.add.at(d, np.searchsorted(pts, sa), keys[r].astype(np.uint64))
        np.subtract.at(d, np.searchsorted(pts, sb), keys[r].astype(np.uint64))
        key.append(np.cumsum(d, dtype=np.uint64)[:len(p)][bind])
    rows: dict[tuple, tuple[int, list[int]]] = {}  # key -> (budget, live segments)
    for x, h1, h2 in zip(bind.tolist(), key[0].tolist(), key[1].tolist()):
        b = int(budget[x])
        live = np.flatnonzero((sa <= p[x]) & (sb > p[x]))
        got = rows.get((h1, h2))
        if got is not None:
            if not np.array_equal(got[1], live):  # never seen: a collision of 128-bit keys
                rows[(h1, h2, x)] = (b, live)
            elif b < got[0]:
                rows[(h1, h2)] = (b, got[1])
        else:
            rows[(h1, h2)] = (b, live)
    terms: dict[int, tuple[list, list, int]] = {}  # segment -> (booleans, coefficients, least usage)

    def seg_terms(x: int) -> tuple[list, list, int]:
        got = terms.get(x)
        if got is None:
            i, w = int(si[x]), gp.W[window[int(si[x])]][int(sj[x])]
            m = int(w.min())
            up = np.flatnonzero(w > m)
            got = terms[x] = ([picks[i][s_] for s_ in up.tolist()], (w[up] - m).tolist(), m)
        return got

    for b, live in rows.values():
        vs, cs = [], []
        low = 0
        for x in live.tolist():
            v, c, m = seg_terms(x)
            vs += v
            cs += c
            low += m
        model.Add(cp_model.LinearExpr.WeightedSum(vs, cs) <= b - low)
