"""Regions of small ops on one core (solver.spyre.one_core_regions): a norm's ops, its
restickified statistics included, moved to one core with every intermediate held in LX,
kept only when the program validates and simulates faster."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from lowering import lower_document
from lowering.graph_format import GraphDocument
from simulator.api import simulate
from simulator.timing import time_program
from solver.baseline.passes import plan_heuristic
from solver.emit import emit_program
from solver.oracle import checked_program
from solver.spyre.one_core_regions import region_decisions, regions_on_one_core, small_regions
from target.hardware import load_target
from target.superdsc import LxMemory

HW = load_target()
TINY = Path(__file__).resolve().parents[1] / "benchmarks" / "graphs" / "tiny"


def _bert_tiny():
    return lower_document(GraphDocument.from_json((TINY / "bert_tiny_layer16.json").read_bytes()))


def test_regions_are_small_untiled_ops_joined_through_their_tensors():
    pg = _bert_tiny()
    d = plan_heuristic(pg, HW)
    prog = emit_program(pg, HW, d)
    regions = small_regions(pg, prog)
    kinds = {o.id: o for o in prog.ops}
    prims = {op.id: op for op in pg.ops}
    assert regions and all(len(r) >= 2 for r in regions)
    assert [len(r) for r in regions] == sorted((len(r) for r in regions), reverse=True)
    for r in regions:
        for oid in r:
            assert kinds[oid].kind == "restickify" or prims[oid].body.kind in ("pointwise", "reduce", "copy")
    # a norm's restickified statistics sit in a region with the ops on both sides of it
    restick = next(o for o in prog.ops if o.kind == "restickify" and o.src.startswith("var_mean"))
    region = next(r for r in regions if restick.id in r)
    readers = {o.id for o in prog.ops if o.prim and any(i["tensor"] == restick.dst for i in o.prim["inputs"])}
    producer = next(o.id for o in prog.ops if o.prim and o.prim["output"]["tensor"] == restick.src)
    assert readers and readers | {producer} <= region


def test_norm_region_on_one_core_holds_its_restickified_copy_and_runs_faster():
    pg = _bert_tiny()
    d = plan_heuristic(pg, HW)
    prog = emit_program(pg, HW, d)
    got = regions_on_one_core(pg, HW, d, prog)
    assert got.us < got.base_us and got.notes
    new, issues = checked_program(pg, HW, got.decisions)
    assert new is not None and not issues
    assert abs(time_program(new, HW).total_us - got.us) < 1e-6
    tmap = new.tensor_map()
    relaid = [o for o in new.ops if o.kind in ("restickify", "relayout") and isinstance(tmap[o.dst].memory, LxMemory)]
    assert relaid and all(o.num_cores_used == 1 for o in relaid)
    rng = np.random.default_rng(0)
    inputs = {n: (rng.standard_normal(pg.tensors[n].shape) / 4).astype(np.float16)
              for n in pg.inputs if pg.tensors[n].dtype == "float16"}
    res = simulate(new, HW, inputs=inputs, graph=pg, numerics=True, timing=False)
    assert res.valid


def test_a_region_too_large_for_one_core_is_not_offered():
    pg = _bert_tiny()
    d = plan_heuristic(pg, HW)
    prog = emit_program(pg, HW, d)
    region = small_regions(pg, prog)[0]
    small_hw = dataclasses.replace(HW, lx_capacity_bytes=64)
    assert region_decisions(pg, small_hw, d, prog, region) is None


def test_a_restickified_copy_of_a_graph_input_is_not_held():
    """a = exp(x) read with x sticked on its rows, b = neg(a): the region (x's restickify,
    a, b) holds a but not x's copy: where this graph is one copy of a repeated block, x is
    one tensor every copy reads, and its copy would stay live across all of them."""
    from target.op_rules import stick_options
    from target.primitives import Access, Call, In, IterDim, PointwiseBody, PrimGraph, PrimOp, PrimTensor
    from solver.naive import plan_naive
    f = "float16"
    ts = {n: PrimTensor(n, (64, 128), f, "user_input" if n == "x" else "intermediate") for n in ("x", "a", "b")}
    dims = (IterDim("r", 64), IterDim("c", 128))
    ops = [PrimOp("exp", dims, (Access("x", (0, 1)),), Access("a", (0, 1)), PointwiseBody(Call("exp", (In(0),)))),
           PrimOp("neg", dims, (Access("a", (0, 1)),), Access("b", (0, 1)), PointwiseBody(Call("neg", (In(0),))))]
    pg = PrimGraph("rows", ts, ops, ["x"], ["b"])
    d = plan_naive(pg, HW)
    for op in ops:
        d.ops[op.id].stick = next(ch for ch in stick_options(op) if ch.output == 0)
        d.ops[op.id].core_split = {"c": 32}
    prog = emit_program(pg, HW, d)
    restick = next(o for o in prog.ops if o.kind == "restickify")
    assert restick.src == "x"
    region = next(r for r in small_regions(pg, prog) if restick.id in r)
    got = region_decisions(pg, HW, d, prog, region)
    assert got is not None and "a" in got.resident and restick.dst not in got.resident
    new, issues = checked_program(pg, HW, got)
    assert new is not None and not issues
