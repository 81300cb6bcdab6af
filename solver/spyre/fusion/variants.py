"""Split variants, the alternatives to the planned core splits the search tries per run
(step 1 of the search, `split_variants`).

The CP-SAT model prices ops one by one, so the ops of a chain often take different core
splits, and a member reads on chip only what its own core wrote. A variant gives every
non-matmul member of each run the w-th most byte-heavy split among the run's members (where
that split is legal for it), in one variant also to a heading matmul (the same split of its
result, mapped through the result's tensor dims: `head_split`), and drops the LX
residencies the change invalidates; one more gives the members the heading matmul's split
of its result (`from_head`). A member whose own dims do not carry the variant's split takes
the one under which it reads what its in-run producer's core wrote (`from_producer`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from target.op_rules import legal_core_splits
from target.primitives import PrimGraph
from target.geometry import layout_nbytes, op_granules, parsed_prim
from target.superdsc import Program
from solver.plan import OpPlan, PlanDecisions
from solver.spyre.fusion.runs import without_run_cuts
from solver.spyre.fusion.split_maps import from_head, from_producer, head_split

# Alternatives to the plan tried per run: (which of the run's splits, None: the planned
# splits without the residencies inside the run; whether a heading matmul takes it too).
SPLIT_VARIANTS = ((None, False), (0, False), (0, True), (1, False), ("head", False))


@dataclass
class Variant:
    """The plan with each run's members on one core split (index `which` among the splits
    the run's members have; 0 = as planned), with the residency it invalidates dropped."""
    decisions: PlanDecisions
    changed: dict[str, set[str]]        # run head -> ops whose split changed
    dropped_resident: dict[str, set[str]]  # run head -> residencies dropped for it


def split_variants(pg: PrimGraph, hw, d: PlanDecisions, program: Program, runs: list[list[str]],
                   align=SPLIT_VARIANTS) -> list[Variant]:
    """The plan without the planner's bundle cuts inside runs (variant 0), then each
    alternative of `align` (`SPLIT_VARIANTS`) that changes something and is no plan an
    earlier one gave (a trial is worth one plan)."""
    joined = without_run_cuts(d, runs)
    variants: list[Variant] = [Variant(joined, {}, {})]
    seen = {_signature(variants[0].decisions)}
    for which, with_head in align:
        v = _variant(pg, hw, joined, program, runs, which, with_head)
        if v is not None and _signature(v.decisions) not in seen:
            seen.add(_signature(v.decisions))
            variants.append(v)
    return variants


def _signature(d: PlanDecisions) -> tuple:
    """What a split variant changes: every op's core split and the residencies."""
    return (tuple(sorted((k, tuple(sorted(p.core_split.items()))) for k, p in d.ops.items())),
            tuple(sorted(d.resident)))


def _split_candidates(program: Program, run: list[str]) -> list[dict[str, int]]:
    """The distinct core splits of the run's non-matmul members (a matmul heading the run
    keeps its own), the one of the member moving the most bytes first (the op a common
    split should suit)."""
    ops = {o.id: o for o in program.ops}
    sizes = {t.id: t for t in program.tensors}
    def weight(oid: str) -> int:
        prim = ops[oid].prim
        names = [a["tensor"] for a in prim["inputs"]] + [prim["output"]["tensor"]]
        return sum(layout_nbytes(sizes[n].layout, sizes[n].dtype) for n in names)
    out: list[dict[str, int]] = []
    for oid in sorted((o for o in run if ops[o].opfunc != "matmul"), key=lambda o: -weight(o)):
        sp = {k: v for k, v in ops[oid].core_split.items() if v > 1}
        if sp not in out:
            out.append(sp)
    return out


def _variant(pg: PrimGraph, hw, d: PlanDecisions, program: Program, runs: list[list[str]],
             which: Optional[int], with_head: bool) -> Optional[Variant]:
    """`which` None: the planned splits, with the LX residencies the solve gave results made
    and used up inside a run dropped (whole-slice buffers crowd a kernel's LX: as tile
    buffers they take a tile's worth)."""
    prims = {o.id: parsed_prim(o.prim) for o in program.ops if o.prim is not None}
    layouts = {t.id: t.layout for t in program.tensors}
    dtypes = {t.id: t.dtype for t in program.tensors}
    ops = dict(d.ops)
    changed: dict[str, set[str]] = {}
    shapes = {t.id: tuple(t.shape) for t in program.tensors}
    for run in runs:
        if which == "head":
            want_of = from_head(prims[run[0]], ops.get(run[0], OpPlan()).core_split, shapes)
            if want_of is None:
                continue
            want = None
        else:
            cands = _split_candidates(program, run)
            if which is None or which >= len(cands):
                continue
            want = cands[which]
        made: dict[str, str] = {}  # result tensor -> the run member making it
        for oid in run:
            prim = prims[oid]
            made[prim.output.tensor] = oid
            if prim.body.kind == "matmul":
                continue
            if which == "head":
                want = want_of(prim)
            mine = want
            if mine is None or not all(n in {x.name for x in prim.iter_dims} for n in mine):
                # e.g. a reduction over a split dim: the split that reads the box its
                # producer's cores wrote, mapped through the tensor it reads
                mine = from_producer(prim, made, prims, ops)
                if mine is None:
                    continue
            cur = {k: v for k, v in ops.get(oid, OpPlan()).core_split.items() if v > 1}
            if cur == mine:
                continue
            gran = op_granules(prim, layouts, dtypes, hw.stick_bytes)
            if mine not in legal_core_splits(prim, gran, hw.cores):
                continue
            ops[oid] = replace(ops.get(oid, OpPlan()), core_split=dict(mine), core_slices=None)
            changed.setdefault(run[0], set()).add(oid)
        head = prims[run[0]]
        if with_head and which != "head" and head.body.kind == "matmul":
            # the heading matmul takes the same split of its result as the chain reading it,
            # so the chain reads it on chip (mapped through the tensor's dims)
            split = head_split(head, [prims[o] for o in run[1:]], want)
            if split is not None:
                gran = op_granules(head, layouts, dtypes, hw.stick_bytes)
                cur = {k: v for k, v in ops.get(head.id, OpPlan()).core_split.items() if v > 1}
                if split != cur and split in legal_core_splits(head, gran, hw.cores):
                    ops[head.id] = replace(ops.get(head.id, OpPlan()), core_split=split, core_slices=None)
                    changed.setdefault(run[0], set()).add(head.id)
    touched: dict[str, set[str]] = {}
    all_changed = set().union(*changed.values()) if changed else set()
    resident = dict(d.resident)
    run_of = {oid: run[0] for run in runs for oid in run}
    for t in list(resident):
        users = {o.id for o in pg.ops if o.output.tensor == t or any(a.tensor == t for a in o.inputs)}
        heads = {run_of.get(u) for u in users}
        if which is None and len(heads) == 1 and None not in heads:
            del resident[t]   # made and used up inside one run
            touched.setdefault(heads.pop(), set()).add(t)
        elif users & all_changed:
            del resident[t]
            for head, ch in changed.items():
                if users & ch:
                    touched.setdefault(head, set()).add(t)
    if not changed and not touched:
        return None
    return Variant(replace(d, ops=ops, resident=resident), changed, touched)
