"""The validator's LX and memory checks (a mixin of `simulator.validate`'s checker): what
each core holds in LX and when, tile buffers read in their kernel's tile order, kernels
that stay together, LX capacity and overlaps, device-memory overlaps and bounds."""
from __future__ import annotations

import bisect
from typing import Optional

import numpy as np

from target.geometry import core_ranges, op_granules, operand_box, tile_iteration_ranges, tile_operand_boxes
from target.layout import layout_nbytes
from target.primitives import DTYPE_BYTES
from target.superdsc import HbmMemory, LxMemory, fused_group_key, lx_live_spans, resolve_alias


def tile_order_problem(pbox, rbox) -> Optional[str]:
    """`tile_order_problem_ref` over all cores at once (same verdict, same message)."""
    pcores, plo, phi = pbox
    rcores, rlo, rhi = rbox
    prow = {c: i for i, c in enumerate(pcores)}
    n_r = rlo.shape[1]
    if not len(rcores):
        return None
    empty = (rhi <= rlo).any(axis=2)  # (reader cores, reader tiles)
    rows = [prow.get(c, -1) for c in rcores]
    have = np.array([r >= 0 for r in rows], dtype=bool)
    bad_first = np.full(len(rcores), -1, dtype=np.int64)  # first failing tile per core, -1 none
    if have.any():
        sel = np.flatnonzero(have)
        olo, ohi = plo[[rows[i] for i in sel]], phi[[rows[i] for i in sel]]  # (cores, p tiles, rank)
        lo, hi = rlo[sel], rhi[sel]
        n_p = olo.shape[1]
        # a kernel's members mostly tile alike: reader tile j inside producer tile j settles
        # most (core, tile) pairs in O(cores x tiles); only the rest are checked against
        # every producer tile i <= j
        ok = empty[sel].copy()  # (cores, reader tiles)
        d = min(n_p, n_r)
        ok[:, :d] |= ((olo[:, :d] <= lo[:, :d]) & (hi[:, :d] <= ohi[:, :d])).all(axis=2)
        cs, js = np.nonzero(~ok)
        if len(cs):
            # inside[k, i]: the k-th unsettled reader box inside producer tile i of its core
            inside = ((olo[cs] <= lo[cs, js][:, None, :]) & (hi[cs, js][:, None, :] <= ohi[cs])).all(axis=2)
            by_then = np.arange(n_p)[None, :] <= js[:, None]  # producer tile i <= j
            ok[cs, js] = (inside & by_then).any(axis=1)
        fails = ~ok
        any_fail = fails.any(axis=1)
        bad_first[sel[any_fail]] = fails[any_fail].argmax(axis=1)
    for ci, c in enumerate(rcores):
        if not have[ci]:
            if not empty[ci].all():
                return f"core {c} reads it, but the producer runs no tile on that core"
            continue
        if bad_first[ci] >= 0:
            return (f"core {c} needs in tile {int(bad_first[ci])} a box its producer tiles do not cover by then "
                    f"(another core's part, or a later tile's)")
    return None


def tile_order_problem_ref(pbox, rbox) -> Optional[str]:
    """What is wrong when a reader's (core, tile j) boxes `rbox` are not each inside the
    producer's box on the same core in some tile i <= j (`pbox`); None when all are."""
    pcores, plo, phi = pbox
    rcores, rlo, rhi = rbox
    prow = {c: i for i, c in enumerate(pcores)}
    for ci, c in enumerate(rcores):
        lo, hi = rlo[ci], rhi[ci]  # (reader tiles, rank)
        empty = (hi <= lo).any(axis=1)  # a tile that reads nothing
        if c not in prow:
            if not empty.all():
                return f"core {c} reads it, but the producer runs no tile on that core"
            continue
        olo, ohi = plo[prow[c]], phi[prow[c]]  # (producer tiles, rank)
        # inside[i, j]: reader tile j inside producer tile i
        inside = ((olo[:, None, :] <= lo[None, :, :]) & (hi[None, :, :] <= ohi[:, None, :])).all(axis=2)
        n_p = olo.shape[0]
        for j in range(lo.shape[0]):
            if empty[j]:
                continue
            if not inside[: min(j + 1, n_p), j].any():
                return (f"core {c} needs in tile {j} a box its producer tiles do not cover by then "
                        f"(another core's part, or a later tile's)")
    return None


class LxChecks:
    """LX, tile-buffer, kernel-order and memory checks; the checker supplies `p`, `hw`,
    `tmap`, `add` and `op_ranges`."""

    def lx_boxes(self, tname: str) -> Optional[dict]:
        """Per core, the box of an LX tensor its producer wrote into that core's LX."""
        cache = self.__dict__.setdefault("_lx_boxes", {})
        if tname in cache:
            return cache[tname]
        m = self.tmap[tname].memory
        res = None
        if 0 <= m.live_from < len(self.p.ops):
            o = self.p.ops[m.live_from]
            prim = self.prims.get(o.id)
            rec = self._rec_at.get(m.live_from)
            if prim is not None and prim.output.tensor == tname and rec is not None:
                res = rec.out_boxes()
            elif prim is not None and prim.output.tensor == tname:
                tm = self.tmap
                layouts = {n: tm[n].layout for n in [a.tensor for a in prim.inputs] + [tname]}
                dtypes = {n: tm[n].dtype for n in layouts}
                gran = op_granules(prim, layouts, dtypes, self.hw.stick_bytes)
                real = {n: f for n, f in o.core_split.items() if f > 1}
                res = {c: operand_box(prim, -1, rng, tm[tname].shape)
                       for c, rng in core_ranges(prim, real, o.core_slices, gran).items()}
        cache[tname] = res
        return res

    # -- tile buffers -------------------------------------------------------------------------------
    def tile_boxes(self, k: int, operand: int, tname: str):
        """(cores, box_lo, box_hi) per (core, tile) of op k's operand (-1: output), or None
        when the op's split did not pass its own checks."""
        o = self.p.ops[k]
        prim = self.prims.get(o.id)
        if prim is None or o.id not in self.geometry_ok:
            return None
        rec = self._rec_at.get(k)
        if rec is not None:
            return rec.tile_boxes(operand, self.tmap[tname].shape)
        if o.id not in self._tile_iter:
            gran, ranges = self.op_ranges(o, prim)
            self._tile_iter[o.id] = tile_iteration_ranges(prim, ranges, o.temporal_tiles, gran)
        cores, lo, hi = self._tile_iter[o.id]
        blo, bhi = tile_operand_boxes(prim, operand, lo, hi, self.tmap[tname].shape, copy_reads=True)
        return cores, blo, bhi

    def check_tile_buffers(self):
        """Every per-tile LX tensor lives inside one fused coarse-tiled kernel and every reader's
        tile-j box on a core lies inside the box the producer wrote there in tile j."""
        p = self.p
        n_ops = len(p.ops)
        tiled = [t for t in self.tmap.values() if isinstance(t.memory, LxMemory) and t.memory.per_tile]
        if not tiled:
            return
        readers: dict[str, list[tuple[int, int]]] = {}  # tensor -> [(op index, input index)]
        for k, o in enumerate(p.ops):
            prim = self.prims.get(o.id)
            if prim is not None:
                for i, a in enumerate(prim.inputs):
                    readers.setdefault(a.tensor, []).append((k, i))
        keys = [fused_group_key(o) for o in p.ops]
        io = set(p.inputs) | set(p.outputs)
        for t in tiled:
            m = t.memory
            scope = lambda msg, op=None: self.add("lx_tile_scope", f"tile buffer {t.id}: {msg}", op=op, tensor=t.id)
            if t.id in io or t.is_output or t.role != "intermediate":
                scope("a program input or output is never a tile buffer (it exists whole in device memory)")
                continue
            if not (0 <= m.live_from <= m.live_to < n_ops):
                continue  # lx_live_range
            producer = p.ops[m.live_from]
            pprim = self.prims.get(producer.id)
            if pprim is None or pprim.output.tensor != t.id:
                scope(f"op {m.live_from} ({producer.id}) at live_from does not produce it", op=producer.id)
                continue
            key = keys[m.live_from]
            if key is None:
                scope(f"its producer {producer.id} is not in a fused coarse-tiled kernel (compute op with "
                      f"temporal tiles > 1)", op=producer.id)
                continue
            ok = True
            for k in range(m.live_from, m.live_to + 1):
                if keys[k] != key:
                    scope(f"op {k} ({p.ops[k].id}) inside its live range [{m.live_from}, {m.live_to}] is not "
                          f"in the producer's fused kernel {key}", op=p.ops[k].id)
                    ok = False
                    break
            for k, _ in readers.get(t.id, []):
                if keys[k] != key:
                    scope(f"reader {p.ops[k].id} (op {k}, kernel {keys[k]}) is outside the producer's fused "
                          f"kernel {key}", op=p.ops[k].id)
                    ok = False
            if m.live_to > m.live_from and all(k != m.live_to for k, _ in readers.get(t.id, [])):
                scope(f"op {m.live_to} ({p.ops[m.live_to].id}) at live_to does not read it", op=p.ops[m.live_to].id)
            red_tiled = [d.name for d in pprim.iter_dims
                         if d.kind == "reduction" and int(producer.temporal_tiles.get(d.name, 1)) > 1]
            if red_tiled:
                scope(f"its producer {producer.id} tiles reduction dim {red_tiled[0]}: a tile's output is a "
                      f"partial, complete only after the last tile", op=producer.id)
                ok = False
            pbox = self.tile_boxes(m.live_from, -1, t.id)
            if pbox is None:
                continue
            pcores, plo, phi = pbox
            # verdicts that depend on the producer's and the readers' records alone are kept
            # on the records (the tile buffer is the producer's output: its record's content)
            prec = self._rec_at.get(m.live_from)
            need = prec._order.get(("tile_need",)) if prec is not None else None
            if need is None:
                # lx_size: the largest box the producer writes in one tile on one core
                ext = phi - plo
                stick = t.layout.stick_dim
                if stick is not None:
                    se = t.layout.stick_elems
                    ext[:, :, stick] = -(-ext[:, :, stick] // se) * se if se > 1 else ext[:, :, stick]
                elems = np.prod(ext, axis=2) if ext.shape[2] else np.full(ext.shape[:2], t.layout.stick_elems)
                need = int(elems.max(initial=0)) * DTYPE_BYTES[t.dtype]
                if prec is not None:
                    prec._order[("tile_need",)] = need
            if need > m.size_per_core:
                self.add("lx_size", f"{producer.id}: a core writes {need} bytes of tile buffer {t.id} per tile "
                                    f"into an LX buffer of {m.size_per_core}", op=producer.id, tensor=t.id)
            if not ok:
                continue
            prow = {c: i for i, c in enumerate(pcores)}
            for k, idx in readers.get(t.id, []):
                if not (m.live_from < k <= m.live_to):
                    continue  # lx_live_range
                rbox = self.tile_boxes(k, idx, t.id)
                if rbox is None:
                    continue
                rcores, rlo, rhi = rbox
                reader = p.ops[k]
                rrec = self._rec_at.get(k)
                vkey = ("tile", prec.serial, idx) if prec is not None and rrec is not None else None
                if vkey is not None and vkey in rrec._order:
                    bad = rrec._order[vkey]
                else:
                    bad = self._tile_read_problem(pcores, plo, phi, prow, rcores, rlo, rhi)
                    if vkey is not None:
                        rrec._order[vkey] = bad
                if bad:
                    self.add("lx_slice_mismatch", f"{reader.id}: tile buffer {t.id}: {bad} (another tiling or "
                                                  f"per-core slicing)", op=reader.id, tensor=t.id)

    @staticmethod
    def _tile_read_problem(pcores, plo, phi, prow, rcores, rlo, rhi) -> Optional[str]:
        """What is wrong with a reader's tile-j boxes against the producer's tile-j boxes."""
        if rlo.shape[1] != plo.shape[1]:
            return f"runs {rlo.shape[1]} tiles, the producer {plo.shape[1]}"
        if any(c not in prow for c in rcores):
            return f"core {next(c for c in rcores if c not in prow)} reads a tile the producer never wrote on it"
        rows = np.array([prow[c] for c in rcores], dtype=np.int64)
        olo, ohi = plo[rows], phi[rows]
        inside = (rhi <= rlo) | ((olo <= rlo) & (rhi <= ohi))
        fails = np.argwhere(~inside.all(axis=2))
        if len(fails):
            ci, j = int(fails[0][0]), int(fails[0][1])
            return f"core {rcores[ci]} reads in tile {j} a box outside the one the producer wrote there in that tile"
        return None

    def check_kernel_order(self):
        """Inside a fused kernel the tile loop runs every member on tile j before tile j+1,
        on each core independently: a member may read an earlier member's result (in any
        memory) only where its own core wrote it in the same or an earlier tile. (Tile
        buffers: check_tile_buffers, which demands the same tile.)"""
        p = self.p
        keys = [fused_group_key(o) for o in p.ops]
        producer_at: dict[str, int] = {}
        for k, o in enumerate(p.ops):
            prim = self.prims.get(o.id)
            if prim is None or keys[k] is None:
                continue
            for idx, a in enumerate(prim.inputs):
                t = self.tmap.get(a.tensor)
                q = producer_at.get(a.tensor)
                if t is None or q is None or keys[q] != keys[k] or any(keys[x] != keys[k] for x in range(q, k)):
                    continue
                if isinstance(t.memory, LxMemory) and t.memory.per_tile:
                    continue
                red_tiled = self._reduction_tiled(q)
                if red_tiled:
                    # a K-tiled producer's result is a partial sum until its last tile
                    self.add("kernel_tile_order", f"{o.id} reads {a.tensor}, made by {p.ops[q].id} in the same "
                                                  f"fused kernel, which tiles reduction dim {red_tiled}: the result "
                                                  f"is a partial until the kernel's last tile", op=o.id, tensor=a.tensor)
                    continue
                pbox, rbox = self.tile_boxes(q, -1, a.tensor), self.tile_boxes(k, idx, a.tensor)
                if pbox is None or rbox is None:
                    continue
                prec, rrec = self._rec_at.get(q), self._rec_at.get(k)
                if prec is None or rrec is None:
                    bad = tile_order_problem_ref(pbox, rbox)
                else:
                    # the verdict depends on the two ops' contents (their records) alone
                    okey = ("order", prec.serial, idx, tuple(t.shape))
                    if okey not in rrec._order:
                        rrec._order[okey] = tile_order_problem(pbox, rbox)
                    bad = rrec._order[okey]
                if bad:
                    self.add("kernel_tile_order", f"{o.id} reads {a.tensor}, made by {p.ops[q].id} in the same "
                                                  f"fused kernel: {bad}", op=o.id, tensor=a.tensor)
            if prim.output.tensor in self.tmap:
                producer_at[prim.output.tensor] = k

    def _reduction_tiled(self, k: int) -> Optional[str]:
        """The first reduction dim op k tiles (temporal tiles > 1), or None."""
        o, prim = self.p.ops[k], self.prims.get(self.p.ops[k].id)
        if prim is None:
            return None
        return next((d.name for d in prim.iter_dims
                     if d.kind == "reduction" and int(o.temporal_tiles.get(d.name, 1)) > 1), None)

    # -- memory over time -----------------------------------------------------------------------
    def check_memory(self):
        hw = self.hw
        n_ops = len(self.p.ops)
        lx = [(t.id, t.memory) for t in self.tmap.values() if isinstance(t.memory, LxMemory)]
        if lx:
            spans = lx_live_spans(self.p)  # live ranges widened over the fused kernels they touch
            delta = [0] * (n_ops + 2)
            for i, m in lx:
                a, b = max(0, spans[i][0]), min(n_ops, spans[i][1])
                if b >= a:
                    delta[a] += m.size_per_core
                    delta[b + 1] -= m.size_per_core
            live = 0
            for k in range(n_ops):
                live += delta[k]
                if live > hw.lx_capacity_bytes:
                    self.add("lx_capacity", f"at op {k} ({self.p.ops[k].id}) {live} bytes per core are live "
                                            f"in LX > {hw.lx_capacity_bytes}", op=self.p.ops[k].id)
                    break
            self._overlaps([(i, spans[i][0], spans[i][1], m.lx_address, m.lx_address + m.size_per_core)
                            for i, m in lx], "lx_overlap", "LX")
        # device memory: live from producer (inputs: start) to last reader (outputs: end)
        last_read: dict[str, int] = {}
        for k, o in enumerate(self.p.ops):
            prim = self.prims.get(o.id)
            if prim is not None:
                for a in prim.inputs:
                    last_read[resolve_alias(self.tmap, a.tensor)] = k
        written = getattr(self, "written", {})
        outs = {resolve_alias(self.tmap, t) for t in self.p.outputs}
        hbm = []
        for t in self.tmap.values():
            if isinstance(t.memory, HbmMemory) and not t.memory.alias_of and t.dtype in DTYPE_BYTES:
                start = written.get(t.id, -1)
                end = n_ops if t.id in outs else max(last_read.get(t.id, start), start)
                hbm.append((t.id, start, end, t.memory.offset, t.memory.offset + layout_nbytes(t.layout, t.dtype)))
        self._overlaps(hbm, "hbm_overlap", "device-memory")

    def _overlaps(self, items, code: str, what: str):
        """Report buffers that overlap in address while both are live: `items` are
        (tensor, first op, last op, address start, address end) with the op span
        inclusive and the address range half-open.

        A sweep over op indices (O(n log n) plus O(n) overlap tests): buffers enter at
        their first op and leave after their last, and the live set is kept sorted by
        address. While the live buffers are pairwise disjoint, a new buffer overlaps one
        of them only if it overlaps its neighbour below or above in address order, so two
        tests per buffer decide it. A buffer found overlapping is reported and not added
        (the live set stays disjoint): every reported pair is real, and when any pair
        overlaps at least one is reported (at most 20). `self.overlap_tests` counts the
        tests (what the complexity test asserts on)."""
        events = []
        for it in items:
            if it[1] > it[2] or it[4] <= it[3]:
                continue  # never live, or no bytes: cannot overlap anything
            events.append((it[1], 1, it))      # enters at its first op
            events.append((it[2] + 1, 0, it))  # leaves after its last (0 < 1: leaves first)
        events.sort(key=lambda e: (e[0], e[1], e[2][3], e[2][4], e[2][0]))
        starts: list = []  # live buffers' address starts, sorted
        live: list = []    # the live buffers, in the same order
        members: set = set()
        reported = 0
        tests = 0
        for _, entering, it in events:
            if not entering:
                if id(it) in members:
                    members.discard(id(it))
                    k = bisect.bisect_left(starts, it[3])
                    while live[k] is not it:
                        k += 1
                    del starts[k], live[k]
                continue
            k = bisect.bisect_right(starts, it[3])
            clash = None
            for j in (k - 1, k):
                if 0 <= j < len(live):
                    tests += 1
                    a = live[j]
                    if a[3] < it[4] and it[3] < a[4]:
                        clash = a
                        break
            if clash is not None:
                self.add(code, f"{what} buffers of {clash[0]} [{clash[3]}, {clash[4]}) and {it[0]} "
                               f"[{it[3]}, {it[4]}) overlap while both live", tensor=it[0])
                reported += 1
                if reported >= 20:
                    break
                continue
            starts.insert(k, it[3])
            live.insert(k, it)
            members.add(id(it))
        self.overlap_tests = getattr(self, "overlap_tests", 0) + tests
