"""Holding results in LX (a step of the search, `hold_in_lx`): results still handed from a
kernel to later ops through device memory are held whole in LX where their readers can take
(`_follow_split`), or their producer's side can take their core order (`_relabel_producer`),
or their producer (`_lead_split`) or the reading kernel
(`_kernel_follows`) can give, the split that reads what each core made, or where both sides
can meet on one (`meet.meet_splits`)."""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Optional

from target.op_rules import legal_core_splits
from target.primitives import PrimGraph, PrimOp
from target.geometry import (box_contains, core_ranges, default_core_slices, layout_nbytes, op_granules,
                                operand_box)
from target.superdsc import CoreSlice, Program, fused_group_key
from simulator.timing import time_program
from solver.oracle import valid_program
from solver.plan import OpPlan, PlanDecisions
from solver.spyre.fusion.meet import meet_splits, tiles_that_fit
from solver.spyre.fusion.split_maps import head_split, result_split, split_through
from solver.spyre.fusion.trial import issues_of, trial
from solver.spyre.tile_buffers import add_whole_residencies, kernel_numbers, whole_candidates

# results handed between kernels through device memory that `hold_in_lx` tries to keep in
# LX (the largest first), and the smallest it tries: 256 KiB since 2026-12-05 (1 MiB
# before), so the small encoders' 197-512 token activations (0.3-0.8 MB) are tried too; the
# prefill layers' largest results come first, so their trials are the same
HOLD_TRIALS = 6
HOLD_MIN_BYTES = 1 << 18


def hold_in_lx(pg: PrimGraph, hw, tr: tuple, deadline: Optional[float], trial_s: float,
               limit: int = HOLD_TRIALS) -> tuple:
    """Results that go from one kernel to later ops through device memory (written whole,
    read back) held whole in LX instead: the readers take the split that reads what each
    core made (`_follow_split`), the tensor gets LX the plan leaves free over its live range
    (`tile_buffers.add_whole_residencies`, validator-judged); where the readers read what
    one producer core made but on another core, the producer's side takes their core order
    instead (`_relabel_producer`, tried first: the readers keep their own LX chains). The
    largest `limit` such
    results (at least `HOLD_MIN_BYTES`) whose readers can follow are tried one at a time,
    each kept where the whole program simulates faster (also with the moved kernels keeping
    their tile counts, `_tiles_kept`); then, in `limit` trials more, those whose producing
    matmul can take its readers' split (`_lead_split`); then, in `limit` more, those whose
    producing and reading pointwise/reduce kernels can meet on a common split
    (`meet.meet_splits`). The solve chose residencies before fusion changed the splits
    and freed LX (tile buffers), so a result it left in device memory may now fit."""
    fused_d, prog, rep = tr
    cands = whole_candidates(pg, prog, hw)
    tmap = prog.tensor_map()
    nbytes = {t: layout_nbytes(tmap[t].layout, tmap[t].dtype) for t in cands}
    tried = {"follow": 0, "lead": 0, "meet": 0}  # trials of each kind
    order = sorted((t for t in cands if nbytes[t] >= HOLD_MIN_BYTES), key=lambda t: -nbytes[t])
    # first the results whose readers follow, then (on the splits that left) the ones whose
    # producer leads, then those whose producing and reading kernels meet on a common split
    for t, kind in [(t, "follow") for t in order] + [(t, "lead") for t in order] + [(t, "meet") for t in order]:
        if t in fused_d.resident:
            continue
        # (ops, residencies to drop, bundle starts to add, whether tile buffers are placed again)
        if kind == "lead":
            alternatives = [(ops, set(), [], False) for ops in _lead_split(pg, prog, fused_d, t, hw)
                            + _kernel_follows(pg, prog, fused_d, t, hw)]
        elif kind == "meet":
            alternatives = [(ops, drop, starts, True) for ops, drop, starts in meet_splits(pg, prog, fused_d, t, hw)]
        else:
            follow = _follow_split(pg, prog, fused_d, t, hw)
            alternatives = [] if follow is None else [(*follow, [], False)] + [
                (ops, follow[1], [], True) for ops in _tiles_kept(pg, prog, fused_d, follow[0], hw)]
            relabelled = _relabel_producer(pg, prog, fused_d, t, hw)
            if relabelled is not None:
                # the readers stay as they are (their own LX chains kept): tried first
                alternatives.insert(0, (relabelled, set(), [], False))
        best = None
        for ops, drop, starts, retile in alternatives:
            if tried[kind] >= limit or (deadline is not None and time.perf_counter() + 2 * trial_s > deadline):
                break
            tried[kind] += 1
            d2, prog2 = replace(fused_d, ops=ops, resident={x: r for x, r in fused_d.resident.items()
                                                            if x not in drop}), prog
            if starts and hw.lx_persists_across_bundles:
                # kernels on one split and tile count would otherwise merge (`fused_group_key`)
                d2.bundle_starts = list(d2.bundle_starts) + [s for s in starts if s not in d2.bundle_starts]
            if ops != fused_d.ops or drop:
                prog2 = valid_program(pg, hw, d2)
                if prog2 is None:
                    continue
            held = add_whole_residencies(pg, hw, d2, prog2, only={t})
            if held is None:
                continue
            if retile:
                # the moved kernels' tile buffers went with their old splits: placed again
                tr2 = trial(pg, hw, held.decisions)
                if tr2 is None or issues_of(tr2, hw):
                    continue
                held, rep2 = replace(held, decisions=tr2[0], program=tr2[1]), tr2[2]
            else:
                rep2 = time_program(held.program, hw)
            if rep2.total_us < (best[2].total_us if best else rep.total_us):
                best = (held.decisions, held.program, rep2)
        if best is not None:
            fused_d, prog, rep = best
    return fused_d, prog, rep


def _follow_split(pg: PrimGraph, program: Program, d: PlanDecisions, tensor: str, hw
                  ) -> Optional[tuple[dict, set[str]]]:
    """`d.ops` with the ops reading `tensor` (pointwise, reduce or copy ops) on the split
    under which each core reads the slice of it that the same core made (`split_through`;
    a copy through its strided maps, `_copy_follows`, on explicit core slices where the
    natural order puts a work slice on another core, carried on to its followers),
    and, through every LX-resident result of an op so changed and from a kernel member to
    the members reading its result, their readers likewise; None when some reader cannot
    follow (no such split, not legal for it, another kind of op). Returns the ops and the
    LX residencies to drop. Whether the kernels so changed stay valid is the validator's
    question."""
    prims = {op.id: op for op in pg.ops}
    producer = {op.output.tensor: op.id for op in pg.ops}
    readers: dict[str, list[str]] = {}
    for op in pg.ops:
        for a in op.inputs:
            readers.setdefault(a.tensor, []).append(op.id)
    layouts = {t.id: t.layout for t in program.tensors}
    dtypes = {t.id: t.dtype for t in program.tensors}
    shapes = {t.id: tuple(t.shape) for t in program.tensors}
    ops = dict(d.ops)
    drop: set[str] = set()
    kernel = {program.ops[k].id: n for k, n in kernel_numbers(program).items()}
    # (producer, tensor, the readers to move: None for all)
    queue: list[tuple[str, str, Optional[set]]] = [(producer[tensor], tensor, None)]
    done: set[str] = set()
    while queue:
        p, t, only = queue.pop()
        for r in dict.fromkeys(readers.get(t, [])):
            if only is not None and r not in only:
                continue
            rp = prims[r]
            plan = ops.get(r, OpPlan())
            if rp.body.kind not in ("pointwise", "reduce", "copy") or plan.alias:
                return None
            p_plan = ops.get(p, OpPlan())
            if rp.body.kind == "copy":
                # a copy reads through its strided maps, not along its operand map's dims
                got = _copy_follows(prims[p], p_plan, rp, t, shapes, layouts, dtypes, hw)
                if got is None:
                    return None
                want, slices = got
            else:
                want = split_through(prims[p], p_plan.core_split, rp, t)
                if want is None:
                    return None
                slices = _carry_slices(prims[p], p_plan, rp, t)
            cur = {k: v for k, v in plan.core_split.items() if v > 1}
            # a pointwise or reduce reader of a producer in the natural order keeps its slices
            same = cur == want and ((slices is None and rp.body.kind != "copy") or plan.core_slices == slices)
            if r in done:
                if not same:
                    return None
                continue
            done.add(r)
            if same:
                continue
            if want not in legal_core_splits(rp, op_granules(rp, layouts, dtypes, hw.stick_bytes), hw.cores):
                return None
            ops[r] = replace(plan, core_split=dict(want), core_slices=slices)
            out = rp.output.tensor
            # on through a result held in LX (a tile buffer too), and from a member of a
            # kernel to the kernel's other members reading it: they must all follow; a
            # whole-slice result some reader of which cannot follow (a matmul) goes to
            # device memory instead, where any split reads it
            held = d.resident.get(out)
            mates = {x for x in readers.get(out, []) if r in kernel and kernel.get(x) == kernel[r]}
            if held is not None and not held.per_tile and any(
                    prims[x].body.kind not in ("pointwise", "reduce", "copy") for x in readers.get(out, [])):
                drop.add(out)
                if mates:
                    queue.append((r, out, mates))
            elif held is not None:
                queue.append((r, out, None))
            elif mates:
                queue.append((r, out, mates))
    moved = {o for o in ops if ops[o] is not d.ops.get(o)}
    # a kernel some member of which moved moves whole, or the kernel would split (a
    # kernel whose head must move too is `_kernel_follows`' case)
    members: dict[int, set[str]] = {}
    for o, n in kernel.items():
        members.setdefault(n, set()).add(o)
    for o in sorted(moved):
        if o in kernel and not _mates_follow(o, members[kernel[o]] - done, prims, ops, shapes, layouts, dtypes, hw):
            return None
        done |= members.get(kernel.get(o, -1), set())
    moved = {o for o in ops if ops[o] is not d.ops.get(o)}
    # a moved kernel member whose tiled dim is now split finer takes proportionally fewer
    # tiles, and every moved member of one kernel the fewest of them (one count a kernel)
    count: dict[int, int] = {}
    for o in moved:
        old, new = d.ops.get(o, OpPlan()), ops[o]
        for dim, t in new.temporal_tiles.items():
            ratio = max(1, new.core_split.get(dim, 1) // max(1, old.core_split.get(dim, 1)))
            count[kernel.get(o, -1)] = min(count.get(kernel.get(o, -1), t), t // ratio)
    for o in moved:
        p = ops[o]
        if p.temporal_tiles and kernel.get(o, -1) in count:
            c = count[kernel.get(o, -1)]
            ops[o] = replace(p, temporal_tiles={dim: c for dim in p.temporal_tiles} if c >= 2 else {})
            held = d.resident.get(prims[o].output.tensor)
            if ops[o].temporal_tiles != p.temporal_tiles and held is not None and held.per_tile:
                drop.add(prims[o].output.tensor)  # a tile buffer sized for other tiles
    # an op that moved reads its other operands held whole in LX from other cores' slices
    # unless their producers moved with it: those go to device memory
    for o in moved:
        for a in prims[o].inputs:
            held = d.resident.get(a.tensor)
            if a.tensor != tensor and held is not None and not held.per_tile and producer.get(a.tensor) not in moved:
                drop.add(a.tensor)
    return ops, drop


def _tiles_kept(pg: PrimGraph, program: Program, d: PlanDecisions, ops: dict, hw) -> list[dict]:
    """`_follow_split`'s ops with every moved kernel member keeping its tile count where its
    new slices still hold that many (`meet.tiles_that_fit`; one count a kernel, the fewest),
    instead of proportionally fewer: [that] when the follow left some moved kernel untiled,
    else [] (or when it is the same). A kernel whose
    members each get a smaller slice streams no worse at the same count (granite prefill,
    deterministic: the post-attention norm's apply following the fp32 input's row x column
    split, 3786.0 -> 3869.6 us at proportionally fewer tiles, untiled; 3663.5 at its 2)."""
    prims = {op.id: op for op in pg.ops}
    kernel = {program.ops[k].id: n for k, n in kernel_numbers(program).items()}
    layouts = {t.id: t.layout for t in program.tensors}
    dtypes = {t.id: t.dtype for t in program.tensors}
    moved = [o for o in ops if ops[o] is not d.ops.get(o) and d.ops.get(o) is not None and d.ops[o].temporal_tiles]
    if not any(not ops[o].temporal_tiles for o in moved):
        # only where the follow left a kernel untiled: elsewhere the extra trial rarely
        # paid for its time under a wall-clock deadline (2-4 more trials a plan)
        return []
    kept: dict[str, dict[str, int]] = {
        o: tiles_that_fit(prims[o], ops[o].core_split, d.ops[o].temporal_tiles,
                          op_granules(prims[o], layouts, dtypes, hw.stick_bytes))
        for o in moved if o in prims}
    count: dict[int, int] = {}
    for o, tiles in kept.items():
        for t in tiles.values():
            count[kernel.get(o, -1)] = min(count.get(kernel.get(o, -1), t), t)
    out = dict(ops)
    for o, tiles in kept.items():
        c = count.get(kernel.get(o, -1), 0)
        out[o] = replace(ops[o], temporal_tiles={dim: c for dim in tiles} if c >= 2 and len(tiles) else {})
    return [out] if any(out[o].temporal_tiles != ops[o].temporal_tiles for o in kept) else []


def _mates_follow(moved: str, rest: set[str], prims: dict, ops: dict, shapes: dict, layouts: dict, dtypes: dict,
                  hw) -> bool:
    """The members `rest` of a kernel whose member `moved` follows a held result, moved with
    it (in `ops`): each pointwise or reduce member writing a result of the moved one's
    shape takes the same split of it (`split_maps.result_split`), e.g. the scaling of a
    split-K result that feeds the residual add which follows. False when one cannot (a
    matmul heading the kernel is `_kernel_follows`' case)."""
    src = prims[moved]
    for x in sorted(rest):
        xp = prims[x]
        if xp.body.kind not in ("pointwise", "reduce") or ops.get(x, OpPlan()).alias:
            return False
        want = result_split(src, {k: v for k, v in ops[moved].core_split.items() if v > 1}, xp, shapes)
        if want is None or want not in legal_core_splits(xp, op_granules(xp, layouts, dtypes, hw.stick_bytes),
                                                         hw.cores):
            return False
        ops[x] = replace(ops.get(x, OpPlan()), core_split=dict(want), core_slices=None)
    return True


def _made_boxes(prim: PrimOp, plan: OpPlan, shapes: dict, layouts: dict, dtypes: dict, hw) -> dict:
    """Per core, the box of its result `prim` writes under `plan`'s split and core slices."""
    split = {k: v for k, v in plan.core_split.items() if v > 1}
    gran = op_granules(prim, layouts, dtypes, hw.stick_bytes)
    slices = ([CoreSlice(core=c, slice=dict(sl)) for c, sl in plan.core_slices] if plan.core_slices is not None
              else default_core_slices(prim, split))
    return {c: operand_box(prim, -1, r, shapes[prim.output.tensor])
            for c, r in core_ranges(prim, split, slices, gran).items()}


def _copy_follows(producer: PrimOp, p_plan: OpPlan, reader: PrimOp, tensor: str, shapes: dict,
                  layouts: dict, dtypes: dict, hw) -> Optional[tuple[dict, Optional[list]]]:
    """A copy reading `tensor` (its producer's result): a legal split on as many cores as the
    producer's, and the core slices (None: the natural order) under which each of its cores
    reads (`geometry.copy_read_box`, every piece from `tensor`) inside the box the same core
    made; the natural order first, else each work slice on the core that made what it reads.
    None when no legal split does."""
    made = _made_boxes(producer, p_plan, shapes, layouts, dtypes, hw)
    n = len(made)
    slots = [i for i, a in enumerate(reader.inputs) if a.tensor == tensor]
    gran = op_granules(reader, layouts, dtypes, hw.stick_bytes)
    shape = shapes[tensor]
    matched = None
    for split in legal_core_splits(reader, gran, hw.cores):
        total = 1
        for f in split.values():
            total *= f
        if total != n or not split:
            continue
        natural = default_core_slices(reader, split)
        ranges = core_ranges(reader, split, natural, gran)
        need = {c: [operand_box(reader, i, r, shape, copy_reads=True) for i in slots]
                for c, r in ranges.items()}
        if all(c in made and all(box_contains(made[c], b) for b in bs) for c, bs in need.items()):
            return split, None
        if matched is not None:
            continue
        # the same work slices on the cores that made what they read
        free = dict(made)
        placed = []
        for cs in natural:
            host = next((c for c, m in free.items() if all(box_contains(m, b) for b in need[cs.core])), None)
            if host is None:
                break
            del free[host]
            placed.append((host, dict(cs.slice)))
        else:
            matched = (split, sorted(placed, key=lambda x: x[0]))
    return matched


def _carry_slices(producer: PrimOp, p_plan: OpPlan, reader: PrimOp, tensor: str) -> Optional[list]:
    """The producer's explicit core slices (None: the natural order) as the reader's, for a
    reader following the producer's split through `tensor` (`split_through`): each core runs
    the reader slice whose index along each dim is the producer's along the dim it maps from."""
    if p_plan.core_slices is None:
        return None
    acc = next(a for a in reader.inputs if a.tensor == tensor)
    names = [d.name for d in producer.iter_dims]
    rename = {}
    for j, i in enumerate(producer.output.dims):
        if i is not None and j < len(acc.dims) and acc.dims[j] is not None:
            rename[names[i]] = reader.iter_dims[acc.dims[j]].name
    split = {k for k, v in p_plan.core_split.items() if v > 1}
    return [(c, {rename[k]: v for k, v in sl.items() if k in split and k in rename}) for c, sl in p_plan.core_slices]


def _lead_split(pg: PrimGraph, program: Program, d: PlanDecisions, tensor: str, hw) -> list[dict]:
    """When `tensor`'s readers cannot follow its producer's split: `d.ops` with the producer,
    a tiled matmul that is a kernel of its own, on the split its readers (outside any
    kernel, all agreeing) read the tensor in (`head_split`), at its tile count and at twice
    that (a result held whole takes LX the matmul's double buffering used: smaller tiles
    leave it room). Empty when there is no such move."""
    prims = {op.id: op for op in pg.ops}
    producer = next((op for op in pg.ops if op.output.tensor == tensor), None)
    plan = d.ops.get(producer.id) if producer is not None else None
    if producer is None or producer.body.kind != "matmul" or plan is None or not plan.temporal_tiles:
        return []
    key = {o.id: fused_group_key(o) for o in program.ops}
    if sum(1 for k in key.values() if k is not None and k == key.get(producer.id)) != 1:
        return []  # its kernel has members: they would need to follow too
    want = None
    for op in pg.ops:
        if not any(a.tensor == tensor for a in op.inputs):
            continue
        rp = d.ops.get(op.id, OpPlan())
        if rp.temporal_tiles:
            return []
        split = head_split(producer, [prims[op.id]], {k: v for k, v in rp.core_split.items() if v > 1})
        if split is None or (want is not None and split != want):
            return []
        want = split
    cur = {k: v for k, v in plan.core_split.items() if v > 1}
    layouts = {t.id: t.layout for t in program.tensors}
    dtypes = {t.id: t.dtype for t in program.tensors}
    if want is None or want == cur or want not in legal_core_splits(
            producer, op_granules(producer, layouts, dtypes, hw.stick_bytes), hw.cores):
        return []
    out = []
    for f in (1, 2):
        ops = dict(d.ops)
        ops[producer.id] = replace(plan, core_split=dict(want), core_slices=None,
                                   temporal_tiles={k: v * f for k, v in plan.temporal_tiles.items()})
        out.append(ops)
    return out


def _kernel_follows(pg: PrimGraph, program: Program, d: PlanDecisions, tensor: str, hw) -> list[dict]:
    """When `tensor` is read (outside its producer's kernel) only by members of one other
    kernel headed by a matmul: `d.ops` with that whole kernel on the split under which the
    reader reads what each core made: the reader's split mapped through its result's
    tensor dims to the head's (results of one shape), the other members on the head's split
    of their results (`split_maps.from_head`). Empty when there is no such move or one is not legal."""
    prims = {op.id: op for op in pg.ops}
    producer = next((op for op in pg.ops if op.output.tensor == tensor), None)
    if producer is None:
        return []
    key = {o.id: fused_group_key(o) for o in program.ops}
    ids = [o.id for o in program.ops]
    p_split = d.ops.get(producer.id, OpPlan()).core_split
    target = None   # (reader, its wanted split)
    for op in pg.ops:
        if not any(a.tensor == tensor for a in op.inputs):
            continue
        want = split_through(producer, p_split, op, tensor)
        if want is None:
            return []
        cur = {k: v for k, v in d.ops.get(op.id, OpPlan()).core_split.items() if v > 1}
        if key.get(op.id) is not None and key.get(op.id) == key.get(producer.id) and cur == want:
            continue   # in the producer's kernel already reading its own cores' part
        if key.get(op.id) is None or target is not None:
            return []
        target = (op, want)
    if target is None:
        return []
    reader, want = target
    k = ids.index(reader.id)
    while k > 0 and key[ids[k - 1]] == key[reader.id] and ids[k] not in d.bundle_starts:
        k -= 1
    head = prims.get(ids[k])
    members = []
    for oid in ids[k:]:
        if key[oid] != key[reader.id] or (oid != ids[k] and oid in d.bundle_starts):
            break
        members.append(oid)
    shapes = {t.id: tuple(t.shape) for t in program.tensors}
    if head is None or head.body.kind != "matmul":
        return []
    split = result_split(reader, want, head, shapes)
    if split is None:
        return []
    layouts = {t.id: t.layout for t in program.tensors}
    dtypes = {t.id: t.dtype for t in program.tensors}

    def legal(prim: PrimOp, sp: dict) -> bool:
        return sp in legal_core_splits(prim, op_granules(prim, layouts, dtypes, hw.stick_bytes), hw.cores)
    if not legal(head, split):
        return []
    ops = dict(d.ops)
    ops[head.id] = replace(ops.get(head.id, OpPlan()), core_split=dict(split), core_slices=None)
    for oid in members[1:]:
        w = result_split(head, split, prims[oid], shapes)
        if w is None or not legal(prims[oid], w):
            return []
        ops[oid] = replace(ops.get(oid, OpPlan()), core_split=w, core_slices=None)
    return [ops]


def _slices_of(prim: PrimOp, plan: OpPlan) -> list[tuple[int, dict]]:
    split = {k: v for k, v in plan.core_split.items() if v > 1}
    if plan.core_slices is not None:
        return [(c, dict(sl)) for c, sl in plan.core_slices]
    return [(cs.core, dict(cs.slice)) for cs in default_core_slices(prim, split)]


def _relabel_producer(pg: PrimGraph, program: Program, d: PlanDecisions, tensor: str, hw) -> Optional[dict]:
    """When `tensor`'s readers (pointwise, reduce or copy ops) each read, on every core, a box
    some one core of its producer makes, but on another core than the one that made it
    (the producer's and the readers' natural core orders enumerate the same slices in
    another order: a bias add split rows x columns feeding a head permute split heads x
    rows): `d.ops` with the producer's side relabelled instead of the readers moved. The
    side is every op joined to the producer through an LX-resident tensor other than
    `tensor` (whole or a tile buffer, both ways: a kernel's members, a held operand's
    producer and its other readers); each of its ops runs the work slice it ran on core h
    on core pi(h) now, pi the matching under which each reader core reads what its own core
    made. Every read inside the side stays a same-core read (the whole side moves alike);
    device memory does not care which core reads it. None when there is no such matching,
    the side reaches a reader of `tensor`, or a side op is a restickify or an alias."""
    prims = {op.id: op for op in pg.ops}
    producer = next((op for op in pg.ops if op.output.tensor == tensor), None)
    if producer is None or producer.id not in d.ops:
        return None
    layouts = {t.id: t.layout for t in program.tensors}
    dtypes = {t.id: t.dtype for t in program.tensors}
    shapes = {t.id: tuple(t.shape) for t in program.tensors}
    readers = [op for op in pg.ops if any(a.tensor == tensor for a in op.inputs)]
    if not readers or any(r.body.kind not in ("pointwise", "reduce", "copy") or d.ops.get(r.id, OpPlan()).alias
                          for r in readers):
        return None
    made = _made_boxes(producer, d.ops[producer.id], shapes, layouts, dtypes, hw)
    # per reader core, every box it reads of `tensor`
    need: dict[int, list] = {}
    for r in readers:
        plan = d.ops.get(r.id, OpPlan())
        split = {k: v for k, v in plan.core_split.items() if v > 1}
        slices = ([CoreSlice(core=c, slice=dict(sl)) for c, sl in plan.core_slices] if plan.core_slices is not None
                  else default_core_slices(r, split))
        ranges = core_ranges(r, split, slices, op_granules(r, layouts, dtypes, hw.stick_bytes))
        for c, rg in ranges.items():
            need.setdefault(c, []).extend(operand_box(r, i, rg, shapes[tensor], copy_reads=r.body.kind == "copy")
                                          for i, a in enumerate(r.inputs) if a.tensor == tensor)
    if set(need) == set(made) and all(all(box_contains(made[c], b) for b in bs) for c, bs in need.items()):
        return None  # the readers read what their own cores made already: `_follow_split`'s case
    if set(need) != set(made):
        return None   # pi must permute the producer's own cores (a side op on more keeps the rest)
    pi: dict[int, int] = {}   # producer core -> reader core
    free = dict(made)
    for c in sorted(need):
        h = next((h for h, m in sorted(free.items()) if all(box_contains(m, b) for b in need[c])), None)
        if h is None:
            return None
        del free[h]
        pi[h] = c
    # the producer's side: ops joined to it through held tensors other than `tensor`
    by_tensor_readers: dict[str, list[str]] = {}
    for op in pg.ops:
        for a in op.inputs:
            by_tensor_readers.setdefault(a.tensor, []).append(op.id)
    writer = {op.output.tensor: op.id for op in pg.ops}
    reader_ids = {r.id for r in readers}
    side, queue = {producer.id}, [producer.id]
    while queue:
        o = queue.pop()
        for t in [a.tensor for a in prims[o].inputs] + [prims[o].output.tensor]:
            if t == tensor or t not in d.resident:
                continue
            for x in [writer.get(t)] + by_tensor_readers.get(t, []):
                if x is None or x in side:
                    continue
                if x in reader_ids or d.ops.get(x, OpPlan()).alias:
                    return None
                side.add(x)
                queue.append(x)
    outs = {prims[o].output.tensor for o in side}
    if any(o.src in outs and o.dst in d.resident for o in program.ops if o.kind in ("restickify", "relayout")):
        return None   # a held restickified copy on the side: its slices are not relabelled here
    ops = dict(d.ops)
    for o in side:
        plan = ops.get(o, OpPlan())
        ops[o] = replace(plan, core_slices=sorted(((pi.get(c, c), sl) for c, sl in _slices_of(prims[o], plan)),
                                                  key=lambda x: x[0]))
    return ops
