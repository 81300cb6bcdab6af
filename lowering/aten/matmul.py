"""mm / bmm / addmm / baddbmm -> `matmul` PrimOps (+ a pointwise op for a bias)."""
from __future__ import annotations

from typing import Optional, Sequence

from lowering.aten.context import Ctx, NodeArgs, View, expr_fn, register
from lowering.aten.pointwise import as_operand, broadcast_shapes, emit_pointwise
from target.primitives import Access, Const, IterDim, MatmulBody


def emit_matmul(ctx: Ctx, node: NodeArgs, x: View, y: View, out_dtype: str, out_id: str,
                out_order: Optional[Sequence[int]] = None) -> View:
    """out[..., m, n] = sum_k x[..., m, k] * y[..., k, n]; batch dims must agree (size-1
    batch dims broadcast). Iteration dims: batch dims (size > 1), then m, n, k.
    `out_order` stores the output tensor with its (batch..., m, n) dims permuted (a grouped
    convolution keeps its group dim next to n: [N, P, G, Og] is [N, P, O] row-major)."""
    if x.rank < 2 or y.rank < 2:
        raise node.fail("shape_mismatch", f"matmul operands {list(x.shape)} x {list(y.shape)} need rank >= 2")
    M, K = x.shape[-2:]
    K2, N = y.shape[-2:]
    if K != K2:
        raise node.fail("shape_mismatch", f"matmul inner dims differ: {list(x.shape)} x {list(y.shape)}")
    nb = max(x.rank, y.rank) - 2
    batch = []
    for j in range(nb):
        bx = x.shape[x.rank - 2 - nb + j] if x.rank - 2 - nb + j >= 0 else 1
        by = y.shape[y.rank - 2 - nb + j] if y.rank - 2 - nb + j >= 0 else 1
        if bx != by and 1 not in (bx, by):
            raise node.fail("shape_mismatch", f"matmul batch dims differ: {list(x.shape)} x {list(y.shape)}")
        batch.append(max(bx, by))
    iters: list[IterDim] = []
    b_iter: list[Optional[int]] = []
    for j, s in enumerate(batch):
        if s == 1:
            b_iter.append(None)
        else:
            b_iter.append(len(iters))
            iters.append(IterDim(f"b{j}", s))
    m, n, k = len(iters), len(iters) + 1, len(iters) + 2
    iters += [IterDim("m", M), IterDim("n", N), IterDim("k", K, "reduction")]

    def batch_iters(v: View) -> list[Optional[int]]:
        lead = v.rank - 2
        return [b_iter[nb - lead + j] if v.shape[j] > 1 else None for j in range(lead)]

    ax = ctx.access(x, batch_iters(x) + [m, k], node.id)
    ay = ctx.access(y, batch_iters(y) + [k, n], node.id)
    out_shape, out_dims = tuple(batch) + (M, N), tuple(b_iter) + (m, n)
    if out_order is not None:
        if sorted(out_order) != list(range(len(out_shape))):
            raise node.fail("bad_argument", f"matmul output order {list(out_order)} for rank {len(out_shape)}")
        out_shape, out_dims = tuple(out_shape[i] for i in out_order), tuple(out_dims[i] for i in out_order)
    tid = ctx.new_tensor(out_id, out_shape, out_dtype)
    ctx.emit(tid, iters, [ax, ay], Access(tid, out_dims), MatmulBody(m, n, k), node.id)
    return ctx.tensor_view(tid, out_id)


@register("aten.mm.default", "aten.bmm.default",
          doc="`matmul` (iteration dims batch…, m, n, k); transposed operands read through the Access")
def _mm(ctx: Ctx, node: NodeArgs):
    x, y = node.arg(0, "self"), node.arg(1, "mat2")
    want = 2 if node.target == "aten.mm.default" else 3
    if x.rank != want or y.rank != want:
        raise node.fail("shape_mismatch", f"{node.target} of {list(x.shape)} x {list(y.shape)}")
    return [emit_matmul(ctx, node, x, y, x.dtype, node.id)]


@register("aten.addmm.default", "aten.baddbmm.default",
          doc="`matmul` into `node.mm`, then a pointwise `alpha*mm + beta*bias`")
def _addmm(ctx: Ctx, node: NodeArgs):
    bias, x, y = node.arg(0, "self"), node.arg(1, "mat1" if "addmm" in node.target else "batch1"), \
        node.arg(2, "mat2" if "addmm" in node.target else "batch2")
    beta, alpha = node.kwargs.get("beta", 1), node.kwargs.get("alpha", 1)
    mm = emit_matmul(ctx, node, x, y, x.dtype, f"{node.id}.mm")
    b = as_operand(node, bias)
    if isinstance(b, View) and broadcast_shapes(node, [tuple(mm.shape), tuple(b.shape)]) != tuple(mm.shape):
        raise node.fail("shape_mismatch", f"{node.target}: bias of shape {list(b.shape)} does not broadcast "
                                          f"to the product's shape {list(mm.shape)}")

    def build(e):
        prod = e[0] if alpha == 1 else expr_fn("mul", e[0], Const(float(alpha)))
        if beta == 0:
            return prod
        add = e[1] if beta == 1 else expr_fn("mul", e[1], Const(float(beta)))
        return expr_fn("add", prod, add)
    return [emit_pointwise(ctx, node, [mm, b], build, x.dtype, out_shape=mm.shape)]
