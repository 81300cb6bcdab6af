"""Per-op-family lowering tests: each builds a small document by calling the aten ops
eagerly (tests/lowering_helpers.DocBuilder), lowers it, runs the reference interpreter
and compares with torch (fp32 and fp16; tolerances in lowering_helpers.TOLERANCE)."""
import math

import pytest
import torch

from tests.lowering_helpers import DocBuilder

FLOATS = [torch.float32, torch.float16]
ALL_FLOATS = [torch.float32, torch.float16, torch.bfloat16]
ALL_IDS = ["fp32", "fp16", "bf16"]


def rnd(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed + 7 * len(shape) + sum(shape))
    return torch.randn(*shape, generator=g).to(dtype)


# -- pointwise -------------------------------------------------------------------------
UNARY = ["exp", "neg", "rsqrt", "tanh", "erf", "relu", "sqrt", "reciprocal", "sin", "cos", "sigmoid",
         "silu", "abs", "log"]


@pytest.mark.parametrize("dtype", FLOATS, ids=["fp32", "fp16"])
@pytest.mark.parametrize("fn", UNARY)
def test_unary(fn, dtype):
    b = DocBuilder()
    x = rnd(3, 5, dtype=dtype)
    if fn in ("rsqrt", "sqrt", "log"):
        x = x.abs() + 0.1
    if fn == "reciprocal":
        x = x.sign() * (x.abs() + 0.5)
    pg = b.check(b.call(f"aten.{fn}.default", b.input(x)))
    assert [op.kind for op in pg.ops] == ["pointwise"]


@pytest.mark.parametrize("dtype", ALL_FLOATS, ids=ALL_IDS)
def test_binary_broadcast_and_scalars(dtype):
    b = DocBuilder()
    x, y, z = b.input(rnd(2, 3, 4, dtype=dtype)), b.input(rnd(3, 1, dtype=dtype)), b.input(rnd(4, dtype=dtype))
    a = b.call("aten.add.Tensor", x, y, alpha=2)
    s = b.call("aten.sub.Tensor", a, z)
    m = b.call("aten.mul.Tensor", s, 0.5)
    d = b.call("aten.div.Tensor", m, b.call("aten.add.Tensor", b.call("aten.abs.default", z), 1.0))
    p = b.call("aten.pow.Tensor_Scalar", d, 2)
    r = b.call("aten.rsub.Scalar", p, 1.0)
    mx = b.call("aten.maximum.default", r, y)
    pg = b.check(mx)
    add = next(op for op in pg.ops if op.id == a.node)
    # y [3, 1] broadcasts: its size-1 dim is None, its 3 walks iteration dim of output dim 1
    assert add.inputs[1].dims == (add.output.dims[1], None)
    assert len(pg.ops) == 9


def test_compare_where_logic_int():
    b = DocBuilder()
    x = b.input(torch.arange(12).reshape(3, 4))
    y = b.input(torch.tensor([[1], [5], [9]]))
    le = b.call("aten.le.Tensor", x, y)
    ne = b.call("aten.ne.Scalar", x, 3)
    both = b.call("aten.bitwise_and.Tensor", le, ne)
    ge = b.call("aten.ge.Scalar", x, 2)
    eq = b.call("aten.eq.Tensor", x, y)
    full = b.call("aten.full.default", [], True, dtype=torch.bool)
    anded = b.call("aten.bitwise_and.Tensor", full, both)
    sub = b.call("aten.sub.Tensor", x, 1)
    st0 = b.call("aten.scalar_tensor.default", 0.0, dtype=torch.float32)
    stn = b.call("aten.scalar_tensor.default", -math.inf, dtype=torch.float32)
    w = b.call("aten.where.self", anded, st0, stn)
    pg = b.check(anded, ge, eq, sub, w)
    # constant fills fold into the where's expression: no fill op survives
    assert all(op.kind != "fill" for op in pg.ops)


def test_casts_and_int_division():
    b = DocBuilder()
    x = b.input(rnd(4, 6) * 10)
    i = b.call("prims.convert_element_type.default", x, torch.int64)
    h = b.call("prims.convert_element_type.default", x, torch.float16)
    back = b.call("prims.convert_element_type.default", h, torch.float32)
    q = b.call("aten.div.Tensor", i, 3)
    f = b.call("aten.div.Tensor_mode", i, 3, rounding_mode="floor")
    c = b.call("aten._to_copy.default", i, dtype=torch.float32)
    b.check(i, h, back, q, f, c)


def test_gelu_variants_and_clamp():
    b = DocBuilder()
    x = b.input(rnd(5, 7) * 3)
    g = b.call("aten.gelu.default", x)
    gt = b.call("aten.gelu.default", x, approximate="tanh")
    c = b.call("aten.clamp.default", x, -1.0, 0.5)
    b.check(g, gt, c)


@pytest.mark.parametrize("dtype", FLOATS, ids=["fp32", "fp16"])
def test_clamp_with_tensor_bounds(dtype):
    """clamp_min/clamp_max/clamp .Tensor: the bounds broadcast with self like a binary op,
    torch's type promotion (a zero-dim fp32 bound does not widen an fp16 self; an int self
    with float bounds gives float)."""
    from lowering import node_supported

    b = DocBuilder()
    x = b.input(rnd(3, 1, 5, dtype=dtype) * 3)
    lo = b.input(rnd(4, 1, dtype=dtype) - 1)           # broadcasts x to [3, 4, 5]
    hi = b.input(rnd(5, dtype=dtype, seed=1).abs())
    zero_d = b.input(torch.tensor(0.25))                # fp32, zero-dim
    ints = b.input(torch.arange(-6, 6).reshape(3, 4))
    outs = [
        b.call("aten.clamp_min.Tensor", x, lo),
        b.call("aten.clamp_max.Tensor", x, hi),
        b.call("aten.clamp.Tensor", x, lo, hi),
        b.call("aten.clamp.Tensor", x, None, hi),
        b.call("aten.clamp_min.Tensor", x, zero_d),
        b.call("aten.clamp_max.Tensor", ints, b.input(torch.tensor([[0.5], [1.5], [2.5]], dtype=dtype))),
        b.call("aten.clamp_min.Tensor", ints, b.input(torch.tensor([1, -3, 0, 2]))),
    ]
    assert outs[0].value.shape == outs[2].value.shape == (3, 4, 5)
    assert outs[4].value.dtype == dtype and outs[5].value.dtype == dtype and outs[6].value.dtype == torch.int64
    pg = b.check(*outs)
    assert all(op.kind == "pointwise" for op in pg.ops)
    for target in ("aten.clamp_min.Tensor", "aten.clamp_max.Tensor", "aten.clamp.Tensor"):
        assert node_supported(target, [None, None])


@pytest.mark.parametrize("dtype", FLOATS, ids=["fp32", "fp16"])
def test_isinf_isnan(dtype):
    from lowering import node_supported

    b = DocBuilder()
    inf, nan = math.inf, math.nan
    x = b.input(torch.tensor([[1.0, inf, -inf, nan], [0.0, -2.5, 7e4, -0.0]], dtype=dtype))
    big = b.call("aten.mul.Tensor", x, 10.0)  # fp16: 7e5 overflows to inf, as the op stores it
    ints = b.input(torch.tensor([3, -1, 0]))
    outs = [b.call("aten.isinf.default", x), b.call("aten.isnan.default", x), b.call("aten.isinf.default", big),
            b.call("aten.isinf.default", ints), b.call("aten.isnan.default", ints)]
    assert all(o.value.dtype == torch.bool for o in outs)
    pg = b.check(*outs)
    assert [op.kind for op in pg.ops if op.source != big.node] == ["pointwise"] * 5
    assert all(pg.tensors[op.output.tensor].dtype == "bool" for op in pg.ops if op.source != big.node)
    assert node_supported("aten.isinf.default", [None]) and node_supported("aten.isnan.default", [None])


# -- reductions ------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ALL_FLOATS, ids=ALL_IDS)
def test_reductions(dtype):
    b = DocBuilder()
    x = b.input(rnd(2, 6, 8, dtype=dtype))
    s = b.call("aten.sum.dim_IntList", x, [1, 2], True)
    mean = b.call("aten.mean.dim", x, [-1])
    amax = b.call("aten.amax.default", x, [1], True)
    vm = b.call("aten.var_mean.correction", x, [2], correction=0, keepdim=True)
    v1 = b.call("aten.var.correction", x, [0, 2], correction=1)
    pg = b.check(s, mean, amax, vm[0], vm[1], v1)
    red = [op for op in pg.ops if op.kind == "reduce"]
    assert all(any(d.kind == "reduction" for d in op.iter_dims) for op in red)
    sum_op = next(op for op in pg.ops if op.id == s.node)
    # keepdim: the reduced output dims are None
    assert sum_op.output.dims[1] is None and sum_op.output.dims[2] is None


def test_cumsum_of_bool_and_softmax():
    b = DocBuilder()
    m = b.input(torch.tensor([[1, 1, 0, 1, 0, 1]]))
    ne = b.call("aten.ne.Scalar", m, 0)
    cs = b.call("aten.cumsum.default", ne, -1)
    x = b.input(rnd(3, 9))
    sm = b.call("aten._softmax.default", x, -1, False)
    pg = b.check(cs, sm)
    assert sum(op.kind == "reduce" for op in pg.ops) == 3  # cumsum, amax, sum


# -- matmul ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ALL_FLOATS, ids=ALL_IDS)
def test_mm_addmm_bmm_with_folded_transposes(dtype):
    b = DocBuilder()
    x = b.input(rnd(5, 16, dtype=dtype))
    w = b.input(rnd(8, 16, dtype=dtype), kind="parameter", name="w")
    bias = b.input(rnd(8, dtype=dtype), kind="parameter", name="bias")
    wt = b.call("aten.permute.default", w, [1, 0])
    lin = b.call("aten.addmm.default", bias, x, wt)
    mm = b.call("aten.mm.default", x, b.call("aten.t.default", w))
    q = b.input(rnd(3, 4, 6, dtype=dtype))
    k = b.input(rnd(3, 5, 6, dtype=dtype))
    bmm = b.call("aten.bmm.default", q, b.call("aten.transpose.int", k, 1, 2))
    pg = b.check(lin, mm, bmm)
    # transposes are folded into the matmul's operand maps, never copied
    assert not [op for op in pg.ops if op.kind == "copy"]
    mm_op = next(op for op in pg.ops if op.id == mm.node)
    body = mm_op.body
    assert mm_op.inputs[1].tensor == "w" and mm_op.inputs[1].dims == (body.n, body.k)
    assert mm_op.inputs[0].dims == (body.m, body.k)
    assert mm_op.iter_dims[body.k].kind == "reduction"


def test_matmul_with_m_of_one_keeps_the_role_dim():
    b = DocBuilder()
    x = b.input(rnd(1, 32))
    w = b.input(rnd(32, 48), kind="parameter", name="w")
    pg = b.check(b.call("aten.mm.default", x, w))
    op = pg.ops[0]
    assert op.iter_dims[op.body.m].size == 1
    assert op.inputs[0].dims == (op.body.m, op.body.k)
    assert op.output.dims == (op.body.m, op.body.n)


# -- views and copies ------------------------------------------------------------------
def test_views_fold_and_regroups_copy():
    b = DocBuilder()
    x = b.input(rnd(2, 3, 4))
    p = b.call("aten.permute.default", x, [2, 0, 1])
    u = b.call("aten.unsqueeze.default", p, 1)
    e = b.call("aten.expand.default", u, [4, 5, 2, 3])
    y = b.call("aten.mul.Tensor", e, 2.0)  # reads x through the folded view
    v = b.call("aten.view.default", x, [6, 4])  # contiguous regroup: a copy at its consumer
    z = b.call("aten.add.Tensor", v, 1.0)
    sl = b.call("aten.slice.Tensor", x, 2, 1, 4, 2)
    sel = b.call("aten.select.int", sl, 1, -1)
    w = b.call("aten.neg.default", sel)
    r = b.call("aten.reshape.default", p, [4, 6])  # regroup of a permuted view
    sq = b.call("aten.squeeze.dim", b.call("aten.unsqueeze.default", x, 0), 0)
    pg = b.check(y, z, w, r, sq)
    mul = next(op for op in pg.ops if op.id == y.node)
    assert mul.inputs[0].tensor == "in0" and mul.inputs[0].dims == (2, 3, 0)  # x dims -> (d2, d3, d0)
    assert pg.outputs[4] == "in0"  # a no-op view of an input is the input itself
    copies = [op for op in pg.ops if op.kind == "copy"]
    assert len(copies) == 3  # the regroup, the slice+select, the permuted reshape


@pytest.mark.parametrize("dtype", FLOATS, ids=["fp32", "fp16"])
def test_cat_split_pad(dtype):
    b = DocBuilder()
    x = b.input(rnd(2, 6, 4, dtype=dtype))
    parts = b.call("aten.split.Tensor", x, 4, 1)
    neg = b.call("aten.neg.default", parts[1])
    cat = b.call("aten.cat.default", [neg, parts[0]], 1)
    pad = b.call("aten.constant_pad_nd.default", x, [1, 2, -1, 0], -3.0)
    pg = b.check(cat, pad, parts[0])
    cat_op = next(op for op in pg.ops if op.id == cat.node)
    # the split piece is read straight from x through the piece's strided map
    assert cat_op.body.out_offsets == ((0, 0, 0), (0, 2, 0))
    assert cat_op.inputs[1].tensor == "in0"


# -- gathers and creation ---------------------------------------------------------------
def test_embedding_index_gather():
    b = DocBuilder()
    wte = b.input(rnd(10, 8), kind="parameter", name="wte")
    ids = b.input(torch.tensor([[1, 9, 0, 3]]))
    emb = b.call("aten.embedding.default", wte, ids)
    x = b.input(torch.arange(20).reshape(4, 5))
    i0 = b.input(torch.tensor([[0], [3]]))
    i1 = b.input(torch.tensor([1, -1, 2]))
    idx = b.call("aten.index.Tensor", x, [i0, i1])
    idx_mid = b.call("aten.index.Tensor", x, [None, i1])
    g_idx = b.input(torch.tensor([[0, 2], [1, 1], [3, 0]]))
    gat = b.call("aten.gather.default", x, 0, g_idx)
    isel = b.call("aten.index_select.default", wte, 0, b.input(torch.tensor([4, 4, 2])))
    pg = b.check(emb, idx, idx_mid, gat, isel)
    two = next(op for op in pg.ops if op.id == idx.node)
    assert two.body.table_axes == (0, 1) and two.inputs[0].dims == (None, None)
    e = next(op for op in pg.ops if op.id == emb.node)
    assert e.body.axis == 0 and e.inputs[0].dims[0] is None


def test_fills():
    b = DocBuilder()
    io = b.call("prims.iota.default", 7, start=3, step=2, dtype=torch.int64, device=torch.device("cpu"),
                requires_grad=False)
    f = b.call("aten.full.default", [2, 3], 1.5, dtype=torch.float32)
    z = b.call("aten.zeros.default", [4], dtype=torch.float16)
    ar = b.call("aten.arange.start_step", 0, 10, 3, dtype=torch.int64)
    pg = b.check(io, f, z, ar)
    assert {op.kind for op in pg.ops} == {"fill"}


# -- attention, conv, pool -----------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS, ids=["fp32", "fp16"])
@pytest.mark.parametrize("mask", ["none", "bool", "additive", "causal"])
def test_sdpa_materialized(mask, dtype):
    b = DocBuilder()
    q, k, v = (b.input(rnd(1, 2, 5, 8, dtype=dtype, seed=s)) for s in (1, 2, 3))
    kwargs = {"scale": 0.3}
    if mask == "bool":
        kwargs["attn_mask"] = b.input(torch.rand(1, 1, 5, 5, generator=torch.Generator().manual_seed(0)) > 0.3)
        kwargs["attn_mask"].value[..., 0] = True  # no fully-masked row
    elif mask == "additive":
        kwargs["attn_mask"] = b.input(rnd(1, 1, 5, 5, dtype=dtype))
    causal = mask == "causal"
    if mask == "bool":  # the CPU flash kernel takes additive masks only; the public op takes bool
        out = [b.call("aten.scaled_dot_product_attention.default", q, k, v, **kwargs)]
        pg = b.check(out[0])
    else:
        out = b.call("aten._scaled_dot_product_flash_attention_for_cpu.default", q, k, v, 0.0, causal, **kwargs)
        pg = b.check(out[0], out[1], dtype=dtype)  # lse (fp32) is computed from dtype scores
    kinds = [op.kind for op in pg.ops if op.source == out[0].node]
    seq = [k for k in kinds if k != "fill"]
    core = ["pointwise", "pointwise", "matmul"] + (["pointwise"] if mask != "none" else []) + \
        ["reduce", "pointwise", "pointwise", "reduce", "pointwise", "matmul"]
    assert seq[:len(core)] == core


def test_sdpa_dropout_is_rejected():
    from lowering.errors import GraphError
    from lowering import lower_document

    b = DocBuilder()
    q = b.input(rnd(1, 2, 4, 8))
    b.nodes.append({"id": "att", "target": "aten._scaled_dot_product_flash_attention_for_cpu.default",
                    "args": [{"kind": "tensor", "node": "in0"}] * 3 + [{"kind": "float", "value": 0.1}],
                    "outputs": [b.inputs[0]["meta"], {"shape": [1, 2, 4], "stride": [8, 4, 1], "dtype": "float32"}]})
    with pytest.raises(GraphError) as e:
        lower_document(b.document(type("R", (), {"node": "att", "output": 0})()))
    assert e.value.code == "unsupported_op" and e.value.node == "att"


@pytest.mark.parametrize("dtype", FLOATS, ids=["fp32", "fp16"])
def test_conv2d_im2col(dtype):
    b = DocBuilder()
    x = b.input(rnd(2, 3, 9, 8, dtype=dtype))
    w = b.input(rnd(5, 3, 3, 3, dtype=dtype) * 0.3, kind="parameter", name="w")
    bias = b.input(rnd(5, dtype=dtype), kind="parameter", name="bias")
    c = b.call("aten.convolution.default", x, w, bias, [2, 1], [1, 2], [1, 2], False, [0, 0], 1)
    w1 = b.input(rnd(4, 3, 1, 1, dtype=dtype), kind="parameter", name="w1")
    c1 = b.call("aten.convolution.default", x, w1, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    relu = b.call("aten.relu.default", c)
    pg = b.check(relu, c1)
    conv_ops = [op for op in pg.ops if op.source == c.node]
    assert sum(op.kind == "matmul" for op in conv_ops) == 1
    mm = next(op for op in conv_ops if op.kind == "matmul")
    assert mm.iter_dims[mm.body.k].size == 27 and mm.iter_dims[mm.body.n].size == 5


def test_conv_transposed_rejected():
    from lowering.errors import GraphError

    b = DocBuilder()
    x = b.input(rnd(1, 4, 5, 5))
    w = b.input(rnd(4, 2, 3, 3), kind="parameter", name="w")
    c = b.call("aten.convolution.default", x, w, None, [1, 1], [0, 0], [1, 1], True, [0, 0], 1)
    with pytest.raises(GraphError) as e:
        b.check(c)
    assert e.value.code == "unsupported_op" and "transposed" in e.value.message


def _conv_matmul(pg, conv):
    ops = [op for op in pg.ops if op.source == conv.node]
    assert {op.kind for op in ops} <= {"copy", "matmul", "pointwise"}  # no new primitive kind
    mms = [op for op in ops if op.kind == "matmul"]
    assert len(mms) == 1
    return mms[0]


@pytest.mark.parametrize("dtype", FLOATS, ids=["fp32", "fp16"])
def test_grouped_and_depthwise_conv(dtype):
    """groups > 1: one im2col for all groups, the group a batch dim of one matmul."""
    from lowering import node_supported

    b = DocBuilder()
    conv = "aten.convolution.default"
    x = b.input(rnd(2, 4, 9, 8, dtype=dtype))
    # depthwise conv2d: groups = C = 4, stride, padding, dilation, bias
    w_dw = b.input(rnd(4, 1, 3, 3, dtype=dtype) * 0.5, kind="parameter", name="w_dw")
    b_dw = b.input(rnd(4, dtype=dtype), kind="parameter", name="b_dw")
    dw_args = [[2, 1], [1, 2], [1, 2], False, [0, 0], 4]
    dw = b.call(conv, x, w_dw, b_dw, *dw_args)
    # grouped conv2d: groups = 2, 3 output channels per group, bias
    w_g = b.input(rnd(6, 2, 3, 2, dtype=dtype) * 0.5, kind="parameter", name="w_g")
    b_g = b.input(rnd(6, dtype=dtype), kind="parameter", name="b_g")
    g = b.call(conv, x, w_g, b_g, [1, 1], [1, 0], [1, 1], False, [0, 0], 2)
    # depthwise conv1d with a channel multiplier of 2, no bias
    x1 = b.input(rnd(2, 3, 11, dtype=dtype))
    w_1 = b.input(rnd(6, 1, 3, dtype=dtype) * 0.5, kind="parameter", name="w_1")
    d1 = b.call(conv, x1, w_1, None, [1], [1], [1], False, [0], 3)
    # plain depthwise conv1d, bias, consumed by a pointwise op (reads the permuted result)
    w_p = b.input(rnd(3, 1, 5, dtype=dtype) * 0.5, kind="parameter", name="w_p")
    b_p = b.input(rnd(3, dtype=dtype), kind="parameter", name="b_p")
    p1 = b.call("aten.relu.default", b.call(conv, x1, w_p, b_p, [2], [2], [1], False, [0], 3))
    pg = b.check(dw, g, d1, p1)

    mm = _conv_matmul(pg, dw)
    sizes = {d.name: d.size for d in mm.iter_dims}
    # batch N=2, G=4; m = 5*8 output positions, n = 1 channel per group, k = 1*3*3
    assert sorted(sizes.values()) == sorted([2, 4, 40, 1, 9])
    assert mm.iter_dims[mm.body.n].size == 1 and mm.iter_dims[mm.body.k].size == 9
    assert pg.tensors[mm.output.tensor].shape == (2, 40, 4, 1)  # [N, P, G, Og]: [N, P, O] row-major
    mm = _conv_matmul(pg, g)
    assert mm.iter_dims[mm.body.n].size == 3 and mm.iter_dims[mm.body.k].size == 2 * 3 * 2
    assert pg.tensors[mm.output.tensor].shape == (2, 9 * 7, 2, 3)
    mm = _conv_matmul(pg, d1)
    assert mm.iter_dims[mm.body.n].size == 2 and mm.iter_dims[mm.body.k].size == 3

    assert node_supported(conv, [None, None, None, *dw_args])


def test_grouped_conv_rejects_channels_groups_do_not_divide():
    from lowering.errors import GraphError

    b = DocBuilder()
    x = b.input(rnd(1, 4, 5, 5))
    w = b.input(rnd(4, 2, 3, 3), kind="parameter", name="w")
    c = b.call("aten.convolution.default", x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 2)
    b.nodes[-1]["args"][8]["value"] = 3  # 4 channels in 3 groups
    from lowering import lower_document

    with pytest.raises(GraphError) as e:
        lower_document(b.document(c))
    assert e.value.code == "shape_mismatch" and "groups 3" in e.value.message


@pytest.mark.parametrize("ceil_mode", [False, True])
def test_max_pool(ceil_mode):
    import torch._inductor.inductor_prims  # noqa: F401  (registers prims._low_memory_max_pool_with_offsets)

    b = DocBuilder()
    x = b.input(rnd(1, 2, 9, 9))
    vals, offs = b.call("prims._low_memory_max_pool_with_offsets.default", x, [3, 3], [2, 2], [1, 1], [1, 1],
                        ceil_mode)
    pg = b.check(vals)
    red = next(op for op in pg.ops if op.kind == "reduce")
    assert red.body.fn == "max" and sum(d.kind == "reduction" for d in red.iter_dims) == 2
    # the offsets output is not computed: consuming it is a clear error
    from lowering.errors import GraphError

    b2 = DocBuilder()
    x2 = b2.input(rnd(1, 2, 9, 9))
    v2, o2 = b2.call("prims._low_memory_max_pool_with_offsets.default", x2, [3, 3], [2, 2], [1, 1], [1, 1], False)
    with pytest.raises(GraphError) as e:
        b2.check(b2.call("aten.add.Tensor", o2, 1))
    assert e.value.code == "unsupported_op"


def test_neighbour_ops():
    b = DocBuilder()
    x = b.input(rnd(3, 4, 5))
    m = b.input(torch.rand(4, 5, generator=torch.Generator().manual_seed(1)) > 0.5)
    outs = [
        b.call("aten.masked_fill.Scalar", x, m, -2.0),
        b.call("aten.where.ScalarSelf", m, 0.5, x),
        b.call("aten.logical_or.default", m, b.call("aten.logical_not.default", m)),
        b.call("aten.lt.Scalar", x, 0.1), b.call("aten.gt.Tensor", x, b.call("aten.neg.default", x)),
        b.call("aten.hardtanh.default", x, -0.5, 0.5), b.call("aten.clamp_min.default", x, 0.0),
        b.call("aten.remainder.Scalar", x, 0.7), b.call("aten.floor_divide.default", x, 0.3),
        b.call("aten.amin.default", x, [0, 2]), b.call("aten.prod.dim_int", x, 1, True),
        b.call("aten.sum.default", x), b.call("aten.mean.default", x),
        b.call("aten.softmax.int", x, 1), b.call("aten.to.dtype", x, torch.float16),
        b.call("aten.index_select.default", x, 2, b.input(torch.tensor([4, 0, 0]))),
        b.call("aten.narrow.default", x, 2, 1, 3),
        b.call("aten.zeros_like.default", x), b.call("aten.full_like.default", x, 7.0),
        b.call("aten.copy.default", x, b.input(rnd(5))),
        b.call("aten.minimum.default", x, b.input(rnd(4, 1))),
        b.call("aten.sigmoid.default", x),
    ]
    outs += b.call("aten.unbind.int", x, 1)
    bb = b.call("aten.baddbmm.default", b.input(rnd(3, 4, 2)), x, b.input(rnd(3, 5, 2)), beta=0.5, alpha=2.0)
    outs.append(bb)
    b.check(*outs)


@pytest.mark.parametrize("mask", ["causal", "per_head"])
def test_sdpa_grouped_query_attention(mask):
    # 4 query heads share 2 kv heads: k and v are read broadcast over the group, never copied
    b = DocBuilder()
    q = b.input(rnd(1, 4, 5, 8, seed=1))
    k, v = b.input(rnd(1, 2, 6, 8, seed=2)), b.input(rnd(1, 2, 6, 8, seed=3))
    if mask == "causal":
        out = b.call("aten._scaled_dot_product_flash_attention_for_cpu.default", q, k, v, 0.0, True, scale=0.3)
        pg = b.check(out[0], out[1])
    else:
        m = b.input(rnd(1, 4, 5, 6, seed=4))
        out = [b.call("aten.scaled_dot_product_attention.default", q, k, v, m, enable_gqa=True)]
        pg = b.check(out[0])
    for op in pg.ops:
        if op.kind == "copy":
            assert all(a.tensor not in ("in1", "in2") for a in op.inputs)
    scores = next(op for op in pg.ops if op.kind == "matmul")
    assert scores.inputs[1].tensor.endswith("k_scaled")
    assert sum(1 for d in scores.inputs[1].dims if d is not None) == 3  # kv head, s, e: group is broadcast


def test_any_all():
    b = DocBuilder()
    x = b.input(torch.tensor([[0, 1, 0], [0, 0, 0]]))
    b.check(b.call("aten.any.dim", x, 1), b.call("aten.all.dim", x, 0, True),
            b.call("aten.any.default", b.call("aten.gt.Scalar", x, 0)))


def test_pooling_and_tiling_neighbours():
    b = DocBuilder()
    x = b.input(rnd(1, 3, 8, 8))
    avg = b.call("aten.avg_pool2d.default", x, [3, 3], [2, 2], [1, 1])
    avg_div = b.call("aten.avg_pool2d.default", x, [2, 2], [2, 2], [0, 0], False, True, 3)
    adap = b.call("aten._adaptive_avg_pool2d.default", x, [2, 4])
    mx = b.call("aten.max.dim", x, 2, True)
    rep = b.call("aten.repeat.default", b.input(rnd(2, 3)), [2, 1, 3])
    b.check(avg, avg_div, adap, mx[0], rep)


def test_conv1d_and_max_pool2d_with_indices():
    b = DocBuilder()
    x = b.input(rnd(2, 3, 11))
    w = b.input(rnd(4, 3, 3), kind="parameter", name="w")
    c = b.call("aten.convolution.default", x, w, None, [2], [1], [2], False, [0], 1)
    img = b.input(rnd(1, 2, 7, 7))
    vals, _ = b.call("aten.max_pool2d_with_indices.default", img, [2, 2], [2, 2], [0, 0], [1, 1], True)
    b.check(c, vals)
