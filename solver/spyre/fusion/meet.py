"""Two kernels meeting on one split (used by `hold.hold_in_lx` where neither side can give way).

A result handed between kernels through device memory can be held in LX when its readers take
the producer's split (`hold._follow_split`) or a producing matmul takes theirs
(`hold._lead_split`). Between two pointwise/reduce kernels neither may be possible: an RMSNorm's
fp32 input is made on 32 row slices (with the row statistics), while the kernel applying the
norm reads a per-row vector sticked along the rows that allows at most 16 row slices, so it
runs on 32 column slices; the 8 MiB input is written and read back (granite prefill,
deterministic, 2026-12-02: 108.5 + 57.0 us for a 4096-wide norm). Here both kernels move to a
common split of the result's dims, each member carried from the op whose result it reads
(`split_maps.split_through`), keeping its tile count where the new slices allow it.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from target.op_rules import legal_core_splits
from target.primitives import PrimGraph, PrimOp
from target.geometry import op_granules
from target.superdsc import Program
from solver.plan import OpPlan, PlanDecisions
from solver.spyre.fusion.split_maps import factored_split, nearby_factors, result_split, split_through
from solver.spyre.tile_buffers import kernel_numbers

_MOVABLE = ("pointwise", "reduce")


def meet_splits(pg: PrimGraph, program: Program, d: PlanDecisions, tensor: str, hw
                ) -> list[tuple[dict, set[str], list[str]]]:
    """Alternatives (ops, LX residencies to drop, the ops to start bundles: each moved
    kernel's first member) that put the kernel making `tensor` and the
    kernels (or lone ops) reading it on one common split of `tensor`'s non-unit dims, on the
    producer's core count; the factorings nearest the producer's own first. [] when an op
    that would move is not pointwise or reduce (matmul kernels are `_lead_split`'s and
    `_kernel_follows`' cases) or no factoring carries through every op."""
    prims = {op.id: op for op in pg.ops}
    producer = {t: op.id for t, op in pg.producer().items()}
    readers = {t: [op.id for op in ops] for t, ops in pg.consumers().items()}
    p = producer.get(tensor)
    if p is None:
        return []
    index = {o.id: k for k, o in enumerate(program.ops)}
    kernel = {program.ops[k].id: n for k, n in kernel_numbers(program).items()}
    members: dict[int, list[str]] = {}
    for o, n in kernel.items():
        members.setdefault(n, []).append(o)

    def group(o: str) -> list[str]:
        return members[kernel[o]] if o in kernel else [o]
    moving = set(group(p))
    for r in readers.get(tensor, []):
        moving |= set(group(r))
    if any(o not in prims or prims[o].body.kind not in _MOVABLE or d.ops.get(o, OpPlan()).alias for o in moving):
        return []
    order = sorted(moving, key=lambda o: index.get(o, len(index)))
    layouts = {t.id: t.layout for t in program.tensors}
    dtypes = {t.id: t.dtype for t in program.tensors}
    shapes = {t.id: tuple(t.shape) for t in program.tensors}
    prod = prims[p]
    cur = {k: v for k, v in d.ops.get(p, OpPlan()).core_split.items() if v > 1}
    cores = 1
    for f in cur.values():
        cores *= f
    if len([n for n in shapes[tensor] if n != 1]) != 2:
        return []
    factorings = [(a, cores // a) for a in (2 ** k for k in range(cores.bit_length())) if cores % a == 0]
    now = next((f for f in factorings if factored_split(prod, shapes[tensor], f) == cur), None)
    if now is None:
        return []
    out = []
    for f in nearby_factors(now, cores.bit_length())[1:]:  # every other factoring, nearest first
        p_split = factored_split(prod, shapes[tensor], f)
        if p_split is None:
            continue
        got = _carried(prims, producer, order, p, p_split, shapes, layouts, dtypes, hw)
        if got is None:
            continue
        ops = dict(d.ops)
        for o, split in got.items():
            plan = ops.get(o, OpPlan())
            ops[o] = replace(plan, core_split=dict(split), core_slices=None,
                             temporal_tiles=tiles_that_fit(prims[o], split, plan.temporal_tiles,
                                                           op_granules(prims[o], layouts, dtypes, hw.stick_bytes)))
        heads = [group(o)[0] for o in order if o in kernel and group(o)[0] == o]
        out.append((ops, _residencies_lost(pg, d, set(got), tensor, readers), heads))
    return out


def _carried(prims: dict[str, PrimOp], producer: dict[str, str], order: list[str], p: str, p_split: dict[str, int],
             shapes: dict, layouts: dict, dtypes: dict, hw) -> Optional[dict[str, dict[str, int]]]:
    """Each moving op's split: the producer's `p_split`, then each op in program order the
    split that reads what the moving op it reads from made (`split_through`), or, reading
    none, the same split of a same-shaped result (`result_split`). None when one has none
    or it is not legal for it."""
    got = {p: p_split}
    for o in order:
        if o == p:
            continue
        prim = prims[o]
        want = None
        for a in prim.inputs:
            src = producer.get(a.tensor)
            if src in got:
                want = split_through(prims[src], got[src], prim, a.tensor)
                break
        else:
            want = next((s for s in (result_split(prims[m], got[m], prim, shapes) for m in got) if s is not None), None)
        if want is None or want not in legal_core_splits(prim, op_granules(prim, layouts, dtypes, hw.stick_bytes),
                                                         hw.cores):
            return None
        got[o] = want
    return got


def tiles_that_fit(prim: PrimOp, split: dict[str, int], tiles: dict[str, int], gran: dict[int, int]) -> dict[str, int]:
    """The op's tile count where its new per-core slice along the tiled dim still holds that
    many whole split units (`gran`: elements a unit, per iteration dim), else the most that
    do (halving)."""
    out = {}
    for name, t in tiles.items():
        i = next((k for k, d in enumerate(prim.iter_dims) if d.name == name), None)
        if i is None:
            continue
        units = prim.iter_dims[i].size // max(1, split.get(name, 1)) // max(1, gran.get(i, 1))
        while t > 1 and (t > units or units % t):
            t //= 2
        if t > 1:
            out[name] = t
    return out


def _residencies_lost(pg: PrimGraph, d: PlanDecisions, moved: set[str], tensor: str, readers: dict) -> set[str]:
    """LX residencies the move breaks: tile buffers of moved ops (placed again by the trial),
    whole results a moved op reads from an op that did not move, and moved ops' whole
    results some op that did not move reads."""
    made = {op.id: op.output.tensor for op in pg.ops}
    producer = {t: op.id for t, op in pg.producer().items()}
    drop = set()
    for o in moved:
        r = d.resident.get(made[o])
        if r is not None and (r.per_tile or any(x not in moved for x in readers.get(made[o], []))):
            drop.add(made[o])
        for a in next(op for op in pg.ops if op.id == o).inputs:
            held = d.resident.get(a.tensor)
            if held is not None and a.tensor != tensor and producer.get(a.tensor) not in moved:
                drop.add(a.tensor)
    return drop
