"""The `heuristic` baseline as torch-spyre is now (docs/baseline.md): the `nonstick_dim_order`
pass (PR #4391) and `require_layout` semantics (PR #4302: the producer writes the order), CP-SAT
LX placement (#3978), and the mid-2026 variant kept reachable as `heuristic-2026-06`."""
from __future__ import annotations

import random

import pytest

from target.hardware import load_target
from target.layout import spyre_default_dim_order
from target.primitives import (
    Access, Call, In, IterDim, MatmulBody, PointwiseBody, PrimGraph, PrimOp, PrimTensor,
)
from simulator.api import simulate
from solver.baseline.lx_cpsat import cpsat_place, placement_value
from solver.baseline.nonstick_dim_order import matmul_reorder
from solver.baseline.passes import plan_heuristic, plan_heuristic_2026_06, plan_heuristic_upstream
from solver.baseline.scratchpad import LxBuffer, greedy_place
from solver.planners import PLANNER_INFO, plan

HW = load_target()
F16 = "float16"


def _bmm_graph(B: int, M: int, K: int, N: int) -> PrimGraph:
    """o = relu(x) @ relu(w), [B,M,K] @ [B,K,N]: both bmm operands produced by an op (the
    pass leaves graph inputs alone)."""
    ts = [PrimTensor("x", (B, M, K), F16, "user_input"), PrimTensor("w", (B, K, N), F16, "user_input"),
          PrimTensor("a", (B, M, K), F16), PrimTensor("b", (B, K, N), F16), PrimTensor("o", (B, M, N), F16)]

    def relu(op_id, src, dst, d1, d2):
        dims = (IterDim("b", B), IterDim("i", d1), IterDim("j", d2))
        return PrimOp(op_id, dims, (Access(src, (0, 1, 2)),), Access(dst, (0, 1, 2)),
                      PointwiseBody(Call("relu", (In(0),))))

    bmm = PrimOp("bmm", (IterDim("b", B), IterDim("m", M), IterDim("n", N), IterDim("k", K, "reduction")),
                 (Access("a", (0, 1, 3)), Access("b", (0, 3, 2))), Access("o", (0, 1, 2)), MatmulBody(1, 2, 3))
    ops = [relu("relu_x", "x", "a", M, K), relu("relu_w", "w", "b", K, N), bmm]
    return PrimGraph("bmm_pass", {t.id: t for t in ts}, ops, ["x", "w"], ["o"])


# -- beam search: liveness merge -------------------------------------------------------------------
def _merge_graph() -> PrimGraph:
    """a = x + yᵀ (a on n restickifies y: 8192 elements; on m restickifies x: 6400), then
    e = w1 + w2ᵀ (6400 or 8192 the same way), an output nobody reads, then c = a * z with z on
    n (a on m pays 6400 more). Width 2 keeps the two cheapest states after e, both with a on
    m: 19200 in all. The states differ only in e's stick, which no later op reads: merging them
    keeps a on n alive, 14592."""
    M, N = 100, 64

    def pw(op_id, ins, out):
        return PrimOp(op_id, (IterDim("m", M), IterDim("n", N)), ins, Access(out, (0, 1)),
                      PointwiseBody(Call("add", tuple(In(i) for i in range(len(ins))))))

    ts = [PrimTensor("x", (M, N), F16, "user_input"), PrimTensor("y", (N, M), F16, "user_input"),
          PrimTensor("w1", (M, N), F16, "user_input"), PrimTensor("w2", (N, M), F16, "user_input"),
          PrimTensor("z", (M, N), F16, "user_input"), PrimTensor("a", (M, N), F16),
          PrimTensor("e", (M, N), F16), PrimTensor("c", (M, N), F16)]
    ops = [pw("add", (Access("x", (0, 1)), Access("y", (1, 0))), "a"),
           pw("noise", (Access("w1", (0, 1)), Access("w2", (1, 0))), "e"),
           pw("mul", (Access("a", (0, 1)), Access("z", (0, 1))), "c")]
    return PrimGraph("merge", {t.id: t for t in ts}, ops, ["x", "y", "w1", "w2", "z"], ["e", "c"])


def test_liveness_merge_keeps_a_state_the_plain_beam_trims():
    from solver.baseline.propagate_layouts import beam_search_layouts

    pg = _merge_graph()
    assert beam_search_layouts(pg, HW.stick_bytes, width=2).restick_elements == 19200
    merged = beam_search_layouts(pg, HW.stick_bytes, width=2, liveness_merge=True)
    assert merged.restick_elements == 14592 == beam_search_layouts(pg, HW.stick_bytes, width=100).restick_elements
    assert merged.stick_of["a"] == 1 and merged.max_states == 2
    assert any("liveness merge" in n for n in plan_heuristic_upstream(pg, HW).stats["notes"])


# -- the nonstick_dim_order pass ------------------------------------------------------------------
def test_matmul_reorder_rule():
    """Generic [B, M, K] on K is device [M, K/64, B, 64] (dim order [1, 2, 0]); the rule swaps
    the largest non-stick dim before the stick group (M) into the slot after it (B) when it
    is larger."""
    assert matmul_reorder([1, 2, 0], (4, 256, 128), 2, F16, HW.stick_bytes) == [0, 2, 1]
    assert matmul_reorder([1, 2, 0], (8, 4, 128), 2, F16, HW.stick_bytes) is None      # M <= B
    assert matmul_reorder([0, 1, 2], (4, 256, 128), 2, F16, HW.stick_bytes) is None   # stick group last
    assert matmul_reorder([1, 0], (256, 128), 1, F16, HW.stick_bytes) is None          # nothing before it
    assert matmul_reorder([1, 2, 0], (4, 256, 128), 2, F16, HW.stick_bytes, pinned={2}) is None
    # [1, H, S, D] on D: generic [H, S, D/64, 1]; S (the larger of H, S) moves after the stick group
    assert matmul_reorder([1, 2, 3, 0], (1, 8, 512, 128), 3, F16, HW.stick_bytes) == [1, 0, 3, 2]


def test_pass_reorders_a_bmm_operand_and_the_program_carries_it():
    pg = _bmm_graph(B=4, M=256, K=128, N=512)
    d = plan_heuristic_upstream(pg, HW)
    # x is sticked on K: generic [1, 2, 0] -> [0, 2, 1] (batch outermost, M inside each K stick)
    assert spyre_default_dim_order(3, 2) == [1, 2, 0]
    assert d.dim_orders["a"] == [0, 2, 1]
    # graph inputs keep the transferred (generic) layout: the pass does not touch them
    assert d.dim_orders["x"] == [1, 2, 0]
    program = plan(pg, HW, "heuristic", fallback=False)
    tm = program.tensor_map()
    assert tm["a"].layout.dim_order == [0, 2, 1]
    assert tm["o"].layout.dim_order == spyre_default_dim_order(3, tm["o"].layout.stick_dim)
    res = simulate(program, HW, graph=pg, numerics=True)
    assert res.valid, res.errors
    assert res.max_rel_err is not None and res.max_rel_err < 2e-2


def test_the_pass_pays_on_the_timing_model():
    """The reorder takes the batch outermost in the bmm's operands: without it the operands
    interleave the batches' rows and the matmul stalls."""
    from simulator.timing import time_program
    from solver.oracle import checked_program

    pg = _bmm_graph(B=8, M=512, K=128, N=512)
    with_pass = plan_heuristic_upstream(pg, HW)
    without = plan_heuristic_upstream(pg, HW)
    for t in ("a", "b"):
        without.dim_orders[t] = spyre_default_dim_order(3, 2)
    times = [time_program(checked_program(pg, HW, d)[0], HW).total_us for d in (with_pass, without)]
    assert times[0] < times[1]


# -- CP-SAT LX placement --------------------------------------------------------------------------
def _overlap_free(bufs, cap):
    placed = [b for b in bufs if b.address is not None]
    for i, p in enumerate(placed):
        assert p.address % 128 == 0 and 0 <= p.address and p.address + p.size <= cap
        for q in placed[i + 1:]:
            if p.start < q.end and q.start < p.end:
                assert p.address + p.size <= q.address or q.address + q.size <= p.address


def test_cpsat_placement_beats_first_fit_where_first_fit_blocks():
    """First fit places the small early buffer at 0 and the big one no longer fits; CP-SAT
    places the small one above, keeping more traffic on chip."""
    cap = 1000 * 128
    bufs = [LxBuffer("small", 300 * 128, [0, 2]),
            LxBuffer("big", 800 * 128, [1, 2, 3, 4]),
            LxBuffer("late", 200 * 128, [0, 5])]
    greedy_place(bufs, cap, 128)
    greedy_value = placement_value(bufs)
    assert bufs[1].address is None
    stats = cpsat_place(bufs, cap, 128)
    _overlap_free(bufs, cap)
    assert placement_value(bufs) > greedy_value
    assert stats["objective"] == placement_value(bufs) and not stats["kept_greedy"]


@pytest.mark.parametrize("seed,window", [(s, w) for s in range(6) for w in (128, 4)])
def test_cpsat_placement_respects_capacity_and_never_loses_to_greedy(seed, window, monkeypatch):
    """Whole groups and (window 4) a group placed window by window around the earlier ones."""
    import solver.baseline.lx_cpsat as lx_cpsat

    monkeypatch.setattr(lx_cpsat, "WINDOW_BUFFERS", window)
    rng = random.Random(seed)
    cap = 64 * 128
    bufs = []
    for k in range(14):
        start = rng.randrange(0, 10)
        uses = sorted({start} | {start + rng.randrange(1, 6) for _ in range(rng.randrange(1, 4))})
        bufs.append(LxBuffer(f"b{k}", rng.randrange(1, 40) * 128, uses))
    bufs.append(LxBuffer("too_big", 65 * 128, [0, 1]))
    greedy = [LxBuffer(b.name, b.size, list(b.uses)) for b in bufs]
    greedy_place(greedy, cap, 128)
    cpsat_place(bufs, cap, 128)
    _overlap_free(bufs, cap)
    assert bufs[-1].address is None
    assert placement_value(bufs) >= placement_value(greedy)


def test_heuristic_places_lx_with_cpsat_and_the_old_variant_first_fit():
    pg = _bmm_graph(B=4, M=256, K=128, N=512)
    new, old = plan_heuristic_upstream(pg, HW), plan_heuristic_2026_06(pg, HW)
    assert any("placed by CP-SAT" in n for n in new.stats["notes"])
    assert any("placed first-fit" in n for n in old.stats["notes"])


# -- the mid-2026 variant -----------------------------------------------------------------------
def test_old_variant_stays_reachable():
    info = PLANNER_INFO["heuristic-2026-06"]
    assert info.fast and info.online and not info.searches
    pg = _bmm_graph(B=4, M=256, K=128, N=512)
    program = plan(pg, HW, "heuristic-2026-06", fallback=False)
    assert program.stats.planner == "heuristic-2026-06"
    # row-major layouts, beam width 64: the decisions plan_heuristic's own defaults make
    d = plan_heuristic_2026_06(pg, HW)
    assert d.dim_orders == {} and d == _with_name(plan_heuristic(pg, HW), "heuristic-2026-06")
    assert any("width 64" in n for n in d.stats["notes"])
    assert any("width 200" in n for n in plan_heuristic_upstream(pg, HW).stats["notes"])


def _with_name(d, name):
    d.planner = name
    return d
