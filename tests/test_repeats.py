"""Repeated structure (solver/spyre/depth/repeats.py) and windows (solver/spyre/depth/windows.py): the
block detection, the renaming of a copied plan, the window tiling, and the planner's depth
step on a tiny 6-layer Llama (one copy solved, reused, one valid program never slower than
the heuristic) and on a graph planned in windows."""
from __future__ import annotations

import re
from dataclasses import replace

import pytest

from target.primitives import Access, Call, IterDim, In, PointwiseBody, PrimGraph, PrimOp, PrimTensor
from target.hardware import load_target
from simulator.timing import time_program
from solver.plan import OpPlan, PlanDecisions, Residency
from solver.spyre import budget
from solver.spyre.depth import blocks, repeats, segments, windows
from solver.spyre.depth.blocks import copy_decisions, copy_map, find_repeats, op_signatures
from solver.spyre.schedule import chain_order

torch = pytest.importorskip("torch")

HW = load_target()


def _tiny_llama(layers: int):
    from transformers import LlamaConfig, LlamaModel

    from backend.capture import capture
    from lowering import lower_document
    from lowering.graph_format import GraphDocument

    torch.manual_seed(0)
    cfg = LlamaConfig(num_hidden_layers=layers, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, vocab_size=128, use_cache=False)
    model = LlamaModel(cfg).eval()
    ids = torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(1))
    return lower_document(GraphDocument.model_validate(capture(model, (ids,), name=f"llama_x{layers}")))


@pytest.fixture(scope="module")
def llama6():
    return _tiny_llama(6)


# -- a hand-made stack: blocks of 8 pointwise ops, each reading its own weight ------------------
def _chain(blocks: int, miswire: int | None = None) -> PrimGraph:
    """`blocks` copies of an 8-op block: x -> x*w_b -> exp -> ... -> + x (the block's input);
    in copy `miswire` the last op adds the block's first result instead of its input (same
    shapes and op kinds: only the wiring differs)."""
    dims = (IterDim("d0", 4), IterDim("d1", 64))
    acc = (0, 1)
    tensors = {"x": PrimTensor("x", (4, 64), "float16", "user_input")}
    ops = []
    cur = "x"
    for b in range(blocks):
        w = f"w{b}"
        tensors[w] = PrimTensor(w, (4, 64), "float16", "parameter")
        first = f"b{b}_0"
        prev = cur
        body_mul = PointwiseBody(Call("mul", (In(0), In(1))))
        ops.append(PrimOp(first, dims, (Access(cur, acc), Access(w, acc)), Access(first, acc), body_mul))
        tensors[first] = PrimTensor(first, (4, 64), "float16")
        last = first
        for j in range(1, 7):
            t = f"b{b}_{j}"
            ops.append(PrimOp(t, dims, (Access(last, acc),), Access(t, acc), PointwiseBody(Call("exp", (In(0),)))))
            tensors[t] = PrimTensor(t, (4, 64), "float16")
            last = t
        out = f"b{b}_7"
        other = first if b == miswire else prev
        ops.append(PrimOp(out, dims, (Access(last, acc), Access(other, acc)), Access(out, acc),
                          PointwiseBody(Call("add", (In(0), In(1))))))
        tensors[out] = PrimTensor(out, (4, 64), "float16")
        cur = out
    return PrimGraph("chain", tensors, ops, ["x"] + [f"w{b}" for b in range(blocks)], [cur])


def test_find_repeats_on_a_hand_made_stack():
    pg = _chain(6)
    rep = find_repeats(pg)
    assert rep is not None
    # the first block reads the graph's input where the others read an intermediate: it is
    # not a copy by signature, but a partial copy at the edge (its decisions are reused)
    assert rep.period == 8 and rep.copies == 5 and rep.start == 8
    assert blocks.partial_edges(pg, rep) == (8, 0)


def test_a_copy_wired_differently_is_not_a_copy():
    pg = _chain(7, miswire=3)
    # every op signature is the same as in the clean stack: only the edges differ
    assert op_signatures(pg) == op_signatures(_chain(7))
    rep = find_repeats(pg)
    assert rep is not None and rep.period == 8
    blocks = [set(range(rep.block(c).start, rep.block(c).stop)) for c in range(rep.copies)]
    miswired = set(range(3 * 8, 4 * 8))
    assert all(not (b & miswired) for b in blocks), "the miswired copy must not be a copy"
    assert rep.copies == 3 and rep.start == 4 * 8  # the copies after it


def test_signatures_ignore_names():
    pg = _chain(3)
    ren = {t: f"t{i}" for i, t in enumerate(pg.tensors)}
    ops = [PrimOp(f"op{i}", op.iter_dims, tuple(Access(ren[a.tensor], a.dims) for a in op.inputs),
                  Access(ren[op.output.tensor], op.output.dims), op.body, source="elsewhere")
           for i, op in enumerate(pg.ops)]
    other = PrimGraph("renamed", {ren[t]: replace(v, id=ren[t]) for t, v in pg.tensors.items()}, ops,
                      [ren[t] for t in pg.inputs], [ren[t] for t in pg.outputs])
    assert op_signatures(other) == op_signatures(pg)


def test_no_repeats_in_one_layer():
    assert find_repeats(chain_order(_tiny_llama(1))) is None


def test_find_repeats_on_a_tiny_llama_stack(llama6):
    pg = chain_order(llama6)
    rep = find_repeats(pg)
    assert rep is not None and rep.copies >= 5
    assert rep.copies * rep.period >= 0.75 * len(pg.ops)
    # each copy reads the weights of one or two layers (a block may start mid-layer), and
    # copy c reads the layers copy 0 reads shifted by c
    for c in range(rep.copies):
        layers = {int(m.group(1)) for i in rep.block(c) for a in pg.ops[i].inputs
                  if (m := re.search(r"layers_(\d+)_", a.tensor))}
        first = {int(m.group(1)) for i in rep.block(0) for a in pg.ops[i].inputs
                 if (m := re.search(r"layers_(\d+)_", a.tensor))}
        assert layers == {x + c for x in first} and 1 <= len(layers) <= 2


def test_copy_decisions_renames_everything():
    pg = _chain(3)
    rep = blocks.Repeats(0, 8, 3)
    d = PlanDecisions(planner="cpsat")
    for i in rep.block(0):
        d.ops[pg.ops[i].id] = OpPlan(core_split={"d1": 2})
    d.input_sticks = {"w0": 0, "x": 1}
    d.resident = {"b0_3": Residency(0, 128), "b0_4@stick0": Residency(128, 128)}
    d.restick_ops = {"b0_4@stick0": OpPlan(core_split={"d0": 4})}
    d.dim_orders = {"b0_3": [1, 0], "b0_4@stick0": [1, 0]}
    d.bundle_starts = ["b0_2"]
    d.op_order = [pg.ops[i].id for i in rep.block(0)]
    m = copy_map(pg, rep.block(0), rep.block(2))
    out = copy_decisions(d, m, boundary_inputs={"x"})
    assert out.dim_orders == {"b2_3": [1, 0], "b2_4@stick0": [1, 0]}   # the planner's layouts too
    assert set(out.ops) == {f"b2_{j}" for j in range(8)}
    assert all(p.core_split == {"d1": 2} for p in out.ops.values())
    assert out.input_sticks == {"w2": 0}          # the boundary input keeps its producer's layout
    assert set(out.resident) == {"b2_3", "b2_4@stick0"}
    assert set(out.restick_ops) == {"b2_4@stick0"}
    assert out.bundle_starts == ["b2_2"] and out.op_order == [f"b2_{j}" for j in range(8)]
    out.ops["b2_0"].core_split["d1"] = 4
    assert d.ops["b0_0"].core_split == {"d1": 2}, "copies must not share mutable plans"


@pytest.mark.parametrize("n", [1, 50, 120, 121, 300, 1000])
def test_windows_tile_the_ops(n):
    wins = windows.windows_of(n, 120, 16)
    kept = [i for _, _, a, b in wins for i in range(a, b)]
    assert kept == list(range(n))
    for a, b, ka, kb in wins:
        assert b - a <= 120 and a <= ka <= kb <= b


def _heuristic_us(pg):
    from solver.planners import plan

    return time_program(plan(pg, HW, "heuristic"), HW).total_us


def test_cpsat_reuses_one_copy_on_a_stack(llama6):
    from solver.planners import plan

    program = plan(llama6, HW, "cpsat", time_limit_s=8, deterministic=True, fallback=False)
    notes = program.stats.notes
    assert program.stats.planner == "cpsat" and program.stats.fallback_from is None
    rep = find_repeats(chain_order(llama6))
    assert any(n.startswith(f"repeats: {rep.copies} copies of a {rep.period}-op block") for n in notes), notes
    # one CP-SAT model of one copy, not of the stack
    assert any(n.startswith(f"representative: {rep.period} ops") for n in notes), notes
    sim = time_program(program, HW).total_us
    assert sim <= _heuristic_us(llama6) * (1 + 1e-9)
    assert abs(program.stats.predicted_us - sim) <= 1e-6 * sim   # predicted = simulated here


def test_irregular_graph_is_planned_in_windows(monkeypatch):
    from solver.planners import plan

    pg = _tiny_llama(1)
    monkeypatch.setattr(budget, "WINDOWS_ABOVE_OPS", 30)
    monkeypatch.setattr(budget, "WINDOW_OPS", 40)
    monkeypatch.setattr(budget, "MIN_WINDOW_S", 0.2)
    program = plan(pg, HW, "cpsat", time_limit_s=6, deterministic=True, fallback=False)
    notes = program.stats.notes
    assert notes[0].startswith(f"windows: {len(pg.ops)} ops"), notes
    assert sum(1 for n in notes if n.startswith("window ")) >= 2, notes
    assert any(n.startswith("windows LNS:") for n in notes), notes
    assert time_program(program, HW).total_us <= _heuristic_us(pg) * (1 + 1e-9)


def test_partial_copy_keeps_only_residencies_inside_and_never_an_output():
    """The ops before the first copy get the block's decisions for their positions; an LX
    residency is reused only when its producer and every reader are among them, and never
    for a graph output (it must reach device memory)."""
    pg = _chain(4)
    d = PlanDecisions(planner="cpsat")
    for j in range(8):
        d.ops[f"b1_{j}"] = OpPlan(core_split={"d1": 4})
    # b1_5 is read by b1_6 only; b1_1 is produced before the part that is copied
    d.resident = {"b1_5": Residency(0, 64), "b1_1": Residency(64, 64)}
    readers = segments.reader_index(pg)
    # the last 3 positions of block 1 (ops 13..15) onto ops 5..7 of block 0
    src, dst = list(range(13, 16)), list(range(5, 8))
    out = blocks.partial_copy(pg, d, src, dst, readers)
    assert set(out.ops) == {"b0_5", "b0_6", "b0_7"}
    assert all(p.core_split == {"d1": 4} for p in out.ops.values())
    assert set(out.resident) == {"b0_5"}          # b0_1 is produced outside the part
    # a segment keeps the device dim orders of what it produces, and a merge keeps them all
    d.dim_orders = {"b1_5": [1, 0], "b1_1": [1, 0]}
    part = segments.keep_part(pg, d, list(range(13, 16)), readers)
    assert part.dim_orders == {"b1_5": [1, 0]}
    assert segments.merge([(part, [pg.ops[i].id for i in range(13, 16)])]).dim_orders == {"b1_5": [1, 0]}
    # the last block's output is a graph output: never resident, even when copied
    d.ops = {f"b2_{j}": OpPlan() for j in range(8)}
    d.resident = {"b2_7": Residency(0, 64)}
    out = blocks.partial_copy(pg, d, list(range(16, 24)), list(range(24, 32)), readers)
    assert not out.resident


def test_aligned_windows_tile_and_cut_where_fewest_tensors_cross():
    crossing = [3] * 300
    for i in (100, 200, 60):   # cheap cut points: near the nominal 104 and 100 + 104; 60 too far
        crossing[i] = 1
    wins = windows.aligned_windows(crossing, 120, 16)
    kept = [i for _, _, a, b in wins for i in range(a, b)]
    assert kept == list(range(300))
    assert [kt for _, _, _, kt in wins[:-1]] == [100, 200]
    for a, b, ka, kb in wins:
        assert a == ka and kb <= b <= a + 120 + 8


def test_crossings_count_tensors_alive_across_each_position():
    pg = _chain(2)   # in each block: op j reads op j-1; the last op also reads the block input
    c = windows.crossings(pg, list(range(len(pg.ops))))
    assert c[0] == 0
    assert c[1] == 1            # b0_0 -> b0_1 (x is a graph input, not produced)
    assert c[8] == 1            # between blocks only b0_7 crosses
    assert c[9] == 2            # b1_0 (read by b1_1) and b0_7 (read by b1_7)
