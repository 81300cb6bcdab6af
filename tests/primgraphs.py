"""Hand-built PrimGraphs with independent numpy references (for the simulator-core tests).

Each builder returns (PrimGraph, reference) where reference(inputs) -> list of outputs
computed directly with numpy (fp16 storage rounding after every op, like the IR semantics)."""
from __future__ import annotations

import numpy as np

from target.primitives import (
    Access, Call, Const, CopyBody, FillBody, GatherBody, In, IterDim, MatmulBody, PointwiseBody,
    PrimGraph, PrimOp, PrimTensor, ReduceBody, StridedMap,
)

F16 = "float16"


def _t(i, shape, dtype=F16, role="intermediate"):
    return PrimTensor(i, tuple(shape), dtype, role)


def _g(name, tensors, ops, inputs, outputs):
    return PrimGraph(name, {t.id: t for t in tensors}, ops, inputs, outputs)


def r16(a):
    return np.asarray(a, dtype=np.float32).astype(np.float16).astype(np.float32)


def mlp(M=64, K=128, N=192):
    """y = x @ w (matmul), z = y + b (bias broadcast along rows), o = relu(z)."""
    ts = [_t("x", (M, K), role="user_input"), _t("w", (K, N), role="parameter"),
          _t("b", (N,), role="parameter"), _t("y", (M, N)), _t("z", (M, N)), _t("o", (M, N))]
    ops = [
        PrimOp("mm", (IterDim("m", M), IterDim("n", N), IterDim("k", K, "reduction")),
               (Access("x", (0, 2)), Access("w", (2, 1))), Access("y", (0, 1)), MatmulBody(0, 1, 2)),
        PrimOp("bias", (IterDim("m", M), IterDim("n", N)), (Access("y", (0, 1)), Access("b", (1,))),
               Access("z", (0, 1)), PointwiseBody(Call("add", (In(0), In(1))))),
        PrimOp("relu", (IterDim("m", M), IterDim("n", N)), (Access("z", (0, 1)),), Access("o", (0, 1)),
               PointwiseBody(Call("relu", (In(0),)))),
    ]

    def ref(inp):
        y = r16(inp["x"].astype(np.float32) @ inp["w"].astype(np.float32))
        z = r16(y + inp["b"].astype(np.float32))
        return [r16(np.maximum(z, 0))]
    return _g("mlp", ts, ops, ["x", "w", "b"], ["o"]), ref


def softmax(M=64, N=256):
    """Row softmax decomposed as Inductor does: amax, sub, exp, sum, div (keepdim stats)."""
    ts = [_t("x", (M, N), role="user_input"), _t("mx", (M, 1)), _t("sh", (M, N)), _t("ex", (M, N)),
          _t("sm", (M, 1)), _t("p", (M, N))]
    red = (IterDim("m", M), IterDim("n", N, "reduction"))
    par = (IterDim("m", M), IterDim("n", N))
    ops = [
        PrimOp("amax", red, (Access("x", (0, 1)),), Access("mx", (0, None)), ReduceBody("max")),
        PrimOp("sub", par, (Access("x", (0, 1)), Access("mx", (0, None))), Access("sh", (0, 1)),
               PointwiseBody(Call("sub", (In(0), In(1))))),
        PrimOp("exp", par, (Access("sh", (0, 1)),), Access("ex", (0, 1)), PointwiseBody(Call("exp", (In(0),)))),
        PrimOp("sum", red, (Access("ex", (0, 1)),), Access("sm", (0, None)), ReduceBody("sum")),
        PrimOp("div", par, (Access("ex", (0, 1)), Access("sm", (0, None))), Access("p", (0, 1)),
               PointwiseBody(Call("div", (In(0), In(1))))),
    ]

    def ref(inp):
        x = inp["x"].astype(np.float32)
        mx = r16(x.max(1, keepdims=True))
        sh = r16(x - mx)
        ex = r16(np.exp(sh))
        sm = r16(ex.sum(1, keepdims=True))
        return [r16(ex / sm)]
    return _g("softmax", ts, ops, ["x"], ["p"]), ref


def attention_scores(B=2, S=128, D=64):
    """s = q @ k^T per batch: k is read transposed (its stick, on d, must move to s)."""
    ts = [_t("q", (B, S, D), role="user_input"), _t("k", (B, S, D), role="user_input"), _t("s", (B, S, S))]
    ops = [PrimOp("qk", (IterDim("b", B), IterDim("m", S), IterDim("n", S), IterDim("k", D, "reduction")),
                  (Access("q", (0, 1, 3)), Access("k", (0, 2, 3))), Access("s", (0, 1, 2)), MatmulBody(1, 2, 3))]

    def ref(inp):
        return [r16(np.einsum("bmk,bnk->bmn", inp["q"].astype(np.float32), inp["k"].astype(np.float32)))]
    return _g("scores", ts, ops, ["q", "k"], ["s"]), ref


def copies(A=4, Bd=8, C=64):
    """A reshape [A,Bd,C] -> [A*Bd,C] (alias-able) then a transpose copy -> [C, A*Bd]."""
    R = A * Bd
    ts = [_t("x", (A, Bd, C), role="user_input"), _t("r", (R, C)), _t("tr", (C, R)), _t("o", (C, R))]
    ops = [
        PrimOp("reshape", (IterDim("i", R), IterDim("j", C)), (Access("x", (None, None, None)),),
               Access("r", (0, 1)), CopyBody((StridedMap((R, C), (C, 1), 0),), ((0, 0),))),
        PrimOp("transpose", (IterDim("i", C), IterDim("j", R)), (Access("r", (None, None)),),
               Access("tr", (0, 1)), CopyBody((StridedMap((C, R), (1, C), 0),), ((0, 0),))),
        PrimOp("scale", (IterDim("i", C), IterDim("j", R)), (Access("tr", (0, 1)),), Access("o", (0, 1)),
               PointwiseBody(Call("mul", (In(0), Const(2.0))))),
    ]

    def ref(inp):
        return [r16(inp["x"].astype(np.float32).reshape(R, C).T * 2.0)]
    return _g("copies", ts, ops, ["x"], ["o"]), ref


def embedding(V=100, D=128, B=2, S=16):
    ts = [_t("table", (V, D), role="parameter"), _t("ids", (B, S), "int64", "user_input"),
          _t("e", (B, S, D)), _t("pos", (S, D)), _t("o", (B, S, D))]
    ops = [
        PrimOp("embed", (IterDim("b", B), IterDim("s", S), IterDim("d", D)),
               (Access("table", (None, 2)), Access("ids", (0, 1))), Access("e", (0, 1, 2)), GatherBody(0)),
        PrimOp("iota", (IterDim("s", S), IterDim("d", D)), (), Access("pos", (0, 1)),
               FillBody(iota_dim=0, start=0.0, step=0.5)),
        PrimOp("addpos", (IterDim("b", B), IterDim("s", S), IterDim("d", D)),
               (Access("e", (0, 1, 2)), Access("pos", (1, 2))), Access("o", (0, 1, 2)),
               PointwiseBody(Call("add", (In(0), In(1))))),
    ]

    def ref(inp):
        e = inp["table"].astype(np.float32)[inp["ids"]]
        pos = np.broadcast_to((np.arange(S) * 0.5)[:, None], (S, D))
        return [r16(e + r16(pos))]
    return _g("embedding", ts, ops, ["table", "ids"], ["o"]), ref


def colsum(M=256, N=128):
    """Sum over rows (a reduction dim that is not the stick): splittable across cores."""
    ts = [_t("x", (M, N), role="user_input"), _t("s", (1, N))]
    ops = [PrimOp("colsum", (IterDim("r", M, "reduction"), IterDim("n", N)), (Access("x", (0, 1)),),
                  Access("s", (None, 1)), ReduceBody("sum"))]

    def ref(inp):
        return [r16(inp["x"].astype(np.float32).sum(0, keepdims=True))]
    return _g("colsum", ts, ops, ["x"], ["s"]), ref


ALL = {"mlp": mlp, "softmax": softmax, "scores": attention_scores, "copies": copies,
       "embedding": embedding, "colsum": colsum}


def gated_projections(M=512, K=2048, N=2048):
    """z = (x @ w1) * (x @ w2): a gated MLP's two projections reading the same rows."""
    ts = {t.id: t for t in (PrimTensor("x", (M, K), "float16", "user_input"),
                            PrimTensor("w1", (K, N), "float16", "parameter"),
                            PrimTensor("w2", (K, N), "float16", "parameter"),
                            PrimTensor("y1", (M, N), "float16", "intermediate"),
                            PrimTensor("y2", (M, N), "float16", "intermediate"),
                            PrimTensor("z", (M, N), "float16", "intermediate"))}

    def mm(oid, b, out):
        return PrimOp(oid, (IterDim("m", M), IterDim("n", N), IterDim("k", K, "reduction")),
                      (Access("x", (0, 2)), Access(b, (2, 1))), Access(out, (0, 1)), MatmulBody(0, 1, 2))
    mul = PrimOp("mul", (IterDim("m", M), IterDim("n", N)), (Access("y1", (0, 1)), Access("y2", (0, 1))),
                 Access("z", (0, 1)), PointwiseBody(Call("mul", (In(0), In(1)))))
    return PrimGraph("gated", ts, [mm("mm1", "w1", "y1"), mm("mm2", "w2", "y2"), mul], ["x", "w1", "w2"], ["z"])


def inputs_for(pg: PrimGraph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name in pg.inputs:
        t = pg.tensors[name]
        if t.dtype == "int64":
            bound = 2
            for op in pg.ops:
                if op.body.kind == "gather" and op.inputs[1].tensor == name:
                    bound = pg.tensors[op.inputs[0].tensor].shape[op.body.axis]
            out[name] = rng.integers(0, bound, size=t.shape).astype(np.int64)
        else:
            out[name] = (rng.standard_normal(t.shape) * 0.5).astype(np.float16)
    return out
