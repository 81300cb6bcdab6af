"""Fused coarse-tiled groups (solver.spyre.fusion): the CP-SAT planner tiles runs of ops the
timing model runs faster as one fused kernel, and never makes a plan slower."""
from dataclasses import replace

import tests.primgraphs as primgraphs
from target.hardware import load_target
from simulator.timing import time_program
from simulator.validate import validate_program
from solver.spyre.cpsat_planner import plan_cpsat
from solver.emit import emit_program
from solver.spyre.fusion import fuse_tiled_groups
from solver.plan import PlanDecisions
from solver.planners import plan

HW = load_target()
FAST = dict(time_limit_s=5, deterministic=True)


def _untiled(d: PlanDecisions) -> PlanDecisions:
    """`d` without temporal tiles, and so without tile buffers (they exist only in a tiled kernel)."""
    return replace(d, ops={k: replace(p, temporal_tiles={}) for k, p in d.ops.items()},
                   resident={t: r for t, r in d.resident.items() if not r.per_tile})


def test_softmax_too_big_for_lx_gets_a_faster_fused_tiled_group():
    """Softmax 2048x8192 fp16 over 32 cores: x (1 MiB per core) cannot stay in LX with the
    chain, so amax and the shift both read it from device memory; one coarse-tiled kernel
    over both reads it once."""
    pg, _ = primgraphs.softmax(M=2048, N=8192)
    d = plan_cpsat(pg, HW, **FAST)
    tiled = {k: p.temporal_tiles for k, p in d.ops.items() if p.temporal_tiles}
    assert len(tiled) >= 2 and all(max(t.values()) > 1 for t in tiled.values())
    program = plan(pg, HW, "cpsat", **FAST)  # plan() validates
    rep = time_program(program, HW)
    groups = {o.fused_group for o in rep.ops if o.fused_group is not None}
    assert groups
    assert any("already on chip" in e for o in rep.ops for e in o.effects)
    without = emit_program(pg, HW, _untiled(d))
    assert not validate_program(without, HW)
    assert rep.total_us < 0.9 * time_program(without, HW).total_us
    assert any(n.startswith("fusion:") for n in program.stats.notes)


def test_fusion_never_slows_a_plan_and_keeps_it_valid():
    for builder in ("mlp", "softmax", "attention_scores", "colsum"):
        pg, _ = getattr(primgraphs, builder)()
        d = plan_cpsat(pg, HW, time_limit_s=2, deterministic=True)
        res = fuse_tiled_groups(pg, HW, _untiled(d))
        assert res is not None
        assert res.fused_us <= res.base_us + 1e-9
        assert not validate_program(res.program, HW)
        assert res.report.total_us == time_program(res.program, HW).total_us


def test_fused_group_member_reads_a_result_on_chip_only_from_its_own_core():
    """In a coarse-tiled group each tile of a result is produced on the core that computed
    it: a later member with the same work division reads it there; one that needs other
    cores' parts (another split) makes the program invalid."""
    from tests.test_timing import _plan, _program, unary_chain
    pg = unary_chain(2048, 2048, n_ops=2)
    tiles = {"op1": {"r": 4}, "op2": {"r": 4}}
    same = time_program(_program(pg, _plan({"op1": {"r": 32}, "op2": {"r": 32}}, tiles=tiles)), HW)
    op2 = same.op("op2")
    assert op2.fused_group is not None and op2.fused_group == same.op("op1").fused_group
    assert op2.hbm_read_bytes == 0 and any("produced on chip" in e for e in op2.effects)
    # the result still reaches device memory: the program stores it there
    assert same.op("op1").hbm_write_bytes == 2048 * 2048 * 2
    # a member that needs other cores' parts cannot be in the kernel at all: the tile loops
    # of different cores do not wait for each other
    from solver.emit import emit_program
    other = emit_program(pg, HW, _plan({"op1": {"r": 32}, "op2": {"c": 32}}, tiles=tiles))
    assert {i.code for i in validate_program(other, HW)} == {"kernel_tile_order"}


def _two_readers_of_x(rows, cols):
    """x -> neg -> t1 and x -> exp -> t2: two members of one kernel read the same input."""
    from target.primitives import Access, Call, In, IterDim, PointwiseBody, PrimGraph, PrimOp, PrimTensor
    t = {"x": PrimTensor("x", (rows, cols), "float16", "user_input"),
         "t1": PrimTensor("t1", (rows, cols), "float16"), "t2": PrimTensor("t2", (rows, cols), "float16")}
    dims = (IterDim("r", rows), IterDim("c", cols))
    ops = [PrimOp(f"op{i}", dims, (Access("x", (0, 1)),), Access(out, (0, 1)), PointwiseBody(Call(fn, (In(0),))))
           for i, (out, fn) in enumerate((("t1", "neg"), ("t2", "exp")), start=1)]
    return PrimGraph("two_readers", t, ops, ["x"], ["t1", "t2"])


def test_fused_member_rereads_an_input_its_cores_did_not_load():
    """Inside one kernel a later read of an input is free only where each core already
    holds the box it needs: with another work division its cores load their own boxes."""
    from tests.test_timing import _plan, _program
    pg = _two_readers_of_x(2048, 2048)
    tiles = {"op1": {"r": 4}, "op2": {"r": 4}}
    x_bytes = 2048 * 2048 * 2
    same = time_program(_program(pg, _plan({"op1": {"r": 32}, "op2": {"r": 32}}, tiles=tiles)), HW)
    assert same.op("op2").fused_group == same.op("op1").fused_group is not None
    assert same.op("op2").hbm_read_bytes == 0
    assert any("already on chip" in e for e in same.op("op2").effects)
    crossed = time_program(_program(pg, _plan({"op1": {"r": 32}, "op2": {"c": 32}}, tiles=tiles)), HW)
    assert crossed.op("op2").fused_group == crossed.op("op1").fused_group is not None
    assert crossed.op("op2").hbm_read_bytes == x_bytes
    assert crossed.total_us > same.total_us


def test_a_lone_prefill_matmul_is_tiled_so_its_loads_overlap_its_compute():
    """An untiled kernel overlaps little of its weight stream with its PT time (the
    calibrated `untiled_overlap_chunks`); tiled, the loads of tile j+1 run under the compute
    of tile j. A lone matmul is a run of its own. Each row tile reads the weight again, so
    tiling pays where the rows outweigh it (16384 rows against a 2048x2048 weight)."""
    from calibration.cases import matmul_graph

    pg = matmul_graph(16384, 2048, 2048)
    d = plan_cpsat(pg, HW, **FAST)
    assert max(d.ops["mm"].temporal_tiles.values(), default=1) > 1
    program = plan(pg, HW, "cpsat", **FAST)
    without = emit_program(pg, HW, _untiled(d))
    assert not validate_program(without, HW)
    assert time_program(program, HW).total_us < 0.9 * time_program(without, HW).total_us


def _two_matmuls(M=512, K=2048, N=2048):
    """z = (x @ w1) @ w2: two prefill-sized matmuls back to back, each a run of its own."""
    from target.primitives import Access, IterDim, MatmulBody, PrimGraph, PrimOp, PrimTensor
    ts = {t.id: t for t in (PrimTensor("x", (M, K), "float16", "user_input"),
                            PrimTensor("w1", (K, N), "float16", "parameter"),
                            PrimTensor("w2", (N, N), "float16", "parameter"),
                            PrimTensor("y", (M, N), "float16", "intermediate"),
                            PrimTensor("z", (M, N), "float16", "intermediate"))}

    def mm(oid, a, b, out, k):
        return PrimOp(oid, (IterDim("m", M), IterDim("n", N), IterDim("k", k, "reduction")),
                      (Access(a, (0, 2)), Access(b, (2, 1))), Access(out, (0, 1)), MatmulBody(0, 1, 2))
    return PrimGraph("two_mm", ts, [mm("mm1", "x", "w1", "y", K), mm("mm2", "y", "w2", "z", N)],
                     ["x", "w1", "w2"], ["z"])


def test_adjacent_runs_with_the_same_tile_count_stay_separate_kernels():
    """The program forms a kernel from ANY consecutive ops with equal tile and core counts,
    so two adjacent tiled runs would merge and the second matmul would read the first's
    result across tiles (kernel_tile_order). Fusion cuts a bundle at each tiled run's head,
    so both matmuls get tiled in kernels of their own."""
    from solver.plan import OpPlan
    # 4096 rows: both heads take K tiles (a K tile re-reads no operand; 1362 -> 991 us
    # simulated). Row tiles gain about 10% at most on the heights tried (the fill of a tiled
    # kernel is one of tiles x `untiled_overlap_chunks` pieces): 16384 rows 5280 -> 4884 us,
    # 32768 x 1024 3871 -> 3464 us
    pg = _two_matmuls(M=4096)
    split = {"m": 8, "n": 4}
    d = PlanDecisions("test", ops={o.id: OpPlan(core_split=dict(split)) for o in pg.ops})
    res = fuse_tiled_groups(pg, HW, d, tile_counts=(16,))
    assert res is not None and not validate_program(res.program, HW)
    groups = {o.op_id: o.fused_group for o in res.report.ops}
    assert groups["mm1"] is not None and groups["mm2"] is not None
    assert groups["mm1"] != groups["mm2"]
    assert res.fused_us < 0.9 * res.base_us


def test_split_k_matmul_is_resplit_when_tiling_would_beat_it(monkeypatch):
    """A matmul planned with its reduction dim split can join no fused kernel; the
    alternative plan moves it to the non-reduction split whose tiled estimate wins, and
    drops the residencies of its operands (their boxes change)."""
    from solver.plan import OpPlan, Residency
    from solver.spyre.fusion import resplit_for_tiling
    from solver.spyre.model import build_model
    pg = _two_matmuls()
    d = PlanDecisions("test", ops={"mm1": OpPlan(core_split={"m": 4, "n": 8}),
                                   "mm2": OpPlan(core_split={"m": 8, "k": 4})},
                      resident={"y": Residency(lx_address=0)})
    _, strategies, _ = build_model(pg, HW, d)  # the hint's strategies are kept
    out = resplit_for_tiling(pg, d, strategies)
    assert out is not None
    moved_d, moved = out
    assert moved == ["mm2"]
    assert "k" not in moved_d.ops["mm2"].core_split and moved_d.ops["mm1"] == d.ops["mm1"]
    assert "y" not in moved_d.resident
    # (holding y in LX for the split-K reader, mm1 on its split, is another way: here it
    # wins by 1%; the planner searches from both plans and keeps the faster)
    from solver.spyre.fusion import hold
    monkeypatch.setattr(hold, "hold_in_lx", lambda pg, hw, tr, *a: tr)
    res_k = fuse_tiled_groups(pg, HW, replace(d, resident={}))
    res_moved = fuse_tiled_groups(pg, HW, moved_d)
    assert res_moved.fused_us < res_k.fused_us


def test_adjacent_runs_merge_into_one_kernel_where_that_is_faster(monkeypatch):
    """Two projections of the same rows on different splits: the search tiles each run,
    then tries the second on the first's split and tile count without the cut between
    them; one kernel loads x once and overlaps one weight stream with the other's compute."""
    from solver.spyre.fusion import merge
    from solver.plan import OpPlan
    pg = primgraphs.gated_projections(M=16384)   # (row tiles re-read the weights: tall rows make tiling pay)
    d = PlanDecisions("test", ops={"mm1": OpPlan(core_split={"m": 8, "n": 4}),
                                   "mm2": OpPlan(core_split={"m": 4, "n": 8}),
                                   "mul": OpPlan(core_split={"m": 4, "n": 8})})
    merged = fuse_tiled_groups(pg, HW, d)
    assert merged is not None and not validate_program(merged.program, HW)
    groups = {o.op_id: o.fused_group for o in merged.report.ops}
    assert groups["mm1"] is not None and groups["mm1"] == groups["mm2"] == groups["mul"]
    monkeypatch.setattr(merge, "merge_adjacent", lambda pg, hw, tr, *a: tr)
    apart = fuse_tiled_groups(pg, HW, d)
    assert merged.fused_us < apart.fused_us


def _two_heads(M=512, K=4096, N=1024):
    """exp(x @ wq + bq) + neg(x @ wk + bk): two projections of the same rows with bias adds,
    each heading a chain of its own; the chain order runs each chain straight into the final
    add, so the two matmuls are not adjacent."""
    from target.primitives import (Access, Call, In, IterDim, MatmulBody, PointwiseBody, PrimGraph,
                                     PrimOp, PrimTensor)
    from solver.spyre.schedule import chain_order
    names = [("x", (M, K), "user_input"), ("wq", (K, N), "parameter"), ("wk", (K, N), "parameter"),
             ("bq", (N,), "parameter"), ("bk", (N,), "parameter")]
    names += [(t, (M, N), "intermediate") for t in ("q0", "k0", "q", "k", "qe", "kn", "z")]
    ts = {n: PrimTensor(n, shape, "float16", role) for n, shape, role in names}
    rows = (IterDim("m", M), IterDim("n", N))

    def mm(oid, b, out):
        return PrimOp(oid, rows + (IterDim("k", K, "reduction"),),
                      (Access("x", (0, 2)), Access(b, (2, 1))), Access(out, (0, 1)), MatmulBody(0, 1, 2))

    def pw(oid, fn, ins, out):
        acc = tuple(Access(t, (1,) if t.startswith("b") else (0, 1)) for t in ins)
        return PrimOp(oid, rows, acc, Access(out, (0, 1)), PointwiseBody(Call(fn, tuple(In(i) for i in range(len(ins))))))
    ops = [mm("mm_q", "wq", "q0"), mm("mm_k", "wk", "k0"), pw("bias_q", "add", ["q0", "bq"], "q"),
           pw("bias_k", "add", ["k0", "bk"], "k"), pw("exp", "exp", ["q"], "qe"),
           pw("neg", "neg", ["k"], "kn"), pw("add", "add", ["qe", "kn"], "z")]
    return chain_order(PrimGraph("two_heads", ts, ops, ["x", "wq", "wk", "bq", "bk"], ["z"]))


def test_sibling_matmuls_move_next_to_each_other_and_share_one_kernel():
    """Two projections of one input (query and key), each with its bias add in its kernel
    and followed by a chain of its own: with `reorder` the search moves the second kernel
    next to the first (op_order, dependencies kept), merges them into one kernel that loads
    x once, and the result is valid and faster than without."""
    from solver.plan import OpPlan
    M, K, N = 16384, 1024, 1024   # (row tiles re-read the weights: tall rows make tiling pay)
    pg = _two_heads(M, K, N)
    order = [op.id for op in pg.ops]
    assert abs(order.index("mm_q") - order.index("mm_k")) > 2  # apart before the search
    # the chains after the bias adds on 16 cores: no kernel of the plain search spans them
    d = PlanDecisions("test", ops={op.id: OpPlan(core_split={"m": 8, "n": 4} if op.id[:2] in ("mm", "bi")
                                                 else {"m": 16}) for op in pg.ops})
    apart = fuse_tiled_groups(pg, HW, d)
    together = fuse_tiled_groups(pg, HW, d, reorder=True)
    assert apart is not None and together is not None
    assert not validate_program(together.program, HW)
    new = together.decisions.op_order
    assert sorted(new) == sorted(order)
    first, second = sorted(("mm_q", "mm_k"), key=new.index)
    assert new.index(second) == new.index(first) + 2  # after the first's bias add
    assert [o.id for o in together.program.ops if o.kind == "compute"] == new
    groups = {o.op_id: o.fused_group for o in together.report.ops}
    assert groups["mm_q"] is not None and groups["mm_q"] == groups["mm_k"] == groups["bias_q"] == groups["bias_k"]
    # its weight, read again every row tile (no tiled dim indexes it); x is on chip
    assert set(together.decisions.ops[second].temporal_tiles) == {"m"}
    row_tiles = together.report.op(second).temporal_tiles
    assert together.report.op(second).hbm_read_bytes == K * N * 2 * row_tiles
    assert any("x already on chip" in e for e in together.report.op(second).effects)
    assert apart.report.op("mm_q").fused_group != apart.report.op("mm_k").fused_group
    assert together.fused_us < apart.fused_us
    # without reorder nothing moves
    assert not apart.decisions.op_order or apart.decisions.op_order == order


def _projection_then_row_stats(M=512, K=4096, N=4096):
    """s = sum_n((x @ w)^2): a projection followed by a norm's statistics, as in an
    RMSNorm after an attention output projection; the reduction runs over the dim the
    matmul's cores split, under another name (as lowering names it: d2 in the chain, r2 in
    the reduction)."""
    from target.primitives import (Access, Call, In, IterDim, MatmulBody, PointwiseBody, PrimGraph,
                                     PrimOp, PrimTensor, ReduceBody)
    ts = {t.id: t for t in (PrimTensor("x", (M, K), "float16", "user_input"),
                            PrimTensor("w", (K, N), "float16", "parameter"),
                            PrimTensor("y", (M, N), "float16", "intermediate"),
                            PrimTensor("sq", (M, N), "float16", "intermediate"),
                            PrimTensor("s", (M, 1), "float16", "intermediate"))}
    ops = [PrimOp("mm", (IterDim("m", M), IterDim("n", N), IterDim("k", K, "reduction")),
                  (Access("x", (0, 2)), Access("w", (2, 1))), Access("y", (0, 1)), MatmulBody(0, 1, 2)),
           PrimOp("sq", (IterDim("m", M), IterDim("n", N)), (Access("y", (0, 1)),), Access("sq", (0, 1)),
                  PointwiseBody(Call("mul", (In(0), In(0))))),
           PrimOp("sum", (IterDim("m", M), IterDim("r", N, "reduction")), (Access("sq", (0, 1)),),
                  Access("s", (0, None)), ReduceBody("sum"))]
    return PrimGraph("proj_stats", ts, ops, ["x", "w"], ["y", "s"])


def test_a_reduction_over_the_heads_split_dim_joins_its_kernel(monkeypatch):
    """A row sum reading a chain on the matmul's m x n split: no split of the sum's own dim
    names is the head's (the result has no n), so the variants give it the split that reads
    the box each core wrote, mapped through the tensor it reads (n split as a reduction,
    partial sums combined on the ring); in the kernel it reads the squares on chip."""
    from solver.spyre.fusion import hold, search, variants
    from solver.plan import OpPlan
    # about the members of a kernel a parallel-tiled matmul heads: K-tiled (stage 3), the
    # matmul is a kernel of its own
    monkeypatch.setattr(search._Search, "pick_k_tiles", lambda self, *a: None)
    pg = _projection_then_row_stats(M=8192, K=1024, N=1024)   # (tall rows: tiling pays)
    d = PlanDecisions("test", ops={"mm": OpPlan(core_split={"m": 8, "n": 4}),
                                   "sq": OpPlan(core_split={"m": 8, "n": 4}),
                                   "sum": OpPlan(core_split={"m": 32})})
    res = fuse_tiled_groups(pg, HW, d)
    assert res is not None and not validate_program(res.program, HW)
    groups = {o.op_id: o.fused_group for o in res.report.ops}
    assert groups["mm"] is not None and groups["mm"] == groups["sq"] == groups["sum"]
    assert {k: v for k, v in res.decisions.ops["sum"].core_split.items() if v > 1} == {"m": 8, "r": 4}
    monkeypatch.setattr(variants, "from_producer", lambda *a: None)
    # (holding the squares whole in LX for a sum outside the kernel is another way there)
    monkeypatch.setattr(hold, "hold_in_lx", lambda pg, hw, tr, *a: tr)
    without = fuse_tiled_groups(pg, HW, d)
    assert without.report.op("sum").fused_group != without.report.op("mm").fused_group
    assert res.fused_us < without.fused_us


def test_a_result_handed_between_kernels_is_held_in_lx_with_its_reader_following(monkeypatch):
    """op1 (a tiled kernel on row slices) hands t1 to op2 on column slices through device
    memory: written whole, read back. `hold.hold_in_lx` moves op2 to the row split, where each
    core reads the slice it made, keeps t1 whole in LX, and the program is valid and faster;
    a kernel reading it follows whole; with no split to follow, t1 stays in device memory."""
    from solver.spyre.fusion import hold
    from target.superdsc import LxMemory
    from tests.test_timing import _plan, unary_chain
    pg = unary_chain(2048, 2048, n_ops=3)
    d = _plan({"op1": {"r": 32}, "op2": {"c": 32}, "op3": {"c": 32}}, tiles={"op1": {"r": 4}})
    prog = emit_program(pg, HW, d)
    assert not validate_program(prog, HW)
    rep = time_program(prog, HW)
    held_d, held_prog, held_rep = hold.hold_in_lx(pg, HW, (d, prog, rep), None, 0.0)
    assert not validate_program(held_prog, HW)
    assert isinstance(held_prog.tensor_map()["t1"].memory, LxMemory)
    assert {k: v for k, v in held_d.ops["op2"].core_split.items() if v > 1} == {"r": 32}
    assert held_rep.op("op1").hbm_write_bytes == 0 and held_rep.op("op2").hbm_read_bytes == 0
    assert held_rep.total_us < rep.total_us
    # op2 and op3 one kernel on the column split: op2 follows, and op3, reading op2's
    # result in that kernel, with it
    d2 = _plan({"op1": {"r": 32}, "op2": {"c": 32}, "op3": {"c": 32}},
               tiles={"op1": {"r": 4}, "op2": {"c": 2}, "op3": {"c": 2}})
    prog2 = emit_program(pg, HW, d2)
    rep2 = time_program(prog2, HW)
    assert rep2.op("op2").fused_group == rep2.op("op3").fused_group is not None
    out = hold.hold_in_lx(pg, HW, (d2, prog2, rep2), None, 0.0)
    assert not validate_program(out[1], HW) and out[2].total_us < rep2.total_us
    assert all({k: v for k, v in out[0].ops[o].core_split.items() if v > 1} == {"r": 32} for o in ("op2", "op3"))
    assert isinstance(out[1].tensor_map()["t1"].memory, LxMemory)
    # no split under which a reader reads what its own core made (so the kernels cannot
    # meet on one either, `meet`): nothing moves
    from solver.spyre.fusion import meet
    monkeypatch.setattr(hold, "split_through", lambda *a: None)
    monkeypatch.setattr(meet, "split_through", lambda *a: None)
    assert hold.hold_in_lx(pg, HW, (d, prog, rep), None, 0.0)[1] is prog


def _projection_plus_resident(M=4096, K=1024, N=1024):
    """z = exp(r) + x @ w, exp(r) held in LX on its own split."""
    from target.primitives import (Access, Call, In, IterDim, MatmulBody, PointwiseBody, PrimGraph,
                                     PrimOp, PrimTensor)
    ts = {t.id: t for t in (PrimTensor("x", (M, K), "float16", "user_input"),
                            PrimTensor("w", (K, N), "float16", "parameter"),
                            PrimTensor("r", (M, N), "float16", "user_input"),
                            PrimTensor("a", (M, N), "float16"), PrimTensor("y", (M, N), "float16"),
                            PrimTensor("z", (M, N), "float16"))}
    rows = (IterDim("m", M), IterDim("n", N))
    ops = [PrimOp("a", rows, (Access("r", (0, 1)),), Access("a", (0, 1)), PointwiseBody(Call("exp", (In(0),)))),
           PrimOp("mm", rows + (IterDim("k", K, "reduction"),), (Access("x", (0, 2)), Access("w", (2, 1))),
                  Access("y", (0, 1)), MatmulBody(0, 1, 2)),
           PrimOp("add", rows, (Access("a", (0, 1)), Access("y", (0, 1))), Access("z", (0, 1)),
                  PointwiseBody(Call("add", (In(0), In(1)))))]
    return PrimGraph("lead", ts, ops, ["x", "w", "r"], ["z"])


def test_a_matmul_takes_its_readers_split_so_its_result_stays_in_lx(monkeypatch):
    """The add reads exp(r) from LX on the m8 x n4 split and the projection's result from
    device memory (the matmul on m4 x n8): the add cannot follow the matmul's split (its LX
    operand would then be on other cores), so the matmul takes the add's split and its
    result is held whole in LX: valid, faster, no device traffic for y."""
    from solver.spyre.fusion import hold
    from target.superdsc import LxMemory
    from solver.plan import OpPlan, Residency
    pg = _projection_plus_resident()
    d = PlanDecisions("test", ops={"a": OpPlan(core_split={"m": 8, "n": 4}),
                                   "mm": OpPlan(core_split={"m": 4, "n": 8}, temporal_tiles={"m": 8}),
                                   "add": OpPlan(core_split={"m": 8, "n": 4})},
                      resident={"a": Residency(lx_address=0)}, bundle_starts=["mm"])
    prog = emit_program(pg, HW, d)
    assert not validate_program(prog, HW)
    rep = time_program(prog, HW)
    held_d, held_prog, held_rep = hold.hold_in_lx(pg, HW, (d, prog, rep), None, 0.0)
    assert not validate_program(held_prog, HW)
    assert {k: v for k, v in held_d.ops["mm"].core_split.items() if v > 1} == {"m": 8, "n": 4}
    assert isinstance(held_prog.tensor_map()["y"].memory, LxMemory)
    assert held_rep.op("add").hbm_read_bytes == 0
    assert held_rep.total_us < 0.9 * rep.total_us
    monkeypatch.setattr(hold, "_lead_split", lambda *a: [])
    assert hold.hold_in_lx(pg, HW, (d, prog, rep), None, 0.0)[1] is prog


def test_a_kernel_takes_the_split_its_member_reads_a_held_result_in(monkeypatch):
    """exp(r) is made on m8 x n4 and read by the add inside the projection's kernel on
    m4 x n8 (through device memory: another core made each part). The add, a kernel member,
    cannot change split alone, so the whole kernel (matmul and add) takes the split under
    which the add reads what its own core made, and exp(r) stays whole in LX."""
    from solver.spyre.fusion import hold
    from target.superdsc import LxMemory
    from solver.plan import OpPlan
    pg = _projection_plus_resident()
    d = PlanDecisions("test", ops={"a": OpPlan(core_split={"m": 8, "n": 4}),
                                   "mm": OpPlan(core_split={"m": 4, "n": 8}, temporal_tiles={"m": 8}),
                                   "add": OpPlan(core_split={"m": 4, "n": 8}, temporal_tiles={"m": 8})},
                      bundle_starts=["mm"])
    prog = emit_program(pg, HW, d)
    assert not validate_program(prog, HW)
    rep = time_program(prog, HW)
    assert rep.op("mm").fused_group == rep.op("add").fused_group is not None
    held_d, held_prog, held_rep = hold.hold_in_lx(pg, HW, (d, prog, rep), None, 0.0)
    assert not validate_program(held_prog, HW)
    for oid in ("mm", "add"):
        assert {k: v for k, v in held_d.ops[oid].core_split.items() if v > 1} == {"m": 8, "n": 4}
    assert isinstance(held_prog.tensor_map()["a"].memory, LxMemory)
    assert held_rep.op("mm").fused_group == held_rep.op("add").fused_group is not None
    assert held_rep.total_us < 0.8 * rep.total_us
    monkeypatch.setattr(hold, "_kernel_follows", lambda *a: [])
    out = hold.hold_in_lx(pg, HW, (d, prog, rep), None, 0.0)
    assert "a" not in out[0].resident


def test_following_stops_at_a_held_result_a_matmul_reads_and_drops_its_residency():
    """op1 (a kernel on row slices) hands t1 to op2 through device memory; op2's result t2
    is held in LX for a split-K matmul that reads exactly op2's slices. op2 can follow op1's
    split, but the matmul cannot follow op2: t2 goes to device memory instead (any split
    reads it there) and the matmul keeps its split."""
    from solver.spyre.fusion import hold
    from target.primitives import (Access, Call, In, IterDim, MatmulBody, PointwiseBody, PrimGraph,
                                     PrimOp, PrimTensor)
    from solver.plan import OpPlan, Residency
    M, N = 512, 2048
    ts = {t.id: t for t in (PrimTensor("x", (M, N), "float16", "user_input"),
                            PrimTensor("w", (N, N), "float16", "parameter"),
                            PrimTensor("t1", (M, N), "float16"), PrimTensor("t2", (M, N), "float16"),
                            PrimTensor("z", (M, N), "float16"))}
    rows = (IterDim("r", M), IterDim("c", N))
    pg = PrimGraph("drop", ts, [
        PrimOp("op1", rows, (Access("x", (0, 1)),), Access("t1", (0, 1)), PointwiseBody(Call("exp", (In(0),)))),
        PrimOp("op2", rows, (Access("t1", (0, 1)),), Access("t2", (0, 1)), PointwiseBody(Call("neg", (In(0),)))),
        PrimOp("mm", (IterDim("m", M), IterDim("n", N), IterDim("k", N, "reduction")),
               (Access("t2", (0, 2)), Access("w", (2, 1))), Access("z", (0, 1)), MatmulBody(0, 1, 2))],
        ["x", "w"], ["z"])
    d = PlanDecisions("test", ops={"op1": OpPlan(core_split={"r": 32}, temporal_tiles={"r": 4}),
                                   "op2": OpPlan(core_split={"r": 4, "c": 8}),
                                   "mm": OpPlan(core_split={"m": 4, "k": 8})},
                      resident={"t2": Residency(lx_address=0)})
    prog = emit_program(pg, HW, d)
    assert not validate_program(prog, HW)
    ops, drop = hold._follow_split(pg, prog, d, "t1", HW)
    assert {k: v for k, v in ops["op2"].core_split.items() if v > 1} == {"r": 32}
    assert ops["mm"] == d.ops["mm"] and drop == {"t2"}
    moved = replace(d, ops=ops, resident={})
    assert not validate_program(emit_program(pg, HW, moved), HW)


def test_a_kernel_with_more_tiles_than_its_members_stream_well_gets_fewer():
    """Two pointwise ops in one kernel on 64-row core slices at 64 tiles: one row per tile
    underfills the stream. `retile.fewer_tiles` tries a half and a quarter of the count and keeps
    the faster valid one (one pass: 64 -> 16 tiles, still underfilled), and passes repeat
    while one gains: 16 -> 4, where the kernel no longer loses RETILE_MIN_US."""
    from solver.spyre.fusion import retile
    from tests.test_timing import _plan, unary_chain
    pg = unary_chain(2048, 2048, n_ops=2)
    d = _plan({"op1": {"r": 32}, "op2": {"r": 32}}, tiles={"op1": {"r": 64}, "op2": {"r": 64}})
    prog = emit_program(pg, HW, d)
    assert not validate_program(prog, HW)
    rep = time_program(prog, HW)
    assert any(e.startswith("underfill") for e in rep.op("op1").effects)
    one_d, _, one_rep = retile.fewer_tiles(pg, HW, (d, prog, rep), None, 0.0, limit=2)
    assert one_d.ops["op1"].temporal_tiles == one_d.ops["op2"].temporal_tiles == {"r": 16}
    assert any(e.startswith("underfill") for e in one_rep.op("op1").effects)
    out_d, out_prog, out_rep = retile.fewer_tiles(pg, HW, (d, prog, rep), None, 0.0)
    assert not validate_program(out_prog, HW)
    assert out_d.ops["op1"].temporal_tiles == out_d.ops["op2"].temporal_tiles == {"r": 4}
    assert out_rep.op("op1").fused_group == out_rep.op("op2").fused_group is not None
    assert out_rep.total_us < 0.8 * one_rep.total_us < 0.8 * rep.total_us


def _three_op_chain(rows: int, cols: int, splits: dict, tiles: dict) -> tuple:
    """unary_chain(rows, cols, 3) planned with `splits` and `tiles`, emitted (valid), and
    `hold._follow_split`'s (ops, drop) for t1."""
    from solver.spyre.fusion import hold
    from tests.test_timing import _plan, unary_chain
    pg = unary_chain(rows, cols, n_ops=3)
    d = _plan(splits, tiles=tiles)
    prog = emit_program(pg, HW, d)
    assert not validate_program(prog, HW)
    return pg, d, prog, hold._follow_split(pg, prog, d, "t1", HW)


def test_a_following_kernel_takes_fewer_tiles_where_its_tiled_dim_is_now_split():
    """op2 and op3 (one kernel on row slices, 64 tiles along the columns) follow op1's
    column split to read t1 from LX: each core then holds 1/32 of the columns, so the kernel
    takes 64 / 32 = 2 tiles (one count for both members), and the program is valid."""
    from solver.spyre.fusion import hold
    from target.superdsc import LxMemory
    pg, d, prog, (ops, drop) = _three_op_chain(1024, 8192, {"op1": {"c": 32}, "op2": {"r": 32}, "op3": {"r": 32}},
                                               {"op1": {"r": 4}, "op2": {"c": 64}, "op3": {"c": 64}})
    assert ops["op2"].temporal_tiles == ops["op3"].temporal_tiles == {"c": 2} and not drop
    rep = time_program(prog, HW)
    held_d, held_prog, held_rep = hold.hold_in_lx(pg, HW, (d, prog, rep), None, 0.0)
    assert not validate_program(held_prog, HW)
    assert isinstance(held_prog.tensor_map()["t1"].memory, LxMemory)
    assert held_rep.total_us < rep.total_us


def test_a_following_kernel_with_other_tiles_drops_its_tile_buffers():
    """The kernel of op2 and op3 keeps t2 as a tile buffer sized for 64 column tiles; when
    it follows op1's split with 2 tiles, the buffer goes (the trial re-adds buffers)."""
    from solver.spyre.fusion import hold
    from solver.plan import Residency
    from tests.test_timing import _plan, unary_chain
    pg = unary_chain(1024, 8192, n_ops=3)
    d = _plan({"op1": {"c": 32}, "op2": {"r": 32}, "op3": {"r": 32}},
              tiles={"op1": {"r": 4}, "op2": {"c": 64}, "op3": {"c": 64}})
    d.resident["t2"] = Residency(lx_address=0, per_tile=True)
    prog = emit_program(pg, HW, d)
    assert not validate_program(prog, HW)
    ops, drop = hold._follow_split(pg, prog, d, "t1", HW)
    assert ops["op2"].temporal_tiles == {"c": 2} and drop == {"t2"}
    assert not validate_program(emit_program(pg, HW, replace(d, ops=ops, resident={})), HW)


def test_a_run_a_whole_trial_moved_goes_back_on_its_own_best_choice():
    """The combination may keep a whole trial (one variant and tile count for every run)
    that put a run on a choice much slower for it than its own best; `revisit` puts it
    back, kept only because the whole program is valid and faster. A run no faster on its
    own choice is left as it is."""
    from solver.plan import OpPlan
    from solver.spyre.fusion import revisit
    from solver.spyre.fusion.runs import span_us, with_tiles
    from solver.spyre.fusion.trial import trial
    from solver.spyre.fusion.variants import Variant
    pg = _projection_then_row_stats()
    run = ["mm", "sq", "sum"]

    def on(splits: dict, tiles: int) -> tuple:
        ops = {o: OpPlan(core_split=s, temporal_tiles={"m": tiles}) for o, s in splits.items()}
        d = with_tiles(PlanDecisions("test", ops=ops), {o: {"m": tiles} for o in run}, [run], HW)
        tr = trial(pg, HW, d)
        assert tr is not None and not validate_program(tr[1], HW)
        return tr
    own = {"mm": {"m": 8, "n": 4}, "sq": {"m": 8, "n": 4}, "sum": {"m": 8, "r": 4}}
    other = {"mm": {"m": 16, "n": 2}, "sq": {"m": 16, "n": 2}, "sum": {"m": 16, "r": 2}}
    good, kept = on(own, 16), on(other, 32)   # 332 vs 478 us (2026-12-02)
    assert span_us(good[2], run) < span_us(kept[2], run) - revisit.REVISIT_MIN_US
    variant = Variant(PlanDecisions("test", ops={o: OpPlan(core_split=s) for o, s in own.items()}),
                      {"mm": set(run)}, {})
    best = [(span_us(good[2], run), 0, {o: {"m": 16} for o in run})]
    d, prog, rep = revisit.runs_on_their_best(pg, HW, kept, [run], best, [variant], None, 0.0)
    assert not validate_program(prog, HW)
    assert {o: {k: v for k, v in d.ops[o].core_split.items() if v > 1} for o in run} == own
    assert all(d.ops[o].temporal_tiles == {"m": 16} for o in run)
    assert rep.total_us < kept[2].total_us
    # the other way round the run is already faster than the choice offered: unchanged
    best_other = [(span_us(kept[2], run), 0, {o: {"m": 32} for o in run})]
    variant_other = Variant(PlanDecisions("test", ops={o: OpPlan(core_split=s) for o, s in other.items()}),
                            {"mm": set(run)}, {})
    same = revisit.runs_on_their_best(pg, HW, good, [run], best_other, [variant_other], None, 0.0)
    assert same is good


def _residual_after_scaled(rows=2048, cols=2048):
    """x -> op1 -> t1 (a residual); y -> scale -> ty; add(t1, ty): the scaling of another
    branch runs in one kernel with the add reading t1, as a split-K result's scaling and the
    final residual add of a layer do."""
    from target.primitives import Access, Call, In, IterDim, PointwiseBody, PrimGraph, PrimOp, PrimTensor
    f16 = "float16"
    ts = {n: PrimTensor(n, (rows, cols), f16, role) for n, role in
          (("x", "user_input"), ("y", "user_input"), ("t1", "intermediate"), ("ty", "intermediate"),
           ("out", "intermediate"))}
    dims = (IterDim("r", rows), IterDim("c", cols))
    ops = [PrimOp("op1", dims, (Access("x", (0, 1)),), Access("t1", (0, 1)), PointwiseBody(Call("neg", (In(0),)))),
           PrimOp("scale", dims, (Access("y", (0, 1)),), Access("ty", (0, 1)), PointwiseBody(Call("neg", (In(0),)))),
           PrimOp("add", dims, (Access("t1", (0, 1)), Access("ty", (0, 1))), Access("out", (0, 1)),
                  PointwiseBody(Call("add", (In(0), In(1)))))]
    return PrimGraph("residual", ts, ops, ["x", "y"], ["out"])


def test_a_held_results_reader_brings_its_kernel_mates_along():
    """t1 (made on row slices) goes to `add` through device memory; `add` runs in one kernel
    with `scale`, which does not read t1, on column slices. Holding t1 moves `add` to the row
    split and `scale` with it (the same split of its result), so the kernel stays whole."""
    from solver.spyre.fusion import hold
    from target.superdsc import LxMemory
    from tests.test_timing import _plan
    pg = _residual_after_scaled()
    d = _plan({"op1": {"r": 32}, "scale": {"c": 32}, "add": {"c": 32}},
              tiles={"op1": {"r": 4}, "scale": {"r": 64}, "add": {"r": 64}})
    prog = emit_program(pg, HW, d)
    assert not validate_program(prog, HW)
    rep = time_program(prog, HW)
    assert rep.op("scale").fused_group == rep.op("add").fused_group is not None
    assert rep.op("op1").fused_group != rep.op("add").fused_group
    out_d, out_prog, out_rep = hold.hold_in_lx(pg, HW, (d, prog, rep), None, 0.0)
    assert not validate_program(out_prog, HW)
    assert isinstance(out_prog.tensor_map()["t1"].memory, LxMemory)
    assert all({k: v for k, v in out_d.ops[o].core_split.items() if v > 1} == {"r": 32} for o in ("scale", "add"))
    assert out_rep.op("scale").fused_group == out_rep.op("add").fused_group is not None
    assert out_rep.total_us < rep.total_us


def _scaled_rows(rows=512, cols=4096):
    """t1 = -x on fp32 rows; y = t1 * v[row]: an RMSNorm's apply reading its fp32 input and
    the per-row vector, sticked along the rows (16 sticks of 32 fp32 for 512 rows), so the
    apply takes at most 16 row slices."""
    from target.primitives import Access, Call, In, IterDim, PointwiseBody, PrimGraph, PrimOp, PrimTensor
    f32 = "float32"
    ts = {t.id: t for t in (PrimTensor("x", (rows, cols), f32, "user_input"), PrimTensor("v", (rows,), f32, "user_input"),
                            PrimTensor("t1", (rows, cols), f32), PrimTensor("y", (rows, cols), f32))}
    dims = (IterDim("r", rows), IterDim("c", cols))
    ops = [PrimOp("op1", dims, (Access("x", (0, 1)),), Access("t1", (0, 1)), PointwiseBody(Call("neg", (In(0),)))),
           PrimOp("op2", dims, (Access("t1", (0, 1)), Access("v", (0,))), Access("y", (0, 1)),
                  PointwiseBody(Call("mul", (In(0), In(1)))))]
    return PrimGraph("scaled_rows", ts, ops, ["x", "v"], ["y"])


def test_two_kernels_that_cannot_follow_each_other_meet_on_one_split():
    """op1's kernel writes t1 on 32 row slices; op2 cannot read 32 row slices (its per-row
    vector has 16 sticks) and runs on 32 column slices, so t1 goes through device memory and
    op1 is no matmul to take op2's split. `meet.meet_splits` moves both to a common split of
    t1's dims; `hold.hold_in_lx` keeps the fastest valid one with t1 held in LX."""
    from target.op_rules import legal_core_splits
    from target.geometry import op_granules
    from target.superdsc import LxMemory
    from solver.spyre.fusion import hold, meet
    from tests.test_timing import _plan
    pg = _scaled_rows()
    d = _plan({"op1": {"r": 32}, "op2": {"c": 32}}, tiles={"op1": {"r": 2}, "op2": {"r": 2}})
    d.bundle_starts = ["op1", "op2"]   # two kernels (as `runs.with_tiles` cuts them)
    prog = emit_program(pg, HW, d)
    assert not validate_program(prog, HW)
    rep = time_program(prog, HW)
    assert rep.op("op1").fused_group != rep.op("op2").fused_group
    tmap = prog.tensor_map()
    op2 = pg.ops[1]
    gran = op_granules(op2, {t.id: t.layout for t in prog.tensors}, {t.id: t.dtype for t in prog.tensors},
                       HW.stick_bytes)
    assert {"r": 32} not in legal_core_splits(op2, gran, HW.cores)   # it cannot follow
    assert not isinstance(tmap["t1"].memory, LxMemory)
    alternatives = meet.meet_splits(pg, prog, d, "t1", HW)
    assert alternatives and all(ops["op1"].core_split == ops["op2"].core_split for ops, _, _ in alternatives)
    out_d, out_prog, out_rep = hold.hold_in_lx(pg, HW, (d, prog, rep), None, 0.0)
    assert not validate_program(out_prog, HW)
    assert isinstance(out_prog.tensor_map()["t1"].memory, LxMemory)
    assert out_d.ops["op1"].core_split == out_d.ops["op2"].core_split
    assert out_rep.op("op1").hbm_write_bytes == 0
    assert out_rep.total_us < rep.total_us


def test_a_following_kernel_may_keep_its_tile_count():
    """op2 and op3 (one kernel on column slices, 2 tiles along the rows) follow op1's row
    split: proportionally fewer tiles leave the kernel untiled; `hold._tiles_kept` offers the
    same moves at its 2 tiles, which each core's 64 rows still hold."""
    from solver.spyre.fusion import hold
    pg, d, prog, (ops, _) = _three_op_chain(2048, 2048, {"op1": {"r": 32}, "op2": {"c": 32}, "op3": {"c": 32}},
                                            {"op1": {"r": 4}, "op2": {"r": 2}, "op3": {"r": 2}})
    assert ops["op2"].temporal_tiles == ops["op3"].temporal_tiles == {}
    kept = hold._tiles_kept(pg, prog, d, ops, HW)
    assert len(kept) == 1 and kept[0]["op2"].temporal_tiles == kept[0]["op3"].temporal_tiles == {"r": 2}
    assert all(kept[0][o].core_split == ops[o].core_split for o in ("op2", "op3"))
    rep = time_program(prog, HW)
    out = hold.hold_in_lx(pg, HW, (d, prog, rep), None, 0.0)
    assert not validate_program(out[1], HW) and out[2].total_us < rep.total_us
