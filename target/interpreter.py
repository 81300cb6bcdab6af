"""Reference interpreter of the primitive loop-nest IR, written from the op definitions in
target/primitives.py (never by calling torch): the numerics every planned program is
checked against.

Semantics (the simulator follows the same): float16/bfloat16 tensors are stored in their
dtype (bfloat16 as float32 values rounded to bfloat16, numpy has no bfloat16); every op
computes in float32 (float64 if a float64 tensor is involved; matmul accumulates in
float32) and rounds its output to the output tensor's dtype. Integer and bool ops are
exact; a float result stored to an integer dtype truncates toward zero.
"""
from __future__ import annotations

import math
from typing import Mapping, Optional, Sequence

import numpy as np

from target.primitives import (
    Access, Call, Const, CopyBody, Expr, FillBody, GatherBody, GroupedMatmulBody, In, MatmulBody, PointwiseBody, PrimGraph, PrimOp,
    ScatterBody, index_iter_dims, scatter_problems,
    ReduceBody,
)

_NP = {
    "float32": np.float32, "float16": np.float16, "bfloat16": np.float32, "float64": np.float64,
    "int64": np.int64, "int32": np.int32, "int16": np.int16, "int8": np.int8, "uint8": np.uint8,
    "bool": np.bool_,
}
_FLOATS = ("float16", "bfloat16", "float32", "float64")


def numpy_dtype(dtype: str):
    """The numpy storage type of a graph dtype (bfloat16 is held as float32, rounded)."""
    return _NP[dtype]


class InterpreterError(ValueError):
    pass


def round_bfloat16(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), kept as float32."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    bits = a.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    out = rounded.astype(np.uint32).view(np.float32)
    return np.where(np.isnan(a), a, out)


def store(a: np.ndarray, dtype: str) -> np.ndarray:
    """Round a computed array to a tensor dtype's storage."""
    a = np.asarray(a)
    if dtype == "bfloat16":
        return round_bfloat16(a)
    if dtype in _FLOATS:
        with np.errstate(over="ignore"):  # out of range rounds to +-inf, as the hardware does
            return a.astype(_NP[dtype])
    if dtype == "bool":
        return a.astype(np.bool_)
    with np.errstate(invalid="ignore", over="ignore"):
        if a.dtype.kind == "f":
            a = np.trunc(a)
        return a.astype(_NP[dtype])


def _compute_dtype(op: PrimOp, tensors) -> np.dtype:
    dts = [tensors[a.tensor].dtype for a in op.inputs] + [tensors[op.output.tensor].dtype]
    if "float64" in dts:
        return np.dtype(np.float64)
    if any(d in _FLOATS for d in dts):
        return np.dtype(np.float32)
    if any(d not in ("bool",) for d in dts):
        return np.dtype(np.int64)
    return np.dtype(np.bool_)


def to_iter_space(arr: np.ndarray, acc: Access, sizes: Sequence[int]) -> np.ndarray:
    """arr viewed with one axis per iteration dim (size 1 where the operand does not vary)."""
    if arr.ndim != len(acc.dims):
        raise InterpreterError(f"{acc.tensor}: rank {arr.ndim} vs access {acc.dims}")
    kept = []
    for j, d in enumerate(acc.dims):
        if d is None:
            if arr.shape[j] != 1:
                raise InterpreterError(f"{acc.tensor}: dim {j} of size {arr.shape[j]} accessed as broadcast")
            continue
        if not 0 <= d < len(sizes):
            raise InterpreterError(f"{acc.tensor}: iteration dim {d} does not exist")
        if arr.shape[j] != sizes[d]:
            raise InterpreterError(f"{acc.tensor}: dim {j} has size {arr.shape[j]}, iteration dim {d} {sizes[d]}")
        kept.append(j)
    arr = arr.reshape([arr.shape[j] for j in kept])
    iters = [acc.dims[j] for j in kept]
    if len(set(iters)) != len(iters):
        raise InterpreterError(f"{acc.tensor}: one iteration dim walks two tensor dims")
    order = sorted(range(len(iters)), key=lambda i: iters[i])
    arr = np.transpose(arr, order)
    shape = [1] * len(sizes)
    for i in order:
        shape[iters[i]] = sizes[iters[i]]
    return arr.reshape(shape)


def _from_iter_space(res: np.ndarray, acc: Access, shape: Sequence[int], sizes: Sequence[int]) -> np.ndarray:
    """The output tensor from a result with one axis per iteration dim (non-output dims
    already of size 1)."""
    present = sorted(d for d in acc.dims if d is not None)
    for d in range(len(sizes)):
        if d not in present and res.shape[d] != 1:
            raise InterpreterError(f"{acc.tensor}: iteration dim {d} is neither reduced nor in the output")
    res = np.broadcast_to(res, [sizes[d] if d in present else 1 for d in range(len(sizes))])
    res = res.reshape([sizes[d] for d in present]) if present else res.reshape(())
    by_dim = [d for d in acc.dims if d is not None]
    res = np.transpose(res, [present.index(d) for d in by_dim])
    return np.ascontiguousarray(res).reshape(shape)


_UNARY = {
    "neg": np.negative, "abs": np.abs, "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh,
    "sin": np.sin, "cos": np.cos, "logical_not": np.logical_not,
    "log1p": np.log1p, "expm1": np.expm1, "log2": np.log2, "log10": np.log10, "tan": np.tan, "atan": np.arctan,
    "asin": np.arcsin, "acos": np.arccos, "sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh,
    "acosh": np.arccosh, "atanh": np.arctanh,
    # integer-valued roundings (round: half to even, as torch); identities on integer operands
    "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc, "round": np.round,
}
_BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "maximum": np.maximum, "minimum": np.minimum,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
    "ge": np.greater_equal, "logical_and": np.logical_and, "logical_or": np.logical_or,
    "bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor,
    "atan2": np.arctan2,
    "fmod": np.fmod,  # C fmod: the result takes the dividend's sign (remainder: the divisor's)
}


# erf(x) = 2/sqrt(pi) * x * sum_n (-x^2)^n / (n! (2n+1)); 34 terms reach 1e-16 at |x| = 2
_ERF_SERIES = [(-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(34)]


def _erf(x: np.ndarray) -> np.ndarray:
    """erf in float64 (numpy has none): the Maclaurin series for |x| < 2 (about 1e-14
    after cancellation), the Numerical Recipes erfc fit beyond (erfc < 0.005 there, so its
    1.2e-7 relative error is below 1e-9 absolute)."""
    x64 = np.asarray(x, dtype=np.float64)
    a = np.abs(x64)
    small = np.minimum(a, 2.0)
    z2 = small * small
    series = np.full_like(small, _ERF_SERIES[-1])
    for c in _ERF_SERIES[-2::-1]:  # Horner in x^2
        series *= z2
        series += c
    series *= small * (2.0 / np.sqrt(np.pi))
    t = 1.0 / (1.0 + 0.5 * a)
    poly = -a * a - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))))
    tail = 1.0 - t * np.exp(poly)
    out = np.where(a < 2.0, series, tail)
    return (np.sign(x64) * out).astype(np.asarray(x).dtype)


def _erfc(x: np.ndarray) -> np.ndarray:
    """erfc in float64 without 1 - erf's cancellation where it is small: 1 - the series for
    |x| < 2 (erfc > 0.004 there), the Numerical Recipes fit t*exp(poly) beyond (relative
    error 1.2e-7), reflected for x < 0 (erfc(-x) = 2 - erfc(x))."""
    x64 = np.asarray(x, dtype=np.float64)
    a = np.abs(x64)
    near = 1.0 - _erf(np.minimum(a, 2.0))
    t = 1.0 / (1.0 + 0.5 * a)
    poly = -a * a - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))))
    pos = np.where(a < 2.0, near, t * np.exp(poly))
    return np.where(x64 < 0, 2.0 - pos, pos).astype(np.asarray(x).dtype)


def eval_expr(e: Expr, vals: Sequence[np.ndarray], cdt: np.dtype) -> np.ndarray:
    if isinstance(e, In):
        return vals[e.index]
    if isinstance(e, Const):
        if cdt.kind == "b":
            return np.asarray(bool(e.value))
        if cdt.kind in "iu":
            return np.asarray(int(e.value), dtype=cdt)
        return np.asarray(e.value, dtype=cdt)
    args = [eval_expr(a, vals, cdt) for a in e.args]
    fn = e.fn
    with np.errstate(all="ignore"):
        if fn in _UNARY:
            return _UNARY[fn](args[0])
        if fn in _BINARY:
            a, b = args
            if fn.startswith("bitwise") and (a.dtype.kind == "f" or b.dtype.kind == "f"):
                raise InterpreterError(f"{fn} of floating operands")
            return _BINARY[fn](a, b)
        if fn == "div":
            a, b = args
            if cdt.kind in "iub":
                return np.true_divide(a, b)  # stored to an int dtype, this truncates
            return np.divide(a, b)
        if fn == "floordiv":
            return np.floor_divide(*args)
        if fn == "remainder":
            return np.mod(*args)
        if fn == "pow":
            return np.power(*args)
        if fn == "reciprocal":
            return np.divide(np.asarray(1, dtype=args[0].dtype), args[0])
        if fn == "rsqrt":
            return np.divide(np.asarray(1, dtype=args[0].dtype), np.sqrt(args[0]))
        if fn in ("shift_left", "shift_right"):   # integers; shifts past 63 as torch (0, or the sign for >>)
            a, b = (np.asarray(v) for v in args)
            if a.dtype.kind == "f" or b.dtype.kind == "f":
                raise InterpreterError(f"{fn} of floating operands")
            a64, b64 = a.astype(np.int64), b.astype(np.int64)
            inside = (b64 >= 0) & (b64 < 64)
            amount = np.where(inside, b64, 0)
            if fn == "shift_left":
                return np.where(inside, np.left_shift(a64, amount), 0)
            return np.where(inside, np.right_shift(a64, amount), np.where(a64 < 0, -1, 0))
        if fn == "sign":  # torch: sign(NaN) = 0
            x = args[0]
            return (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)
        if fn == "erf":
            return _erf(args[0])
        if fn == "erfc":
            return _erfc(args[0])
        if fn == "sigmoid":
            return 1 / (1 + np.exp(-args[0]))
        if fn == "relu":
            return np.maximum(args[0], np.asarray(0, dtype=args[0].dtype))
        if fn == "silu":
            return args[0] / (1 + np.exp(-args[0]))
        if fn == "gelu":
            x = args[0]
            return (x * 0.5 * (1 + _erf(x / np.sqrt(np.asarray(2.0, dtype=x.dtype))))).astype(x.dtype)
        if fn == "gelu_tanh":
            x = args[0]
            k = np.asarray(np.sqrt(2 / np.pi), dtype=x.dtype)
            return 0.5 * x * (1 + np.tanh(k * (x + np.asarray(0.044715, dtype=x.dtype) * x * x * x)))
        if fn == "where":
            return np.where(args[0].astype(bool), args[1], args[2])
        if fn == "cast":
            dtype = dict(e.attrs).get("dtype")
            return store(args[0], str(dtype)).astype(cdt)
    raise InterpreterError(f"unknown scalar function {fn!r}")


def _operands(op: PrimOp, env, tensors, sizes, cdt) -> list[np.ndarray]:
    return [to_iter_space(env[a.tensor], a, sizes).astype(cdt, copy=False) for a in op.inputs]


def _run_pointwise(op, body: PointwiseBody, env, tensors, sizes, cdt):
    vals = _operands(op, env, tensors, sizes, cdt)
    res = eval_expr(body.expr, vals, cdt)
    if np.ndim(res) == 0:
        res = np.asarray(res).reshape([1] * len(sizes))
    return res


def _reduction_axes(op: PrimOp) -> tuple[int, ...]:
    return tuple(i for i, d in enumerate(op.iter_dims) if d.kind == "reduction")


def _run_reduce(op, body: ReduceBody, env, tensors, sizes, cdt):
    vals = _operands(op, env, tensors, sizes, cdt)
    x = np.broadcast_to(eval_expr(body.expr, vals, cdt), sizes) if sizes else np.asarray(
        eval_expr(body.expr, vals, cdt))
    axes = _reduction_axes(op)
    if x.dtype == np.bool_ and body.fn in ("sum", "prod", "cumsum"):
        x = x.astype(np.int64)
    if body.fn == "cumsum":
        if len(axes) != 1:
            raise InterpreterError(f"{op.id}: cumsum needs exactly one reduction dim, has {len(axes)}")
        return np.cumsum(x, axis=axes[0], dtype=x.dtype)
    fold = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}.get(body.fn)
    if fold is None:
        raise InterpreterError(f"unknown reduction {body.fn!r}")
    if body.fn in ("sum", "prod"):
        return fold(x, axis=axes, keepdims=True, dtype=x.dtype)
    return fold(x, axis=axes, keepdims=True)


def _run_matmul(op, body: MatmulBody, env, tensors, sizes, cdt):
    """einsum over each operand's own iteration dims (no broadcast product is built), so
    the reference stays usable at real layer sizes; float32 accumulation."""
    mdt = cdt if cdt.kind == "f" else np.dtype(np.float32)
    letters = "abcdefghijklmnopqrstuvwxyz"
    if len(sizes) > len(letters):
        raise InterpreterError(f"{op.id}: too many iteration dims")
    subs, arrays = [], []
    for acc in op.inputs:
        a = to_iter_space(env[acc.tensor], acc, sizes).astype(mdt, copy=False)
        own = sorted(d for d in acc.dims if d is not None)
        a = a.reshape([sizes[d] for d in own])
        subs.append("".join(letters[d] for d in own))
        arrays.append(a)
    if len(arrays) != 2:
        raise InterpreterError(f"{op.id}: matmul needs 2 operands")
    out_dims = sorted({d for acc in op.inputs for d in acc.dims if d is not None} - {body.k})
    out_sub = "".join(letters[d] for d in out_dims)
    res = np.einsum(f"{subs[0]},{subs[1]}->{out_sub}", arrays[0], arrays[1], optimize=True)
    shape = [sizes[d] if d in out_dims else 1 for d in range(len(sizes))]
    return res.reshape(shape)


def _run_grouped_matmul(op, body: GroupedMatmulBody, env, tensors, sizes, cdt):
    """Per group g, the rows whose id is g times w[g] (float32 accumulation); rows whose id
    is outside [0, G) stay 0. Only the selected products are computed."""
    mdt = cdt if cdt.kind == "f" else np.dtype(np.float32)
    if len(op.inputs) != 3:
        raise InterpreterError(f"{op.id}: grouped matmul needs x, w and the group ids")

    def own(acc, want):
        a = to_iter_space(env[acc.tensor], acc, sizes)
        dims = [d for d in acc.dims if d is not None]
        if any(d not in want for d in dims):
            raise InterpreterError(f"{op.id}: {acc.tensor} indexes iteration dims outside {want}")
        # axes in `want` order, size 1 where the operand does not vary
        a = a.reshape([sizes[d] if d in dims else 1 for d in range(len(sizes))])
        return np.transpose(a, list(want) + [d for d in range(len(sizes)) if d not in want]).reshape(
            [a.shape[d] for d in want])

    x = own(op.inputs[0], (body.m, body.k)).astype(mdt, copy=False)
    w = own(op.inputs[1], (body.g, body.k, body.n)).astype(mdt, copy=False)
    gid = own(op.inputs[2], (body.m,)).astype(np.int64)
    M, N, G = sizes[body.m], sizes[body.n], sizes[body.g]
    x = np.broadcast_to(x, (M, x.shape[1]))
    w = np.broadcast_to(w, (G, w.shape[1], N))
    gid = np.broadcast_to(gid, (M,))
    res = np.zeros((M, N), dtype=mdt)
    for g in range(G):
        rows = np.nonzero(gid == g)[0]
        if rows.size:
            res[rows] = np.matmul(x[rows], w[g])
    shape = [1] * len(sizes)
    shape[body.m], shape[body.n] = M, N
    order = sorted([body.m, body.n])
    res = res if order == [body.m, body.n] else res.T
    return res.reshape(shape)


def _run_gather(op, body: GatherBody, env, tensors, sizes, cdt):
    table = env[op.inputs[0].tensor]
    axes = body.table_axes
    if len(op.inputs) != 1 + len(axes):
        raise InterpreterError(f"{op.id}: {len(axes)} gathered axes but {len(op.inputs) - 1} index operands")
    t_acc = op.inputs[0]
    idx_of = {}
    for ax, acc in zip(axes, op.inputs[1:]):
        idx = to_iter_space(env[acc.tensor], acc, sizes).astype(np.int64)
        n = table.shape[ax]
        if np.any((idx < -n) | (idx >= n)):
            raise InterpreterError(f"{op.id}: index out of range for table dim {ax} of size {n}")
        idx_of[ax] = np.where(idx < 0, idx + n, idx)
    index = []
    for t, d in enumerate(t_acc.dims):
        if t in idx_of:
            index.append(idx_of[t])
        elif d is None:
            if table.shape[t] != 1:
                raise InterpreterError(f"{op.id}: table dim {t} of size {table.shape[t]} accessed as broadcast")
            index.append(np.zeros([1] * len(sizes), dtype=np.int64))
        else:
            if table.shape[t] != sizes[d]:
                raise InterpreterError(f"{op.id}: table dim {t} size {table.shape[t]} vs iteration {sizes[d]}")
            shape = [1] * len(sizes)
            shape[d] = sizes[d]
            index.append(np.arange(sizes[d]).reshape(shape))
    if not index:
        return table.reshape([1] * len(sizes))
    return table[tuple(index)]


def scatter_rows(op: PrimOp, index_its: Sequence[np.ndarray], table_shape: Sequence[int],
                 sizes: Sequence[int]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The rows a scatter stores, as (row point, destination): the row point indexes the op's
    row dims (`index_iter_dims`, ascending) within `sizes`, the destination is the position
    along each scattered table axis. Rows are taken in row-major order of the row dims;
    each destination appears once, from the last row naming it; negative indices wrap, rows
    outside the table are dropped. `index_its` are the index operands in iteration space
    (`to_iter_space` over `sizes`). Shared by the interpreter and the functional run."""
    rows = sorted(index_iter_dims(op))
    axes = op.body.table_axes
    got: dict[tuple[int, ...], tuple[int, ...]] = {}
    for point in np.ndindex(*[sizes[d] for d in rows]):
        at = dict(zip(rows, point))
        dest = []
        for ax, idx in zip(axes, index_its):
            sel = tuple(at[d] if (d in at and idx.shape[d] != 1) else 0 for d in range(len(sizes)))
            v = int(idx[sel])
            n = int(table_shape[ax])
            v = v + n if v < 0 else v
            if not 0 <= v < n:
                break
            dest.append(v)
        else:
            got.pop(tuple(dest), None)
            got[tuple(dest)] = point
    return [(p, d) for d, p in got.items()]


def scatter_row_value(op: PrimOp, values_it: np.ndarray, point: tuple[int, ...]) -> np.ndarray:
    """A row of a scatter's values (iteration space, broadcast to the op's sizes) at row
    point `point`, its dims in the table's order of the dims the table walks."""
    rows = sorted(index_iter_dims(op))
    sel: list = [slice(None)] * values_it.ndim
    for d, p in zip(rows, point):
        sel[d] = p
    row = values_it[tuple(sel)]
    rest = [d for d in range(values_it.ndim) if d not in rows]
    axes = op.body.table_axes
    walked = [d for j, d in enumerate(op.inputs[0].dims) if d is not None and j not in axes]
    return np.transpose(row, [rest.index(d) for d in walked])


def scatter_target(op: PrimOp, dest: tuple[int, ...], walked_ranges: Sequence[tuple[int, int]]) -> tuple:
    """The table box a row lands in: the destination along the scattered axes, `walked_ranges`
    (per iteration dim) along the dims the table walks, 0 on its size-1 unmapped dims."""
    axes = op.body.table_axes
    box = []
    for j, d in enumerate(op.inputs[0].dims):
        if j in axes:
            p = dest[axes.index(j)]
            box.append((p, p + 1))
        elif d is None:
            box.append((0, 1))
        else:
            box.append(tuple(walked_ranges[d]))
    return tuple(box)


def _run_scatter(op, body: ScatterBody, env, sizes):
    bad = scatter_problems(op)
    if bad:
        raise InterpreterError(f"{op.id}: {bad[0]}")
    out = np.array(env[op.inputs[0].tensor], copy=True)
    vals = np.broadcast_to(to_iter_space(env[op.inputs[1].tensor], op.inputs[1], sizes), tuple(sizes))
    index_its = [to_iter_space(env[a.tensor], a, sizes).astype(np.int64) for a in op.inputs[2:]]
    whole = [(0, s) for s in sizes]
    for point, dest in scatter_rows(op, index_its, out.shape, sizes):
        box = scatter_target(op, dest, whole)
        region = tuple(slice(a, b) for a, b in box)
        out[region] = scatter_row_value(op, vals, point).reshape(out[region].shape)
    return out


def _run_copy(op, body: CopyBody, env, tensors, out_shape, out_dtype):
    out = np.full(out_shape, body.pad_value, dtype=_NP[out_dtype] if out_dtype != "bool" else np.float32)
    if out_dtype == "bool":
        out = out.astype(np.bool_)
    if len(body.maps) != len(op.inputs) or len(body.out_offsets) != len(op.inputs):
        raise InterpreterError(f"{op.id}: {len(op.inputs)} inputs, {len(body.maps)} maps")
    for acc, smap, offs in zip(op.inputs, body.maps, body.out_offsets):
        src = np.ascontiguousarray(env[acc.tensor]).reshape(-1)
        if len(smap.shape) != len(out_shape) or len(offs) != len(out_shape):
            raise InterpreterError(f"{op.id}: map rank {len(smap.shape)} vs output rank {len(out_shape)}")
        if any(o < 0 or o + s > n for o, s, n in zip(offs, smap.shape, out_shape)):
            raise InterpreterError(f"{op.id}: piece {smap.shape} at {offs} outside output {out_shape}")
        if 0 in smap.shape:
            continue
        lo = smap.offset + sum((s - 1) * st for s, st in zip(smap.shape, smap.strides) if st < 0)
        hi = smap.offset + sum((s - 1) * st for s, st in zip(smap.shape, smap.strides) if st > 0)
        if lo < 0 or hi >= src.size:
            raise InterpreterError(f"{op.id}: strided map reads [{lo}, {hi}] of {src.size} elements")
        flat_index = np.full(smap.shape, smap.offset, dtype=np.int64)
        for j, (s, st) in enumerate(zip(smap.shape, smap.strides)):
            shape = [1] * len(smap.shape)
            shape[j] = s
            flat_index = flat_index + np.arange(s, dtype=np.int64).reshape(shape) * st
        region = tuple(slice(o, o + s) for o, s in zip(offs, smap.shape))
        out[region] = src[flat_index]
    return out


def _run_fill(op, body: FillBody, out_shape, cdt):
    if body.iota_dim is None:
        return np.full(out_shape, body.value, dtype=np.float64)
    d = body.iota_dim
    if not 0 <= d < max(len(out_shape), 1):
        raise InterpreterError(f"{op.id}: iota dim {d} for shape {out_shape}")
    if not out_shape:
        return np.asarray(body.start)
    shape = [1] * len(out_shape)
    shape[d] = out_shape[d]
    vals = body.start + body.step * np.arange(out_shape[d], dtype=np.float64)
    return np.broadcast_to(vals.reshape(shape), out_shape)


def run_op(op: PrimOp, env: Mapping[str, np.ndarray], tensors) -> np.ndarray:
    out_t = tensors[op.output.tensor]
    sizes = [d.size for d in op.iter_dims]
    body = op.body
    if isinstance(body, CopyBody):
        return store(_run_copy(op, body, env, tensors, out_t.shape, out_t.dtype), out_t.dtype)
    if isinstance(body, FillBody):
        return store(_run_fill(op, body, out_t.shape, None), out_t.dtype)
    if isinstance(body, ScatterBody):
        return store(_run_scatter(op, body, env, sizes), out_t.dtype)
    cdt = _compute_dtype(op, tensors)
    if isinstance(body, PointwiseBody):
        res = _run_pointwise(op, body, env, tensors, sizes, cdt)
    elif isinstance(body, ReduceBody):
        res = _run_reduce(op, body, env, tensors, sizes, cdt)
    elif isinstance(body, MatmulBody):
        res = _run_matmul(op, body, env, tensors, sizes, cdt)
    elif isinstance(body, GatherBody):
        res = _run_gather(op, body, env, tensors, sizes, cdt)
    elif isinstance(body, GroupedMatmulBody):
        res = _run_grouped_matmul(op, body, env, tensors, sizes, cdt)
    else:
        raise InterpreterError(f"unknown body {body!r}")
    return store(_from_iter_space(np.asarray(res), op.output, out_t.shape, sizes), out_t.dtype)


def interpret(pg: PrimGraph, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Run pg on named input arrays; one array per pg.outputs entry, in order."""
    env: dict[str, np.ndarray] = {}
    for tid in pg.inputs:
        if tid not in inputs:
            raise InterpreterError(f"missing input {tid!r}")
        t = pg.tensors[tid]
        arr = np.asarray(inputs[tid])
        if tuple(arr.shape) != tuple(t.shape):
            raise InterpreterError(f"input {tid!r} has shape {arr.shape}, expected {t.shape}")
        env[tid] = store(arr, t.dtype)
    for op in pg.ops:
        for a in op.inputs:
            if a.tensor not in env:
                raise InterpreterError(f"op {op.id} reads {a.tensor!r} before it is produced")
        env[op.output.tensor] = run_op(op, env, pg.tensors)
    return [env[o] for o in pg.outputs]


def reference_inputs(pg: PrimGraph, seed: int = 0, arrays: Optional[Mapping[str, np.ndarray]] = None) -> dict:
    """Random inputs for pg (normal floats, small non-negative ints, bools), overridable."""
    rng = np.random.default_rng(seed)
    out = {}
    for tid in pg.inputs:
        t = pg.tensors[tid]
        if arrays and tid in arrays:
            out[tid] = arrays[tid]
        elif t.dtype in _FLOATS:
            out[tid] = store(rng.standard_normal(t.shape).astype(np.float32), t.dtype)
        elif t.dtype == "bool":
            out[tid] = rng.random(t.shape) < 0.5
        else:
            out[tid] = rng.integers(0, 2, t.shape).astype(_NP[t.dtype])
    return out
