"""Primitive ops: every aten op is lowered to loop nests of this one shape.

A primitive op is a loop nest over named iteration dims (parallel or reduction). Each
operand says, for every one of its tensor dims, which iteration dim indexes it (or None
for a size-1 broadcast dim). The body is one of a few kinds:

- ``matmul``: out[..., m, n] = sum_k x[..., m, k] * y[..., k, n]  (runs on the PT array)
- ``pointwise``: out = expr(inputs) elementwise (SFP)
- ``reduce``: out = fold(fn, expr(inputs)) over the reduction dims (SFP)
- ``gather``: out[i..., d...] = table[index[i...], d...] along one table axis (embedding)
- ``copy``: out = strided view of the single input's logical row-major elements. Views
  that are only dim relabelings (permute, unsqueeze, expand of size-1 dims) are folded
  into consumers' operand maps instead; ``copy`` covers what is not (reshape that
  regroups dims, slice, im2col windows, cat pieces); the planner decides whether a copy
  is a free alias on the device layout or moves data.
- ``fill``: out = constant or iota (no tensor inputs).
- ``grouped_matmul``: out[m, n] = sum_k x[m, k] * w[group[m], k, n] (mixture-of-experts
  expert matmuls, PT array): a matmul whose weight is chosen per row by an integer group
  operand; the group (expert) dim is an iteration dim of its own, so it can be split.
- ``scatter``: out = table with out[index[i...], d...] = values[i..., d...] (a slot-mapped
  row store, the inverse of ``gather``). In place: on the device its output IS its table's
  bytes (docs/superdsc.md, "In-place ops"), so it costs the rows it writes.

All stick, split and residency decisions are expressed over iteration dims, so the
solver and simulator never look at aten targets. The op rules (which iteration dim each
operand's stick may sit on) live in ``target/op_rules.py`` beside these definitions.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Optional, Union

DimKind = Literal["parallel", "reduction"]
TensorRole = Literal["user_input", "parameter", "buffer", "constant", "intermediate"]

# Element sizes of the dtypes primitive tensors may have.
DTYPE_BYTES = {
    "float32": 4, "float16": 2, "bfloat16": 2, "float64": 8,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}


@dataclass(frozen=True)
class PrimTensor:
    id: str
    shape: tuple[int, ...]
    dtype: str
    role: TensorRole = "intermediate"
    # The device dim order the graph fixes for this tensor (`superdsc.Layout.dim_order`:
    # every dim once, the stick dim where its stick group goes), or None: the planner's
    # choice. Set by the lowering for a tensor whose layout outlives the program (a paged
    # KV cache, resident on the device across steps); the emitter lays the tensor out so
    # whatever a planner asks (a layout that outlives the program is a contract).
    dim_order: Optional[tuple[int, ...]] = None

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class IterDim:
    name: str
    size: int
    kind: DimKind = "parallel"


@dataclass(frozen=True)
class Access:
    """How an op indexes one tensor: dims[j] is the iteration-dim index for tensor dim j,
    or None when tensor dim j has size 1 and is broadcast."""

    tensor: str
    dims: tuple[Optional[int], ...]


# -- scalar expressions (bodies of pointwise and reduce ops) ------------------------------
@dataclass(frozen=True)
class In:
    """The value of operand `index` at the current iteration point."""

    index: int


@dataclass(frozen=True)
class Const:
    value: float  # may be +-inf / nan


@dataclass(frozen=True)
class Call:
    """fn is one of SCALAR_FNS; `attrs` carries static attributes (e.g. dtype of a cast)."""

    fn: str
    args: tuple["Expr", ...]
    attrs: tuple[tuple[str, Union[str, float, int]], ...] = ()


Expr = Union[In, Const, Call]

SCALAR_FNS = frozenset({
    # arithmetic
    "add", "sub", "mul", "div", "neg", "pow", "maximum", "minimum", "abs", "reciprocal",
    "floordiv", "remainder", "fmod", "floor", "ceil", "trunc", "round", "sign",
    # transcendental
    "exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "sin", "cos",
    "erfc", "log1p", "expm1", "log2", "log10", "tan", "atan", "asin", "acos", "sinh", "cosh", "asinh", "acosh", "atanh",
    "atan2",
    # activations kept fused where Spyre has them
    "relu", "gelu", "gelu_tanh", "silu",
    # comparisons and logic (produce bool)
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not",
    "bitwise_and", "bitwise_or", "bitwise_xor", "shift_left", "shift_right",
    # selection and casts
    "where", "cast",
})

REDUCE_FNS = frozenset({"sum", "max", "min", "prod", "cumsum"})


@dataclass(frozen=True)
class MatmulBody:
    """Iteration-dim indices of the matmul roles; every other dim is a batch dim."""

    m: int
    n: int
    k: int
    kind: Literal["matmul"] = "matmul"


@dataclass(frozen=True)
class GroupedMatmulBody:
    """out[m, n] = sum_g [group[m] == g] * sum_k x[m, k] * w[g, k, n] (a mixture-of-experts
    expert matmul over tokens grouped by expert).

    Operands: 0 is x (indexes m, k), 1 is w (indexes g, k, n: one weight matrix per group),
    2 is the per-row group id (integer, indexes m). `g` is a reduction-kind iteration dim:
    each row takes exactly one group's product (a row whose id is outside [0, G) is 0), so
    summing over g is a selection, and a core split over g is a split reduction whose
    partials are exactly zero outside each row's own group. Work is M*N*K multiply-adds
    (not G*M*N*K): only the selected group's product is computed."""

    m: int
    n: int
    k: int
    g: int
    kind: Literal["grouped_matmul"] = "grouped_matmul"


@dataclass(frozen=True)
class PointwiseBody:
    expr: Expr
    kind: Literal["pointwise"] = "pointwise"


@dataclass(frozen=True)
class ReduceBody:
    """fold `fn` over the op's reduction dims of `expr` (cumsum: a scan along them)."""

    fn: str
    expr: Expr = In(0)
    kind: Literal["reduce"] = "reduce"


@dataclass(frozen=True)
class GatherBody:
    """out = table[index] along table dim `axis`; operand 0 is the table, 1 the index.

    General (multi-index) form, as aten.index.Tensor needs: operand 1 + j holds the
    index into table dim `table_axes[j]` (`axis`, then `extra_axes`). The table's Access
    has None at its gathered axes (the position there comes from the index values,
    negative values wrap as in torch); every other table dim and every index dim maps
    to an iteration dim (None for size 1). The iteration dims are the output's."""

    axis: int
    kind: Literal["gather"] = "gather"
    extra_axes: tuple[int, ...] = ()

    @property
    def table_axes(self) -> tuple[int, ...]:
        return (self.axis,) + tuple(self.extra_axes)


@dataclass(frozen=True)
class ScatterBody:
    """out = table, then out[index_0[i], index_1[i], ..., d...] = values[i..., d...]: the
    rows of `values` stored at the positions the index operands name along table dims
    `table_axes` (`axis`, then `extra_axes`), in row-major order of the index dims (when
    two rows name one position the later one wins). Operand 0 is the table (the tensor
    updated), 1 the values, 1 + 1 + j the index into table dim `table_axes[j]`. The table's
    Access and the output's are the same: None at the scattered axes, the values' iteration
    dims elsewhere. The iteration dims are the values' (all parallel). Negative indices wrap
    as in torch; a row whose index lies outside the table is not stored.

    In place: a program stores the output in the table's own bytes (`alias_of` the table,
    same layout), so only the rows move. The dims an index operand indexes (the rows) are
    never split across cores: which of two rows naming one position lands last is their
    order, which one core keeps."""

    axis: int
    kind: Literal["scatter"] = "scatter"
    extra_axes: tuple[int, ...] = ()

    @property
    def table_axes(self) -> tuple[int, ...]:
        return (self.axis,) + tuple(self.extra_axes)


@dataclass(frozen=True)
class StridedMap:
    """out[i] = in_flat[offset + sum_j i_j * strides[j]], over the input's logical
    row-major element order."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0


@dataclass(frozen=True)
class CopyBody:
    """Out is assembled from strided pieces of the inputs: piece p writes the region of
    the output starting at `out_offsets[p]` (per dim) from input p through `maps[p]`.
    Positions no piece writes hold `pad_value` (constant padding)."""

    maps: tuple[StridedMap, ...]
    out_offsets: tuple[tuple[int, ...], ...]
    pad_value: float = 0.0
    kind: Literal["copy"] = "copy"


@dataclass(frozen=True)
class FillBody:
    """A constant, or iota along dim `iota_dim` (start + step * index)."""

    value: float = 0.0
    iota_dim: Optional[int] = None
    start: float = 0.0
    step: float = 1.0
    kind: Literal["fill"] = "fill"


Body = Union[MatmulBody, PointwiseBody, ReduceBody, GatherBody, CopyBody, FillBody, GroupedMatmulBody, ScatterBody]


_NOTHING = object()


@dataclass(frozen=True)
class PrimOp:
    id: str
    iter_dims: tuple[IterDim, ...]
    inputs: tuple[Access, ...]
    output: Access
    body: Body
    # The aten node this op came from (for error messages and traces).
    source: str = ""

    @property
    def kind(self) -> str:
        return self.body.kind

    # The memo maps key on ops (compared by content): the hash of the nested fields is
    # computed once per object. Not pickled: str hashes differ between processes.
    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.id, self.iter_dims, self.inputs, self.output, self.body, self.source))
            object.__setattr__(self, "_hash", h)
        return h

    def derived(self, name: str, make: Callable[[], Any]) -> Any:
        """`make()` computed once per op object (an op is immutable): facts derived from
        the op alone that the emitter and validator ask for on every trial program. Not
        pickled or copied. `make` must return an immutable value."""
        memo = self.__dict__.get("_derived")
        if memo is None:
            memo = {}
            object.__setattr__(self, "_derived", memo)
        got = memo.get(name, _NOTHING)
        if got is _NOTHING:
            got = memo[name] = make()
        return got

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_hash", None)
        state.pop("_derived", None)
        return state


@dataclass
class PrimGraph:
    """Ops in a valid execution order; tensors by id; graph inputs/outputs by id."""

    name: str
    tensors: dict[str, PrimTensor]
    ops: list[PrimOp]
    inputs: list[str]
    outputs: list[str]
    # graph hash of the interchange document this was lowered from
    source_hash: str = ""
    meta: dict = field(default_factory=dict)

    def producer(self) -> dict[str, PrimOp]:
        return {op.output.tensor: op for op in self.ops}

    def consumers(self) -> dict[str, list[PrimOp]]:
        out: dict[str, list[PrimOp]] = {t: [] for t in self.tensors}
        for op in self.ops:
            for acc in op.inputs:
                out[acc.tensor].append(op)
        return out


# -- JSON form (embedded in SuperDSC programs; see docs/superdsc.md) ---------------------
_EXPR_TYPES = {"in": In, "const": Const, "call": Call}
_BODY_TYPES = {b.__dataclass_fields__["kind"].default: b
               for b in (MatmulBody, PointwiseBody, ReduceBody, GatherBody, CopyBody, FillBody,
                          GroupedMatmulBody, ScatterBody)}


def _float_json(v: float):
    if v != v:
        return "nan"
    if v in (float("inf"), float("-inf")):
        return "inf" if v > 0 else "-inf"
    return v


def _float_from(v) -> float:
    return float(v) if isinstance(v, str) else v


def expr_to_json(e: Expr) -> dict:
    if isinstance(e, In):
        return {"in": e.index}
    if isinstance(e, Const):
        return {"const": _float_json(e.value)}
    return {"call": e.fn, "args": [expr_to_json(a) for a in e.args],
            **({"attrs": {k: v for k, v in e.attrs}} if e.attrs else {})}


def expr_from_json(d: dict, depth: int = 0) -> Expr:
    if depth > 64:
        raise ValueError("expression nested deeper than 64")
    if "in" in d:
        return In(int(d["in"]))
    if "const" in d:
        return Const(_float_from(d["const"]))
    fn = d["call"]
    if fn not in SCALAR_FNS:
        raise ValueError(f"unknown scalar function {fn!r}")
    return Call(fn, tuple(expr_from_json(a, depth + 1) for a in d["args"]),
                tuple(sorted(d.get("attrs", {}).items())))


def body_to_json(b: Body) -> dict:
    if isinstance(b, PointwiseBody):
        return {"kind": "pointwise", "expr": expr_to_json(b.expr)}
    if isinstance(b, ReduceBody):
        return {"kind": "reduce", "fn": b.fn, "expr": expr_to_json(b.expr)}
    if isinstance(b, CopyBody):
        return {"kind": "copy", "pad_value": _float_json(b.pad_value),
                "out_offsets": [list(o) for o in b.out_offsets],
                "maps": [{"shape": list(m.shape), "strides": list(m.strides), "offset": m.offset}
                         for m in b.maps]}
    if isinstance(b, FillBody):
        return {"kind": "fill", "value": _float_json(b.value), "iota_dim": b.iota_dim,
                "start": b.start, "step": b.step}
    if isinstance(b, MatmulBody):
        return {"kind": "matmul", "m": b.m, "n": b.n, "k": b.k}
    if isinstance(b, GroupedMatmulBody):
        return {"kind": "grouped_matmul", "m": b.m, "n": b.n, "k": b.k, "g": b.g}
    return {"kind": b.kind, "axis": b.axis,
            **({"extra_axes": list(b.extra_axes)} if b.extra_axes else {})}


def body_from_json(d: dict) -> Body:
    kind = d["kind"]
    if kind == "pointwise":
        return PointwiseBody(expr_from_json(d["expr"]))
    if kind == "reduce":
        if d["fn"] not in REDUCE_FNS:
            raise ValueError(f"unknown reduction {d['fn']!r}")
        return ReduceBody(d["fn"], expr_from_json(d["expr"]))
    if kind == "copy":
        return CopyBody(tuple(StridedMap(tuple(m["shape"]), tuple(m["strides"]), int(m["offset"]))
                              for m in d["maps"]),
                        tuple(tuple(o) for o in d["out_offsets"]), _float_from(d["pad_value"]))
    if kind == "fill":
        return FillBody(_float_from(d["value"]), d["iota_dim"], d["start"], d["step"])
    if kind == "matmul":
        return MatmulBody(int(d["m"]), int(d["n"]), int(d["k"]))
    if kind == "grouped_matmul":
        return GroupedMatmulBody(int(d["m"]), int(d["n"]), int(d["k"]), int(d["g"]))
    if kind == "gather":
        return GatherBody(int(d["axis"]), extra_axes=tuple(int(a) for a in d.get("extra_axes", ())))
    if kind == "scatter":
        return ScatterBody(int(d["axis"]), extra_axes=tuple(int(a) for a in d.get("extra_axes", ())))
    raise ValueError(f"unknown body kind {kind!r}")


def in_place_table(op: PrimOp) -> Optional[str]:
    """The tensor an in-place op updates (its output is stored in that tensor's bytes), or
    None for an op that writes a fresh tensor."""
    return op.inputs[0].tensor if op.body.kind == "scatter" and op.inputs else None


def index_iter_dims(op: PrimOp) -> frozenset[int]:
    """A scatter's row dims: the iteration dims its index operands index (never split)."""
    if op.body.kind != "scatter":
        return frozenset()
    return frozenset(d for a in op.inputs[2:] for d in a.dims if d is not None)


def scatter_problems(op: PrimOp) -> list[str]:
    """What makes a scatter's loop nest malformed ([] when well formed): operand count, the
    output's access not the table's, a mapped scattered axis, an iteration dim that is
    neither a row dim nor one the table walks (two rows' elements would land on one
    position of a row), or a reduction dim."""
    body = op.body
    axes = body.table_axes
    out: list[str] = []
    if len(op.inputs) != 2 + len(axes):
        return [f"a scatter along {len(axes)} axes has {len(op.inputs)} operands, needs {2 + len(axes)}"]
    table = op.inputs[0]
    if tuple(table.dims) != tuple(op.output.dims):
        out.append("the output's access is not the table's")
    if any(a < 0 or a >= len(table.dims) or table.dims[a] is not None for a in axes):
        out.append(f"scattered axes {list(axes)} must be unmapped table dims")
    rows = index_iter_dims(op)
    walked = {d for j, d in enumerate(table.dims) if d is not None and j not in axes}
    if rows & walked or (rows | walked) != set(range(len(op.iter_dims))):
        out.append("every iteration dim must be a row dim (indexed by the indices) or a dim the table walks")
    if any(d.kind != "parallel" for d in op.iter_dims):
        out.append("a scatter has parallel iteration dims only")
    return out


def op_to_json(op: PrimOp) -> dict:
    return {
        "id": op.id,
        "source": op.source,
        "iter_dims": [{"name": d.name, "size": d.size, "kind": d.kind} for d in op.iter_dims],
        "inputs": [{"tensor": a.tensor, "dims": list(a.dims)} for a in op.inputs],
        "output": {"tensor": op.output.tensor, "dims": list(op.output.dims)},
        "body": body_to_json(op.body),
    }


def op_from_json(d: dict) -> PrimOp:
    return PrimOp(
        id=d["id"],
        iter_dims=tuple(IterDim(x["name"], int(x["size"]), x["kind"]) for x in d["iter_dims"]),
        inputs=tuple(Access(a["tensor"], tuple(a["dims"])) for a in d["inputs"]),
        output=Access(d["output"]["tensor"], tuple(d["output"]["dims"])),
        body=body_from_json(d["body"]),
        source=d.get("source", ""),
    )


def tensor_to_json(t: PrimTensor) -> dict:
    return {"id": t.id, "shape": list(t.shape), "dtype": t.dtype, "role": t.role,
            **({"dim_order": list(t.dim_order)} if t.dim_order is not None else {})}


def tensor_from_json(d: dict) -> PrimTensor:
    order = d.get("dim_order")
    return PrimTensor(d["id"], tuple(int(s) for s in d["shape"]), d["dtype"], d["role"],
                      None if order is None else tuple(int(j) for j in order))


def graph_to_json(g: PrimGraph) -> dict:
    return {"name": g.name, "source_hash": g.source_hash,
            "tensors": [tensor_to_json(t) for t in g.tensors.values()],
            "ops": [op_to_json(o) for o in g.ops], "inputs": list(g.inputs), "outputs": list(g.outputs)}


def graph_from_json(d: dict) -> PrimGraph:
    tensors = [tensor_from_json(t) for t in d["tensors"]]
    return PrimGraph(d["name"], {t.id: t for t in tensors}, [op_from_json(o) for o in d["ops"]],
                     list(d["inputs"]), list(d["outputs"]), d.get("source_hash", ""))
