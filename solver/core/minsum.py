"""Min-sum message passing on the group graph (a pairwise MRF), for starts far from the
local optima the single-group moves get stuck in.

Sequential (Gauss-Seidel) min-sum with damping over the groups in a fixed order, forward
then backward; decoding is greedy in the same order, each group taking its best strategy
given the already decoded neighbours' strategies plus the messages of the others. Memory
enters as Lagrangian penalties: `penalty[t]` per unit of usage at compressed step t adds
sum_t penalty[t] * usage to a group's strategies (`unary_with_penalty`); `lagrangian_starts`
raises the penalties where the decoded choice exceeds the limit (subgradient steps) and
returns every decoded choice for the caller to repair and improve.
"""
from __future__ import annotations

import time
from typing import Iterator, Optional

import numpy as np

from solver.core.clock import OutOfTime, check_deadline
from solver.core.group_state import shared_tables
from solver.core.merge import GroupedProblem
from solver.core.problem import FORBIDDEN_COST

BIG = 1e15  # forbidden entries in message passing (finite: no inf - inf)


def bfs_order(gp: GroupedProblem, root: int) -> list[int]:
    """Groups in breadth-first order from `root` (then the other components)."""
    adj: list[list[int]] = [[] for _ in range(gp.num_groups)]
    for a, b in gp.edges:
        adj[a].append(b)
        adj[b].append(a)
    seen = [False] * gp.num_groups
    out: list[int] = []
    for r in [root] + list(range(gp.num_groups)):
        if seen[r]:
            continue
        seen[r] = True
        queue = [r]
        head = 0
        while head < len(queue):
            x = queue[head]
            head += 1
            out.append(x)
            for y in adj[x]:
                if not seen[y]:
                    seen[y] = True
                    queue.append(y)
    return out


class MinSum:
    def __init__(self, gp: GroupedProblem):
        self.gp = gp
        G = gp.num_groups
        self.unary0 = [np.where(c >= FORBIDDEN_COST, BIG, c.astype(np.float64)) for c in gp.cost]
        # directed edges: for group g, list of (neighbour, table oriented [g, nb], message id in, id out)
        self.nbrs: list[list[tuple[int, np.ndarray, int, int]]] = [[] for _ in range(G)]
        self.msg: list[np.ndarray] = []
        # the group states' float tables (inf forbidden; messages are capped at BIG below):
        # a second float copy of every table was a third of the peak memory at 65k nodes
        ftables = shared_tables(gp)[11]
        for (a, b), t, tf in zip(gp.edges, gp.tables, ftables):
            ab = len(self.msg)
            self.msg.append(np.zeros(t.shape[1]))  # a -> b, over b's strategies
            ba = len(self.msg)
            self.msg.append(np.zeros(t.shape[0]))  # b -> a, over a's strategies
            self.nbrs[a].append((b, tf, ba, ab))
            self.nbrs[b].append((a, tf.T, ab, ba))
        self.order = list(range(G))

    def unary_with_penalty(self, penalty: Optional[np.ndarray]) -> list[np.ndarray]:
        if penalty is None:
            return self.unary0
        gp = self.gp
        cum = np.concatenate([[0.0], np.cumsum(penalty)])
        out = []
        for g, u in enumerate(self.unary0):
            W = gp.W[g]
            if len(W):
                w = cum[gp.seg_end[g]] - cum[gp.seg_start[g]]  # penalty summed over each segment
                u = u + w @ W
            out.append(u)
        return out

    def sweep(self, unary: list[np.ndarray], damping: float = 0.5, deadline: Optional[float] = None) -> None:
        """One forward and one backward pass; OutOfTime past `deadline`."""
        for order in (self.order, self.order[::-1]):
            for i, g in enumerate(order):
                if i % 256 == 0:
                    check_deadline(deadline)
                belief = unary[g].copy()
                for _, _, m_in, _ in self.nbrs[g]:
                    belief += self.msg[m_in]
                for nb, t, m_in, m_out in self.nbrs[g]:
                    h = belief - self.msg[m_in]
                    new = np.minimum((h[:, None] + t).min(axis=0), BIG)
                    new -= new.min()
                    self.msg[m_out] = damping * self.msg[m_out] + (1 - damping) * new

    def decode(self, unary: list[np.ndarray]) -> list[int]:
        G = self.gp.num_groups
        k = [-1] * G
        for g in self.order:
            c = unary[g].copy()
            for nb, t, m_in, _ in self.nbrs[g]:
                c += np.minimum(t[:, k[nb]], BIG) if k[nb] >= 0 else self.msg[m_in]
            k[g] = int(np.argmin(c))
        return k


def lagrangian_starts(gp: GroupedProblem, deadline: float, sweeps: int = 3, rounds: int = 25,
                      step: float = 0.01, decay: float = 0.9,
                      order: Optional[list[int]] = None, node_rounds: int = 100,
                      beta: float = 0.3, switch_at: Optional[float] = None,
                      ) -> Iterator[tuple[list[int], float, np.ndarray]]:
    """Decoded choices of min-sum runs under usage penalties raised by subgradient steps:
    penalty[t] += step * decay^r * (usage[t] - limit) / limit (kept >= 0), in cost units per
    unit of usage; messages stay warm between rounds. Then `node_rounds` rounds of per-group
    penalties (the contest winners' node-specific weights): each group's penalty term is
    scaled by its own factor, raised by (1 + beta) for the groups above their least usage at
    a step the decode overfills, and all lowered by (1 - beta / 3) after a decode that fits,
    so the pressure lands on the groups that cause the overflow (V: starts of 1.77-1.81 M
    against 2.27 M from the per-step penalties alone). Yields (choice, share of compressed
    steps over the limit, the per-step penalties) for each new choice; the first round has no
    penalty. `order`: the sweep and decoding order (default: group index). `switch_at`
    (perf_counter seconds): go on to the per-group factors then, after at least two rounds."""
    ms = MinSum(gp)
    if order is not None:
        ms.order = list(order)
    seen = set()
    has_limit = gp.limit is not None and gp.tl.n_steps > 0
    penalty = np.zeros(gp.tl.n_steps)

    def new(k: list[int], prof: Optional[np.ndarray]):
        key = tuple(k)
        if key in seen:
            return None
        seen.add(key)
        return k, float((prof > gp.limit).mean()) if has_limit else 0.0, penalty.copy()

    for r in range(rounds):
        if time.perf_counter() > deadline:
            return
        if r >= 2 and switch_at is not None and time.perf_counter() > switch_at:
            break  # on to the per-group factors
        unary = ms.unary_with_penalty(penalty if has_limit else None)
        try:
            for _ in range(sweeps):
                ms.sweep(unary, deadline=deadline)
        except OutOfTime:
            return
        k = ms.decode(unary)
        prof = gp.profile(k) if has_limit else None
        out = new(k, prof)
        if out is not None:
            yield out
        if not has_limit:
            return
        penalty = np.maximum(0.0, penalty + step * decay ** r * (prof - gp.limit) / gp.limit)
    # per-group penalty factors
    base = ms.unary_with_penalty(penalty)
    zero = ms.unary0
    rho = np.ones(gp.num_groups)
    all_g = np.concatenate([np.full(len(x), g) for g, x in enumerate(gp.seg_start)] or [np.zeros(0, int)])
    all_j = np.concatenate([np.arange(len(x)) for x in gp.seg_start] or [np.zeros(0, int)])
    all_s = np.concatenate(gp.seg_start or [np.zeros(0, int)])
    all_e = np.concatenate(gp.seg_end or [np.zeros(0, int)])
    for r in range(node_rounds):
        if time.perf_counter() > deadline:
            return
        unary = [z + (b - z) * rho[g] for g, (z, b) in enumerate(zip(zero, base))]
        try:
            for _ in range(sweeps):
                ms.sweep(unary, deadline=deadline)
        except OutOfTime:
            return
        k = ms.decode(unary)
        prof = gp.profile(k)
        out = new(k, prof)
        if out is not None:
            yield out
        over = np.flatnonzero(prof > gp.limit)
        if len(over):
            hit = np.zeros(len(all_s), dtype=bool)
            for t in over:
                hit |= (all_s <= t) & (all_e > t)
            for g, j in zip(all_g[hit], all_j[hit]):
                if gp.W[g][j, k[g]] > gp.W[g][j].min():
                    rho[g] *= 1 + beta
        else:
            rho *= 1 - beta / 3


def window_minsum(st, window: list[int], penalty: Optional[np.ndarray], sweeps: int = 4,
                  noise: float = 0.0, rng: Optional[np.random.Generator] = None) -> list[int]:
    """Min-sum over a window of groups with every other group fixed at its current strategy
    (`st`: a search.GroupState): fixed neighbours become unary costs, `penalty` (per step,
    as in `lagrangian_starts`) prices usage. Returns the decoded strategy of each window group
    (in window order); memory is left to the caller's repair."""
    gp = st.gp
    inw = {g: i for i, g in enumerate(window)}
    cum = np.concatenate([[0.0], np.cumsum(penalty)]) if penalty is not None else None
    unary = []
    for g in window:
        u = np.where(np.isfinite(st.cost[g]), st.cost[g], BIG)
        for o, t in st.inc[g]:
            if o not in inw:
                u = u + np.minimum(t[:, st.k[o]], BIG)
        if cum is not None and len(gp.W[g]):
            u = u + (cum[gp.seg_end[g]] - cum[gp.seg_start[g]]) @ gp.W[g]
        if noise and rng is not None:
            fin = u < BIG
            spread = float(np.ptp(u[fin])) if fin.sum() > 1 else 0.0
            u = u + rng.random(len(u)) * noise * spread
        unary.append(u)
    nbrs: list[list] = [[] for _ in window]
    msg: list[np.ndarray] = []
    for i, g in enumerate(window):
        for o, t in st.inc[g]:
            j = inw.get(o)
            if j is None or j < i:
                continue
            tf = np.minimum(t, BIG)
            ij = len(msg)
            msg.append(np.zeros(tf.shape[1]))
            ji = len(msg)
            msg.append(np.zeros(tf.shape[0]))
            nbrs[i].append((j, tf, ji, ij))
            nbrs[j].append((i, tf.T, ij, ji))
    order = list(range(len(window)))
    for _ in range(sweeps):
        for seq in (order, order[::-1]):
            for i in seq:
                belief = unary[i].copy()
                for _, _, m_in, _ in nbrs[i]:
                    belief += msg[m_in]
                for j, t, m_in, m_out in nbrs[i]:
                    new = ((belief - msg[m_in])[:, None] + t).min(axis=0)
                    new -= new.min()
                    msg[m_out] = 0.5 * msg[m_out] + 0.5 * new
    k = [-1] * len(window)
    for i in order:
        c = unary[i].copy()
        for j, t, m_in, _ in nbrs[i]:
            c += t[:, k[j]] if k[j] >= 0 else msg[m_in]
        k[i] = int(np.argmin(c))
    return k
