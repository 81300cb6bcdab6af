"""Fused coarse-tiled kernels: core splits, temporal tiles and tile buffers for runs of
consecutive compute ops.

The timing model (`simulator.superdsc.fused_group_key`, `simulator.timing` `close_group`)
runs consecutive compute ops of one bundle with the same temporal tiling (T > 1) on the
same core count as one coarse-tiled fused kernel, as torch-spyre's back end does: each
core loads each box of an external device-memory tensor once, a member's result is on chip
for later members on the same core, loads and compute of all members overlap across the
tile loop, and the loop overhead is paid once. A result only the kernel uses can then be a tile buffer
(`solver.spyre.tile_buffers`): it is never written whole. Against that stand the costs of tiling:
a small per-tile stream underfills, double buffering needs LX room, a working set past the
spill knee derates. Whether a run gains is therefore a question for the simulator itself.

The search, over the runs of the emitted plan (`_runs`: consecutive tileable graph ops on
one core count; a matmul only heads a run, and one whose reduction dim is split across
cores joins none, since its partial sums are combined after the loop):
1. split variants (`_variant`): the CP-SAT model prices ops one by one, so the ops of a
   chain often take different core splits, and a member reads on chip only what its own
   core wrote. A variant gives every non-matmul member of each run the w-th most
   byte-heavy split among the run's members (where that split is legal for it), in one
   variant also to a heading matmul (the same split of its result, mapped through the
   result's tensor dims: `_head_split`), and drops the LX residencies the change
   invalidates (`SPLIT_VARIANTS`); one more gives the members the heading matmul's split
   of its result (`_from_head`). The planner's bundle cuts inside runs go. A member
   reading an earlier member's result is tiled along the dim that walks the same tensor
   dim as its producer's tiles (`_assign`), so its tile j needs what the producer wrote in
   tile j.
2. stage 1: one whole-program trial per variant at the middle tile count; each run keeps
   the variant that is fastest for it (or the plan as it was).
3. stage 2: on the chosen splits, one trial per other tile count; each run keeps its
   fastest tile count.
4. the combination: each tiled run starts a bundle, so adjacent runs never merge by
   accident (`_with_tiles`); runs the validator names in an invalid combination go back
   to as planned (`_runs_named`); then adjacent runs are merged into one kernel where a
   trial shows that valid and faster (`_merge_adjacent`: e.g. a gated MLP's gate and up
   projections, loading their common input once).
5. with `reorder`, matmuls reading one tensor (query, key and value projections) move next
   to each other in the op order, their kernels whole, and are merged the same way
   (`_merge_siblings`).
6. results still handed from a kernel to later ops through device memory are held whole
   in LX where their readers can take (`_follow_split`), or their producer or the reading
   kernel can give (`_lead_split`, `_kernel_follows`), the split that reads what each core
   made (`_hold_in_lx`).
Every trial emits, adds the tile buffers the validator accepts and simulates; runs are
separated by ops outside any kernel, so their times add up independently. The combination
of the per-run choices is emitted, validated and simulated once more; per-run choices
interact (a changed split moves residencies and bundle cuts next to the run), so the
fastest valid whole trial is kept too, and the faster of the two is kept only if it is
faster than the plan the pass started from. Nothing here is keyed on op names or shapes.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Optional

from lowering.primitives import PrimGraph, PrimOp, op_from_json
from lowering.op_rules import legal_core_splits, split_units
from simulator.geometry import box_contains, core_ranges, layout_nbytes, op_granules, operand_box, reduction_split
from simulator.superdsc import Program, fused_group_key
from simulator.timing import TimingReport, time_program
from simulator.validate import validate_program
from solver.emit import emit_program
from solver.plan import OpPlan, PlanDecisions
from solver.spyre.tile_buffers import add_tile_buffers, add_whole_residencies, kernel_numbers, whole_candidates

TILE_COUNTS = (2, 4, 8, 16, 32, 64)
# Alternatives to the plan tried per run: (which of the run's splits, None: the planned
# splits without the residencies inside the run; whether a heading matmul takes it too).
SPLIT_VARIANTS = ((None, False), (0, False), (0, True), (1, False), ("head", False))
# whole-program trials of one search: each variant at the middle tile count, then the rest
FUSION_TRIALS = 1 + len(SPLIT_VARIANTS) + len(TILE_COUNTS) - 1
# results handed between kernels through device memory that `_hold_in_lx` tries to keep in
# LX (the largest first), and the smallest it tries
HOLD_TRIALS = 6
HOLD_MIN_BYTES = 1 << 20
# trials of `_fewer_tiles` (two per kernel), and the least a kernel must lose to underfill
# and loop overhead (us) to be tried
RETILE_TRIALS = 8
RETILE_MIN_US = 5.0
# times an invalid combination of per-run choices is retried with the runs it names as planned
REPAIR_ROUNDS = 2
_FUSABLE_BODIES = frozenset({"pointwise", "reduce", "matmul"})


@dataclass
class FusionResult:
    decisions: PlanDecisions
    program: Program
    report: TimingReport
    base_us: float                # simulated time of the plan before this pass
    fused_us: float               # simulated time of the returned plan
    groups: int = 0               # runs given temporal tiles
    notes: list[str] = field(default_factory=list)


def _tile_dims(program: Program, hw) -> dict[str, list[tuple[str, int]]]:
    """Per fusable op, the parallel iteration dims it can be tiled along, best first: (dim,
    the most tiles it can take there = the fewest whole split units any of its cores has
    on that dim)."""
    layouts = {t.id: t.layout for t in program.tensors}
    dtypes = {t.id: t.dtype for t in program.tensors}
    out: dict[str, list[tuple[str, int]]] = {}
    for o in program.ops:
        if o.kind != "compute" or o.alias or o.prim is None:
            continue
        prim = op_from_json(o.prim)
        if prim.body.kind not in _FUSABLE_BODIES:
            continue
        split = {n: f for n, f in o.core_split.items() if f > 1}
        if prim.body.kind == "matmul" and reduction_split(prim, split):
            continue  # partial sums are combined after the tile loop: no epilogue can fuse
        gran = op_granules(prim, layouts, dtypes, hw.stick_bytes)
        ranges = core_ranges(prim, split, o.core_slices, gran)
        # a coarse-tiled kernel walks row tiles: prefer a dim outside the output's stick dim,
        # so the members of a group tile the same rows
        st = layouts[prim.output.tensor].stick_dim
        stick_iter = prim.output.dims[st] if st is not None and st < len(prim.output.dims) else None
        cands = []
        for i, d in enumerate(prim.iter_dims):
            if d.kind != "parallel":
                continue
            units = min(split_units(r[i][1] - r[i][0], gran.get(i, 1)) for r in ranges.values())
            if units >= 2:
                cands.append((i != stick_iter, units, -i, d.name))
        if cands:
            out[o.id] = [(name, units) for _, units, _, name in sorted(cands, reverse=True)]
    return out


def _runs(program: Program, tileable: dict, graph_ops: set[str]) -> list[list[str]]:
    """Maximal runs of consecutive tileable graph ops on one core count: the
    only places a fused kernel can form. Bundle cuts inside a run are the planner's or the
    emitter's (external-tensor limit), and tile buffers change the latter, so a run ignores
    them; a trial removes the planner's cuts inside runs."""
    runs: list[list[str]] = []
    cur: list[str] = []
    key = None
    for o in program.ops:
        k = o.num_cores_used if (o.id in tileable and o.id in graph_ops) else None
        # a matmul can only head a kernel (its elementwise epilogue overlaps the array's
        # compute); one in the middle would force its split and tiling on the chain before it
        if k is None or k != key or o.opfunc == "matmul":
            if cur:
                runs.append(cur)
            cur = []
        key = k
        if k is not None:
            cur.append(o.id)
    if cur:
        runs.append(cur)
    return runs


def _with_tiles(d: PlanDecisions, tiles: dict[str, dict[str, int]], runs: list[list[str]], hw) -> PlanDecisions:
    """`d` with the given temporal tiles, and a bundle start at the head of every tiled run:
    the program groups ANY consecutive ops with equal tile and core counts into one kernel
    (`fused_group_key`), so two adjacent runs that chose the same tile count would otherwise
    merge, and the second's matmul would read the first's result across tiles
    (kernel_tile_order). A bundle boundary costs nothing in the timing model and LX
    contents persist across it (hardware `lx_persists_across_bundles`; where they do not, no
    cut is added and such runs may only take different tile counts)."""
    ops = {}
    for oid, p in d.ops.items():
        ops[oid] = replace(p, temporal_tiles=dict(tiles[oid])) if oid in tiles else p
    for oid in tiles:
        if oid not in ops:
            ops[oid] = OpPlan(temporal_tiles=dict(tiles[oid]))
    starts = list(d.bundle_starts)
    if hw.lx_persists_across_bundles:
        starts += [r[0] for r in runs if r[0] in tiles and r[0] not in starts]
    return replace(d, ops=ops, bundle_starts=starts)


class _OwnCores:
    """Whether a reader takes an earlier op's result only from the boxes its own cores
    wrote (a fused kernel's members may read nothing else: kernel_tile_order)."""

    def __init__(self, program: Program, hw):
        self.ops = {o.id: o for o in program.ops}
        self.tmap = program.tensor_map()
        self.hw = hw
        self.prims = {o.id: op_from_json(o.prim) for o in program.ops if o.prim is not None}
        self._ranges: dict[str, dict] = {}

    def ranges(self, oid: str) -> dict:
        if oid not in self._ranges:
            o, prim = self.ops[oid], self.prims[oid]
            names = [a.tensor for a in prim.inputs] + [prim.output.tensor]
            gran = op_granules(prim, {n: self.tmap[n].layout for n in names},
                               {n: self.tmap[n].dtype for n in names}, self.hw.stick_bytes)
            self._ranges[oid] = core_ranges(prim, {n: f for n, f in o.core_split.items() if f > 1},
                                            o.core_slices, gran)
        return self._ranges[oid]

    def reads_own(self, reader: str, producer: str) -> bool:
        rp, pp = self.prims[reader], self.prims[producer]
        t = pp.output.tensor
        shape = self.tmap[t].shape
        made = {c: operand_box(pp, -1, r, shape) for c, r in self.ranges(producer).items()}
        for i, a in enumerate(rp.inputs):
            if a.tensor != t:
                continue
            for c, r in self.ranges(reader).items():
                box = operand_box(rp, i, r, shape)
                if any(b <= a_ for a_, b in box):
                    continue
                if c not in made or not box_contains(made[c], box):
                    return False
        return True


def _assign(run: list[str], tileable: dict[str, list[tuple[str, int]]], t: int,
            prims: dict[str, PrimOp], own: Optional[_OwnCores] = None) -> dict[str, dict[str, int]]:
    """Tiles for the ops of `run` at tile count t: every maximal sub-run of ops that can take
    t tiles (a lone op too: tiled, its loads overlap its compute, which an untiled kernel
    does little of; docs/simulator-timing.md). A member
    reading an earlier member's result is tiled along its iteration dim that walks the
    same dim of that tensor as the producer's tiles do, so its tile j needs what the
    producer wrote in tile j (the validator's kernel_tile_order rule; and the result can
    then be a tile buffer); otherwise along its own preferred dim."""
    out: dict[str, dict[str, int]] = {}
    seg: list[str] = []

    def dims(oid: str) -> list[str]:
        return [n for n, units in tileable.get(oid, []) if units >= t]

    def fits(oid: str) -> bool:
        # a member reads earlier members' results only where its own cores wrote them
        made = {prims[s].output.tensor: s for s in seg}
        return own is None or all(own.reads_own(oid, made[a.tensor]) for a in prims[oid].inputs
                                  if a.tensor in made)
    for oid in run + [None]:  # type: ignore[list-item]
        if oid is not None and dims(oid) and fits(oid):
            seg.append(oid)
            continue
        if seg:
            walked: dict[str, int] = {}  # result tensor -> the tensor dim its producer tiles
            for s in seg:
                prim, opts = prims[s], dims(s)
                pick = opts[0]
                for a in prim.inputs:
                    j = walked.get(a.tensor)
                    if j is not None and j < len(a.dims) and a.dims[j] is not None \
                            and prim.iter_dims[a.dims[j]].name in opts:
                        pick = prim.iter_dims[a.dims[j]].name
                        break
                out[s] = {pick: t}
                i = next(k for k, d in enumerate(prim.iter_dims) if d.name == pick)
                j = next((jj for jj, d in enumerate(prim.output.dims) if d == i), None)
                if j is not None:
                    walked[prim.output.tensor] = j
        # an op that does not fit stays untiled: it separates the kernels before and after
        # it (adjacent ops with one tile count would otherwise run as one kernel)
        seg = []
    return out


def _span_us(rep: TimingReport, run: list[str]) -> float:
    """Simulated time from the start of the run's first op to the end of its last (what the
    run costs, restickify ops the emitter put between its members included)."""
    by_id = {o.op_id: o for o in rep.ops}
    first, last = by_id[run[0]], by_id[run[-1]]
    return last.end_us - first.start_us


def _valid_program(pg: PrimGraph, hw, d: PlanDecisions) -> Optional[Program]:
    try:
        prog = emit_program(pg, hw, d)
    except ValueError:
        return None
    return None if validate_program(prog, hw) else prog


@dataclass
class _Variant:
    """The plan with each run's members on one core split (index `which` among the splits
    the run's members have; 0 = as planned), with the residency it invalidates dropped."""
    decisions: PlanDecisions
    changed: dict[str, set[str]]        # run head -> ops whose split changed
    dropped_resident: dict[str, set[str]]  # run head -> residencies dropped for it


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
             which: Optional[int], with_head: bool) -> Optional[_Variant]:
    """`which` None: the planned splits, with the LX residencies the solve gave results made
    and used up inside a run dropped (whole-slice buffers crowd a kernel's LX: as tile
    buffers they take a tile's worth)."""
    prims = {o.id: op_from_json(o.prim) for o in program.ops if o.prim is not None}
    layouts = {t.id: t.layout for t in program.tensors}
    dtypes = {t.id: t.dtype for t in program.tensors}
    ops = dict(d.ops)
    changed: dict[str, set[str]] = {}
    shapes = {t.id: tuple(t.shape) for t in program.tensors}
    for run in runs:
        if which == "head":
            want_of = _from_head(prims[run[0]], ops.get(run[0], OpPlan()).core_split, shapes)
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
                mine = _from_producer(prim, made, prims, ops)
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
            split = _head_split(head, [prims[o] for o in run[1:]], want)
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
    return _Variant(replace(d, ops=ops, resident=resident), changed, touched)


def _from_producer(prim: PrimOp, made: dict[str, str], prims: dict[str, PrimOp],
                   ops: dict[str, OpPlan]) -> Optional[dict[str, int]]:
    """The split of `prim`'s iteration dims (reduction dims included) under which each core
    reads the box of an earlier run member's result that the same core wrote: the
    producer's split of its result's tensor dims, mapped to the dims `prim` reads them
    along. None when `prim` reads no earlier member's result or a split tensor dim has no
    image in it."""
    for a in prim.inputs:
        p = made.get(a.tensor)
        if p is None or p == prim.id:
            continue
        return _split_through(prims[p], ops.get(p, OpPlan()).core_split, prim, a.tensor)
    return None


def _split_through(producer: PrimOp, producer_split: dict[str, int], reader: PrimOp,
                   tensor: str) -> Optional[dict[str, int]]:
    """The split of `reader`'s iteration dims under which each of its cores reads the box of
    `tensor` (the producer's result) that the same core wrote: the producer's split of the
    tensor's dims, mapped to the reader's dims along which it reads them. None when a split
    tensor dim has no image in the reader, or nothing is split."""
    split = {k: v for k, v in producer_split.items() if v > 1}
    acc = next((a for a in reader.inputs if a.tensor == tensor), None)
    if acc is None or not split:
        return None
    names = [d.name for d in producer.iter_dims]
    out: dict[str, int] = {}
    for j, i in enumerate(producer.output.dims):
        if i is None or names[i] not in split:
            continue
        r = acc.dims[j] if j < len(acc.dims) else None
        if r is None:
            return None
        out[reader.iter_dims[r].name] = split[names[i]]
    return out if len(out) == len(split) else None


def _from_head(head: PrimOp, head_split: dict[str, int], shapes: dict[str, tuple]):
    """The reverse of `_head_split`: a function giving a run member the heading matmul's
    split of its result (as a split of the member's iteration dims writing the same tensor
    dims), for members whose result has the head's result shape; None when the head is no
    matmul or splits a dim its result does not have (a split reduction)."""
    if head.body.kind != "matmul":
        return None
    split = {k: v for k, v in head_split.items() if v > 1}
    names = [d.name for d in head.iter_dims]
    by_tensor_dim = {j: split[names[i]] for j, i in enumerate(head.output.dims)
                     if i is not None and names[i] in split}
    if not split or len(by_tensor_dim) != len(split):
        return None
    out_shape = shapes[head.output.tensor]

    def want(member: PrimOp) -> Optional[dict[str, int]]:
        if shapes[member.output.tensor] != out_shape:
            return None
        out: dict[str, int] = {}
        for j, f in by_tensor_dim.items():
            i = member.output.dims[j]
            if i is None:
                return None
            out[member.iter_dims[i].name] = f
        return out
    return want


def _head_split(head, members: list, want: dict[str, int]) -> Optional[dict[str, int]]:
    """`want` (a split of the first member reading `head`'s result) as a split of `head`'s
    iteration dims: each split dim mapped to the result's tensor dim it indexes, then to the
    head's iteration dim writing that tensor dim. None when a split dim has no such image."""
    out_t = head.output.tensor
    reader = next((m for m in members if any(a.tensor == out_t for a in m.inputs)), None)
    if reader is None or not want:
        return None
    acc = next(a for a in reader.inputs if a.tensor == out_t)
    tensor_dim = {reader.iter_dims[d].name: j for j, d in enumerate(acc.dims) if d is not None}
    head_dim = {j: head.iter_dims[d].name for j, d in enumerate(head.output.dims) if d is not None}
    split: dict[str, int] = {}
    for name, f in want.items():
        j = tensor_dim.get(name)
        if j is None or j not in head_dim:
            return None
        split[head_dim[j]] = f
    return split


def _without_run_cuts(d: PlanDecisions, runs: list[list[str]]) -> PlanDecisions:
    inside = {oid for run in runs for oid in run[1:]}
    starts = [s for s in d.bundle_starts if s not in inside]
    return d if len(starts) == len(d.bundle_starts) else replace(d, bundle_starts=starts)


def _trial(pg: PrimGraph, hw, d: PlanDecisions) -> Optional[tuple[PlanDecisions, Program, TimingReport]]:
    """Emit `d`, add the tile buffers the validator accepts, time it. The program may be
    invalid (a trial only ranks choices; the final combination is validated)."""
    try:
        prog = emit_program(pg, hw, d)
    except ValueError:
        return None
    buf = add_tile_buffers(pg, hw, d, prog)
    if buf is not None:
        d, prog = buf.decisions, buf.program
    return d, prog, time_program(prog, hw)


def fuse_tiled_groups(pg: PrimGraph, hw, d: PlanDecisions, deadline: Optional[float] = None,
                      tile_counts=TILE_COUNTS, align=SPLIT_VARIANTS, reorder: bool = False
                      ) -> Optional[FusionResult]:
    """`d` with fused kernels on the runs of ops where the simulator times them faster: per
    run a common core split (`align` alternatives to the planned splits), a tile count and
    tile buffers for the kernel's own results. None when `d` does not emit to a valid
    program. Stops trying at `deadline` (perf_counter seconds); the result is always a
    validated program no slower (simulated) than `d`'s.

    `reorder`: also try moving matmuls that read one tensor next to each other in the op
    order and merging them into one kernel (`_merge_siblings`); the result's `op_order` is
    then the order its program was validated and timed in, so a caller that passes True must
    keep that order (not reset it to the graph's)."""
    base_prog = _valid_program(pg, hw, d)
    if base_prog is None:
        return None
    base_rep = time_program(base_prog, hw)
    result = FusionResult(d, base_prog, base_rep, base_rep.total_us, base_rep.total_us)
    graph_ops = {op.id for op in pg.ops}
    runs = _runs(base_prog, _tile_dims(base_prog, hw), graph_ops)
    if not runs:
        return result
    joined = _without_run_cuts(d, runs)
    variants: list[_Variant] = [_Variant(joined, {}, {})]
    seen = {_signature(variants[0].decisions)}
    for which, with_head in align:
        v = _variant(pg, hw, joined, base_prog, runs, which, with_head)
        if v is not None and _signature(v.decisions) not in seen:  # a trial is worth one plan
            seen.add(_signature(v.decisions))
            variants.append(v)
    # per run: (simulated us, variant index, tiles of the run's ops); -1: as planned
    best: list[tuple[float, int, dict]] = [(_span_us(base_rep, r), -1, {}) for r in runs]
    out_of_time = False
    # per-run choices interact (a changed split moves residencies and bundle cuts next to
    # the run), so the fastest valid whole trial is kept too, in case it beats the combination
    whole: list = [base_rep.total_us, None]
    longest = [0.0]  # the slowest trial so far: the time the next one, the final and the resplit need

    def trials(v: PlanDecisions, counts, vi_of_run) -> None:
        """One whole-program trial per tile count; each run keeps what is fastest for it."""
        nonlocal out_of_time
        try:
            vprog = emit_program(pg, hw, v)
        except ValueError:
            return
        tileable = _tile_dims(vprog, hw)
        own = _OwnCores(vprog, hw)
        for t in counts:
            if deadline is not None and time.perf_counter() + 3 * longest[0] > deadline:
                out_of_time = True
                return
            per_count = t if isinstance(t, tuple) else (t,) * len(runs)
            per_run = [_assign(r, tileable, ti, own.prims, own) for r, ti in zip(runs, per_count)]
            if not any(per_run):
                continue
            started = time.perf_counter()
            tr = _trial(pg, hw, _with_tiles(v, {k: x for a in per_run for k, x in a.items()}, runs, hw))
            longest[0] = max(longest[0], time.perf_counter() - started)
            if tr is None:
                continue
            if tr[2].total_us < whole[0] and not validate_program(tr[1], hw):
                whole[:] = [tr[2].total_us, tr]
            for i, (r, a) in enumerate(zip(runs, per_run)):
                us = _span_us(tr[2], r)
                if a and vi_of_run(i) is not None and us < best[i][0]:
                    best[i] = (us, vi_of_run(i), a)

    # stage 1: which split each run takes, judged at a middle tile count, or a high one for a
    # run a matmul heads (a large matmul's slices double-buffer only in small tiles: at the
    # middle count every variant of its run would lose to the plan as it was)
    counts = sorted(tile_counts)
    t_mid, t_high = counts[(len(counts) - 1) // 2], counts[max(0, len(counts) - 2)]
    heads = {o.id: o.opfunc == "matmul" for o in base_prog.ops}
    judge = (tuple(t_high if heads.get(r[0]) else t_mid for r in runs),)
    for vi, v in enumerate(variants):
        trials(v.decisions, judge, lambda i, vi=vi: vi)
    # stage 2: the tile count of each run, on the split stage 1 chose for it
    chosen = [max(0, vi) for _, vi, _ in best]
    mixed = _combine(d, variants, runs, [(0.0, vi, {}) for vi in chosen], hw, keep_untouched=False)
    # nearest counts first: when time runs out, the untried ones are the least likely to win
    rest = sorted((t for t in tile_counts if t != t_mid),
                  key=lambda t: abs(t.bit_length() - t_mid.bit_length()))
    trials(mixed, rest, lambda i: chosen[i])
    if out_of_time:
        result.notes.append("fusion: stopped early (time limit)")
    chosen_tr = whole[1]
    # the per-run choices were each judged in trials that may have been invalid elsewhere,
    # so their combination may be too: the runs the validator names go back to as planned,
    # a few times, before the combination is given up
    base_span = [(_span_us(base_rep, r), -1, {}) for r in runs]
    for _ in range(REPAIR_ROUNDS + 1):
        combined = _combine(d, variants, runs, best, hw)
        tr = _trial(pg, hw, combined) if combined is not None else None
        if tr is None:
            break
        issues = validate_program(tr[1], hw)
        if not issues:
            if tr[2].total_us < whole[0]:
                chosen_tr = tr
            break
        named = _runs_named(pg, runs, issues)
        if not named or all(best[i][1] < 0 for i in named) or (
                deadline is not None and time.perf_counter() + longest[0] > deadline):
            break
        best = [base_span[i] if i in named else b for i, b in enumerate(best)]
    if chosen_tr is None:
        return result
    fused_d, prog, rep = _merge_adjacent(pg, hw, chosen_tr, runs, deadline, longest[0])
    if reorder:
        fused_d, prog, rep = _merge_siblings(pg, hw, (fused_d, prog, rep), deadline, longest[0])
    fused_d, prog, rep = _hold_in_lx(pg, hw, (fused_d, prog, rep), deadline, longest[0])
    fused_d, prog, rep = _fewer_tiles(pg, hw, (fused_d, prog, rep), deadline, longest[0])
    groups = len({o.fused_group for o in rep.ops if o.fused_group is not None})
    buffers = sum(1 for t in prog.tensors if getattr(t.memory, "per_tile", False))
    result.decisions, result.program, result.report = fused_d, prog, rep
    result.fused_us, result.groups = rep.total_us, groups
    result.notes.append(f"fusion: {groups} fused kernels with {buffers} tile buffers, simulated "
                        f"{base_rep.total_us:.1f} -> {rep.total_us:.1f} us")
    return result


def _merge_adjacent(pg: PrimGraph, hw, tr: tuple, runs: list[list[str]], deadline: Optional[float],
                    trial_s: float, heads: Optional[set[str]] = None) -> tuple:
    """Adjacent tiled runs as one kernel where that is valid and faster: one run takes the
    other's tile count (and, where both are headed by matmuls, the other head's core
    split, its members following), and the bundle cut `_with_tiles` put between them goes.
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
        for cand in cands:
            if deadline is not None and time.perf_counter() + trial_s > deadline:
                return fused_d, prog, rep
            out = _trial(pg, hw, cand)
            if out is not None and out[2].total_us < rep.total_us and not validate_program(out[1], hw):
                fused_d, prog, rep = out
    return fused_d, prog, rep


def _fewer_tiles(pg: PrimGraph, hw, tr: tuple, deadline: Optional[float], trial_s: float,
                 limit: int = RETILE_TRIALS) -> tuple:
    """Kernels whose members underfill the stream (a small per-core tile: the timing
    model's `underfill_curve`) or pay much loop overhead, with a half and a quarter of
    their tile count, the kernels losing the most to both first, each kept where the whole
    program is valid and faster. The tile counts were chosen per run before merges, re-splits and LX holds
    changed the kernels (and a whole trial at one count for every run may have won), so a
    kernel can be left with more tiles than its pointwise members stream well."""
    fused_d, prog, rep = tr
    kernels: dict[int, list] = {}
    for o in rep.ops:
        if o.fused_group is not None:
            kernels.setdefault(o.fused_group, []).append(o)

    def loss(members) -> float:
        out = sum(o.overhead_us for o in members)  # the tile loop's, paid per tile
        for o in members:
            for e in o.effects:
                if e.startswith("underfill x"):
                    eff = float(e.split("x", 1)[1])
                    out += o.memory_us * (1.0 - eff)
        return out
    order = sorted((g for g in kernels if loss(kernels[g]) > RETILE_MIN_US), key=lambda g: -loss(kernels[g]))
    tried = 0
    for g in order:
        ids = [o.op_id for o in kernels[g]]
        best = None
        for f in (2, 4):
            if tried >= limit or (deadline is not None and time.perf_counter() + 2 * trial_s > deadline):
                return fused_d, prog, rep
            ops = dict(fused_d.ops)
            for oid in ids:
                p = ops.get(oid, OpPlan())
                tiles = {k: v // f for k, v in p.temporal_tiles.items()}
                if not tiles or min(tiles.values()) < 2:
                    break
                ops[oid] = replace(p, temporal_tiles=tiles)
            else:
                tried += 1
                # tile buffers are sized per tile: re-placed by the trial
                cand = replace(fused_d, ops=ops, resident={x: r for x, r in fused_d.resident.items()
                                                           if not (r.per_tile and x in _results(pg, ids))})
                out = _trial(pg, hw, cand)
                if out is not None and out[2].total_us < (best[2].total_us if best else rep.total_us) \
                        and not validate_program(out[1], hw):
                    best = out
                continue
            break
        if best is not None:
            fused_d, prog, rep = best
    return fused_d, prog, rep


def _results(pg: PrimGraph, ids: list[str]) -> set[str]:
    ops = set(ids)
    return {op.output.tensor for op in pg.ops if op.id in ops}


def _follow_split(pg: PrimGraph, program: Program, d: PlanDecisions, tensor: str, hw
                  ) -> Optional[tuple[dict, set[str]]]:
    """`d.ops` with the ops reading `tensor` (pointwise, reduce or copy ops) on the split
    under which each core reads the slice of it that the same core made (`_split_through`),
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
            want = _split_through(prims[p], ops.get(p, OpPlan()).core_split, rp, t)
            if want is None:
                return None
            cur = {k: v for k, v in plan.core_split.items() if v > 1}
            if r in done:
                if cur != want:
                    return None
                continue
            done.add(r)
            if cur == want:
                continue
            if want not in legal_core_splits(rp, op_granules(rp, layouts, dtypes, hw.stick_bytes), hw.cores):
                return None
            ops[r] = replace(plan, core_split=dict(want), core_slices=None)
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
    if any(not members[kernel[o]] <= done for o in moved if o in kernel):
        return None
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


def _hold_in_lx(pg: PrimGraph, hw, tr: tuple, deadline: Optional[float], trial_s: float,
                limit: int = HOLD_TRIALS) -> tuple:
    """Results that go from one kernel to later ops through device memory (written whole,
    read back) held whole in LX instead: the readers take the split that reads what each
    core made (`_follow_split`), the tensor gets LX the plan leaves free over its live range
    (`tile_buffers.add_whole_residencies`, validator-judged). The largest `limit` such
    results (at least `HOLD_MIN_BYTES`) whose readers can follow are tried one at a time,
    each kept where the whole program simulates faster; then, in `limit` trials more, those
    whose producing matmul can take its readers' split (`_lead_split`). The solve chose residencies before fusion changed the splits
    and freed LX (tile buffers), so a result it left in device memory may now fit."""
    fused_d, prog, rep = tr
    cands = whole_candidates(pg, prog, hw)
    tmap = prog.tensor_map()
    nbytes = {t: layout_nbytes(tmap[t].layout, tmap[t].dtype) for t in cands}
    tried = {False: 0, True: 0}  # trials of each kind
    order = sorted((t for t in cands if nbytes[t] >= HOLD_MIN_BYTES), key=lambda t: -nbytes[t])
    # first the results whose readers follow, then (on the splits that left) the ones whose
    # producer leads
    for t, lead in [(t, False) for t in order] + [(t, True) for t in order]:
        if t in fused_d.resident:
            continue
        if lead:
            alternatives = [(ops, set()) for ops in _lead_split(pg, prog, fused_d, t, hw)
                            + _kernel_follows(pg, prog, fused_d, t, hw)]
        else:
            follow = _follow_split(pg, prog, fused_d, t, hw)
            alternatives = [] if follow is None else [follow]
        best = None
        for ops, drop in alternatives:
            if tried[lead] >= limit or (deadline is not None and time.perf_counter() + 2 * trial_s > deadline):
                break
            tried[lead] += 1
            d2, prog2 = replace(fused_d, ops=ops, resident={x: r for x, r in fused_d.resident.items()
                                                            if x not in drop}), prog
            if ops != fused_d.ops or drop:
                prog2 = _valid_program(pg, hw, d2)
                if prog2 is None:
                    continue
            held = add_whole_residencies(pg, hw, d2, prog2, only={t})
            if held is None:
                continue
            rep2 = time_program(held.program, hw)
            if rep2.total_us < (best[2].total_us if best else rep.total_us):
                best = (held.decisions, held.program, rep2)
        if best is not None:
            fused_d, prog, rep = best
    return fused_d, prog, rep


def _kernel_follows(pg: PrimGraph, program: Program, d: PlanDecisions, tensor: str, hw) -> list[dict]:
    """When `tensor` is read (outside its producer's kernel) only by members of one other
    kernel headed by a matmul: `d.ops` with that whole kernel on the split under which the
    reader reads what each core made: the reader's split mapped through its result's
    tensor dims to the head's (results of one shape), the other members on the head's split
    of their results (`_from_head`). Empty when there is no such move or one is not legal."""
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
        want = _split_through(producer, p_split, op, tensor)
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
    split = _result_split(reader, want, head, shapes)
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
        w = _result_split(head, split, prims[oid], shapes)
        if w is None or not legal(prims[oid], w):
            return []
        ops[oid] = replace(ops.get(oid, OpPlan()), core_split=w, core_slices=None)
    return [ops]


def _result_split(src: PrimOp, split: dict[str, int], dst: PrimOp, shapes: dict) -> Optional[dict[str, int]]:
    """`src`'s split as a split of `dst`'s iteration dims that writes the same slices of a
    result of the same shape (unit dims aside: a [1, 512, 4096] result matches a [512, 4096]
    one): each split dim mapped to the result dim it writes, then to `dst`'s dim writing
    that one. None when the shapes differ or a split dim writes no result dim."""
    s_shape, d_shape = shapes[src.output.tensor], shapes[dst.output.tensor]
    if [x for x in s_shape if x != 1] != [x for x in d_shape if x != 1]:
        return None
    s_dims = [i for j, i in enumerate(src.output.dims) if s_shape[j] != 1]
    d_dims = [i for j, i in enumerate(dst.output.dims) if d_shape[j] != 1]
    want = {k: v for k, v in split.items() if v > 1}
    names = [x.name for x in src.iter_dims]
    out: dict[str, int] = {}
    for si, di in zip(s_dims, d_dims):
        if si is not None and names[si] in want:
            if di is None:
                return None
            out[dst.iter_dims[di].name] = want[names[si]]
    return out if len(out) == len(want) else None


def _lead_split(pg: PrimGraph, program: Program, d: PlanDecisions, tensor: str, hw) -> list[dict]:
    """When `tensor`'s readers cannot follow its producer's split: `d.ops` with the producer,
    a tiled matmul that is a kernel of its own, on the split its readers (outside any
    kernel, all agreeing) read the tensor in (`_head_split`), at its tile count and at twice
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
        split = _head_split(producer, [prims[op.id]], {k: v for k, v in rp.core_split.items() if v > 1})
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


def _sibling_order(pg: PrimGraph, program: Program, d: PlanDecisions) -> Optional[tuple[list[str], set[str]]]:
    """The program's op order with each group of tiled matmuls that read one tensor (the
    query, key and value projections of one normalized input) next to each other: each
    later one's kernel (the matmul heading a bundle, `_with_tiles`, and the members after it,
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


def _merge_siblings(pg: PrimGraph, hw, tr: tuple, deadline: Optional[float], trial_s: float) -> tuple:
    """Matmuls that read one tensor but each head a chain of their own (`chain_order` runs
    each chain straight into its consumer, so their consumers sit between them) moved next to
    each other (`_sibling_order`) and merged into one kernel by `_merge_adjacent`: the kernel
    loads the common input once and overlaps one matmul's weight stream with another's
    compute. Kept only when the merged program is valid and faster; else `tr` as it was."""
    fused_d, prog, rep = tr
    found = _sibling_order(pg, prog, fused_d)
    if found is None or (deadline is not None and time.perf_counter() + 2 * trial_s > deadline):
        return tr
    order, group = found
    moved = _trial(pg, hw, replace(fused_d, op_order=order))
    if moved is None or validate_program(moved[1], hw):
        return tr
    graph_ops = {op.id for op in pg.ops}
    runs = _runs(moved[1], _tile_dims(moved[1], hw), graph_ops)
    merged = _merge_adjacent(pg, hw, moved, runs, deadline, trial_s, heads=group)
    if merged[2].total_us < rep.total_us and not validate_program(merged[1], hw):
        return merged
    return tr


def _aligned_heads(prog: Program, hw, ops: dict, head_a: str, run_b: list[str]) -> Optional[dict]:
    """`ops` with run b's heading matmul on run a's heading matmul's core split (where
    legal for it), and b's members on that split of b's result; None when there is
    nothing to align."""
    prims = {o.id: op_from_json(o.prim) for o in prog.ops if o.prim is not None}
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
    out = dict(ops)
    out[hb.id] = replace(out[hb.id], core_split=dict(split), core_slices=None)
    want_of = _from_head(hb, split, shapes)
    for oid in run_b[1:]:
        want = want_of(prims[oid]) if want_of is not None else None
        gran = op_granules(prims[oid], layouts, dtypes, hw.stick_bytes)
        if want is not None and oid in out and want in legal_core_splits(prims[oid], gran, hw.cores):
            out[oid] = replace(out[oid], core_split=want, core_slices=None)
    return out


def _runs_named(pg: PrimGraph, runs: list[list[str]], issues) -> set[int]:
    """Indices of the runs an op or tensor of the validator's issues belongs to (an op of
    the run, or a tensor one of its ops reads or writes)."""
    touches: dict[str, set[str]] = {}
    for op in pg.ops:
        for t in [a.tensor for a in op.inputs] + [op.output.tensor]:
            touches.setdefault(t, set()).add(op.id)
    named: set[int] = set()
    for i, run in enumerate(runs):
        members = set(run)
        for issue in issues:
            tensor = (issue.tensor or "").split("@stick")[0]
            if issue.op in members or members & touches.get(tensor, set()):
                named.add(i)
    return named


def _tiled_ns(strategy) -> float:
    """A strategy's time once tiled, estimated from its untiled price: the timing model's
    double-buffered body, max(memory, compute) (plus what never overlaps)."""
    c = strategy.parts.base
    return max(c.memory_ns, c.compute_ns) + c.extra_ns


def resplit_for_tiling(pg: PrimGraph, d: PlanDecisions, strategies: dict, margin: float = 0.9
                       ) -> Optional[tuple[PlanDecisions, list[str]]]:
    """`d` with every matmul moved to the non-reduction split (same stick choice) that
    would be fastest once tiled, where that beats its planned time (untiled for a split-K
    matmul, which cannot be tiled; else its own tiled estimate) by `margin`; None when no
    op moves. Returns the plan and the ops moved.

    Why: the planner prices each op untiled, and untiled a split K often wins (each core
    streams a smaller weight slice and loads overlap compute only over
    `untiled_overlap_chunks`), but a K-split matmul can join no fused kernel (its partial
    sums are combined after the tile loop), while a tiled one overlaps its loads with its
    compute across the tile loop: the timing model's double-buffered body is about
    max(memory, compute). That tiled estimate ranks the alternatives; the fusion pass on
    the result, judged by simulation, decides whether the move pays. Residencies of the
    moved ops' operands are dropped (their boxes change)."""
    ops = dict(d.ops)
    moved: list[str] = []
    touched: set[str] = set()
    for op in pg.ops:
        if op.body.kind != "matmul" or op.id not in strategies:
            continue
        cur_plan = d.ops.get(op.id, OpPlan())
        split = {k: v for k, v in cur_plan.core_split.items() if v > 1}
        cands = [s for s in strategies[op.id] if not s.alias and (cur_plan.stick is None or s.stick == cur_plan.stick)]
        now = next((s for s in cands if s.core_split == split), None)
        if now is None:
            continue
        alts = [s for s in cands if not s.reduction_split]
        if not alts:
            continue
        best = min(alts, key=_tiled_ns)
        now_ns = now.parts.base.total_ns if now.reduction_split else _tiled_ns(now)
        if best.core_split != now.core_split and _tiled_ns(best) < margin * now_ns:
            ops[op.id] = replace(cur_plan, core_split=dict(best.core_split), core_slices=None)
            moved.append(op.id)
            touched.update([a.tensor for a in op.inputs] + [op.output.tensor])
    if not moved:
        return None
    resident = {t: r for t, r in d.resident.items() if t not in touched}
    return replace(d, ops=ops, resident=resident), moved


def _combine(d: PlanDecisions, variants: list[_Variant], runs: list[list[str]],
             best: list[tuple[float, int, dict]], hw, keep_untouched: bool = True) -> Optional[PlanDecisions]:
    """The plan with each run's best choice; None when every run is best as planned."""
    if keep_untouched and all(vi < 0 for _, vi, _ in best):
        return None
    ops = dict(d.ops)
    resident = dict(d.resident)
    tiles: dict[str, dict[str, int]] = {}
    for run, (_, vi, a) in zip(runs, best):
        if vi < 0:
            continue
        v = variants[vi]
        for oid in v.changed.get(run[0], ()):
            ops[oid] = v.decisions.ops[oid]
        for t in v.dropped_resident.get(run[0], ()):
            resident.pop(t, None)
        tiles.update(a)
    cut_runs = [r for r, (_, vi, _) in zip(runs, best) if vi >= 0]
    out = replace(_without_run_cuts(d, cut_runs), ops=ops, resident=resident)
    return _with_tiles(out, tiles, runs, hw)
