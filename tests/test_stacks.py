"""A model made of two parts (solver/spyre/depth/stacks.py, repeats.split_time): the repeated
block plan_depth picks is one stack's layer; the other stack, in what does not repeat, is
planned as a stack of its own (one copy solved, its decisions copied), and the solving time
is split by what each solve stands to gain. On a hand-made graph of two stacks of different
blocks (`_two_stacks`), with the large-graph threshold lowered so the small first stack
counts as a large piece."""
from __future__ import annotations

import pytest

from target.primitives import Access, Call, IterDim, In, PointwiseBody, PrimGraph, PrimOp, PrimTensor
from target.hardware import load_target
from simulator.timing import time_program
from solver.spyre import budget
from solver.spyre.depth import blocks, repeats, stacks
from solver.spyre.schedule import chain_order

HW = load_target()


def _two_stacks(first: int = 6, second: int = 8) -> PrimGraph:
    """`first` blocks of 10 ops on (256, 1024) tensors (x*w, then an exp/neg chain, + the
    block's input), one exp, then `second` blocks of 12 ops (x*w, a chain of exp and neg,
    + the block's input): two stacks whose blocks differ in length."""
    tensors = {"x": PrimTensor("x", (256, 1024), "float16", "user_input")}
    ops = []

    def stack(prefix: str, blocks: int, length: int, shape: tuple, cur: str) -> str:
        dims = (IterDim("d0", shape[0]), IterDim("d1", shape[1]))
        acc = (0, 1)
        for b in range(blocks):
            w = f"{prefix}w{b}"
            tensors[w] = PrimTensor(w, shape, "float16", "parameter")
            first_t = f"{prefix}{b}_0"
            ops.append(PrimOp(first_t, dims, (Access(cur, acc), Access(w, acc)), Access(first_t, acc),
                              PointwiseBody(Call("mul", (In(0), In(1))))))
            tensors[first_t] = PrimTensor(first_t, shape, "float16")
            last = first_t
            for j in range(1, length - 1):
                t = f"{prefix}{b}_{j}"
                fn = "exp" if j % 2 else "neg"
                ops.append(PrimOp(t, dims, (Access(last, acc),), Access(t, acc), PointwiseBody(Call(fn, (In(0),)))))
                tensors[t] = PrimTensor(t, shape, "float16")
                last = t
            out = f"{prefix}{b}_{length - 1}"
            ops.append(PrimOp(out, dims, (Access(last, acc), Access(cur, acc)), Access(out, acc),
                              PointwiseBody(Call("add", (In(0), In(1))))))
            tensors[out] = PrimTensor(out, shape, "float16")
            cur = out
        return cur

    mid = stack("a", first, 10, (256, 1024), "x")
    tensors["y0"] = PrimTensor("y0", (256, 1024), "float16")
    ops.append(PrimOp("y0", (IterDim("d0", 256), IterDim("d1", 1024)), (Access(mid, (0, 1)),), Access("y0", (0, 1)),
                      PointwiseBody(Call("exp", (In(0),)))))
    end = stack("b", second, 12, (256, 1024), "y0")
    inputs = ["x"] + [t for t, v in tensors.items() if v.role == "parameter"]
    return PrimGraph("two_stacks", tensors, ops, inputs, [end])


@pytest.fixture
def small_pieces(monkeypatch):
    monkeypatch.setattr(budget, "WINDOWS_ABOVE_OPS", 20)
    monkeypatch.setattr(budget, "MIN_WINDOW_S", 0.5)


def test_the_first_stack_is_a_stack_of_its_own(small_pieces):
    pg = chain_order(_two_stacks())
    rep = blocks.find_repeats(pg, min_copies=budget.MIN_COPIES)
    assert rep is not None and rep.period == 12            # the second stack's block
    before, _ = blocks.partial_edges(pg, rep)
    head = list(range(0, rep.start - before))
    inner = stacks.stack_of(pg, head)
    assert inner is not None and inner.period == 10 and inner.copies >= 4
    # a piece at or below the large-graph threshold is not one
    assert stacks.stack_of(pg, head[:20]) is None


def test_split_time_follows_what_each_solve_stands_to_gain(small_pieces):
    pg = chain_order(_two_stacks())
    rep = blocks.find_repeats(pg, min_copies=budget.MIN_COPIES)
    before, after = blocks.partial_edges(pg, rep)
    rest = [list(range(0, rep.start - before)), list(range(rep.stop + after, len(pg.ops)))]
    head = set(rest[0])
    # the hint spends 3x as long in the first stack's ops as in the rest
    op_us = {op.id: (30.0 if i in head else 10.0 * len(head) / (len(pg.ops) - len(head)))
             for i, op in enumerate(pg.ops)}
    shares, rest_s, rep_s = repeats.split_time(pg, rep, rest, 8.0, op_us)
    assert shares[0][1] is not None and shares[0][0] == pytest.approx(6.0)
    assert rep_s == pytest.approx(2.0) and rest_s + rep_s == pytest.approx(8.0)
    # too little for both: the smaller stake gives its share to the larger
    shares, _, rep_s = repeats.split_time(pg, rep, rest, 1.2, op_us)
    assert shares[0][0] == pytest.approx(1.2) and rep_s == 0.0
    # without the hint's times: by the blocks' ops (10 against 12)
    shares, _, rep_s = repeats.split_time(pg, rep, rest, 11.0, None)
    assert shares[0][0] == pytest.approx(5.0) and rep_s == pytest.approx(6.0)


def test_plan_stack_solves_one_copy_and_copies_it(small_pieces):
    pg = chain_order(_two_stacks())
    head = list(range(0, 61))
    inner = stacks.stack_of(pg, head)
    parts, notes = stacks.plan_stack(pg, head, HW, deadline=None, budget_s=2.0, deterministic=True,
                                     input_sticks={}, name="prologue", rep=inner)
    assert any(n.startswith(f"prologue representative: {inner.period} ops, OPTIMAL") for n in notes), notes
    # the parts cover the piece once, in op order
    ids = [o for _, order in parts for o in order]
    assert ids == [pg.ops[i].id for i in head]
    # every copy runs each op as the representative's copy does
    plans = {o: p for part, _ in parts for o, p in part.ops.items()}
    for j in range(inner.period):
        at = [pg.ops[inner.start + c * inner.period + j].id for c in range(inner.copies)]
        assert len({(plans[o].stick, tuple(sorted(plans[o].core_split.items()))) for o in at}) == 1


def test_two_stacks_compose_to_a_valid_plan_never_slower_than_the_hint(small_pieces):
    from solver.planners import plan

    pg = _two_stacks()
    program = plan(pg, HW, "cpsat", time_limit_s=6, deterministic=True, fallback=False)
    notes = program.stats.notes
    assert any(n.startswith("prologue: a stack of its own") for n in notes), notes
    heuristic = time_program(plan(pg, HW, "heuristic"), HW).total_us
    assert time_program(program, HW).total_us <= heuristic * (1 + 1e-9)


def test_core_search_from_the_stacks_plan_is_never_slower_than_it(small_pieces, monkeypatch):
    from dataclasses import replace

    from solver.oracle import checked_program
    from solver.spyre.depth import core_search
    from solver.spyre.depth.segments import merge, reader_index, subgraph

    monkeypatch.setattr(core_search, "MIN_CORE_S", 0.2)
    monkeypatch.setattr(core_search, "CORE_S_PER_OP", 0.001)
    pg = chain_order(_two_stacks())
    head = list(range(0, 61))
    readers = reader_index(pg)
    parts, notes = stacks.plan_stack(pg, head, HW, deadline=None, budget_s=2.0, deterministic=True,
                                     input_sticks={}, name="prologue", readers=readers)
    got, more = stacks.finish(pg, head, HW, parts, notes, budget_s=3.0, deadline=None, input_sticks={},
                              name="prologue", readers=readers, seed=1)
    assert any("core search from the stack's plan" in n for n in more), more
    assert [o for _, order in got for o in order] == [pg.ops[i].id for i in head]
    sub = subgraph(pg, head, "head")

    def us(d):
        prog, issues = checked_program(sub, HW, replace(d, op_order=[]))
        assert prog is not None, issues
        return time_program(prog, HW).total_us
    assert us(merge(got)) <= us(merge(parts)) * (1 + 1e-9)


def test_two_stacks_each_under_the_coverage_are_planned_by_repeats_together(small_pieces, monkeypatch):
    """Neither stack alone covers MIN_COVERAGE of the graph (raised here to 0.6: the first
    stack covers 100 of 197 ops), both together do: the repeated path, not windows."""
    monkeypatch.setattr(budget, "MIN_COVERAGE", 0.6)
    pg = chain_order(_two_stacks(first=10, second=8))
    rep = blocks.find_repeats(pg, min_copies=budget.MIN_COPIES)
    assert rep.copies * rep.period < budget.MIN_COVERAGE * len(pg.ops)
    assert repeats.covered_ops(pg, rep) >= budget.MIN_COVERAGE * len(pg.ops)
    d = repeats.plan_depth(pg, HW, time_limit_s=2, deterministic=True, t0=0.0)
    assert d is not None
    assert any(n.startswith("epilogue: a stack of its own") or n.startswith("prologue: a stack of its own")
               for n in d.stats["notes"]), d.stats["notes"]
