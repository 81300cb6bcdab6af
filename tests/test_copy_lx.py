"""Copies read boxes, not whole tensors: the box of a copy input a core reads follows from its
piece's strided map (target.geometry.copy_read_box), so a copy may read a tensor held in
LX when every core reads inside the box that core wrote (the rule every reader has), and then
moves no device bytes for it. A rotary-like graph: t = neg(x) as [L, heads*E], permuted to
[heads, L, E], its upper halves sliced, and a cat of (slice, lower halves)."""
from __future__ import annotations

import numpy as np
import pytest

from target.interpreter import interpret
from target.primitives import (Access, Call, CopyBody, In, IterDim, PointwiseBody, PrimGraph, PrimOp,
                                 PrimTensor, StridedMap)
from target import geometry
from simulator.api import compare
from target.geometry import copy_read_box, operand_box, tile_iteration_ranges, tile_operand_boxes
from target.hardware import load_target
from simulator.run import run_program
from simulator.timing import time_program
from simulator.validate import validate_program
from solver.emit import emit_program
from solver.plan import PlanDecisions, Residency

HW = load_target()
F16 = "float16"
L, H, E = 256, 4, 128


def rotary_graph() -> PrimGraph:
    t = {"x": PrimTensor("x", (L, H * E), F16, "user_input"),
         "t": PrimTensor("t", (L, H * E), F16),
         "p": PrimTensor("p", (H, L, E), F16),
         "s": PrimTensor("s", (H, L, E // 2), F16),
         "c": PrimTensor("c", (H, L, E), F16)}
    heads = (IterDim("h", H), IterDim("l", L), IterDim("e", E))
    half = (IterDim("h", H), IterDim("l", L), IterDim("e", E // 2))
    ops = [
        PrimOp("neg", (IterDim("r", L), IterDim("n", H * E)), (Access("x", (0, 1)),), Access("t", (0, 1)),
               PointwiseBody(Call("neg", (In(0),)))),
        # [L, H*E] read as [H, L, E]
        PrimOp("permute", heads, (Access("t", (1, 2)),), Access("p", (0, 1, 2)),
               CopyBody((StridedMap((H, L, E), (E, H * E, 1), 0),), ((0, 0, 0),))),
        # its upper halves
        PrimOp("slice", half, (Access("t", (1, 2)),), Access("s", (0, 1, 2)),
               CopyBody((StridedMap((H, L, E // 2), (E, H * E, 1), E // 2),), ((0, 0, 0),))),
        # cat(slice, lower halves of t) along E
        PrimOp("cat", heads, (Access("s", (0, 1, 2)), Access("t", (1, 2))), Access("c", (0, 1, 2)),
               CopyBody((StridedMap((H, L, E // 2), (L * E // 2, E // 2, 1), 0),
                         StridedMap((H, L, E // 2), (E, H * E, 1), 0)), ((0, 0, 0), (0, 0, E // 2)))),
    ]
    return PrimGraph("rotary", t, ops, ["x"], ["p", "c"])


def _op(pg, oid):
    return next(o for o in pg.ops if o.id == oid)


# -- geometry ---------------------------------------------------------------------------------
def test_permute_box_is_the_heads_rows_and_columns():
    pg = rotary_graph()
    perm = _op(pg, "permute")
    # heads 1..2, rows 64..128, all of E: t rows 64..128, columns of heads 1 and 2
    assert operand_box(perm, 0, [(1, 3), (64, 128), (0, E)], (L, H * E), copy_reads=True) == ((64, 128), (128, 384))
    # one head, part of E: the columns of that part only
    assert operand_box(perm, 0, [(2, 3), (0, 8), (32, 64)], (L, H * E), copy_reads=True) == ((0, 8), (288, 320))
    # without copy_reads (what the planners' searches ask) a copy input is read whole
    assert operand_box(perm, 0, [(2, 3), (0, 8), (32, 64)], (L, H * E)) == ((0, L), (0, H * E))


def test_slice_box_starts_at_its_offset():
    pg = rotary_graph()
    sl = _op(pg, "slice")
    # head 3's upper half: columns 3*128+64 .. 4*128
    assert operand_box(sl, 0, [(3, 4), (0, L), (0, E // 2)], (L, H * E), copy_reads=True) == ((0, L), (448, 512))
    # heads 0..2, upper half of E's first 16: bounding range over heads 0..1
    assert operand_box(sl, 0, [(0, 2), (10, 20), (0, 16)], (L, H * E), copy_reads=True) == ((10, 20), (64, 208))


def test_cat_pieces_read_only_what_their_region_covers():
    pg = rotary_graph()
    cat = _op(pg, "cat")
    # output E 0..64 is piece 0 (s) only: piece 1 reads nothing (an empty box)
    rng = [(1, 2), (0, 32), (0, E // 2)]
    assert operand_box(cat, 0, rng, (H, L, E // 2), copy_reads=True) == ((1, 2), (0, 32), (0, 64))
    assert operand_box(cat, 1, rng, (L, H * E), copy_reads=True) == ((0, 0), (0, 0))
    # output E 32..96 straddles: piece 0 its E 32..64, piece 1 t's head-1 columns 0..32
    rng = [(1, 2), (0, 32), (32, 96)]
    assert operand_box(cat, 0, rng, (H, L, E // 2), copy_reads=True) == ((1, 2), (0, 32), (32, 64))
    assert operand_box(cat, 1, rng, (L, H * E), copy_reads=True) == ((0, 32), (128, 160))


def _copy(in_shape, out_shape, strides, offset=0):
    rank = len(out_shape)
    dims = tuple(IterDim(f"d{i}", s) for i, s in enumerate(out_shape))
    return PrimOp("cp", dims, (Access("a", tuple(None for _ in in_shape)),), Access("b", tuple(range(rank))),
                  CopyBody((StridedMap(tuple(out_shape), tuple(strides), offset),), ((0,) * rank,)))


def test_reshape_merging_dims_decomposes_into_levels():
    # [8, 4, 16] read as [8, 64] (a view merging the last two dims)
    op = _copy((8, 4, 16), (8, 64), (64, 1))
    assert copy_read_box(op, 0, [(2, 4), (16, 48)], (8, 4, 16)) == ((2, 4), (1, 3), (0, 16))
    # inside one inner row: exact
    assert copy_read_box(op, 0, [(2, 3), (20, 30)], (8, 4, 16)) == ((2, 3), (1, 2), (4, 14))


@pytest.mark.parametrize("out_shape,strides,offset", [
    ((4, 16), (64, -1), 63),      # a reversed dim: negative stride
    ((4, 32), (64, 3), 0),        # 32 steps of 3 run past the 64 columns unevenly: a carry
    ((4, 16), (64, 1), 60),       # from column 60 on, 16 columns carry into the next row
    ((4, 16), (65, 1), 0),        # a stride of two digits (one row and one column)
])
def test_maps_that_do_not_decompose_read_whole(out_shape, strides, offset):
    op = _copy((8, 64), out_shape, strides, offset)
    assert copy_read_box(op, 0, [(0, 1), (0, 1)], (8, 64)) == ((0, 8), (0, 64))


def test_numpy_twin_agrees_with_operand_box():
    pg = rotary_graph()
    rng = np.random.default_rng(0)
    for oid in ("permute", "slice", "cat"):
        op = _op(pg, oid)
        sizes = [d.size for d in op.iter_dims]
        boxes = []
        for _ in range(40):
            r = []
            for s in sizes:
                a = int(rng.integers(0, s))
                r.append((a, int(rng.integers(a + 1, s + 1))))
            boxes.append(r)
        lo = np.array([[[a for a, _ in r] for r in boxes]])
        hi = np.array([[[b for _, b in r] for r in boxes]])
        for i, acc in enumerate(op.inputs):
            shape = pg.tensors[acc.tensor].shape
            blo, bhi = tile_operand_boxes(op, i, lo, hi, shape, copy_reads=True)
            for j, r in enumerate(boxes):
                want = operand_box(op, i, r, shape, copy_reads=True)
                assert tuple(zip(blo[0, j].tolist(), bhi[0, j].tolist())) == want, (oid, i, r)


def test_box_covers_every_element_the_copy_reads():
    # brute force: the input elements a core's output box takes lie inside its read box
    pg = rotary_graph()
    for oid in ("permute", "slice", "cat"):
        op = _op(pg, oid)
        for p, (mp, oo) in enumerate(zip(op.body.maps, op.body.out_offsets)):
            shape = pg.tensors[op.inputs[p].tensor].shape
            out = [(1, 3), (5, 40), (10, 70 if oid != "slice" else 50)]
            box = operand_box(op, p, out, shape, copy_reads=True)
            idx = np.indices(mp.shape).reshape(len(mp.shape), -1).T
            pos = idx + np.array(oo)
            inside = np.all([(pos[:, j] >= a) & (pos[:, j] < b) for j, (a, b) in enumerate(out)], axis=0)
            flat = mp.offset + idx[inside] @ np.array(mp.strides)
            coords = np.stack(np.unravel_index(flat, shape), axis=1)
            if len(coords):
                lo = coords.min(axis=0)
                hi = coords.max(axis=0) + 1
                assert tuple(zip(lo.tolist(), hi.tolist())) == box, (oid, p)
            else:
                assert all(b <= a for a, b in box)


# -- validator, functional run and timing ------------------------------------------------------
def _plan(copy_split, copy_slices=None, resident=True) -> PlanDecisions:
    d = PlanDecisions(planner="test")
    d.op("neg").core_split = {"r": 8, "n": 4}      # core 4*i + j: rows 32*i.., head j
    for oid in ("permute", "slice", "cat"):
        d.op(oid).core_split = dict(copy_split)
        d.op(oid).core_slices = copy_slices
    if resident:
        d.resident["t"] = Residency(lx_address=0)
    return d


# the copies split heads x rows, core 4*i + j running head j, rows 32*i..: what core 4*i + j
# of `neg` wrote
MATCHING = [(4 * i + j, {"h": j, "l": i}) for i in range(8) for j in range(4)]


def _emit(d):
    return emit_program(rotary_graph(), HW, d)


def test_copy_reads_lx_inside_each_cores_written_box():
    prog = _emit(_plan({"h": 4, "l": 8}, MATCHING))
    assert [(i.code, i.message) for i in validate_program(prog, HW)] == []
    t = next(x for x in prog.tensors if x.id == "t")
    assert t.memory.kind == "lx"
    # and it computes what the graph does
    x = np.random.default_rng(1).standard_normal((L, H * E)).astype(np.float16)
    refs = interpret(rotary_graph(), {"x": x})
    outs = run_program(prog, {"x": x}, HW)
    assert compare(outs, refs)[0] == 0.0   # copies of neg(x): exact


@pytest.mark.parametrize("split,slices", [
    ({"h": 4, "l": 8}, None),   # the right slices on the wrong cores (natural order: core 8*h + l)
    ({"l": 32}, None),          # every core reads all four heads' columns of its rows
])
def test_copy_reading_another_cores_slice_is_rejected(split, slices):
    prog = _emit(_plan(split, slices))
    issues = validate_program(prog, HW)
    assert any(i.code == "lx_slice_mismatch" and i.tensor == "t" for i in issues), \
        [(i.code, i.message) for i in issues]
    # the same split reading t from device memory is fine
    assert validate_program(_emit(_plan(split, slices, resident=False)), HW) == []


def test_lx_input_moves_no_device_bytes():
    in_lx = _emit(_plan({"h": 4, "l": 8}, MATCHING))
    in_hbm = _emit(_plan({"h": 4, "l": 8}, MATCHING, resident=False))
    a = {o.op_id: o for o in time_program(in_lx, HW).ops}
    b = {o.op_id: o for o in time_program(in_hbm, HW).ops}
    t_bytes = L * H * E * 2
    # permute reads all of t, slice and cat half of it each: from device memory only when
    # t lives there
    assert b["permute"].hbm_read_bytes == t_bytes
    assert a["permute"].hbm_read_bytes == 0
    assert b["slice"].hbm_read_bytes - a["slice"].hbm_read_bytes == t_bytes // 2
    assert b["cat"].hbm_read_bytes - a["cat"].hbm_read_bytes == t_bytes // 2
    assert time_program(in_lx, HW).total_us < time_program(in_hbm, HW).total_us


def test_reference_and_cached_paths_agree():
    progs = [_emit(_plan({"h": 4, "l": 8}, MATCHING)), _emit(_plan({"h": 4, "l": 8})),
             _emit(_plan({"l": 32})), _emit(_plan({"h": 4, "l": 8}, MATCHING, resident=False))]

    def judge():
        return [([(i.code, i.op, i.tensor) for i in validate_program(p, HW)], time_program(p, HW).total_us)
                for p in progs]
    prev = geometry.set_caches(False)
    try:
        ref = judge()
        geometry.set_caches(True)
        cold = judge()
        warm = judge()
    finally:
        geometry.set_caches(prev)
    assert ref == cold == warm
    assert ref[0][0] == [] and ref[1][0] != []


# -- the LX-hold step: copy readers follow through their strided maps ---------------------------
def test_hold_moves_copy_readers_onto_the_cores_that_made_their_input(monkeypatch):
    """t goes to the copies through device memory, the copies on row slices (every core all
    four heads of 8 rows). `hold_in_lx` moves them to heads x rows, each work slice on the
    core of `neg` that made it (explicit core slices: the natural order would put head h,
    rows i on core 8*h + i), holds t whole in LX; valid, faster, same numbers."""
    from target.superdsc import LxMemory
    from solver.spyre.fusion import hold
    monkeypatch.setattr(hold, "HOLD_MIN_BYTES", 0)
    pg = rotary_graph()
    d = _plan({"l": 32}, resident=False)
    prog = _emit(d)
    assert validate_program(prog, HW) == []
    rep = time_program(prog, HW)
    held_d, held_prog, held_rep = hold.hold_in_lx(pg, HW, (d, prog, rep), None, 0.0)
    assert validate_program(held_prog, HW) == []
    assert isinstance(held_prog.tensor_map()["t"].memory, LxMemory)
    for oid in ("permute", "slice", "cat"):
        plan = held_d.ops[oid]
        assert {k: v for k, v in plan.core_split.items() if v > 1} == {"h": 4, "l": 8}
        assert sorted(plan.core_slices) == sorted(MATCHING)
        assert held_rep.op(oid).hbm_read_bytes < rep.op(oid).hbm_read_bytes
    assert held_rep.op("neg").hbm_write_bytes == 0
    assert held_rep.total_us < rep.total_us
    x = np.random.default_rng(2).standard_normal((L, H * E)).astype(np.float16)
    assert compare(run_program(held_prog, {"x": x}, HW), interpret(pg, {"x": x}))[0] == 0.0
