"""Tile buffers (LxMemory.per_tile): the validator confines them to one fused coarse-tiled
kernel and checks containment tile by tile; the functional run executes such a kernel
tile-major, so a buffer holds only the current tile and a mis-tiled reader reads wrong bytes."""
import copy

import numpy as np
import pytest

from target.interpreter import interpret
from target.primitives import (Access, Call, In, IterDim, MatmulBody, PointwiseBody, PrimGraph, PrimOp,
                                 PrimTensor, ReduceBody)
from simulator.api import compare
from target.geometry import core_ranges, default_core_slices, make_layout, op_granules, operand_box, tile_ranges
from target.hardware import load_target
from simulator.run import RunError, fused_kernels, run_program
from target.superdsc import Program
from simulator.timing import time_program
from target.geometry import tile_iteration_ranges, tile_operand_boxes
from simulator.validate import validate_program
from solver.emit import emit_program
from tests.primgraphs import inputs_for, mlp
from tests.test_timing import _plan, unary_chain

HW = load_target()
F16 = "float16"
ROWS, COLS = 256, 256          # 32 cores x 8 rows; 4 sticks of fp16 along the columns
SPLIT = {"r": 32}
TILE_BYTES = (ROWS // 32 // 4) * COLS * 2   # one of 4 row tiles of a core's slice


def codes(prog) -> set[str]:
    return {i.code for i in validate_program(prog, HW)}


def per_tile(prog: Program, **sizes) -> Program:
    """The program with the named LX tensors turned into tile buffers of the given sizes."""
    d = copy.deepcopy(prog.to_dict())
    for t in d["tensors"]:
        if t["id"] in sizes:
            assert t["memory"]["kind"] == "lx", t["id"]
            t["memory"]["per_tile"] = True
            t["memory"]["size_per_core"] = sizes[t["id"]]
    return Program.model_validate(d)


def _err(outs, refs) -> float:
    return compare(outs, refs)[1]


def _wrong_numbers_or_fault(prog, inp, refs) -> bool:
    try:
        outs = run_program(prog, inp, HW)
    except RunError:
        return True
    return _err(outs, refs) > 1e-2


def diamond(rows=ROWS, cols=COLS):
    """t1 = neg(x); t2 = exp(t1); o = t1 + t2: t1 is read by both later members."""
    t = {"x": PrimTensor("x", (rows, cols), F16, "user_input"), "t1": PrimTensor("t1", (rows, cols), F16),
         "t2": PrimTensor("t2", (rows, cols), F16), "o": PrimTensor("o", (rows, cols), F16)}
    dims = (IterDim("r", rows), IterDim("c", cols))
    ops = [PrimOp("op1", dims, (Access("x", (0, 1)),), Access("t1", (0, 1)), PointwiseBody(Call("neg", (In(0),)))),
           PrimOp("op2", dims, (Access("t1", (0, 1)),), Access("t2", (0, 1)), PointwiseBody(Call("exp", (In(0),)))),
           PrimOp("op3", dims, (Access("t1", (0, 1)), Access("t2", (0, 1))), Access("o", (0, 1)),
                  PointwiseBody(Call("add", (In(0), In(1)))))]
    return PrimGraph("diamond", t, ops, ["x"], ["o"])


def _emit(pg, splits, tiles, resident, valid=True):
    prog = emit_program(pg, HW, _plan(splits, tiles=tiles, resident=resident))
    if valid:
        assert codes(prog) == set(), [(i.code, i.message) for i in validate_program(prog, HW)]
    return prog


def _chain3(op2_split=SPLIT, op2_tiles=None, op3_tiles=None, valid=True):
    pg = unary_chain(ROWS, COLS, n_ops=3)
    tiles = {"op1": {"r": 4}, "op2": op2_tiles or {"r": 4}, "op3": op3_tiles if op3_tiles is not None else {"r": 4}}
    splits = {"op1": SPLIT, "op2": op2_split, "op3": SPLIT}
    return pg, _emit(pg, splits, tiles, {"t1": 4096, "t2": 4096}, valid)


# -- (a) a valid kernel with tile buffers ------------------------------------------------------
def test_tile_buffers_valid_run_tile_major_and_move_no_device_bytes():
    pg = diamond()
    splits = {k: SPLIT for k in ("op1", "op2", "op3")}
    tiles = {k: {"r": 4} for k in ("op1", "op2", "op3")}
    full = _emit(pg, splits, tiles, {"t1": 4096, "t2": 4096})   # whole per-core slices in LX
    # packed one tile apart: only a tile-major run keeps t1's current tile intact while t2 is
    # written next to it (a whole 4096-byte slice of t1 would run over t2's bytes)
    tb = per_tile(full, t1=TILE_BYTES, t2=TILE_BYTES)
    d = tb.to_dict()
    next(t for t in d["tensors"] if t["id"] == "t2")["memory"]["lx_address"] = TILE_BYTES
    tb = Program.model_validate(d)
    assert codes(tb) == set(), [(i.code, i.message) for i in validate_program(tb, HW)]
    assert fused_kernels(tb) == [[0, 1, 2]]
    inp = inputs_for(pg)
    out = run_program(tb, inp, HW)
    assert _err(out, interpret(pg, inp)) < 2e-3
    assert np.array_equal(out[0], run_program(full, inp, HW)[0])
    # the same buffers as whole-slice LX tensors are too small for a core's slice: rejected,
    # and run op-major each whole slice of t2 runs over the t1 rows op3 still needs
    d = tb.to_dict()
    for t in d["tensors"]:
        t["memory"].pop("per_tile", None)
    packed_whole = Program.model_validate(d)
    assert codes(packed_whole) == {"lx_size"}
    assert _err(run_program(packed_whole, inp, HW), interpret(pg, inp)) > 1e-2
    # timing: the intermediates never touch device memory (x read once, o written once)
    hbm = _emit(pg, splits, tiles, {})
    per = ROWS * COLS * 2
    rep = time_program(tb, HW)
    assert rep.hbm_bytes == 2 * per
    assert time_program(hbm, HW).hbm_bytes > rep.hbm_bytes


def test_member_tiling_its_reduction_dim_folds_tile_partials():
    """t1 = neg(x) tiled along columns; s = rowsum(t1) tiled along the same columns reads
    each tile of t1 from the tile buffer and folds the four column partials."""
    t = {"x": PrimTensor("x", (ROWS, COLS), F16, "user_input"), "t1": PrimTensor("t1", (ROWS, COLS), F16),
         "s": PrimTensor("s", (ROWS, 1), F16)}
    ops = [PrimOp("op1", (IterDim("r", ROWS), IterDim("c", COLS)), (Access("x", (0, 1)),), Access("t1", (0, 1)),
                  PointwiseBody(Call("neg", (In(0),)))),
           PrimOp("sum", (IterDim("r", ROWS), IterDim("c", COLS, "reduction")), (Access("t1", (0, 1)),),
                  Access("s", (0, None)), ReduceBody("sum"))]
    pg = PrimGraph("negsum", t, ops, ["x"], ["s"])
    prog = _emit(pg, {"op1": SPLIT, "sum": SPLIT}, {"op1": {"c": 4}, "sum": {"c": 4}}, {"t1": 4096})
    tb = per_tile(prog, t1=(ROWS // 32) * 64 * 2)   # 8 rows x one stick
    assert codes(tb) == set()
    inp = inputs_for(pg)
    assert _err(run_program(tb, inp, HW), interpret(pg, inp)) < 2e-3
    # the reader tiled along its rows instead reads column tiles it was never given
    bad = _emit(pg, {"op1": SPLIT, "sum": SPLIT}, {"op1": {"c": 4}, "sum": {"r": 4}}, {"t1": 4096}, valid=False)
    # held whole in LX it is no better: in tile 0 the reader needs columns written in tiles 1-3
    assert codes(bad) == {"kernel_tile_order"}
    bad = per_tile(bad, t1=(ROWS // 32) * 64 * 2)
    assert codes(bad) == {"lx_slice_mismatch"}
    assert _wrong_numbers_or_fault(bad, inp, interpret(pg, inp))


def test_split_k_matmul_reads_a_tile_buffer_and_combines_partials_per_tile():
    M, K, N = 256, 128, 128
    t = {"x": PrimTensor("x", (M, K), F16, "user_input"), "w": PrimTensor("w", (K, N), F16, "parameter"),
         "t1": PrimTensor("t1", (M, K), F16), "y": PrimTensor("y", (M, N), F16)}
    ops = [PrimOp("op1", (IterDim("r", M), IterDim("c", K)), (Access("x", (0, 1)),), Access("t1", (0, 1)),
                  PointwiseBody(Call("neg", (In(0),)))),
           PrimOp("mm", (IterDim("m", M), IterDim("n", N), IterDim("k", K, "reduction")),
                  (Access("t1", (0, 2)), Access("w", (2, 1))), Access("y", (0, 1)), MatmulBody(0, 1, 2))]
    pg = PrimGraph("negmm", t, ops, ["x", "w"], ["y"])
    # core = 2*row_slice + k_slice for both ops: each core reads the k half of t1 it wrote
    prog = _emit(pg, {"op1": {"r": 16, "c": 2}, "mm": {"m": 16, "k": 2}},
                 {"op1": {"r": 4}, "mm": {"m": 4}}, {"t1": 8192})
    tb = per_tile(prog, t1=(M // 16 // 4) * 64 * 2)
    assert codes(tb) == set()
    inp = inputs_for(pg)
    assert _err(run_program(tb, inp, HW), interpret(pg, inp)) < 2e-3


# -- (b) a reader tiled or split unlike the producer --------------------------------------------
@pytest.mark.parametrize("variant", ["tiled_on_columns", "split_differently"])
def test_reader_tiled_or_split_otherwise_is_a_slice_mismatch_and_reads_wrong_bytes(variant):
    if variant == "tiled_on_columns":
        pg, prog = _chain3(op2_tiles={"c": 4}, valid=False)
    else:
        pg, prog = _chain3(op2_split={"r": 16, "c": 2}, valid=False)
    tb = per_tile(prog, t1=TILE_BYTES, t2=TILE_BYTES)
    got = validate_program(tb, HW)
    assert {i.code for i in got} == {"lx_slice_mismatch"}
    assert any(i.op == "op2" and i.tensor == "t1" and "tile" in i.message for i in got)
    inp = inputs_for(pg)
    assert _wrong_numbers_or_fault(tb, inp, interpret(pg, inp))
    # with t1 a whole-slice LX buffer the kernel is still wrong: the tile loop runs op2's
    # tile 0 (all rows of the core, a quarter of the columns) before op1 wrote those rows;
    # split otherwise, op2's cores also read rows other cores wrote
    assert "kernel_tile_order" in codes(prog)


# -- (c) a reader outside the kernel -----------------------------------------------------------
@pytest.mark.parametrize("op3_tiles", [{}, {"r": 2}], ids=["untiled", "other_tile_count"])
def test_reader_outside_the_kernel_is_out_of_scope(op3_tiles):
    pg, prog = _chain3(op3_tiles=op3_tiles)
    tb = per_tile(prog, t1=TILE_BYTES, t2=TILE_BYTES)   # t2 is read by op3, not a member
    got = validate_program(tb, HW)
    assert {i.code for i in got} == {"lx_tile_scope"}
    assert {(i.tensor, i.op) for i in got} >= {("t2", "op3")}
    assert all(i.tensor == "t2" for i in got)
    inp = inputs_for(pg)
    assert _wrong_numbers_or_fault(tb, inp, interpret(pg, inp))
    assert codes(per_tile(prog, t1=TILE_BYTES)) == set()   # t1 stays inside the kernel


def test_reader_in_another_bundle_is_out_of_scope():
    pg, prog = _chain3()
    d = per_tile(prog, t1=TILE_BYTES, t2=TILE_BYTES).to_dict()
    d["ops"][2]["bundle"] = 1
    ext = d["bundles"][0]["external_tensors"]
    d["bundles"] = [{"id": 0, "ops": ["op1", "op2"], "external_tensors": ["x"]},
                    {"id": 1, "ops": ["op3"], "external_tensors": [t for t in ext if t != "x"]}]
    # a tile buffer never leaves its kernel (lx_tile_scope), wherever LX persists; reading
    # an LX value in a later bundle is itself legal on Spyre (hw.lx_persists_across_bundles)
    assert codes(d) == {"lx_tile_scope"}


def test_live_range_must_end_at_a_reader_inside_the_kernel():
    pg, prog = _chain3()
    d = per_tile(prog, t1=TILE_BYTES).to_dict()
    next(t for t in d["tensors"] if t["id"] == "t1")["memory"]["live_to"] = 2   # op3 does not read t1
    got = validate_program(d, HW)
    assert {i.code for i in got} == {"lx_tile_scope"} and "live_to" in got[0].message
    # the same longer live range of a whole-slice buffer is merely conservative
    d = prog.to_dict()
    next(t for t in d["tensors"] if t["id"] == "t1")["memory"]["live_to"] = 2
    assert codes(d) == set()
    # a reader past live_to, and a live_from that is not the producer
    d = per_tile(prog, t2=TILE_BYTES).to_dict()
    next(t for t in d["tensors"] if t["id"] == "t2")["memory"]["live_to"] = 1
    assert codes(d) == {"lx_live_range"}   # op3 is still a member: only the range is wrong
    d = per_tile(prog, t2=TILE_BYTES).to_dict()
    next(t for t in d["tensors"] if t["id"] == "t2")["memory"]["live_from"] = 0
    got = validate_program(d, HW)
    assert {i.code for i in got} == {"lx_live_range", "lx_tile_scope"}
    assert any(i.code == "lx_tile_scope" and "does not produce" in i.message for i in got)


# -- (d) a buffer smaller than a tile ------------------------------------------------------------
def test_tile_buffer_smaller_than_a_tile():
    pg, prog = _chain3()
    assert codes(per_tile(prog, t1=TILE_BYTES - 128)) == {"lx_size"}
    assert codes(per_tile(prog, t1=TILE_BYTES)) == set()


# -- (e) program inputs and outputs are never tile buffers -----------------------------------------
def test_program_output_as_tile_buffer_is_out_of_scope():
    pg, prog = _chain3()
    d = prog.to_dict()
    out = next(t for t in d["tensors"] if t["id"] == "t3")
    out["memory"] = {"kind": "lx", "lx_address": 8192, "size_per_core": TILE_BYTES, "live_from": 2,
                     "live_to": 2, "per_tile": True}
    got = codes(d)
    assert "lx_tile_scope" in got and "io_memory" in got


# -- producers whose tile output is a partial ------------------------------------------------------
def _sum_div(sum_split, sum_tiles):
    t = {"x": PrimTensor("x", (ROWS, COLS), F16, "user_input"), "s": PrimTensor("s", (ROWS, 1), F16),
         "y": PrimTensor("y", (ROWS, COLS), F16)}
    ops = [PrimOp("sum", (IterDim("r", ROWS), IterDim("c", COLS, "reduction")), (Access("x", (0, 1)),),
                  Access("s", (0, None)), ReduceBody("sum")),
           PrimOp("div", (IterDim("r", ROWS), IterDim("c", COLS)), (Access("x", (0, 1)), Access("s", (0, None))),
                  Access("y", (0, 1)), PointwiseBody(Call("div", (In(0), In(1)))))]
    pg = PrimGraph("sumdiv", t, ops, ["x"], ["y"])
    div_split = {"r": sum_split.get("r", 1), "c": sum_split.get("c", 1)}
    d = _plan({"sum": sum_split, "div": {k: v for k, v in div_split.items() if v > 1}},
              tiles={"sum": sum_tiles, "div": {"r": 4}}, resident={"s": 4096})
    return pg, emit_program(pg, HW, d)


def test_producer_tiling_or_splitting_a_reduction_dim():
    pg, prog = _sum_div({"r": 32}, {"r": 4})
    assert codes(prog) == set()
    ok = per_tile(prog, s=4096)
    assert codes(ok) == set()
    inp = inputs_for(pg)
    assert _err(run_program(ok, inp, HW), interpret(pg, inp)) < 2e-3
    # sum tiled along its reduction dim: tile j holds a partial sum when div reads it
    pg, prog = _sum_div({"r": 32}, {"c": 4})
    tb = per_tile(prog, s=4096)
    got = validate_program(tb, HW)
    assert {i.code for i in got} == {"lx_tile_scope"} and "reduction" in got[0].message
    assert _wrong_numbers_or_fault(tb, inp, interpret(pg, inp))
    # sum split across cores along its reduction dim: the existing rule still holds
    pg, prog = _sum_div({"r": 8, "c": 4}, {"r": 4})
    assert "lx_reduction_split" in codes(per_tile(prog, s=4096))


# -- the validator's vectorized tile boxes are geometry.tile_ranges + operand_box --------------
@pytest.mark.parametrize("split,tiles", [({"m": 4, "n": 5}, {"m": 3}), ({"k": 2, "n": 5}, {"m": 4, "k": 2}),
                                         ({}, {"n": 5, "m": 2}), ({"m": 8}, {})])
def test_vectorized_tile_boxes_equal_the_geometry_functions(split, tiles):
    """mm [96,256]x[256,320]: 320 is 5 sticks (stick granules), 96 rows in 4 or 8 slices of
    uneven tiles."""
    pg = mlp(M=96, K=256, N=320)[0]
    mm = pg.ops[0]
    shapes = {"x": (96, 256), "w": (256, 320), "y": (96, 320)}
    layouts = {n: make_layout(s, F16, 1, HW.stick_bytes) for n, s in shapes.items()}
    gran = op_granules(mm, layouts, {n: F16 for n in shapes}, HW.stick_bytes)
    ranges = core_ranges(mm, split, default_core_slices(mm, split), gran)
    cores, lo, hi = tile_iteration_ranges(mm, ranges, tiles, gran)
    assert cores == sorted(ranges)
    for operand in (-1, 0, 1):
        tname = mm.output.tensor if operand < 0 else mm.inputs[operand].tensor
        blo, bhi = tile_operand_boxes(mm, operand, lo, hi, shapes[tname])
        for ci, c in enumerate(cores):
            want = [operand_box(mm, operand, tr, shapes[tname]) for tr in tile_ranges(mm, ranges[c], tiles, gran)]
            got = [tuple(zip(map(int, blo[ci, j]), map(int, bhi[ci, j]))) for j in range(blo.shape[1])]
            assert got == want, (operand, c)


def test_a_trial_carries_the_verdict_its_tile_buffers_got():
    """`fusion.trial` places tile buffers by validating the program it returns, so the trial
    carries that verdict (`issues_of` does not validate again); a trial that placed none
    carries no verdict and `issues_of` asks the validator."""
    from solver.spyre.fusion.trial import issues_of, trial

    pg = diamond()
    splits = {k: SPLIT for k in ("op1", "op2", "op3")}
    tr = trial(pg, HW, _plan(splits, tiles={k: {"r": 4} for k in splits}, resident={}))
    assert {t.id for t in tr[1].tensors if getattr(t.memory, "per_tile", False)} == {"t1", "t2"}
    assert tr.issues == [] == validate_program(tr[1], HW)
    d, prog, rep = tr  # still a (decisions, program, report) triple
    assert rep.total_us == time_program(prog, HW).total_us
    untiled = trial(pg, HW, _plan(splits, tiles={}, resident={}))
    assert untiled.issues is None
    assert issues_of(untiled, HW) == validate_program(untiled[1], HW) == []
    # a program edited after the verdict: only the trial's own verdict is trusted, so an
    # edited copy is a plain triple and is validated
    bad = per_tile(prog, t1=HW.stick_bytes)
    assert "lx_size" in {i.code for i in issues_of((d, bad, rep), HW)}
