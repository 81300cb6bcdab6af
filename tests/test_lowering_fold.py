"""lowering/fold_layouts.py: a copy that reads its producer's output as a permutation of
its dims followed by a reshape is folded into the producer (the producer writes the
permuted tensor, the copy becomes a plain reshape or disappears); every other copy stays."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lowering import lower_document
from lowering.fold_layouts import fold_layouts, permutation_of
from target.interpreter import interpret
from target.op_rules import copy_is_reshape
from target.primitives import (
    Access, Call, CopyBody, In, IterDim, MatmulBody, PointwiseBody, PrimGraph, PrimOp, PrimTensor, StridedMap,
)
from simulator.api import simulate
from target.hardware import load_target
from solver.baseline.passes import plan_heuristic
from solver.planners import plan
from solver.spyre.strategies import GraphContext, op_strategies
from tests.lowering_helpers import DocBuilder, assert_close, capture_with_values, eager_outputs

HW = load_target()


def _rnd(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def _attention_doc(heads: int, kv_heads: int, L: int = 8, E: int = 16, dtype=torch.float32):
    """sdpa -> transpose(1, 2) -> reshape [1, L, H*E] -> o_proj mm: the attention output
    path of every transformer (GQA when kv_heads < heads)."""
    b = DocBuilder()
    q = b.input(_rnd(1, heads, L, E, seed=1, dtype=dtype))
    k = b.input(_rnd(1, kv_heads, L, E, seed=2, dtype=dtype))
    v = b.input(_rnd(1, kv_heads, L, E, seed=3, dtype=dtype))
    w = b.input(_rnd(heads * E, 32, seed=4, dtype=dtype), kind="parameter", name="w_o")
    att = b.call("aten._scaled_dot_product_flash_attention_for_cpu.default", q, k, v, 0.0, True)[0]
    t = b.call("aten.transpose.int", att, 1, 2)
    r = b.call("aten.reshape.default", t, [L, heads * E])
    out = b.call("aten.mm.default", r, w)
    return b, out


def _out_copy(pg: PrimGraph) -> PrimOp:
    """The copy that reads the attention result (the output permute, or the regroup of it)."""
    prod = pg.producer()
    for op in pg.ops:
        p = prod.get(op.inputs[0].tensor) if op.kind == "copy" else None
        if p is not None and p.kind == "matmul" and p.source.startswith("n1_"):  # n1: the sdpa node
            return op
    raise AssertionError("no copy reads the attention result")


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2)], ids=["mha", "gqa"])
def test_fold_matches_eager_and_unfolded(heads, kv_heads):
    b, out = _attention_doc(heads, kv_heads)
    doc = b.document(out)
    before, after = lower_document(doc, fold=False), lower_document(doc)
    want = out.value.numpy()
    got_before, got_after = interpret(before, b.values)[0], interpret(after, b.values)[0]
    assert_close(got_before, want, torch.float32, "unfolded")
    assert_close(got_after, want, torch.float32, "folded")
    np.testing.assert_array_equal(got_after, got_before)  # same arithmetic, only the layout moved
    # the attention result is stored permuted: [1, L, H, E] (or [1, L, kvh, g, E] for GQA)
    res = _out_copy(after).inputs[0].tensor
    assert after.tensors[res].shape[1] == 8 and before.tensors[res].shape[1] != 8
    if heads == kv_heads:
        assert len(after.ops) == len(before.ops) - 1  # the transpose copy is gone
    else:
        assert len(after.ops) == len(before.ops)


class _Attention(torch.nn.Module):
    def __init__(self, hidden=64, heads=4, kv_heads=2):
        super().__init__()
        self.h, self.kvh, self.e = heads, kv_heads, hidden // heads
        self.q = torch.nn.Linear(hidden, hidden, bias=False)
        self.kv = torch.nn.Linear(hidden, 2 * kv_heads * self.e, bias=False)
        self.o = torch.nn.Linear(hidden, hidden, bias=False)

    def forward(self, x):
        B, L, _ = x.shape
        q = self.q(x).view(B, L, self.h, self.e).transpose(1, 2)
        k, v = self.kv(x).view(B, L, 2, self.kvh, self.e).permute(2, 0, 3, 1, 4)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                             enable_gqa=self.kvh != self.h)
        return self.o(y.transpose(1, 2).reshape(B, L, self.h * self.e))


@pytest.mark.parametrize("kv_heads", [4, 2], ids=["mha", "gqa"])
def test_captured_attention_module_matches_eager(kv_heads):
    torch.manual_seed(0)
    model = _Attention(kv_heads=kv_heads).eval()
    inputs = (torch.randn(1, 16, 64),)
    doc, values = capture_with_values(model, inputs)
    before, after = lower_document(doc, fold=False), lower_document(doc)
    assert sum(1 for t in after.tensors if t in before.tensors
               and after.tensors[t].shape != before.tensors[t].shape) == 1  # the attention result
    want = eager_outputs(model, inputs)[0]
    for pg in (before, after):
        assert_close(interpret(pg, values)[0], want, torch.float32, pg.name)


def test_gqa_output_copy_becomes_a_free_alias():
    b, out = _attention_doc(4, 2, L=64, E=64, dtype=torch.float16)
    doc = b.document(out)
    before, after = lower_document(doc, fold=False), lower_document(doc)
    c0, c1 = _out_copy(before), _out_copy(after)
    assert c0.id == c1.id and c0.output.tensor == c1.output.tensor  # ids kept
    shp0, shp1 = before.tensors[c0.inputs[0].tensor].shape, after.tensors[c1.inputs[0].tensor].shape
    assert shp0 == (1, 2, 2, 64, 64) and shp1 == (1, 64, 2, 2, 64)
    assert not copy_is_reshape(c0, shp0, before.tensors[c0.output.tensor].shape)
    assert copy_is_reshape(c1, shp1, after.tensors[c1.output.tensor].shape)
    mm = after.producer()[c1.inputs[0].tensor]
    body = mm.body
    assert mm.output.dims[1] == body.m and mm.output.dims[-1] == body.n  # m outermost, stick on n last
    # CP-SAT's candidates: only the folded copy has an alias strategy
    for pg, c, alias in ((before, c0, False), (after, c1, True)):
        ctx = GraphContext.build(pg, HW)
        assert any(s.alias for s in op_strategies(c, ctx)) is alias
    # the heuristic (torch-spyre's passes) claims it too, and the whole plan runs right
    assert plan_heuristic(after, HW).ops[c1.id].alias
    assert not plan_heuristic(before, HW).ops[c0.id].alias
    program = plan(after, HW, "heuristic", fallback=False)
    res = simulate(program, HW, inputs=b.values, graph=after, numerics=True)
    assert res.valid, res.errors
    assert res.max_rel_err is not None and res.max_rel_err < 2e-2, res.max_rel_err


# -- cases that must not fold -----------------------------------------------------------------
def _matmul_then_copies(readers: int, smap: StridedMap, out_shape, extra_output: bool = False) -> PrimGraph:
    """y[4, 6] = x @ w; `readers` copies of y through `smap`."""
    F = "float32"
    ts = [PrimTensor("x", (4, 5), F, "user_input"), PrimTensor("w", (5, 6), F, "parameter"),
          PrimTensor("y", (4, 6), F)]
    ops = [PrimOp("y", (IterDim("m", 4), IterDim("n", 6), IterDim("k", 5, "reduction")),
                  (Access("x", (0, 2)), Access("w", (2, 1))), Access("y", (0, 1)), MatmulBody(0, 1, 2), "mm")]
    outs = []
    for r in range(readers):
        cid = f"c{r}"
        ts.append(PrimTensor(cid, tuple(out_shape), F))
        iters = tuple(IterDim(f"d{j}", s) for j, s in enumerate(out_shape))
        ops.append(PrimOp(cid, iters, (Access("y", (None, None)),), Access(cid, tuple(range(len(out_shape)))),
                          CopyBody((smap,), ((0,) * len(out_shape),)), "copy"))
        outs.append(cid)
    if extra_output:
        outs.append("y")
    return PrimGraph("g", {t.id: t for t in ts}, ops, ["x", "w"], outs)


def test_a_permuting_copy_of_one_reader_folds_away():
    # y = x*x [2, 3, 4]; c[i, j, l] = y[j, i, l] (transpose(0, 1), stick dim l stays last); z = -c
    F = "float32"
    it = lambda *sizes: tuple(IterDim(f"d{j}", s) for j, s in enumerate(sizes))
    ts = {t.id: t for t in (PrimTensor("x", (2, 3, 4), F, "user_input"), PrimTensor("y", (2, 3, 4), F),
                            PrimTensor("c", (3, 2, 4), F), PrimTensor("z", (3, 2, 4), F))}
    ops = [PrimOp("y", it(2, 3, 4), (Access("x", (0, 1, 2)),), Access("y", (0, 1, 2)),
                  PointwiseBody(Call("mul", (In(0), In(0)))), "sq"),
           PrimOp("c", it(3, 2, 4), (Access("y", (1, 0, 2)),), Access("c", (0, 1, 2)),
                  CopyBody((StridedMap((3, 2, 4), (4, 12, 1), 0),), ((0, 0, 0),)), "copy"),
           PrimOp("z", it(3, 2, 4), (Access("c", (0, 1, 2)),), Access("z", (0, 1, 2)),
                  PointwiseBody(Call("neg", (In(0),))), "neg")]
    pg = PrimGraph("g", ts, ops, ["x"], ["z"])
    assert permutation_of((2, 3, 4), ops[1].body.maps[0]) == (1, 0, 2)
    folded = fold_layouts(pg)
    assert [op.id for op in folded.ops] == ["y", "z"]  # the copy is gone, z reads y
    assert folded.tensors["y"].shape == (3, 2, 4) and "c" not in folded.tensors
    assert folded.ops[0].output.dims == (1, 0, 2) and folded.ops[1].inputs[0].tensor == "y"
    x = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(interpret(folded, {"x": x})[0], interpret(pg, {"x": x})[0])
    assert pg.tensors["y"].shape == (2, 3, 4) and len(pg.ops) == 3  # the input graph untouched


@pytest.mark.parametrize("why", ["two_readers", "graph_output", "slice", "moves_stick"])
def test_copies_that_must_stay(why):
    if why == "slice":  # y[:, 1:4] (an offset, part of the dims): not a permutation
        pg = _matmul_then_copies(1, StridedMap((4, 3), (6, 1), 1), (4, 3))
    elif why == "moves_stick":  # yᵀ: the matmul's n (its stick) would leave the last dim
        pg = _matmul_then_copies(1, StridedMap((6, 4), (1, 6), 0), (6, 4))
        assert permutation_of((4, 6), pg.ops[1].body.maps[0]) == (1, 0)
    else:  # a real permute+reshape of a 3-D y, but y has another reader or is an output
        pg = _matmul_then_copies(2 if why == "two_readers" else 1, StridedMap((4, 6), (6, 1), 0), (4, 6),
                                 extra_output=why == "graph_output")
        # make y 3-D [2, 2, 6] read as [2, 2, 6] transposed (1, 0) then merged: [4, 6]
        y3 = PrimTensor("y", (2, 2, 6), "float32")
        mm = pg.ops[0]
        pg.tensors["y"] = y3
        pg.ops[0] = PrimOp("y", (IterDim("b", 2), IterDim("m", 2), IterDim("n", 6), IterDim("k", 5, "reduction")),
                           (Access("x", (None, 3)), Access("w", (3, 2))), Access("y", (0, 1, 2)),
                           MatmulBody(1, 2, 3), mm.source)
        smap = StridedMap((2, 2, 6), (6, 12, 1), 0)
        for j in range(1, len(pg.ops)):
            c = pg.ops[j]
            pg.tensors[c.output.tensor] = PrimTensor(c.output.tensor, (2, 2, 6), "float32")
            pg.ops[j] = PrimOp(c.id, (IterDim("d0", 2), IterDim("d1", 2), IterDim("d2", 6)),
                               (Access("y", (1, 0, 2)),), Access(c.output.tensor, (0, 1, 2)),
                               CopyBody((smap,), ((0, 0, 0),)), "copy")
        assert permutation_of((2, 2, 6), smap) == (1, 0, 2)
    folded = fold_layouts(pg)
    assert folded.ops == pg.ops and folded.tensors == pg.tensors


def test_permutation_of_rejects_what_is_not_a_permute_reshape():
    x = (2, 3, 4)
    assert permutation_of(x, StridedMap((24,), (1,), 0)) == (0, 1, 2)                    # plain reshape
    assert permutation_of(x, StridedMap((4, 6), (1, 4), 0)) == (2, 0, 1)                 # permute + merge
    assert permutation_of(x, StridedMap((3, 2, 4), (4, 12, 1), 0)) == (1, 0, 2)
    assert permutation_of(x, StridedMap((3, 2, 2, 2), (4, 12, 2, 1), 0)) == (1, 0, 2)    # + split of the last
    assert permutation_of(x, StridedMap((2, 3, 4), (12, 4, 1), 4)) is None                # offset
    assert permutation_of(x, StridedMap((2, 3, 2), (12, 4, 2), 0)) is None                # strided slice
    assert permutation_of(x, StridedMap((2, 3, 4), (0, 4, 1), 0)) is None                 # broadcast
    assert permutation_of(x, StridedMap((2, 3, 2, 2), (12, 4, 1, 2), 0)) is None          # a dim of x split and permuted
    assert permutation_of((1, 3, 1, 4), StridedMap((4, 3), (1, 4), 0)) == (0, 3, 2, 1)   # size-1 dims stay put


@pytest.mark.parametrize("graph,copy,dropped", [("llama31_8b_prefill512", "permute_6", None),
                                                ("gpt2_block512", None, "permute_3")])
def test_layer_graphs_attention_output_copy_folds(graph, copy, dropped):
    """The captured layer graphs (benchmarks/graphs/layers): llama's GQA output permute
    becomes a reshape of the grouped PV result stored [1, L, kvh, g, E]; gpt2's transpose
    copy disappears and the o_proj regroup reads the PV result directly."""
    from pathlib import Path

    from lowering.graph_format import GraphDocument

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "graphs" / "layers" / f"{graph}.json"
    doc = GraphDocument.model_validate_json(path.read_text())
    before, after = lower_document(doc, fold=False), lower_document(doc)
    changed = [t for t in after.tensors if t in before.tensors and after.tensors[t].shape != before.tensors[t].shape]
    assert len(changed) == 1
    pv = changed[0]
    assert after.producer()[pv].kind == "matmul"
    if copy is not None:
        c0, c1 = (next(o for o in g.ops if o.id == copy) for g in (before, after))
        assert before.tensors[pv].shape == (1, 8, 4, 512, 128) and after.tensors[pv].shape == (1, 512, 8, 4, 128)
        assert not copy_is_reshape(c0, before.tensors[pv].shape, before.tensors[c0.output.tensor].shape)
        assert copy_is_reshape(c1, after.tensors[pv].shape, after.tensors[c1.output.tensor].shape)
        assert len(after.ops) == len(before.ops)
    else:
        assert any(o.id == dropped for o in before.ops) and not any(o.id == dropped for o in after.ops)
        assert after.tensors[pv].shape == (1, 512, 12, 64) and len(after.ops) == len(before.ops) - 1
        readers = [o for o in after.ops if any(a.tensor == pv for a in o.inputs)]
        assert len(readers) == 1 and copy_is_reshape(readers[0], after.tensors[pv].shape,
                                                     after.tensors[readers[0].output.tensor].shape)


@pytest.mark.parametrize("producer", ["reduce", "pointwise"])
def test_reduce_and_pointwise_producers_fold(producer):
    # T [1, 3, 4, 5] (a keepdim sum over dim 0, or an add) -> transpose(1, 2) -> reshape [4, 15]
    b = DocBuilder()
    x = b.input(_rnd(2, 3, 4, 5, seed=5))
    if producer == "reduce":
        t = b.call("aten.sum.dim_IntList", x, [0], True)
    else:
        t = b.call("aten.add.Tensor", b.call("aten.slice.Tensor", x, 0, 0, 1), b.input(_rnd(1, 3, 4, 5, seed=6)))
    r = b.call("aten.reshape.default", b.call("aten.transpose.int", t, 1, 2), [4, 15])
    out = b.call("aten.mul.Tensor", r, 2.0)
    doc = b.document(out)
    before, after = lower_document(doc, fold=False), lower_document(doc)
    changed = [k for k in after.tensors if k in before.tensors and after.tensors[k].shape != before.tensors[k].shape]
    assert changed and after.tensors[changed[0]].shape == (1, 4, 3, 5)
    assert after.producer()[changed[0]].kind == producer
    got = interpret(after, b.values)[0]
    np.testing.assert_array_equal(got, interpret(before, b.values)[0])
    assert_close(got, out.value.numpy(), torch.float32, producer)
