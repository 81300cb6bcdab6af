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
from typing import Iterator, Optional, Sequence

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


def order_levels(num_groups: int, edges: list[tuple[int, int]], order: list[int]) -> np.ndarray:
    """Per group: 1 + the highest level of its neighbours earlier in `order` (0 without
    one). Groups of one level share no edge, and every neighbour earlier in the order has a
    lower level, every later one a higher level."""
    pos = np.empty(num_groups, dtype=np.int64)
    pos[np.asarray(order, dtype=np.int64)] = np.arange(len(order))
    earlier: list[list[int]] = [[] for _ in range(num_groups)]
    for a, b in edges:
        if pos[a] < pos[b]:
            earlier[b].append(a)
        else:
            earlier[a].append(b)
    level = [0] * num_groups
    for g in order:
        e = earlier[g]
        if e:
            level[g] = 1 + max(level[x] for x in e)
    return np.array(level, dtype=np.int64)


class MinSum:
    """Sequential (Gauss-Seidel) min-sum over the group graph in `order`, vectorized by
    levels: a group's level is one more than the highest level of its neighbours earlier in
    the order, so a level's groups share no edge, their outgoing messages read only messages
    that the sequential pass has already updated (from earlier neighbours) or not yet (from
    later ones), and computing a whole level at once gives exactly the messages of the
    group-by-group pass (tested against it). Forward over the levels, then backward; decoding
    is greedy in the same order (a group sees the strategies its earlier neighbours took and
    the messages of the later ones). S: 938 levels in program order, 32-48 in breadth-first
    orders; the per-message numpy calls it replaces took 1.0-1.3 s a sweep.

    Flat layout (built per order): strategy positions `off[g] + s`; the directed messages
    sorted by their source's level, message d over its target's strategies at
    `moff[d]:moff[d+1]`, its table block [target strategy, source strategy] (row-major,
    float32) at `xoff[d]:xoff[d+1]` in `T`, and per table entry the index of its source
    strategy in the level's h vector (belief minus the reverse message) in `hidx`: 8 bytes
    per directed table entry (S: 46 MB)."""

    def __init__(self, gp: Optional[GroupedProblem], sizes: Optional[Sequence[int]] = None,
                 edges: Optional[list[tuple[int, int]]] = None, tables: Optional[list[np.ndarray]] = None):
        """Over the group graph of `gp`; or (gp None) over any pairwise problem: `sizes`
        strategies per node, `edges` (a, b) with a != b, each with its float table [a, b]
        (inf forbidden; a min-sum window's sub-problem)."""
        self.gp = gp
        if gp is not None:
            sizes, edges, tables = [len(c) for c in gp.cost], gp.edges, None
            self.unary0 = [np.where(c >= FORBIDDEN_COST, BIG, c.astype(np.float64)) for c in gp.cost]
        self.K = np.array(sizes, dtype=np.int64)
        self.edges = list(edges)
        self._tables = tables  # None: the group states' float tables of gp (built on first use)
        self.off = np.concatenate([[0], np.cumsum(self.K)]).astype(np.int64)
        self._order = list(range(len(self.K)))
        self._sched: Optional[dict] = None
        self.msg = np.zeros(0)

    @property
    def order(self) -> list[int]:
        return self._order

    @order.setter
    def order(self, order: list[int]) -> None:
        self._order = list(order)
        self._sched = None  # the levels (and with them the layout and the messages) follow the order

    # -- layout ----------------------------------------------------------------------------
    def _schedule(self) -> dict:
        if self._sched is not None:
            return self._sched
        K, off = self.K, self.off
        G, E = len(K), len(self.edges)
        level = order_levels(G, self.edges, self._order)
        pos = np.empty(G, dtype=np.int64)
        pos[np.asarray(self._order, dtype=np.int64)] = np.arange(G)
        ends = np.array(self.edges, dtype=np.int64).reshape(E, 2)
        src_u = ends.reshape(-1)              # directed message 2e: a -> b, 2e + 1: b -> a
        tgt_u = ends[:, ::-1].reshape(-1)
        dsort = np.lexsort((pos[src_u], level[src_u]))
        where = np.empty(2 * E, dtype=np.int64)
        where[dsort] = np.arange(2 * E)
        src, tgt = src_u[dsort], tgt_u[dsort]
        rev = where[dsort ^ 1]
        Ks, Kt = K[src], K[tgt]
        moff = np.concatenate([[0], np.cumsum(Kt)]).astype(np.int64)
        xoff = np.concatenate([[0], np.cumsum(Ks * Kt)]).astype(np.int64)
        n_lev = int(level.max()) + 1 if G else 0
        dbound = np.searchsorted(level[src], np.arange(n_lev + 1))
        # h vector of a level: each outgoing message's source strategies, message by message
        hoff = np.concatenate([[0], np.cumsum(Ks)]).astype(np.int64)
        hbase = hoff[dbound[np.minimum(np.searchsorted(dbound, np.arange(len(src)), side="right") - 1, n_lev)]] \
            if len(src) else np.zeros(0, np.int64)
        T = np.empty(int(xoff[-1]), dtype=np.float32)
        hidx = np.empty(int(xoff[-1]), dtype=np.int32)
        ftables = self._tables if self._tables is not None else shared_tables(self.gp)[11]
        for i, d in enumerate(dsort.tolist()):
            t = ftables[d >> 1]
            ks, kt = int(Ks[i]), int(Kt[i])
            T[xoff[i]:xoff[i + 1]].reshape(kt, ks)[:] = t.T if d & 1 == 0 else t  # [target, source]
            hidx[xoff[i]:xoff[i + 1]].reshape(kt, ks)[:] = np.arange(hoff[i] - hbase[i], hoff[i] - hbase[i] + ks)
        # message entries: their target strategy's flat position, and the row starts of T
        n_m = int(moff[-1])
        m_tgt = np.repeat(off[tgt] - moff[:-1], Kt) + np.arange(n_m)
        row_start = np.repeat(xoff[:-1], Kt) + (np.arange(n_m) - np.repeat(moff[:-1], Kt)) * np.repeat(Ks, Kt)
        # h entries: the source strategy's flat position and the reverse message's entry
        n_h = int(hoff[-1])
        h_local = np.arange(n_h) - np.repeat(hoff[:-1], Ks)
        h_src = np.repeat(off[src], Ks) + h_local
        h_rev = np.repeat(moff[rev], Ks) + h_local
        # per level: the message entries into its groups (for their beliefs)
        groups_of = [[] for _ in range(n_lev)]
        for g, lv in enumerate(level.tolist()):
            groups_of[lv].append(g)
        m_level = np.repeat(level[tgt], Kt)
        m_by_level = np.argsort(m_level, kind="stable")
        m_bound = np.searchsorted(m_level[m_by_level], np.arange(n_lev + 1))
        # a strategy's index among its level's strategies (each group is in one level)
        loc_of_pos = np.empty(int(off[-1]), dtype=np.int64)
        levels = []
        for lv in range(n_lev):
            gs = np.array(groups_of[lv], dtype=np.int64)
            kg = K[gs]
            lpos = np.repeat(off[gs], kg) + (np.arange(int(kg.sum())) - np.repeat(np.cumsum(kg) - kg, kg))
            loc_of_pos[lpos] = np.arange(len(lpos))
            into = m_by_level[m_bound[lv]:m_bound[lv + 1]]
            levels.append(dict(d0=int(dbound[lv]), d1=int(dbound[lv + 1]), groups=gs, lpos=lpos,
                               n_loc=len(lpos), into=into))
        for lv in levels:
            lv["into_loc"] = loc_of_pos[m_tgt[lv["into"]]]
        h_loc = loc_of_pos[h_src]
        self._sched = dict(level=level, src=src, tgt=tgt, Ks=Ks, Kt=Kt, moff=moff, xoff=xoff, hoff=hoff,
                           T=T, hidx=hidx, m_tgt=m_tgt, row_start=row_start, h_src=h_src, h_rev=h_rev,
                           h_loc=h_loc, levels=levels)
        self.msg = np.zeros(n_m)
        return self._sched

    def _flat(self, unary) -> np.ndarray:
        return unary if isinstance(unary, np.ndarray) else (
            np.concatenate(unary) if len(unary) else np.zeros(0))

    def unary_with_penalty(self, penalty: Optional[np.ndarray]) -> list[np.ndarray]:
        if penalty is None:
            return self.unary0
        flat = self.penalty_flat(penalty)
        return np.split(flat, self.off[1:-1]) if len(flat) else []

    def penalty_flat(self, penalty: Optional[np.ndarray]) -> np.ndarray:
        """The unary costs plus sum_t penalty[t] * usage, flat over all strategies."""
        base = self._flat(self.unary0)
        if penalty is None:
            return base.copy()
        cum = np.concatenate([[0.0], np.cumsum(penalty)])
        w_pos, w_seg, w_val, s_start, s_end = self._usage_entries()
        seg_w = cum[s_end] - cum[s_start]  # penalty summed over each segment
        return base + np.bincount(w_pos, w_val * seg_w[w_seg], minlength=len(base))

    def _usage_entries(self):
        """Every usage entry W[g][j, s] flat: (strategy position, global segment, value), and
        the global segments' start and end steps."""
        cached = getattr(self, "_usage", None)
        if cached is not None:
            return cached
        gp = self.gp
        pos, seg, val = [], [], []
        n_seg = 0
        for g, W in enumerate(gp.W):
            if not len(W):
                continue
            J, Kg = W.shape
            pos.append(np.tile(np.arange(Kg) + self.off[g], J))
            seg.append(np.repeat(np.arange(J) + n_seg, Kg))
            val.append(W.ravel().astype(np.float64))
            n_seg += J
        cat = lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt)  # noqa: E731
        s_start = cat([s for s in gp.seg_start if len(s)], np.int64)
        s_end = cat([s for s in gp.seg_end if len(s)], np.int64)
        self._usage = (cat(pos, np.int64), cat(seg, np.int64), cat(val, np.float64), s_start, s_end)
        return self._usage

    # -- message passing -------------------------------------------------------------------
    def _update_level(self, lv: dict, unary: np.ndarray, damping: float) -> None:
        s = self._sched
        d0, d1 = lv["d0"], lv["d1"]
        if d0 == d1:
            return
        moff, xoff, hoff = s["moff"], s["xoff"], s["hoff"]
        h0, h1 = int(hoff[d0]), int(hoff[d1])
        # h = belief of the source (unary plus every incoming message) minus the reverse message
        h = unary[s["h_src"][h0:h1]] - self.msg[s["h_rev"][h0:h1]]
        if len(lv["into"]):
            h += np.bincount(lv["into_loc"], self.msg[lv["into"]], minlength=lv["n_loc"])[s["h_loc"][h0:h1]]
        # in chunks of whole messages (the float64 temporaries of a 65k-node instance's
        # largest level were 130 MB at once); messages of one level are independent
        for a, b in self._chunks(d0, d1):
            x0, x1 = int(xoff[a]), int(xoff[b])
            vals = s["T"][x0:x1] + h[s["hidx"][x0:x1]]
            m0, m1 = int(moff[a]), int(moff[b])
            new = np.minimum(np.minimum.reduceat(vals, s["row_start"][m0:m1] - x0), BIG)
            del vals
            new -= np.repeat(np.minimum.reduceat(new, moff[a:b] - m0), s["Kt"][a:b])
            m = self.msg[m0:m1]
            m *= damping
            m += (1 - damping) * new

    CHUNK = 1 << 20  # table entries per vectorized step

    def _chunks(self, d0: int, d1: int) -> list[tuple[int, int]]:
        """[d0, d1) cut into runs of whole messages of about CHUNK table entries (a message
        larger than that is a run of its own)."""
        xoff = self._sched["xoff"]
        if xoff[d1] - xoff[d0] <= self.CHUNK:
            return [(d0, d1)]
        cuts = [d0]
        while cuts[-1] < d1:
            nxt = int(np.searchsorted(xoff, xoff[cuts[-1]] + self.CHUNK, side="right")) - 1
            cuts.append(min(d1, max(nxt, cuts[-1] + 1)))
        return list(zip(cuts[:-1], cuts[1:]))

    def sweep(self, unary, damping: float = 0.5, deadline: Optional[float] = None) -> None:
        """One pass over the levels in increasing order and one in decreasing order (the
        order forward, then backward); OutOfTime past `deadline`."""
        s = self._schedule()
        u = self._flat(unary)
        levels = s["levels"]
        for i, lv in enumerate(levels + levels[::-1]):
            if i % 16 == 0:
                check_deadline(deadline)
            self._update_level(lv, u, damping)
    def decode(self, unary) -> list[int]:
        """Greedy in the order, level by level: each group takes its cheapest strategy given
        the strategies its earlier neighbours took (their table column) and the messages of
        its later ones."""
        s = self._schedule()
        u = self._flat(unary)
        k = np.full(len(self.K), -1, dtype=np.int64)
        level, src, Ks, Kt, moff, xoff, T = (s[x] for x in ("level", "src", "Ks", "Kt", "moff", "xoff", "T"))
        m_dir = np.repeat(np.arange(len(src)), Kt)  # message entry -> its directed message
        for lv_i, lv in enumerate(s["levels"]):
            into = lv["into"]
            vals = u[lv["lpos"]]
            if len(into):
                d = m_dir[into]
                done = level[src[d]] < lv_i  # the source is earlier in the order: decoded
                contrib = self.msg[into]
                if done.any():
                    e, dd = into[done], d[done]
                    col = T[xoff[dd] + (e - moff[dd]) * Ks[dd] + k[src[dd]]].astype(np.float64)
                    contrib = contrib.copy()
                    contrib[done] = np.minimum(col, BIG)
                vals = vals + np.bincount(lv["into_loc"], contrib, minlength=lv["n_loc"])
            k[lv["groups"]] = self._argmin_per_group(vals, self.K[lv["groups"]])
        return [int(x) for x in k]

    @staticmethod
    def _argmin_per_group(values: np.ndarray, K: np.ndarray) -> np.ndarray:
        """`values` holds consecutive runs of K[i] entries: the first cheapest index in each
        run (np.argmin's tie-break)."""
        if not len(K):
            return np.zeros(0, dtype=np.int64)
        starts = np.cumsum(K) - K
        best = np.minimum.reduceat(values, starts)
        hit = np.flatnonzero(values == np.repeat(best, K))
        owner = np.searchsorted(starts, hit, side="right") - 1
        return hit[np.unique(owner, return_index=True)[1]] - starts


def lagrangian_starts(gp: GroupedProblem, deadline: float, sweeps: int = 3, rounds: int = 25,
                      step: float = 0.01, decay: float = 0.9,
                      order: Optional[list[int]] = None, node_rounds: int = 100,
                      beta: float = 0.3, switch_at: Optional[float] = None,
                      info: Optional[dict] = None) -> Iterator[tuple[list[int], float, np.ndarray]]:
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
    (perf_counter seconds): go on to the per-group factors then, after at least two rounds.
    `info` (optional): counts the rounds run per phase ("step_rounds", "group_rounds"); a
    caller that sets info["switch"] (its starts stopped improving) moves the trajectory on
    to the per-group factors before the next round."""
    info = info if info is not None else {}
    info.update(step_rounds=0, group_rounds=0)
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
        if r >= 2 and ((switch_at is not None and time.perf_counter() > switch_at) or info.get("switch")):
            break  # on to the per-group factors
        unary = ms.penalty_flat(penalty if has_limit else None)
        try:
            for _ in range(sweeps):
                ms.sweep(unary, deadline=deadline)
        except OutOfTime:
            return
        k = ms.decode(unary)
        info["step_rounds"] += 1
        prof = gp.profile(k) if has_limit else None
        out = new(k, prof)
        if out is not None:
            yield out
        if not has_limit:
            return
        penalty = np.maximum(0.0, penalty + step * decay ** r * (prof - gp.limit) / gp.limit)
    # per-group penalty factors
    base = ms.penalty_flat(penalty)
    zero = ms.penalty_flat(None)
    rho = np.ones(gp.num_groups)
    all_g = np.concatenate([np.full(len(x), g) for g, x in enumerate(gp.seg_start)] or [np.zeros(0, int)])
    all_j = np.concatenate([np.arange(len(x)) for x in gp.seg_start] or [np.zeros(0, int)])
    all_s = np.concatenate(gp.seg_start or [np.zeros(0, int)])
    all_e = np.concatenate(gp.seg_end or [np.zeros(0, int)])
    for r in range(node_rounds):
        if time.perf_counter() > deadline:
            return
        unary = zero + (base - zero) * np.repeat(rho, ms.K)
        try:
            for _ in range(sweeps):
                ms.sweep(unary, deadline=deadline)
        except OutOfTime:
            return
        k = ms.decode(unary)
        info["group_rounds"] += 1
        prof = gp.profile(k)
        out = new(k, prof)
        if out is not None:
            yield out
        over = prof > gp.limit
        if over.any():
            rho *= group_factor_raise(gp, k, all_g, all_j, all_s, all_e, over, beta)
        else:
            rho *= 1 - beta / 3


def group_factor_raise(gp: GroupedProblem, k: list[int], all_g: np.ndarray, all_j: np.ndarray,
                       all_s: np.ndarray, all_e: np.ndarray, over: np.ndarray, beta: float) -> np.ndarray:
    """Per group: (1 + beta) to the power of how many of its segments cover a step in `over`
    with the group above its least usage there, else 1 (one prefix count for all segments:
    a per-step scan was O(steps over x segments))."""
    n_over = np.concatenate([[0], np.cumsum(over)])
    hit = np.flatnonzero(n_over[all_e] - n_over[all_s] > 0)
    raised = np.zeros(gp.num_groups, dtype=np.int64)
    for g, j in zip(all_g[hit].tolist(), all_j[hit].tolist()):
        if gp.W[g][j, k[g]] > gp.W[g][j].min():
            raised[g] += 1
    return (1 + beta) ** raised


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
    edges, tables = [], []
    for i, g in enumerate(window):
        for o, t in st.inc[g]:
            j = inw.get(o)
            if j is not None and j > i:
                edges.append((i, j))
                tables.append(t)  # [g, o], inf forbidden
    ms = MinSum(None, sizes=[len(u) for u in unary], edges=edges, tables=tables)
    for _ in range(sweeps):
        ms.sweep(unary)
    return ms.decode(unary)
