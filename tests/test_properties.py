"""Property tests (issue 16): random valid primitive graphs -> every planner's program
(naive, heuristic, cpsat with a small time limit) passes the validator, and its
functional run on the simulator matches the IR's reference interpreter.

Graphs are chains over a [M, N] activation built from the primitive ops the lowering
emits: pointwise unary and binary ops (a second input of the same shape, a row vector
broadcast along rows, or a column of per-row statistics), row reductions that keep the
dim (sum, max, min) feeding a broadcast, and matmuls with a parameter that change the
width. Sizes are multiples of a stick or small odd ones (padding). Planners run with
`fallback=False`: a program from another planner would hide a failure.
"""
from __future__ import annotations

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from target.interpreter import interpret  # noqa: E402
from target.primitives import (  # noqa: E402
    Access, Call, Const, In, IterDim, MatmulBody, PointwiseBody, PrimGraph, PrimOp, PrimTensor, ReduceBody,
)
from simulator.api import compare  # noqa: E402
from target.hardware import load_target  # noqa: E402
from simulator.run import run_program  # noqa: E402
from simulator.validate import validate_program  # noqa: E402
from solver import planners  # noqa: E402
from tests.primgraphs import inputs_for  # noqa: E402

HW = load_target()
F16 = "float16"
UNARY = ("relu", "neg", "abs", "tanh", "sigmoid", "silu", "gelu")
BINARY = ("add", "sub", "mul", "maximum", "minimum")
SIZES = (1, 3, 16, 24, 32, 64, 96, 128)


@st.composite
def prim_graphs(draw):
    M = draw(st.sampled_from(SIZES))
    N = draw(st.sampled_from(SIZES[1:]))
    tensors = {"x": PrimTensor("x", (M, N), F16, "user_input")}
    inputs = ["x"]
    ops: list[PrimOp] = []
    cur, width = "x", N
    n_ops = draw(st.integers(1, 6))
    for i in range(n_ops):
        kind = draw(st.sampled_from(["unary", "binary", "row", "col", "reduce", "matmul", "scale"]))
        out = f"t{i}"
        par = (IterDim("m", M), IterDim("n", width))
        if kind == "unary":
            fn = draw(st.sampled_from(UNARY))
            ops.append(PrimOp(f"op{i}", par, (Access(cur, (0, 1)),), Access(out, (0, 1)),
                              PointwiseBody(Call(fn, (In(0),)))))
        elif kind == "scale":
            c = draw(st.sampled_from([0.5, 2.0, -1.0, 0.125]))
            ops.append(PrimOp(f"op{i}", par, (Access(cur, (0, 1)),), Access(out, (0, 1)),
                              PointwiseBody(Call("mul", (In(0), Const(c))))))
        elif kind in ("binary", "row", "col"):
            fn = draw(st.sampled_from(BINARY))
            other = f"in{i}"
            if kind == "binary":
                tensors[other] = PrimTensor(other, (M, width), F16, "user_input")
                acc = Access(other, (0, 1))
            elif kind == "row":  # a bias broadcast along rows
                tensors[other] = PrimTensor(other, (width,), F16, "parameter")
                acc = Access(other, (1,))
            else:  # one value per row
                tensors[other] = PrimTensor(other, (M, 1), F16, "user_input")
                acc = Access(other, (0, None))
            inputs.append(other)
            ops.append(PrimOp(f"op{i}", par, (Access(cur, (0, 1)), acc), Access(out, (0, 1)),
                              PointwiseBody(Call(fn, (In(0), In(1))))))
        elif kind == "reduce":  # row statistic, then broadcast back: x - max(x) or x * sum(x)
            fn = draw(st.sampled_from(["sum", "max", "min"]))
            stat = f"s{i}"
            tensors[stat] = PrimTensor(stat, (M, 1), F16, "intermediate")
            ops.append(PrimOp(f"red{i}", (IterDim("m", M), IterDim("n", width, "reduction")),
                              (Access(cur, (0, 1)),), Access(stat, (0, None)), ReduceBody(fn)))
            combine = "sub" if fn != "sum" else "mul"
            ops.append(PrimOp(f"op{i}", par, (Access(cur, (0, 1)), Access(stat, (0, None))), Access(out, (0, 1)),
                              PointwiseBody(Call(combine, (In(0), In(1))))))
        else:  # matmul with a parameter: [M, width] @ [width, K]
            K = draw(st.sampled_from(SIZES[1:]))
            w = f"w{i}"
            tensors[w] = PrimTensor(w, (width, K), F16, "parameter")
            inputs.append(w)
            ops.append(PrimOp(f"op{i}", (IterDim("m", M), IterDim("n", K), IterDim("k", width, "reduction")),
                              (Access(cur, (0, 2)), Access(w, (2, 1))), Access(out, (0, 1)), MatmulBody(0, 1, 2)))
            width = K
        tensors[out] = PrimTensor(out, (M, width), F16, "intermediate")
        cur = out
    outputs = [cur]
    # Sometimes a second output: an intermediate that is also read later.
    if len(ops) > 1 and draw(st.booleans()):
        first = ops[0].output.tensor
        if first != cur:
            outputs.append(first)
    return PrimGraph("prop", tensors, ops, inputs, outputs)


def _check(pg: PrimGraph, planner: str, **kwargs) -> None:
    prog = planners.plan(pg, HW, planner=planner, deterministic=True, fallback=False, **kwargs)
    assert prog.stats.planner == planner
    issues = validate_program(prog, HW)
    assert issues == [], [i.to_json() for i in issues]
    inp = inputs_for(pg, seed=1)
    outs = run_program(prog, inp, HW)
    refs = interpret(pg, inp)
    assert len(outs) == len(refs)
    for out, ref in zip(outs, refs):
        assert out.shape == ref.shape
    # The run and the interpreter round to fp16 at the same points; the order of a
    # reduction's partial sums (split over cores) is the only difference.
    err = compare(outs, refs)[1]
    assert err < 2e-2, err
    assert all(np.isfinite(o.astype(np.float32)).all() == np.isfinite(r.astype(np.float32)).all()
               for o, r in zip(outs, refs))


COMMON = dict(deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))


@settings(max_examples=40, **COMMON)
@given(pg=prim_graphs())
def test_naive_programs_are_valid_and_match_the_interpreter(pg):
    _check(pg, "naive")


@settings(max_examples=40, **COMMON)
@given(pg=prim_graphs())
def test_heuristic_programs_are_valid_and_match_the_interpreter(pg):
    planners.ensure_registered("heuristic")
    _check(pg, "heuristic")


@settings(max_examples=25, **COMMON)
@given(pg=prim_graphs())
def test_cpsat_programs_are_valid_and_match_the_interpreter(pg):
    planners.ensure_registered("cpsat")
    if "cpsat" not in planners.PLANNERS:
        pytest.skip("cpsat planner not registered")
    _check(pg, "cpsat", time_limit_s=1.0)
