"""Numpy kernels of the primitive op bodies on one core's local slice.

The functional run (simulator/run.py) hands each core's operand boxes (logical dim order)
to `compute_local(op, ranges, arrays)`; the result is the core's output box. Semantics
follow lowering/primitives.py and the reference interpreter: floating values compute in
float32 (matmul accumulates in float32), ints in int64, bools as bool; the caller rounds
to the output tensor's dtype when it stores.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from lowering.primitives import Access, Call, Const, Expr, In, PrimOp

Range = tuple[int, int]

_NP_DTYPES = {
    "float32": np.float32, "float16": np.float16, "float64": np.float64, "bfloat16": np.float32,
    "int64": np.int64, "int32": np.int32, "int16": np.int16, "int8": np.int8, "uint8": np.uint8,
    "bool": np.bool_,
}


class KernelError(RuntimeError):
    pass


def compute_dtype(a: np.ndarray) -> np.ndarray:
    """float -> float32, int -> int64, bool stays."""
    if a.dtype == np.bool_:
        return a
    if np.issubdtype(a.dtype, np.floating):
        return a.astype(np.float32, copy=False)
    return a.astype(np.int64, copy=False)


def _erf(x: np.ndarray) -> np.ndarray:
    # Abramowitz & Stegun 7.1.26 in float64: |error| < 1.5e-7, below fp32 resolution of the
    # results it feeds (gelu), and numpy has no erf.
    x64 = np.asarray(x, dtype=np.float64)
    s = np.sign(x64)
    a = np.abs(x64)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return (s * (1.0 - poly * np.exp(-a * a))).astype(np.float32)


def _f(x):
    x = np.asarray(x)
    return x if np.issubdtype(x.dtype, np.floating) else x.astype(np.float32)


def _div(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.true_divide(_f(a), b).astype(np.float32)


def _floordiv(a, b):
    if np.issubdtype(np.asarray(a).dtype, np.integer) and np.issubdtype(np.asarray(b).dtype, np.integer):
        return np.floor_divide(a, np.where(b == 0, 1, b))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.floor_divide(_f(a), b)


def _remainder(a, b):
    if np.issubdtype(np.asarray(a).dtype, np.integer) and np.issubdtype(np.asarray(b).dtype, np.integer):
        return np.remainder(a, np.where(b == 0, 1, b))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.remainder(_f(a), b)


def _pow(a, b):
    with np.errstate(all="ignore"):
        if np.issubdtype(np.asarray(a).dtype, np.integer) and np.issubdtype(np.asarray(b).dtype, np.integer):
            return np.power(a, b)
        return np.power(_f(a), b).astype(np.float32)


def _unary_float(fn):
    def g(a):
        with np.errstate(all="ignore"):
            return fn(_f(a)).astype(np.float32)
    return g


def _sigmoid(a):
    a = _f(a)
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-a))).astype(np.float32)


def _gelu(a):
    a = _f(a)
    return (0.5 * a * (1.0 + _erf(a / np.float32(np.sqrt(2.0))))).astype(np.float32)


def _gelu_tanh(a):
    a = _f(a)
    c = np.float32(np.sqrt(2.0 / np.pi))
    return (0.5 * a * (1.0 + np.tanh(c * (a + np.float32(0.044715) * a * a * a)))).astype(np.float32)


def _silu(a):
    return (_f(a) * _sigmoid(a)).astype(np.float32)


def _cast(a, dtype: str):
    if dtype not in _NP_DTYPES:
        raise KernelError(f"cast to unknown dtype {dtype!r}")
    if dtype == "bool":
        return np.asarray(a) != 0
    return compute_dtype(np.asarray(a).astype(_NP_DTYPES[dtype]))


_FNS = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": _div, "neg": np.negative,
    "pow": _pow, "maximum": np.maximum, "minimum": np.minimum, "abs": np.abs,
    "reciprocal": lambda a: _div(np.float32(1.0), a), "floordiv": _floordiv, "remainder": _remainder,
    "exp": _unary_float(np.exp), "log": _unary_float(np.log), "sqrt": _unary_float(np.sqrt),
    "rsqrt": _unary_float(lambda a: 1.0 / np.sqrt(a)), "tanh": _unary_float(np.tanh),
    "erf": lambda a: _erf(_f(a)), "sigmoid": _sigmoid, "sin": _unary_float(np.sin),
    "cos": _unary_float(np.cos), "relu": lambda a: np.maximum(a, 0).astype(np.asarray(a).dtype),
    "gelu": _gelu, "gelu_tanh": _gelu_tanh, "silu": _silu,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
    "ge": np.greater_equal, "logical_and": np.logical_and, "logical_or": np.logical_or,
    "logical_not": np.logical_not, "bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or,
    "where": lambda c, a, b: np.where(np.asarray(c).astype(bool), a, b),
}


def _const(v: float):
    if np.isfinite(v) and v == int(v):
        # keep integral constants exact for int operands; float operands promote below
        return np.int64(int(v)) if abs(v) < 2 ** 62 else np.float32(v)
    return np.float32(v)


def eval_expr(e: Expr, operands: Sequence[np.ndarray]) -> np.ndarray:
    if isinstance(e, In):
        return operands[e.index]
    if isinstance(e, Const):
        return _const(e.value)
    assert isinstance(e, Call)
    args = [eval_expr(a, operands) for a in e.args]
    if e.fn == "cast":
        return _cast(args[0], str(dict(e.attrs).get("dtype", "float32")))
    fn = _FNS.get(e.fn)
    if fn is None:
        raise KernelError(f"no kernel for scalar function {e.fn!r}")
    with np.errstate(all="ignore"):
        out = fn(*args)
    out = np.asarray(out)
    if out.dtype == np.float64:
        out = out.astype(np.float32)
    return out


def align(access: Access, arr: np.ndarray, n_iter: int) -> np.ndarray:
    """View a tensor box (tensor dims order) in iteration-dim order: rank n_iter, size-1 axes
    for iteration dims the operand does not index."""
    keep = [j for j, d in enumerate(access.dims) if d is not None]
    drop = tuple(j for j, d in enumerate(access.dims) if d is None)
    a = arr.reshape([s for j, s in enumerate(arr.shape) if j not in drop]) if drop else arr
    its = [access.dims[j] for j in keep]
    if len(set(its)) != len(its):
        raise KernelError(f"operand {access.tensor} indexes one iteration dim twice")
    order = sorted(range(len(its)), key=lambda i: its[i])
    a = a.transpose(order)
    shape = [1] * n_iter
    for i in order:
        shape[its[i]] = arr.shape[keep[i]]
    return a.reshape(shape)


def to_output(access: Access, it_arr: np.ndarray) -> np.ndarray:
    """An iteration-space array (rank n_iter; dims the output does not index have size 1)
    in the output tensor's dim order."""
    n_iter = it_arr.ndim
    its = [d for d in access.dims if d is not None]
    rest = [i for i in range(n_iter) if i not in its]
    a = it_arr.transpose(its + rest)
    a = a.reshape(a.shape[:len(its)] + tuple(s for s in a.shape[len(its):] if s != 1)) if rest else a
    if a.ndim != len(its):
        # a dim the output does not index still has extent > 1: sum is not defined here
        raise KernelError(f"output {access.tensor} does not index an iteration dim of extent > 1")
    shape = []
    k = 0
    for d in access.dims:
        if d is None:
            shape.append(1)
        else:
            shape.append(a.shape[k])
            k += 1
    return a.reshape(shape)


def _fold(fn: str, a: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    if not axes:
        return a
    if fn == "sum":
        return np.sum(a, axis=axes, keepdims=True, dtype=np.float32 if a.dtype.kind == "f" else None)
    if fn == "max":
        return np.max(a, axis=axes, keepdims=True)
    if fn == "min":
        return np.min(a, axis=axes, keepdims=True)
    if fn == "prod":
        return np.prod(a, axis=axes, keepdims=True)
    raise KernelError(f"unknown reduction {fn!r}")


def combine_partials(fn: str, parts: list[np.ndarray]) -> np.ndarray:
    """Fold per-core partial results of a split reduction dim (summed across cores)."""
    out = parts[0]
    for p in parts[1:]:
        if fn in ("sum", "matmul"):
            out = out + p
        elif fn == "max":
            out = np.maximum(out, p)
        elif fn == "min":
            out = np.minimum(out, p)
        elif fn == "prod":
            out = out * p
        else:
            raise KernelError(f"{fn} cannot be split across cores")
    return out


def compute_local(op: PrimOp, ranges: Sequence[Range], arrays: Sequence[np.ndarray],
                  out_shape: Sequence[int]) -> np.ndarray:
    """The op's output box for iteration `ranges`, from its operand boxes (see
    geometry.operand_box). `out_shape` is the full output tensor shape (copy/fill build the
    whole output and cut the box)."""
    b = op.body
    n_iter = len(op.iter_dims)
    arrays = [compute_dtype(a) for a in arrays]
    if b.kind == "pointwise":
        vals = [align(acc, a, n_iter) for acc, a in zip(op.inputs, arrays)]
        res = np.asarray(eval_expr(b.expr, vals))
        ext = tuple(r1 - r0 for r0, r1 in ranges)
        res = np.broadcast_to(res, ext) if res.shape != ext else res
        return to_output(op.output, res)
    if b.kind == "reduce":
        vals = [align(acc, a, n_iter) for acc, a in zip(op.inputs, arrays)]
        res = np.asarray(eval_expr(b.expr, vals))
        ext = tuple(r1 - r0 for r0, r1 in ranges)
        res = np.broadcast_to(res, ext) if res.shape != ext else res
        red = tuple(i for i, d in enumerate(op.iter_dims) if d.kind == "reduction")
        if b.fn == "cumsum":
            if len(red) != 1:
                raise KernelError("cumsum scans exactly one dim")
            res = np.cumsum(res, axis=red[0], dtype=np.float32 if res.dtype.kind == "f" else None)
        else:
            res = _fold(b.fn, res, red)
        return to_output(op.output, res)
    if b.kind == "matmul":
        letters = "abcdefghijklmnopqrstuvwxyz"
        subs = []
        ops_ = []
        for acc, a in zip(op.inputs, arrays):
            keep = [j for j, d in enumerate(acc.dims) if d is not None]
            ops_.append(a.reshape([a.shape[j] for j in keep]).astype(np.float32, copy=False))
            subs.append("".join(letters[acc.dims[j]] for j in keep))
        out_its = [d for d in op.output.dims if d is not None]
        spec = f"{subs[0]},{subs[1]}->{''.join(letters[d] for d in out_its)}"
        res = np.einsum(spec, ops_[0], ops_[1], dtype=np.float32, optimize=True)
        return res.reshape([1 if d is None else res.shape[out_its.index(d)] for d in op.output.dims])
    if b.kind == "gather":
        table, index = arrays[0], arrays[1]
        idx = np.clip(index.astype(np.int64), 0, table.shape[b.axis] - 1)
        res = np.take(table, idx, axis=b.axis)
        want = tuple(r1 - r0 for r0, r1 in ranges_for_output(op, ranges))
        if res.size != int(np.prod(want)):
            raise KernelError(f"{op.id}: gather gives {res.shape}, output box is {want}")
        return res.reshape(want)
    if b.kind == "copy":
        full = _copy_full(op, arrays, out_shape)
        return full[tuple(slice(r0, r1) for r0, r1 in ranges_for_output(op, ranges))]
    if b.kind == "fill":
        full = _fill_full(op, out_shape)
        return full[tuple(slice(r0, r1) for r0, r1 in ranges_for_output(op, ranges))]
    raise KernelError(f"no kernel for body kind {b.kind!r}")


def ranges_for_output(op: PrimOp, ranges: Sequence[Range]) -> list[Range]:
    return [(0, 1) if d is None else ranges[d] for d in op.output.dims]


def _copy_full(op: PrimOp, arrays: Sequence[np.ndarray], out_shape: Sequence[int]) -> np.ndarray:
    b = op.body
    dt = np.result_type(*[a.dtype for a in arrays]) if arrays else np.float32
    full = np.full(tuple(out_shape), b.pad_value, dtype=np.float32 if dt.kind == "f" else dt)
    for m, off, a in zip(b.maps, b.out_offsets, arrays):
        flat = a.reshape(-1)
        idx = np.full(tuple(m.shape), m.offset, dtype=np.int64)
        for j, (n, st) in enumerate(zip(m.shape, m.strides)):
            shp = [1] * len(m.shape)
            shp[j] = n
            idx = idx + (np.arange(n, dtype=np.int64) * st).reshape(shp)
        if idx.size and (idx.min() < 0 or idx.max() >= flat.size):
            raise KernelError(f"{op.id}: copy map reads outside its input")
        region = tuple(slice(o, o + n) for o, n in zip(off, m.shape))
        full[region] = flat[idx]
    return full


def _fill_full(op: PrimOp, out_shape: Sequence[int]) -> np.ndarray:
    b = op.body
    shape = tuple(out_shape)
    if b.iota_dim is None:
        return np.full(shape, b.value, dtype=np.float32)
    n = shape[b.iota_dim]
    vals = np.float64(b.start) + np.float64(b.step) * np.arange(n, dtype=np.float64)
    shp = [1] * len(shape)
    shp[b.iota_dim] = n
    return np.broadcast_to(vals.reshape(shp), shape).astype(np.float64)
