"""The lower bound: hand-computed values, and never above the simulated time of any plan."""
from __future__ import annotations

import pytest

from target.primitives import Access, IterDim, MatmulBody, PrimGraph, PrimOp, PrimTensor
from target.hardware import load_target
from simulator.timing import time_program
from solver.emit import emit_program
from solver.lower_bound import lower_bound
from solver.naive import plan_naive
from solver.planners import plan
from tests import primgraphs

HW = load_target()


def _matmul(M, K, N):
    ts = [PrimTensor("x", (M, K), "float16", "user_input"), PrimTensor("w", (K, N), "float16", "parameter"),
          PrimTensor("y", (M, N), "float16")]
    op = PrimOp("mm", (IterDim("m", M), IterDim("n", N), IterDim("k", K, "reduction")),
                (Access("x", (0, 2)), Access("w", (2, 1))), Access("y", (0, 1)), MatmulBody(0, 1, 2))
    return PrimGraph("mm", {t.id: t for t in ts}, [op], ["x", "w"], ["y"])


def test_matmul_bound_by_hand():
    M, K, N = 512, 4096, 4096
    lb = lower_bound(_matmul(M, K, N), HW)
    compute_us = M * K * N / (HW.pt_sustained_mac_per_ns_per_core * HW.cores) / 1e3
    moved = (M * K + K * N + M * N) * 2
    assert lb.compulsory_bytes == moved
    assert lb.compute_us == pytest.approx(compute_us)
    assert lb.memory_us == pytest.approx(moved / HW.dram_oneway_gbps / 1e3)
    assert lb.lower_bound_us == pytest.approx(max(compute_us, moved / HW.dram_oneway_gbps / 1e3))
    # the datasheet view is the physical limit: never above the simulated-rates bound
    peak = max(M * K * N / (HW.pt_peak_mac_per_ns_per_core * HW.cores), moved / HW.dram_peak_gbps) / 1e3
    assert lb.datasheet_us == pytest.approx(peak)
    assert lb.datasheet_us < lb.lower_bound_us <= lb.per_op_us


def test_decode_matmul_is_memory_bound():
    lb = lower_bound(_matmul(1, 4096, 25600), HW)
    assert lb.memory_us > 10 * lb.compute_us
    assert lb.lower_bound_us == pytest.approx(lb.memory_us)


def test_intermediates_cost_no_compulsory_bytes():
    pg, _ = primgraphs.softmax(M=512, N=1024)
    lb = lower_bound(pg, HW)
    assert lb.compulsory_bytes == 2 * 512 * 1024 * 2  # input once, output once


GRAPHS = ["mlp", "softmax", "attention_scores", "copies", "embedding", "colsum"]


@pytest.mark.parametrize("builder", GRAPHS)
@pytest.mark.parametrize("planner", ["naive", "heuristic"])
def test_bound_below_simulated_time(builder, planner):
    pg, _ = getattr(primgraphs, builder)()
    lb = lower_bound(pg, HW)
    simulated = time_program(plan(pg, HW, planner), HW).total_us
    assert 0 < lb.lower_bound_us <= lb.split_bound_us <= simulated


@pytest.mark.parametrize("builder", ["softmax", "mlp", "attention_scores"])
def test_bound_below_cpsat_plans(builder):
    pg, _ = getattr(primgraphs, builder)()
    program = plan(pg, HW, "cpsat", time_limit_s=2, deterministic=True)
    assert lower_bound(pg, HW).split_bound_us <= time_program(program, HW).total_us


@pytest.mark.parametrize("builder", ["softmax", "mlp"])
def test_bound_below_fused_tiled_plans(builder):
    """Temporal tiles make the simulator fuse consecutive ops into one kernel whose loads
    overlap other ops' compute; the headline bound must still hold."""
    pg, _ = getattr(primgraphs, builder)()
    decisions = plan_naive(pg, HW)
    for op in pg.ops:
        p = decisions.ops[op.id]
        outer = next(d for d in op.iter_dims if d.kind == "parallel")
        if outer.name not in p.core_split:
            per_core = outer.size
        else:
            per_core = outer.size // p.core_split[outer.name]
        if per_core % 2 == 0:
            p.temporal_tiles = {outer.name: 2}
    from simulator.validate import validate_program
    program = emit_program(pg, HW, decisions)
    assert validate_program(program, HW) == []
    assert lower_bound(pg, HW).split_bound_us <= time_program(program, HW).total_us


@pytest.mark.parametrize("planner", ["naive", "heuristic"])
def test_every_program_states_its_lower_bound(planner):
    pg = _matmul(128, 1024, 2048)
    program = plan(pg, HW, planner)
    assert program.stats.lower_bound_us == pytest.approx(lower_bound(pg, HW).lower_bound_us)
    assert program.stats.lower_bound_us <= time_program(program, HW).total_us


@pytest.mark.parametrize("shape", [(512, 768, 768), (512, 4096, 14336), (32, 4096, 4096), (16, 4096, 64)])
def test_split_bound_below_every_split_and_above_the_plain_bound(shape):
    """Every legal core split of a lone matmul, emitted and simulated, takes at least the
    split-aware bound. Since shared reads cross the bus once and fan out to 8 cores free
    (the calibrated model), an M x N split such as m8 x n4 costs nothing the plain bound
    does not charge, so the two bounds may coincide; where every 32-core split needs a wide
    fan-out or a ring combine (16 x 4096 x 64: M holds 16 rows, N one stick) the split
    bound is above the plain one."""
    from target.op_rules import legal_core_splits, split_granules, stick_options
    from simulator.validate import validate_program
    pg = _matmul(*shape)
    op = pg.ops[0]
    lb = lower_bound(pg, HW)
    assert lb.split_bound_us >= lb.lower_bound_us
    if shape == (16, 4096, 64):
        assert lb.split_bound_us > lb.lower_bound_us
    ch = stick_options(op)[0]
    gran = split_granules(op, list(ch.inputs), ch.output, ["float16"] * 3, HW.stick_bytes)
    fastest = float("inf")
    for sp in legal_core_splits(op, gran, HW.cores):
        d = plan_naive(pg, HW)
        d.ops[op.id].stick, d.ops[op.id].core_split = ch, dict(sp)
        program = emit_program(pg, HW, d)
        assert validate_program(program, HW) == []
        us = time_program(program, HW).total_us
        assert us >= lb.split_bound_us - 1e-9, sp
        fastest = min(fastest, us)
    assert fastest < 3 * lb.split_bound_us  # and it is not vacuous


def _shared_input_pair(M, K, N):
    """x feeds two matmuls (the gate/up shape): whichever reads it replicated, the copies
    its cores need beyond one must come from device memory once."""
    ts = [PrimTensor("x", (M, K), "float16", "user_input"), PrimTensor("w1", (K, N), "float16", "parameter"),
          PrimTensor("w2", (K, N), "float16", "parameter"), PrimTensor("y1", (M, N), "float16"),
          PrimTensor("y2", (M, N), "float16")]
    ops = [PrimOp(f"mm{i}", (IterDim("m", M), IterDim("n", N), IterDim("k", K, "reduction")),
                  (Access("x", (0, 2)), Access(w, (2, 1))), Access(y, (0, 1)), MatmulBody(0, 1, 2))
           for i, (w, y) in enumerate((("w1", "y1"), ("w2", "y2")), start=1)]
    return PrimGraph("pair", {t.id: t for t in ts}, ops, ["x", "w1", "w2"], ["y1", "y2"])


def test_split_bound_holds_for_matmuls_sharing_an_input():
    """Pairs of core splits of two matmuls reading one input, unfused and as one tiled
    kernel (where the second read is free on every core that loaded the box before): none
    simulates below the bound. (The bound charges no delivery for a tensor two ops read:
    one fused kernel may deliver it once, at the narrower fan-out.)"""
    import random
    from target.op_rules import legal_core_splits, split_granules, stick_options
    from simulator.validate import validate_program
    pg = _shared_input_pair(256, 1024, 2048)
    lb = lower_bound(pg, HW)
    op = pg.ops[0]
    ch = stick_options(op)[0]
    gran = split_granules(op, list(ch.inputs), ch.output, ["float16"] * 3, HW.stick_bytes)
    splits = legal_core_splits(op, gran, HW.cores)
    rng = random.Random(7)
    pairs = [(a, a) for a in splits] + [(rng.choice(splits), rng.choice(splits)) for _ in range(60)]
    fastest = float("inf")
    for a, b in pairs:
        for tiled in (False, True):
            d = plan_naive(pg, HW)
            for o, sp in zip(pg.ops, (a, b)):
                d.ops[o.id].stick, d.ops[o.id].core_split = ch, dict(sp)
                if tiled:
                    d.ops[o.id].temporal_tiles = {"n": 2}
            program = emit_program(pg, HW, d)
            if validate_program(program, HW):
                continue
            us = time_program(program, HW).total_us
            assert us >= lb.split_bound_us - 1e-9, (a, b, tiled)
            fastest = min(fastest, us)
    assert fastest < 2 * lb.split_bound_us
    assert lb.split_bound_us >= lb.lower_bound_us


def test_split_bound_holds_when_a_split_reduction_result_is_read_back():
    """A matmul whose reduction dim is split writes its combined result to device memory, and
    the op reading it loads it back from there: every split of the matmul, with its reader
    tiled into one kernel with it or not, simulates at or above the bound."""
    from target.op_rules import legal_core_splits, split_granules, stick_options
    from target.primitives import Call, In, PointwiseBody
    from simulator.validate import validate_program
    M, K, N = 128, 4096, 1024
    ts = [PrimTensor("x", (M, K), "float16", "user_input"), PrimTensor("w", (K, N), "float16", "parameter"),
          PrimTensor("y", (M, N), "float16"), PrimTensor("z", (M, N), "float16")]
    mm = PrimOp("mm", (IterDim("m", M), IterDim("n", N), IterDim("k", K, "reduction")),
                (Access("x", (0, 2)), Access("w", (2, 1))), Access("y", (0, 1)), MatmulBody(0, 1, 2))
    act = PrimOp("act", (IterDim("r", M), IterDim("c", N)), (Access("y", (0, 1)),), Access("z", (0, 1)),
                 PointwiseBody(Call("neg", (In(0),))))
    pg = PrimGraph("mm_act", {t.id: t for t in ts}, [mm, act], ["x", "w"], ["z"])
    lb = lower_bound(pg, HW)
    ch = stick_options(mm)[0]
    gran = split_granules(mm, list(ch.inputs), ch.output, ["float16"] * 3, HW.stick_bytes)
    checked = 0
    for sp in legal_core_splits(mm, gran, HW.cores):
        for tiles in ({}, {"n": 2}):
            d = plan_naive(pg, HW)
            d.ops["mm"].stick, d.ops["mm"].core_split = ch, dict(sp)
            d.ops["act"].core_split = {"r": 32}
            if tiles:
                d.ops["mm"].temporal_tiles, d.ops["act"].temporal_tiles = dict(tiles), {"c": 2}
            program = emit_program(pg, HW, d)
            if validate_program(program, HW):
                continue
            assert time_program(program, HW).total_us >= lb.split_bound_us - 1e-9, (sp, tiles)
            checked += 1
    assert checked > 20


def _bmm(B, M, K, N):
    ts = [PrimTensor("q", (B, M, K), "float16", "user_input"), PrimTensor("k", (B, K, N), "float16", "user_input"),
          PrimTensor("s", (B, M, N), "float16")]
    op = PrimOp("bmm", (IterDim("b", B), IterDim("m", M), IterDim("n", N), IterDim("k", K, "reduction")),
                (Access("q", (0, 1, 3)), Access("k", (0, 3, 2))), Access("s", (0, 1, 2)), MatmulBody(1, 2, 3))
    return PrimGraph("bmm", {t.id: t for t in ts}, [op], ["q", "k"], ["s"])


@pytest.mark.parametrize("batch", [2, 32])
def test_bmm_bound_charges_the_best_rate_any_layout_gives(batch):
    """A bmm runs at the sustained rate at best: operand orders only add stalls
    (simulator.timing_terms.matmul_layout_stall), so both bounds charge its MACs at that rate.
    Every stick choice and legal split of the bmm simulates at or above the bound, and the
    bound is not vacuous."""
    from target.op_rules import ANY, legal_core_splits, split_granules, stick_options
    from simulator.validate import validate_program
    M, K, N = 256, 128, 256
    pg = _bmm(batch, M, K, N)
    lb = lower_bound(pg, HW)
    kind = "sustained"
    compute_us = batch * M * K * N / (HW.pt_mac_per_ns("float16", kind) * HW.cores) / 1e3
    assert lb.compute_us == pytest.approx(compute_us)
    assert lb.split_bound_us >= lb.lower_bound_us >= compute_us - 1e-9
    op = pg.ops[0]
    fastest, checked = float("inf"), 0
    for ch in stick_options(op):
        ins = [ANY if (s is None or s == ANY) else s for s in ch.inputs]
        gran = split_granules(op, ins, ch.output, ["float16"] * 3, HW.stick_bytes)
        for sp in legal_core_splits(op, gran, HW.cores):
            d = plan_naive(pg, HW)
            d.ops[op.id].stick, d.ops[op.id].core_split = ch, dict(sp)
            program = emit_program(pg, HW, d)
            if validate_program(program, HW):
                continue
            us = time_program(program, HW).total_us
            assert us >= lb.split_bound_us - 1e-9, (ch, sp)
            fastest = min(fastest, us)
            checked += 1
    assert checked > 0 and fastest < 3 * lb.split_bound_us


def _scaled_matmul(M, K, N):
    """a = neg(x) (a pointwise producer), y = a @ w: a split sharing a's box across cores
    reads it from device memory, where neg wrote it, and pays the write drain."""
    from target.primitives import Call, In, PointwiseBody
    ts = [PrimTensor("x", (M, K), "float16", "user_input"), PrimTensor("w", (K, N), "float16", "parameter"),
          PrimTensor("a", (M, K), "float16"), PrimTensor("y", (M, N), "float16")]
    neg = PrimOp("neg", (IterDim("r", M), IterDim("c", K)), (Access("x", (0, 1)),), Access("a", (0, 1)),
                 PointwiseBody(Call("neg", (In(0),))))
    mm = PrimOp("mm", (IterDim("m", M), IterDim("n", N), IterDim("k", K, "reduction")),
                (Access("a", (0, 2)), Access("w", (2, 1))), Access("y", (0, 1)), MatmulBody(0, 1, 2))
    return PrimGraph("neg_mm", {t.id: t for t in ts}, [neg, mm], ["x", "w"], ["y"])


@pytest.mark.parametrize("shape", [(197, 768, 768), (97, 1024, 1024)])
def test_split_bound_holds_for_a_pointwise_result_read_shared(shape):
    """Rows that no core split divides (197 tokens): every 32-core split of the matmul
    shares a's box or splits K. Every split, its pointwise producer on row or column slices
    or on one core, a in device memory or held in LX where the validator accepts it,
    unfused or as one tiled kernel: none simulates below the bound, which charges a shared
    read of a pointwise result its write and write drain (module docstring)."""
    from target.op_rules import legal_core_splits, split_granules, stick_options
    from simulator.validate import validate_program
    from solver.plan import Residency
    pg = _scaled_matmul(*shape)
    mm = pg.ops[1]
    lb = lower_bound(pg, HW)
    ch = stick_options(mm)[0]
    gran = split_granules(mm, list(ch.inputs), ch.output, ["float16"] * 3, HW.stick_bytes)
    checked, fastest = 0, float("inf")
    for sp in legal_core_splits(mm, gran, HW.cores):
        for neg_split in ({"c": 12}, {"c": 4}, {}):
            for held, tiles in ((False, False), (True, False), (False, True)):
                d = plan_naive(pg, HW)
                d.ops["mm"].stick, d.ops["mm"].core_split = ch, dict(sp)
                d.ops["neg"].core_split = dict(neg_split)
                if held:
                    d.resident["a"] = Residency(lx_address=0)
                if tiles:
                    d.ops["mm"].temporal_tiles, d.ops["neg"].temporal_tiles = {"k": 2}, {"c": 2}
                try:
                    program = emit_program(pg, HW, d)
                except ValueError:
                    continue
                if validate_program(program, HW):
                    continue
                us = time_program(program, HW).total_us
                assert us >= lb.split_bound_us - 1e-9, (sp, neg_split, held, tiles)
                fastest = min(fastest, us)
                checked += 1
    assert checked > 20 and fastest < 3 * lb.split_bound_us


def _suite_graphs():
    from pathlib import Path
    root = Path(__file__).resolve().parents[1] / "benchmarks" / "graphs"
    return sorted(str(p.relative_to(root)) for suite in ("layers", "tiny") for p in (root / suite).glob("*.json"))


@pytest.mark.parametrize("graph", _suite_graphs())
def test_split_bound_below_the_baselines_on_the_suite_graphs(graph):
    """The layer and tiny suites' graphs (the small encoders' bound charges shared reads of
    pointwise results): the naive and heuristic plans simulate at or above the split-aware
    bound (the CP-SAT planner's and the co-optimizer's are checked in every benchmark run,
    docs/benchmarks.md)."""
    from pathlib import Path
    from lowering import lower_document
    from lowering.graph_format import GraphDocument
    root = Path(__file__).resolve().parents[1] / "benchmarks" / "graphs"
    pg = lower_document(GraphDocument.from_json((root / graph).read_bytes()))
    lb = lower_bound(pg, HW)
    for planner in ("naive", "heuristic"):
        assert time_program(plan(pg, HW, planner), HW).total_us >= lb.split_bound_us - 1e-9, planner
