"""Lowering contract tests on hand-written documents (no torch): error codes, dead code
elimination, graph outputs, the PrimGraph JSON form, and the interpreter's numerics rules."""
import numpy as np
import pytest

from lowering import SUPPORTED_TARGETS, lower_document, node_supported
from lowering.errors import GraphError
from lowering.graph_format import GraphDocument
from target.interpreter import InterpreterError, interpret, round_bfloat16
from target.primitives import (
    Access, CopyBody, FillBody, GatherBody, IterDim, PointwiseBody, PrimGraph, PrimOp, PrimTensor, StridedMap,
    graph_from_json, graph_to_json, In, Const, Call,
)


def meta(shape, dtype="float32"):
    stride, acc = [], 1
    for s in reversed(shape):
        stride.insert(0, acc)
        acc *= s
    return {"shape": list(shape), "stride": stride, "storage_offset": 0, "dtype": dtype}


def ref(node, output=0):
    return {"kind": "tensor", "node": node, "output": output}


def doc(nodes, outputs, inputs=(("x", [2, 3], "float32"),)):
    return GraphDocument.model_validate({
        "format": "sticksat.graph", "version": 1, "name": "t",
        "inputs": [{"id": i, "kind": "user_input", "meta": meta(s, d)} for i, s, d in inputs],
        "nodes": nodes, "outputs": [ref(*o) if isinstance(o, tuple) else ref(o) for o in outputs]})


def node(nid, target, args, out_shape, dtype="float32", kwargs=None):
    return {"id": nid, "target": target, "args": args, "kwargs": kwargs or {}, "outputs": [meta(out_shape, dtype)]}


def test_supported_targets_cover_the_tiny_models_ops():
    seen = """aten._scaled_dot_product_flash_attention_for_cpu.default aten.add.Tensor aten.addmm.default
    aten.bitwise_and.Tensor aten.cat.default aten.clone.default aten.convolution.default aten.cos.default
    aten.cumsum.default aten.div.Tensor aten.embedding.default aten.eq.Tensor aten.erf.default aten.exp.default
    aten.expand.default aten.full.default aten.gather.default aten.ge.Scalar aten.index.Tensor aten.le.Tensor
    aten.mean.dim aten.mm.default aten.mul.Tensor aten.ne.Scalar aten.neg.default aten.permute.default
    aten.pow.Tensor_Scalar aten.reciprocal.default aten.relu.default aten.rsqrt.default
    aten.scalar_tensor.default aten.select.int aten.sin.default aten.slice.Tensor aten.split.Tensor
    aten.sqrt.default aten.sub.Tensor aten.tanh.default aten.unsqueeze.default aten.var_mean.correction
    aten.view.default aten.where.self prims._low_memory_max_pool_with_offsets.default
    prims.convert_element_type.default prims.iota.default""".split()
    assert set(seen) <= SUPPORTED_TARGETS
    assert node_supported("aten.mm.default") and not node_supported("aten.nonzero.default")


def test_unsupported_op_names_the_node():
    d = doc([node("nz", "aten.nonzero.default", [ref("x")], [2, 2], "int64")], ["nz"])
    with pytest.raises(GraphError) as e:
        lower_document(d)
    assert e.value.code == "unsupported_op" and e.value.node == "nz"


def test_declared_shape_and_dtype_are_checked():
    bad_shape = doc([node("a", "aten.add.Tensor", [ref("x"), ref("x")], [3, 2])], ["a"])
    with pytest.raises(GraphError) as e:
        lower_document(bad_shape)
    assert e.value.code == "shape_mismatch" and e.value.node == "a"
    bad_dtype = doc([node("a", "aten.add.Tensor", [ref("x"), {"kind": "int", "value": 1}], [2, 3], "float16")],
                    ["a"])
    with pytest.raises(GraphError) as e:
        lower_document(bad_dtype)
    assert e.value.code == "dtype_mismatch"
    # int tensor + float scalar promotes to float32 (torch's rule): accepted
    ok = doc([node("a", "aten.add.Tensor", [ref("i"), {"kind": "float", "value": 0.5}], [4])], ["a"],
             inputs=(("i", [4], "int64"),))
    pg = lower_document(ok)
    assert pg.tensors["a"].dtype == "float32"
    np.testing.assert_array_equal(interpret(pg, {"i": np.arange(4)})[0], np.arange(4) + 0.5)


def test_broadcast_failure_is_a_shape_mismatch():
    d = doc([node("a", "aten.add.Tensor", [ref("x"), ref("y")], [2, 3])], ["a"],
            inputs=(("x", [2, 3], "float32"), ("y", [4], "float32")))
    with pytest.raises(GraphError) as e:
        lower_document(d)
    assert e.value.code == "shape_mismatch"


def test_dead_code_is_dropped_and_outputs_may_repeat_or_name_inputs():
    nodes = [node("e", "aten.exp.default", [ref("x")], [2, 3]),
             node("unused", "aten.tanh.default", [ref("e")], [2, 3]),
             node("n", "aten.neg.default", [ref("e")], [2, 3]),
             node("t", "aten.permute.default", [ref("n"), {"kind": "list", "items": [
                 {"kind": "int", "value": 1}, {"kind": "int", "value": 0}]}], [3, 2])]
    d = doc(nodes, ["n", "x", "n", "t"])
    pg = lower_document(d)
    assert [op.id for op in pg.ops] == ["e", "n", "t"]  # tanh dropped; the permuted output is copied
    assert "unused" not in pg.tensors
    assert pg.outputs[:3] == ["n", "x", "n"]
    assert pg.ops[-1].kind == "copy" and pg.tensors[pg.outputs[3]].shape == (3, 2)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = interpret(pg, {"x": x})
    np.testing.assert_allclose(out[0], -np.exp(x), rtol=1e-6)
    np.testing.assert_array_equal(out[1], x)
    np.testing.assert_allclose(out[3], -np.exp(x).T, rtol=1e-6)


def test_symbolic_size_rejected():
    d = GraphDocument.model_validate({
        "format": "sticksat.graph", "version": 1,
        "inputs": [{"id": "x", "kind": "user_input",
                    "meta": {"shape": [{"sym": "s0"}, 3], "stride": [3, 1], "dtype": "float32"}}],
        "nodes": [], "outputs": [ref("x")]})
    with pytest.raises(GraphError) as e:
        lower_document(d)
    assert e.value.code == "symbolic_size"


def test_prim_graph_json_roundtrip_with_multi_axis_gather():
    nodes = [node("g", "aten.index.Tensor", [ref("t"), {"kind": "list", "items": [ref("i"), ref("j")]}], [3],
                  "float32")]
    d = doc(nodes, ["g"], inputs=(("t", [4, 5], "float32"), ("i", [3], "int64"), ("j", [3], "int64")))
    pg = lower_document(d)
    again = graph_from_json(graph_to_json(pg))
    assert again.ops == pg.ops and again.tensors == pg.tensors and again.outputs == pg.outputs
    assert pg.ops[0].body == GatherBody(0, extra_axes=(1,))
    t = np.arange(20, dtype=np.float32).reshape(4, 5)
    out = interpret(again, {"t": t, "i": np.array([0, 3, -1]), "j": np.array([4, 0, -2])})[0]
    np.testing.assert_array_equal(out, t[[0, 3, -1], [4, 0, -2]])


# -- interpreter rules ---------------------------------------------------------------------
def _graph(ops, tensors, inputs, outputs):
    return PrimGraph("g", {t.id: t for t in tensors}, ops, inputs, outputs)


def test_interpreter_rounds_each_op_output_to_its_dtype():
    # x + 1e-4 in fp16 rounds back to x (fp16 spacing at 1.0 is ~1e-3), then * 2
    t = [PrimTensor("x", (4,), "float16", "user_input"), PrimTensor("a", (4,), "float16"),
         PrimTensor("b", (4,), "float32")]
    it = (IterDim("d0", 4),)
    ops = [PrimOp("a", it, (Access("x", (0,)),), Access("a", (0,)),
                  PointwiseBody(Call("add", (In(0), Const(1e-4))))),
           PrimOp("b", it, (Access("a", (0,)),), Access("b", (0,)), PointwiseBody(Call("mul", (In(0), Const(2.0)))))]
    out = interpret(_graph(ops, t, ["x"], ["b"]), {"x": np.ones(4, np.float16)})[0]
    assert out.dtype == np.float32 and (out == 2.0).all()


def test_bfloat16_rounding_is_nearest_even():
    v = np.array([1.0, 1.00390625, 1.01171875, 3.0e38, -2.5e-3], dtype=np.float32)
    r = round_bfloat16(v)
    assert r[0] == 1.0 and r[1] == 1.0 and r[2] == 1.015625  # tie to even, round up
    assert (r.view(np.uint32) & 0xFFFF == 0).all()


def test_copy_pieces_strides_and_padding():
    t = [PrimTensor("x", (2, 3), "float32", "user_input"), PrimTensor("y", (3, 4), "float32")]
    # y = pad(x transposed, one column of -1 on the left)
    body = CopyBody((StridedMap((3, 2), (1, 3), 0),), ((0, 1),), pad_value=-1.0)
    ops = [PrimOp("y", (IterDim("d0", 3), IterDim("d1", 4)), (Access("x", (1, 0)),), Access("y", (0, 1)), body)]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = interpret(_graph(ops, t, ["x"], ["y"]), {"x": x})[0]
    want = np.full((3, 4), -1.0, np.float32)
    want[:, 1:3] = x.T
    np.testing.assert_array_equal(out, want)


def test_copy_reading_out_of_bounds_is_an_error():
    t = [PrimTensor("x", (4,), "float32", "user_input"), PrimTensor("y", (3,), "float32")]
    ops = [PrimOp("y", (IterDim("d0", 3),), (Access("x", (None,)),), Access("y", (0,)),
                  CopyBody((StridedMap((3,), (2,), 0),), ((0,),)))]
    with pytest.raises(InterpreterError):
        interpret(_graph(ops, t, ["x"], ["y"]), {"x": np.zeros(4, np.float32)})


def test_fill_iota_and_missing_input():
    t = [PrimTensor("i", (2, 3), "int64")]
    ops = [PrimOp("i", (IterDim("d0", 2), IterDim("d1", 3)), (), Access("i", (0, 1)),
                  FillBody(iota_dim=1, start=5, step=-2))]
    out = interpret(_graph(ops, t, [], ["i"]), {})[0]
    np.testing.assert_array_equal(out, [[5, 3, 1], [5, 3, 1]])
    with pytest.raises(InterpreterError):
        interpret(_graph([], [PrimTensor("x", (1,), "float32", "user_input")], ["x"], ["x"]), {})


def test_interpreter_erf_matches_math_erf():
    import math

    from target.interpreter import _erf

    x = np.concatenate([np.linspace(-7, 7, 20001), [0.0, 1e-9, -3e-30, np.inf, -np.inf]])
    want = np.array([math.erf(v) for v in x])
    np.testing.assert_allclose(_erf(x), want, rtol=1e-9, atol=1e-10)


def test_node_supported_checks_argument_limits():
    conv = "aten.convolution.default"
    assert node_supported(conv, [None, None, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1])
    assert node_supported(conv, [None, None, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 2])  # grouped
    assert node_supported(conv, [None, None, None, [1, 1], [0, 0], [1, 1], False, [0, 0]], {"groups": 8})
    assert not node_supported(conv, [None, None, None, [1, 1], [0, 0], [1, 1], True, [0, 0], 1])
    sdpa = "aten._scaled_dot_product_flash_attention_for_cpu.default"
    assert node_supported(sdpa, [None, None, None]) and not node_supported(sdpa, [None, None, None, 0.1])
    assert not node_supported("aten.gelu.default", [None], {"approximate": "erf"})


def test_folded_constants_carry_the_value_their_dtype_stores():
    # scalar_tensor(0.1, float16) holds 0.0999755859375; full(2.7, int64) holds 2
    nodes = [node("c", "aten.scalar_tensor.default", [{"kind": "float", "value": 0.1}], [], "float16",
                  kwargs={"dtype": {"kind": "dtype", "value": "float16"}}),
             node("i", "aten.full.default", [{"kind": "list", "items": []}, {"kind": "float", "value": 2.7}], [],
                  "int64", kwargs={"dtype": {"kind": "dtype", "value": "int64"}}),
             node("a", "aten.add.Tensor", [ref("x"), ref("c")], [2, 3]),
             node("b", "aten.mul.Tensor", [ref("a"), ref("i")], [2, 3])]
    pg = lower_document(doc(nodes, ["b"]))
    assert [op.kind for op in pg.ops] == ["pointwise", "pointwise"]  # both fills folded
    x = np.zeros((2, 3), np.float32)
    np.testing.assert_array_equal(interpret(pg, {"x": x})[0], np.float32(np.float16(0.1)) * 2)


def test_prim_op_memos_are_kept_but_never_pickled():
    """A PrimOp keeps its hash and derived facts once computed (memo keys hash ops over and
    over); a pickled or copied op drops them (str hashes differ between processes), and
    equal ops hash equal."""
    import copy
    import pickle
    op = PrimOp("p", (IterDim("i", 4),), (Access("x", (0,)),), Access("y", (0,)),
                PointwiseBody(In(0)))
    h = hash(op)
    assert op.__dict__.get("_hash") == h
    calls = []
    assert op.derived("fact", lambda: calls.append(1) or (1, 2)) == (1, 2)
    assert op.derived("fact", lambda: calls.append(1) or (3,)) == (1, 2) and calls == [1]
    for other in (pickle.loads(pickle.dumps(op)), copy.deepcopy(op), copy.copy(op)):
        assert "_hash" not in other.__dict__ and "_derived" not in other.__dict__
        assert other == op and hash(other) == h
    assert {op: 1}[PrimOp("p", (IterDim("i", 4),), (Access("x", (0,)),), Access("y", (0,)),
                          PointwiseBody(In(0)))] == 1
