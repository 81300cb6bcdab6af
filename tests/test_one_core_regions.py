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
