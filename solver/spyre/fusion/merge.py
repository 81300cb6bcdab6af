"""Merging kernels after the combination (steps of the search): adjacent tiled runs as one
kernel where a trial shows that valid and faster (`merge_adjacent`), and, with `reorder`,
matmuls reading one tensor moved next to each other in the op order and merged the same
way (`merge_siblings`, the order from `_sibling_order`)."""
from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Optional

from target.op_rules import legal_core_splits
from target.primitives import PrimGraph
from target.geometry import core_ranges, default_core_slices, op_granules, operand_box, parsed_prim
from target.superdsc import Program, fused_group_key
from solver.emit import emit_program
from solver.plan import OpPlan, PlanDecisions
from solver.spyre.fusion.runs import OwnCores, assign_tiles, find_runs, tile_dims
from solver.spyre.fusion.split_maps import from_head
from solver.spyre.fusion.trial import issues_of, trial


def merge_adjacent(pg: PrimGraph, hw, tr: tuple, runs: list[list[str]], deadline: Optional[float],
                   trial_s: float, heads: Optional[set[str]] = None) -> tuple:
    """Adjacent tiled runs as one kernel where that is valid and faster: one run takes the
    other's tile count (and, where both are headed by matmuls, the other head's core
    split, its members following), and the bundle cut `runs.with_tiles` put between them goes.
    A matmul heading the second run then runs inside the first's tile loop: its loads
    overlap the first's compute, and an input the first kernel already loaded (e.g. the
    gate and up projections of a gated MLP reading the same normalized rows) is not
    loaded again. Greedy along the program, each step validated and simulated. `heads`:
    only pairs with a run headed by one of these ops are tried."""
    fused_d, prog, rep = tr
    for a, b in zip(runs, runs[1:]):
        if heads is not None and a[0] not in heads and b[0] not in heads:
            continue
        pos = {o.id: k for k, o in enumerate(prog.ops)}
        cores = {o.id: o.num_cores_used for o in prog.ops}
        tiles = {o: fused_d.ops[o].temporal_tiles for o in a + b
                 if o in fused_d.ops and fused_d.ops[o].temporal_tiles}
        if a[0] not in tiles or b[0] not in tiles or b[0] not in fused_d.bundle_starts:
            continue
        if pos.get(b[0]) != pos.get(a[-1], -2) + 1 or cores.get(a[0]) != cores.get(b[0]):
            continue
        starts = [x for x in fused_d.bundle_starts if x != b[0]]
        cands = []
        for src, dst in ((a, b), (b, a)):
            t = max(tiles[src[0]].values())
            ops = dict(fused_d.ops)
            for o in dst:
                if o in tiles:
                    ops[o] = replace(ops[o], temporal_tiles={dim: t for dim in tiles[o]})
            cands.append(replace(fused_d, ops=ops, bundle_starts=starts))
            aligned = _aligned_heads(prog, hw, ops, src[0], dst)
            if aligned is not None:
                cands.append(replace(fused_d, ops=aligned, bundle_starts=starts,
                                     resident={x: r for x, r in fused_d.resident.items() if not r.per_tile}))
        # the first head on a coarser split of the input both heads read, so the second
        # reads its whole box on chip: with b's run at a's tile count, and with only b's
        # head at it (a K-tiled head's members are a kernel of their own after it)
        heads_only = dict(fused_d.ops)
        heads_only[b[0]] = replace(heads_only[b[0]], temporal_tiles=dict(tiles[a[0]]))
        for base in (cands[0].ops, heads_only):
            nested = _nested_heads(prog, hw, base, a, b)
            if nested is not None:
                cands.append(replace(fused_d, ops=nested, bundle_starts=starts,
                                     resident={x: r for x, r in fused_d.resident.items() if not r.per_tile}))
        # a member left untiled (it read a producer's result off its own cores) may read it
        # on them once the merge re-split the producer: tried inside the kernel too
        cands += [j for j in (_with_joining_members(pg, hw, c, a + b) for c in cands) if j is not None]
        for cand in cands:
            if deadline is not None and time.perf_counter() + trial_s > deadline:
                return fused_d, prog, rep
            out = trial(pg, hw, cand)
            if out is not None and out[2].total_us < rep.total_us and not issues_of(out, hw):
                fused_d, prog, rep = out
    return fused_d, prog, rep


def _with_joining_members(pg: PrimGraph, hw, cand: PlanDecisions, members: list[str]
                          ) -> Optional[PlanDecisions]:
    """`cand` (two runs merged at one tile count) with its untiled members that can now take
    that count tiled as well (`runs.assign_tiles` on the merged plan's program: a member
    joins where its own cores wrote what it reads of the kernel's results); None when no
    member joins, the plan does not emit, or the kernel's tiled members would be tiled
    otherwise (a K-tiled head: the tiles the merge chose stay as they are)."""
    tiled = {o: dict(cand.ops[o].temporal_tiles) for o in members
             if o in cand.ops and cand.ops[o].temporal_tiles}
    counts = {t for x in tiled.values() for t in x.values()}
    if len(counts) != 1 or len(tiled) == len(members):
        return None
    try:
        prog = emit_program(pg, hw, cand)
    except ValueError:
        return None
    own = OwnCores(prog, hw)
    got = assign_tiles(members, tile_dims(prog, hw), counts.pop(), own.prims, own)
    if any(got.get(o) != x for o, x in tiled.items()):
        return None
    joining = {o: x for o, x in got.items() if o not in tiled}
    if not joining:
        return None
    ops = dict(cand.ops)
    for o, x in joining.items():
        ops[o] = replace(ops.get(o, OpPlan()), temporal_tiles=dict(x))
    # a result made inside the kernel and held whole in LX for a member now in it: the
    # trial places tile buffers afresh
    made = {op.output.tensor for op in pg.ops if op.id in set(members)}
    return replace(cand, ops=ops, resident={t: r for t, r in cand.resident.items()
                                            if not (t in made and not r.per_tile)})


def _aligned_heads(prog: Program, hw, ops: dict, head_a: str, run_b: list[str]) -> Optional[dict]:
    """`ops` with run b's heading matmul on run a's heading matmul's core split (where
    legal for it), and b's members on that split of b's result; None when there is
    nothing to align."""
    prims = {o.id: parsed_prim(o.prim) for o in prog.ops if o.prim is not None}
    ha, hb = prims.get(head_a), prims.get(run_b[0])
    if ha is None or hb is None or ha.body.kind != "matmul" or hb.body.kind != "matmul":
        return None
    split = {k: v for k, v in ops[head_a].core_split.items() if v > 1}
    if split == {k: v for k, v in ops[run_b[0]].core_split.items() if v > 1}:
        return None
    layouts = {t.id: t.layout for t in prog.tensors}
    dtypes = {t.id: t.dtype for t in prog.tensors}
    shapes = {t.id: tuple(t.shape) for t in prog.tensors}
    if split not in legal_core_splits(hb, op_granules(hb, layouts, dtypes, hw.stick_bytes), hw.cores):
        return None
    return _run_on_split(ops, hb, run_b, split, prims, shapes, layouts, dtypes, hw)


def _run_on_split(ops: dict, head, run: list[str], split: dict, prims: dict, shapes: dict, layouts: dict,
                  dtypes: dict, hw) -> dict:
    """`ops` with the run's heading matmul `head` on `split` and each member after it on
    the split of the head's result that split makes (where legal for the member)."""
    out = dict(ops)
    out[head.id] = replace(out[head.id], core_split=dict(split), core_slices=None)
    want_of = from_head(head, split, shapes)
    for oid in run[1:]:
        want = want_of(prims[oid]) if want_of is not None else None
        gran = op_granules(prims[oid], layouts, dtypes, hw.stick_bytes)
        if want is not None and oid in out and want in legal_core_splits(prims[oid], gran, hw.cores):
            out[oid] = replace(out[oid], core_split=want, core_slices=None)
    return out


def _contains(outer, inner) -> bool:
    return all(a0 <= a and b <= b0 for (a0, b0), (a, b) in zip(outer, inner) if b > a)


def _nested_heads(prog: Program, hw, ops: dict, run_a: list[str], run_b: list[str]) -> Optional[dict]:
    """`ops` with run a's heading matmul (the earlier) on the split of its stick choice under
    which every core loads a box of the input both heads read that contains the box run b's
    head reads on that core, on as many cores, the smallest such box, and a's members on
    that split of a's result; None when the heads share no input, a's split already nests
    (the plain merge has it), or no split but a's and b's own (`_aligned_heads`) does.
    In one kernel the timing model serves a later member's read inside a box the same core
    loaded earlier on chip, so b's head does not load the shared input again: a gated MLP's
    up projection on m4 x n8 before the gate projection on m8 x n4 (each core's 128 rows
    hold the gate's 64), where one split for both either loads the rows twice or, m8 x n4
    for both, leaves neither the LX to double-buffer its weight stream."""
    prims = {o.id: parsed_prim(o.prim) for o in prog.ops if o.prim is not None}
    by_id = {o.id: o for o in prog.ops}
    ha, hb = prims.get(run_a[0]), prims.get(run_b[0])
    if ha is None or hb is None or ha.body.kind != "matmul" or hb.body.kind != "matmul":
        return None
    shared = [(i, j) for i, x in enumerate(ha.inputs) for j, y in enumerate(hb.inputs) if x.tensor == y.tensor]
    if not shared:
        return None
    ia, ib = shared[0]
    layouts = {t.id: t.layout for t in prog.tensors}
    dtypes = {t.id: t.dtype for t in prog.tensors}
    shapes = {t.id: tuple(t.shape) for t in prog.tensors}
    x_shape = shapes[ha.inputs[ia].tensor]
    gran_a = op_granules(ha, layouts, dtypes, hw.stick_bytes)
    gran_b = op_granules(hb, layouts, dtypes, hw.stick_bytes)
    split_b = {k: v for k, v in by_id[hb.id].core_split.items() if v > 1}
    want = {c: operand_box(hb, ib, r, x_shape)
            for c, r in core_ranges(hb, split_b, by_id[hb.id].core_slices, gran_b).items()}

    def nests(sp: dict, slices) -> Optional[dict]:
        got = core_ranges(ha, sp, slices, gran_a)
        if set(got) != set(want):
            return None
        boxes = {c: operand_box(ha, ia, r, x_shape) for c, r in got.items()}
        return boxes if all(_contains(boxes[c], want[c]) for c in want) else None
    current = {k: v for k, v in ops[ha.id].core_split.items() if v > 1}
    if current != split_b and nests(current, by_id[ha.id].core_slices) is not None:
        return None      # the plain merge has it
    best, best_size = None, None
    for sp in legal_core_splits(ha, gran_a, hw.cores):
        boxes = nests(sp, default_core_slices(ha, sp)) if sp not in (split_b, current) else None
        if boxes is None:
            continue
        size = max(math.prod(b - a for a, b in box) for box in boxes.values())
        if best_size is None or size < best_size:
            best, best_size = sp, size
    if best is None:
        return None
    return _run_on_split(ops, ha, run_a, best, prims, shapes, layouts, dtypes, hw)


def merge_siblings(pg: PrimGraph, hw, tr: tuple, deadline: Optional[float], trial_s: float) -> tuple:
    """Matmuls that read one tensor but each head a chain of their own (`chain_order` runs
    each chain straight into its consumer, so their consumers sit between them) moved next to
    each other (`_sibling_order`) and merged into one kernel by `merge_adjacent`: the kernel
    loads the common input once and overlaps one matmul's weight stream with another's
    compute. Kept only when the merged program is valid and faster; else `tr` as it was."""
    fused_d, prog, rep = tr
    found = _sibling_order(pg, prog, fused_d)
    if found is None or (deadline is not None and time.perf_counter() + 2 * trial_s > deadline):
        return tr
    order, group = found
    moved = trial(pg, hw, replace(fused_d, op_order=order))
    if moved is None or issues_of(moved, hw):
        return tr
    graph_ops = {op.id for op in pg.ops}
    runs = find_runs(moved[1], tile_dims(moved[1], hw), graph_ops)
    merged = merge_adjacent(pg, hw, moved, runs, deadline, trial_s, heads=group)
    if merged[2].total_us < rep.total_us and not issues_of(merged, hw):
        return merged
    return tr


def _sibling_order(pg: PrimGraph, program: Program, d: PlanDecisions) -> Optional[tuple[list[str], set[str]]]:
    """The program's op order with each group of tiled matmuls that read one tensor (the
    query, key and value projections of one normalized input) next to each other: each
    later one's kernel (the matmul heading a bundle, `runs.with_tiles`, and the members after it,
    e.g. a bias add) moves up to right after the group's kernels so far, where every operand
    its ops read is made by then. Returns the order and the matmuls of the groups that
    changed; None when nothing moves."""
    graph_ops = {op.id for op in pg.ops}
    order = [o.id for o in program.ops if o.id in graph_ops]
    if len(order) != len(pg.ops):
        return None
    prims = {op.id: op for op in pg.ops}
    producer = {op.output.tensor: op.id for op in pg.ops}
    block: dict[str, list[str]] = {}  # kernel head -> its ops in order
    ops = program.ops
    for k, o in enumerate(ops):
        key = fused_group_key(o)
        if key is None or o.id not in d.bundle_starts or o.opfunc != "matmul" or o.id not in graph_ops:
            continue
        members = [o.id]
        for nxt in ops[k + 1:]:
            if nxt.id in d.bundle_starts or fused_group_key(nxt) != key or nxt.id not in graph_ops:
                break
            members.append(nxt.id)
        block[o.id] = members
    readers: dict[str, list[str]] = {}
    for oid in order:
        if oid in block:
            for t in dict.fromkeys(a.tensor for a in prims[oid].inputs):
                readers.setdefault(t, []).append(oid)
    out = list(order)
    moved: set[str] = set()
    grouped: set[str] = set()  # the heads of groups that changed
    for group in readers.values():
        group = [o for o in group if o not in moved]
        if len(group) < 2:
            continue
        last = group[0]
        for head in group[1:]:
            pos = {o: k for k, o in enumerate(out)}
            end = pos[block[last][-1]]
            if pos[head] == end + 1:
                last = head
                continue
            mine = set(block[head])
            deps = [producer[a.tensor] for m in block[head] for a in prims[m].inputs
                    if a.tensor in producer and producer[a.tensor] not in mine]
            if pos[head] < end or any(pos[p] > end for p in deps):
                continue
            for m in block[head]:
                out.remove(m)
            at = out.index(block[last][-1]) + 1
            out[at:at] = block[head]
            moved.add(head)
            grouped.update((last, head))
            last = head
    return (out, grouped) if moved else None
