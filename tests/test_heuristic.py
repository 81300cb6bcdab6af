"""The torch-spyre baseline planner: each pass against hand-worked cases, and whole plans
valid and numerically right through the functional run."""
from __future__ import annotations

import pytest

from target.op_rules import legal_core_splits, split_granules
from target.primitives import (
    Access, Call, In, IterDim, MatmulBody, PointwiseBody, PrimGraph, PrimOp, PrimTensor, ReduceBody,
)
from simulator.api import simulate
from target.hardware import load_target
from target.superdsc import HbmMemory, LxMemory
from solver.baseline.passes import plan_heuristic
from solver.baseline.propagate_layouts import beam_search_layouts
from solver.baseline.scratchpad import LxBuffer, greedy_place
from solver.baseline.work_division import (
    greedy_split, largest_divisor_at_most, matmul_axes, matmul_enumerated_split, matmul_split_cost_us,
)
from solver.planners import plan
from tests import primgraphs

HW = load_target()
F16 = "float16"


def _graph(name, tensors, ops, inputs, outputs):
    return PrimGraph(name, {t.id: t for t in tensors}, ops, inputs, outputs)


def _pw(op_id, dims, ins, out, fn, source=""):
    return PrimOp(op_id, dims, ins, out, PointwiseBody(Call(fn, tuple(In(i) for i in range(len(ins))))), source)


# -- beam search ------------------------------------------------------------------------------
def _two_layout_graph():
    """a = x + yᵀ over (m=100, n=64): sticking on n restickifies y ([64,100] sticked on its
    100-long dim: 64*128 = 8192 elements), sticking on m restickifies x ([100,64]: 6400).
    Then c = a * z with z [100,64] sticked on n (6400): a sticked on m must be restickified
    (its device layout [64, 128] = 8192 elements) or z must (6400)."""
    M, N = 100, 64
    ts = [PrimTensor("x", (M, N), F16, "user_input"), PrimTensor("y", (N, M), F16, "user_input"),
          PrimTensor("z", (M, N), F16, "user_input"), PrimTensor("a", (M, N), F16),
          PrimTensor("c", (M, N), F16)]
    dims = (IterDim("m", M), IterDim("n", N))
    ops = [_pw("add", dims, (Access("x", (0, 1)), Access("y", (1, 0))), Access("a", (0, 1)), "add"),
           _pw("mul", dims, (Access("a", (0, 1)), Access("z", (0, 1))), Access("c", (0, 1)), "mul")]
    return _graph("two_layouts", ts, ops, ["x", "y", "z"], ["c"])


def test_beam_search_picks_fewest_restickified_elements():
    pg = _two_layout_graph()
    plan_ = beam_search_layouts(pg, HW.stick_bytes)
    # Globally: stick n everywhere (restickify y once: 8192) beats stick m for `add`
    # (6400) followed by a restickify at `mul` (6400 more).
    assert plan_.restick_elements == 8192
    assert plan_.stick_of["a"] == 1 and plan_.stick_of["c"] == 1
    # Width 1 is the local greedy choice and pays more: the beam really searches.
    greedy = beam_search_layouts(pg, HW.stick_bytes, width=1)
    assert greedy.stick_of["a"] == 0
    assert greedy.restick_elements == 6400 + 6400


def test_beam_search_layouts_reach_the_program():
    pg = _two_layout_graph()
    program = plan(pg, HW, "heuristic")
    tm = program.tensor_map()
    assert tm["a"].layout.stick_dim == 1
    resticks = [o for o in program.ops if o.kind in ("restickify", "relayout")]
    assert [o.src for o in resticks] == ["y"]


def _linear_graph(transposed: bool):
    """y = x @ Wᵀ with W [N, K] (nn.Linear), or y = x @ W with W [K, N] (GPT-2 Conv1D)."""
    M, K, N = 16, 256, 192
    w_shape, w_dims = ((N, K), (1, 2)) if transposed else ((K, N), (2, 1))
    ts = [PrimTensor("x", (M, K), F16, "user_input"), PrimTensor("w", w_shape, F16, "parameter"),
          PrimTensor("y", (M, N), F16)]
    op = PrimOp("mm", (IterDim("m", M), IterDim("n", N), IterDim("k", K, "reduction")),
                (Access("x", (0, 2)), Access("w", w_dims)), Access("y", (0, 1)), MatmulBody(0, 1, 2))
    return _graph("linear", ts, [op], ["x", "w"], ["y"])


def test_linear_weights_arrive_sticked_on_out_features():
    """torch-spyre's model loading transfers nn.Linear weights with dim_order [1, 0]: the
    matmul reads Wᵀ without a restickify. Other weights keep the default layout."""
    program = plan(_linear_graph(transposed=True), HW, "heuristic")
    assert program.tensor_map()["w"].layout.stick_dim == 0
    assert not [o for o in program.ops if o.kind in ("restickify", "relayout")]
    conv1d = plan_heuristic(_linear_graph(transposed=False), HW)
    assert "w" not in conv1d.input_sticks  # already sticked on N by default
    without = plan(_linear_graph(transposed=True), HW, "naive")
    assert [o.src for o in without.ops if o.kind == "restickify"] == ["w"]


# -- work division -----------------------------------------------------------------------------
def _op(dims, out_dims, in_dims=None, reduce=False):
    iter_dims = tuple(IterDim(n, s, k) for n, s, k in dims)
    ins = (Access("i", tuple(in_dims if in_dims is not None else range(len(dims)))),)
    body = ReduceBody("sum") if reduce else PointwiseBody(Call("exp", (In(0),)))
    return PrimOp("op", iter_dims, ins, Access("o", tuple(out_dims)), body)


def test_largest_divisor():
    assert largest_divisor_at_most(400, 32) == 25      # 25600 fp16 = 400 sticks on 32 cores
    assert largest_divisor_at_most(512, 32) == 32
    assert largest_divisor_at_most(7, 32) == 7
    assert largest_divisor_at_most(97, 32) == 1


@pytest.mark.parametrize("dims,granules,expected", [
    # rows first (512 > 16 sticks): every core on m
    ([("m", 512, "parallel"), ("n", 1024, "parallel")], {1: 64}, {"m": 32}),
    # 64 sticks of n outrank 12 rows
    ([("m", 12, "parallel"), ("n", 4096, "parallel")], {1: 64}, {"n": 32}),
    # 5 sticks take 5 cores, the 6 rows the remaining 32 // 5 = 6
    ([("m", 6, "parallel"), ("n", 320, "parallel")], {1: 64}, {"n": 5, "m": 6}),
])
def test_greedy_split_output_dims(dims, granules, expected):
    op = _op(dims, (0, 1))
    assert greedy_split(op, granules, 32) == expected


def test_greedy_split_one_reduction_dim_takes_leftover_cores():
    # 3 rows use 3 cores; 32 // 3 = 10 left for the reduction dim: 64 sticks -> 8
    op = _op([("m", 3, "parallel"), ("k", 4096, "reduction"), ("j", 64, "reduction")], (0, None),
             reduce=True)
    assert greedy_split(op, {1: 64}, 32) == {"m": 3, "k": 8}


def test_a_cumsum_is_never_split_along_its_scan_dim():
    """A cumsum writes along its scan dim (the output has it), but the scan runs in order:
    the baseline splits only the other dims, and its plan of a position-id cumsum (GPT-2's
    `cumsum(attention_mask) * mask - 1` pattern) validates and runs like the reference."""
    rows, seq = 4, 512
    t = {"x": PrimTensor("x", (rows, seq), "float16", "user_input"),
         "c": PrimTensor("c", (rows, seq), "float16")}
    op = PrimOp("cumsum", (IterDim("b", rows), IterDim("s", seq, "reduction")), (Access("x", (0, 1)),),
                Access("c", (0, 1)), ReduceBody("cumsum"))
    assert greedy_split(op, {}, 32) == {"b": 4}
    pg = PrimGraph("cumsum_rows", t, [op], ["x"], ["c"])
    program = plan(pg, HW, "heuristic", fallback=False)
    assert program.stats.planner == "heuristic"
    res = simulate(program, HW, graph=pg, numerics=True)
    assert res.valid, res.errors
    assert res.max_rel_err is not None and res.max_rel_err < 2e-2, res.max_rel_err


@pytest.mark.parametrize("M,K,N", [(512, 4096, 4096), (1, 4096, 25600), (128, 4096, 14336)])
def test_matmul_split_enumeration_is_argmin_of_its_cost(M, K, N):
    op = PrimOp("mm", (IterDim("m", M), IterDim("n", N), IterDim("k", K, "reduction")),
                (Access("x", (0, 2)), Access("w", (2, 1))), Access("y", (0, 1)), MatmulBody(0, 1, 2))
    gran = split_granules(op, [1, 1], 1, [F16] * 3, HW.stick_bytes)
    default = greedy_split(op, gran, HW.cores)
    chosen = matmul_enumerated_split(op, gran, HW, [F16] * 3, default)

    if M == 1:  # upstream's chooser declines a matmul without a row dim: greedy divides it
        assert matmul_axes(op) is None and chosen is None
        return

    def cost(split):  # no batch dim: the weight is loaded once (upstream's shared path)
        return matmul_split_cost_us(HW, (1, 1), (M, split.get("m", 1)), (N, split.get("n", 1)),
                                    (K, split.get("k", 1)), 2, shared_weight=True)

    def cores(split):
        n = 1
        for f in split.values():
            n *= f
        return n
    # an independent enumeration of every legal split (op_rules)
    splits = legal_core_splits(op, gran, HW.cores)
    best = min(splits, key=cost)
    if cores(best) >= cores(default):
        assert chosen is not None and cost(chosen) == pytest.approx(cost(best))
    else:
        # upstream never trades down to fewer cores than the greedy distributor
        assert chosen is None


def test_matmul_with_broadcast_weight_takes_the_shared_weight_path():
    """[B,M,K] @ [K,N] (a weight broadcast over the batch): since PR #2829 upstream's chooser
    prices it (it used to decline): M is the innermost row dim, the batch dim stays a batch
    dim and the weight counts as loaded once."""
    B, M, K, N = 4, 64, 128, 128
    op = PrimOp("bmm", (IterDim("b", B), IterDim("m", M), IterDim("n", N), IterDim("k", K, "reduction")),
                (Access("x", (0, 1, 3)), Access("w", (3, 2))), Access("y", (0, 1, 2)), MatmulBody(1, 2, 3))
    axes = matmul_axes(op)
    assert axes is not None and axes.m == 1 and axes.batch == (0,) and axes.shared_weight
    gran = split_granules(op, [2, 1], 2, [F16] * 3, HW.stick_bytes)
    assert matmul_enumerated_split(op, gran, HW, [F16] * 3, greedy_split(op, gran, 32)) is not None


# -- LX first fit --------------------------------------------------------------------------------
def test_first_fit_places_without_overlap_and_without_eviction():
    cap = 1000 * 128
    bufs = [LxBuffer("a", 600 * 128, [0, 1]),          # fits at 0
            LxBuffer("b", 300 * 128, [1, 3]),          # above a
            LxBuffer("c", 500 * 128, [2, 3]),          # a is freed at 2: 0..500 is free
            LxBuffer("d", 400 * 128, [3, 4]),          # nothing fits while b, c live: stays out
            LxBuffer("e", 100 * 128, [3, 4])]          # fits in the gap above b
    greedy_place(bufs, cap, 128)
    by = {b.name: b for b in bufs}
    assert by["a"].address == 0
    assert by["b"].address == 600 * 128
    assert by["c"].address == 0
    assert by["d"].address is None
    assert by["e"].address is not None
    placed = [b for b in bufs if b.address is not None]
    for i, p in enumerate(placed):
        assert p.address % 128 == 0 and p.address + p.size <= cap
        for q in placed[i + 1:]:
            if p.start < q.end and q.start < p.end:
                assert p.address + p.size <= q.address or q.address + q.size <= p.address


def test_softmax_chain_is_resident_in_lx():
    pg, _ = primgraphs.softmax(M=512, N=1024)
    program = plan(pg, HW, "heuristic")
    tm = program.tensor_map()
    lx = {t for t, d in tm.items() if isinstance(d.memory, LxMemory)}
    assert lx, "the softmax chain's intermediates should be placed in LX"
    for t in pg.inputs + pg.outputs:
        assert isinstance(tm[t].memory, HbmMemory)


def test_mismatched_core_splits_stay_in_device_memory():
    """e = exp(x) is split over rows, its reader s = sum over rows is split over columns:
    each core would read a slice it did not write, so e stays in device memory; in the
    matched case (row sums) it is resident."""
    M, N = 64, 2048
    ts = [PrimTensor("x", (M, N), F16, "user_input"), PrimTensor("e", (M, N), F16),
          PrimTensor("s", (1, N), F16), PrimTensor("r", (M, 1), F16), PrimTensor("o", (M, N), F16)]
    pdims = (IterDim("m", M), IterDim("n", N))
    ops = [_pw("exp", pdims, (Access("x", (0, 1)),), Access("e", (0, 1)), "exp"),
           PrimOp("colsum", (IterDim("m", M, "reduction"), IterDim("n", N)), (Access("e", (0, 1)),),
                  Access("s", (None, 1)), ReduceBody("sum")),
           _pw("scale", pdims, (Access("e", (0, 1)), Access("s", (None, 1))), Access("o", (0, 1)), "mul")]
    pg = _graph("mismatch", ts, ops, ["x"], ["o"])
    d = plan_heuristic(pg, HW)
    assert d.ops["exp"].core_split == {"m": 32}
    assert d.ops["colsum"].core_split == {"n": 32}
    assert "e" not in d.resident
    ops[1] = PrimOp("rowsum", (IterDim("m", M), IterDim("n", N, "reduction")), (Access("e", (0, 1)),),
                    Access("r", (0, None)), ReduceBody("sum"))
    ops[2] = _pw("scale", pdims, (Access("e", (0, 1)), Access("r", (0, None))), Access("o", (0, 1)), "mul")
    matched = plan_heuristic(_graph("matched", ts, ops, ["x"], ["o"]), HW)
    assert "e" in matched.resident


# -- whole plans: valid and numerically right ----------------------------------------------------
@pytest.mark.parametrize("builder", ["mlp", "softmax", "attention_scores", "copies", "embedding", "colsum"])
def test_heuristic_plans_run_correctly_on_hand_graphs(builder):
    pg, _ = getattr(primgraphs, builder)()
    program = plan(pg, HW, "heuristic")  # plan() validates
    res = simulate(program, HW, inputs=primgraphs.inputs_for(pg), graph=pg, numerics=True)
    assert res.valid, res.errors
    assert res.max_rel_err is not None and res.max_rel_err < 2e-2, (builder, res.max_rel_err)
    assert res.simulated_us > 0


@pytest.mark.parametrize("name", ["llama_tiny_prefill16", "llama_tiny_decode32", "gpt2_tiny_block16",
                                  "bert_tiny_layer16"])
def test_heuristic_plans_run_correctly_on_committed_tiny_layers(name):
    """The benchmark suite's tiny layer graphs (captured documents, no torch needed)."""
    from benchmarks.suite import GRAPHS_DIR, read_document_text
    from lowering import lower_document
    from lowering.graph_format import GraphDocument

    pg = lower_document(GraphDocument.from_json(read_document_text(GRAPHS_DIR / "tiny" / f"{name}.json")))
    program = plan(pg, HW, "heuristic")
    res = simulate(program, HW, graph=pg, numerics=True)
    assert res.valid, res.errors
    assert res.max_rel_err is not None and res.max_rel_err < 5e-2, (name, res.max_rel_err)


# Capturing a model costs 10-50 s on a loaded 2-core machine, so these run under -m slow;
# the committed tiny layer graphs above cover the same model families by default.
@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "llama", "bert", "vit", "resnet"])
def test_heuristic_plans_run_correctly_on_tiny_models(name):
    torch = pytest.importorskip("torch")
    from tests.models import tiny_primgraph

    pg = tiny_primgraph(name, dtype=torch.float16)
    program = plan(pg, HW, "heuristic")
    res = simulate(program, HW, graph=pg, numerics=True)
    assert res.valid, res.errors
    assert res.max_rel_err is not None and res.max_rel_err < 5e-2, (name, res.max_rel_err)
