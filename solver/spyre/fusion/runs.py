"""Where a fused kernel can form and how a run of ops is tiled.

A run (`find_runs`) is a maximal sequence of consecutive tileable graph ops on one core
count in the emitted plan; `tile_dims` gives the dims each op can be tiled along,
`assign_tiles` a run's tiles at one tile count (a member reads an earlier member's result
only where its own cores wrote it: `OwnCores`), `reduction_tile_dims` the reduction dims a
matmul or reduce op can be tiled along (K tiles: its result is complete only after its last
tile, so it is a kernel of its own), `with_tiles` puts tiles on a plan with a bundle start at
the head of every tiled run and after every K-tiled op, `without_run_cuts` removes the
planner's cuts inside runs, and `span_us` is what a run costs in a simulated trial.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from target.op_rules import split_units
from target.primitives import PrimGraph, PrimOp
from target.geometry import box_contains, core_ranges, op_granules, operand_box, parsed_prim, reduction_split
from target.superdsc import Program
from simulator.timing_report import TimingReport
from solver.plan import OpPlan, PlanDecisions

_FUSABLE_BODIES = frozenset({"pointwise", "reduce", "matmul"})


def _compute_ops(program: Program, hw, bodies):
    """Each compute op of `program` (no alias) whose body kind is in `bodies`, as (op, its
    primitive op, its split's factors above 1, its granules, the per-core iteration ranges,
    the tensor layouts)."""
    layouts = {t.id: t.layout for t in program.tensors}
    dtypes = {t.id: t.dtype for t in program.tensors}
    for o in program.ops:
        if o.kind != "compute" or o.alias or o.prim is None:
            continue
        prim = parsed_prim(o.prim)
        if prim.body.kind not in bodies:
            continue
        split = {n: f for n, f in o.core_split.items() if f > 1}
        gran = op_granules(prim, layouts, dtypes, hw.stick_bytes)
        yield o, prim, split, gran, core_ranges(prim, split, o.core_slices, gran), layouts


def _fewest_units(i: int, gran: dict, ranges: dict) -> int:
    """The fewest whole split units any core has along iteration dim `i`."""
    return min(split_units(r[i][1] - r[i][0], gran.get(i, 1)) for r in ranges.values())


def tile_dims(program: Program, hw) -> dict[str, list[tuple[str, int]]]:
    """Per fusable op, the parallel iteration dims it can be tiled along, best first: (dim,
    the most tiles it can take there = the fewest whole split units any of its cores has
    on that dim)."""
    out: dict[str, list[tuple[str, int]]] = {}
    for o, prim, split, gran, ranges, layouts in _compute_ops(program, hw, _FUSABLE_BODIES):
        if prim.body.kind == "matmul" and reduction_split(prim, split):
            continue  # partial sums are combined after the tile loop: no epilogue can fuse
        # a coarse-tiled kernel walks row tiles: prefer a dim outside the output's stick dim,
        # so the members of a group tile the same rows
        st = layouts[prim.output.tensor].stick_dim
        stick_iter = prim.output.dims[st] if st is not None and st < len(prim.output.dims) else None
        cands = []
        for i, d in enumerate(prim.iter_dims):
            if d.kind != "parallel":
                continue
            units = _fewest_units(i, gran, ranges)
            if units >= 2:
                cands.append((i != stick_iter, units, -i, d.name))
        if cands:
            out[o.id] = [(name, units) for _, units, _, name in sorted(cands, reverse=True)]
    return out


def reduction_tile_dims(program: Program, hw) -> dict[str, list[tuple[str, int]]]:
    """Per matmul or reduce op whose reduction dims no core split divides, the reduction dims
    it can be tiled along (K tiles), largest first: (dim, the most tiles it can take there).
    A K tile re-reads no operand (every operand but the output is indexed by K) and the
    partial sums stay on chip while they fit the LX the plan leaves free (the timing model
    charges them through device memory otherwise); its result is a partial until the last
    tile, so no member of its kernel may read it (the validator's kernel_tile_order)."""
    out: dict[str, list[tuple[str, int]]] = {}
    for o, prim, split, gran, ranges, _ in _compute_ops(program, hw, ("matmul", "reduce")):
        if reduction_split(prim, split):
            continue
        cands = []
        for i, d in enumerate(prim.iter_dims):
            if d.kind != "reduction":
                continue
            units = _fewest_units(i, gran, ranges)
            if units >= 2:
                cands.append((units, d.name))
        if cands:
            out[o.id] = [(name, units) for units, name in sorted(cands, reverse=True)]
    return out


def reduction_names(pg: PrimGraph) -> dict[str, frozenset[str]]:
    """Per op of the graph, the names of its reduction iteration dims."""
    return {op.id: frozenset(d.name for d in op.iter_dims if d.kind == "reduction") for op in pg.ops}


def find_runs(program: Program, tileable: dict, graph_ops: set[str]) -> list[list[str]]:
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


def with_tiles(d: PlanDecisions, tiles: dict[str, dict[str, int]], runs: list[list[str]], hw,
               pg: Optional[PrimGraph] = None) -> PlanDecisions:
    """`d` with the given temporal tiles, and a bundle start at the head of every tiled run
    and (given `pg`) at the op after every run member tiled along a reduction dim (K tiles:
    its result is a partial until its kernel's last tile, so it is a kernel of its own):
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
        if pg is not None:
            red = reduction_names(pg)
            for r in runs:
                for a, b in zip(r, r[1:]):
                    if any(n in red.get(a, ()) and t > 1 for n, t in tiles.get(a, {}).items()) \
                            and b not in starts:
                        starts.append(b)
    return replace(d, ops=ops, bundle_starts=starts)


def without_run_cuts(d: PlanDecisions, runs: list[list[str]]) -> PlanDecisions:
    inside = {oid for run in runs for oid in run[1:]}
    starts = [s for s in d.bundle_starts if s not in inside]
    return d if len(starts) == len(d.bundle_starts) else replace(d, bundle_starts=starts)


class OwnCores:
    """Whether a reader takes an earlier op's result only from the boxes its own cores
    wrote (a fused kernel's members may read nothing else: kernel_tile_order)."""

    def __init__(self, program: Program, hw):
        self.ops = {o.id: o for o in program.ops}
        self.tmap = program.tensor_map()
        self.hw = hw
        self.prims = {o.id: parsed_prim(o.prim) for o in program.ops if o.prim is not None}
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


def assign_tiles(run: list[str], tileable: dict[str, list[tuple[str, int]]], t: int,
                 prims: dict[str, PrimOp], own: Optional[OwnCores] = None) -> dict[str, dict[str, int]]:
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


def span_us(rep: TimingReport, run: list[str]) -> float:
    """Simulated time from the start of the run's first op to the end of its last (what the
    run costs, restickify ops the emitter put between its members included)."""
    by_id = {o.op_id: o for o in rep.ops}
    first, last = by_id[run[0]], by_id[run[-1]]
    return last.end_us - first.start_us
