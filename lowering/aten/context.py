"""The state one lowering run shares between the aten op-family modules.

Every aten value is a `View`: a strided view (shape, strides, offset) over the logical
row-major elements of one primitive tensor (its `base`). Views that are pure dim
relabelings (permute, unsqueeze, expand of size-1 dims, squeeze) are folded into the
consumer's `Access`; any other view (slice, select, regrouping reshape) is materialized
by a `copy` op the first time a consumer needs it as a tensor. This keeps one rule for
everything view-like: compose the strided map, decide at the consumer.

Size-1 dims never get an iteration dim (except a matmul's m/n/k roles), so an Access
dim is None exactly for a size-1 tensor dim (and, in a gather, for the table's gathered
axes).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from lowering.errors import GraphError
from target.primitives import (
    Access, Body, CopyBody, Expr, IterDim, PrimOp, PrimTensor, StridedMap,
)

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
INT_DTYPES = ("uint8", "int8", "int16", "int32", "int64")


def row_major_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return tuple(reversed(strides))


def copy_op(tensors: dict[str, PrimTensor], op_id: str, out_tid: str,
            pieces: Sequence[tuple[str, StridedMap, tuple[int, ...]]], pad_value: float, source: str) -> PrimOp:
    """The `copy` op assembling tensor `out_tid` from `pieces` (input tensor id, strided
    map over its row-major elements, offset of the piece in the output): one iteration dim
    per output dim of size > 1; an input dim is indexed by the output iteration dim its
    map walks with the input's own row-major stride (None when no dim does). The one
    place a copy's operand maps are derived (the lowering's copies, and the solver's
    split of a copy wider than a bundle: solver.bundles.split_wide_copies)."""
    out = tensors[out_tid]
    iters, out_dims = Ctx.iter_dims_for(out.shape)
    inputs = []
    for base_id, smap, _ in pieces:
        base = tensors[base_id]
        bstr = row_major_strides(base.shape)
        dims: list[Optional[int]] = []
        for b in range(len(base.shape)):
            hit = None
            if base.shape[b] > 1:
                for j, (sz, st) in enumerate(zip(smap.shape, smap.strides)):
                    if st == bstr[b] and sz > 1 and sz <= base.shape[b] and out_dims[j] is not None:
                        hit = out_dims[j]
                        break
            dims.append(hit)
        inputs.append(Access(base_id, tuple(dims)))
    body = CopyBody(tuple(p[1] for p in pieces), tuple(tuple(p[2]) for p in pieces), pad_value)
    return PrimOp(op_id, tuple(iters), tuple(inputs), Access(out_tid, tuple(out_dims)), body, source)


def numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


@dataclass(frozen=True)
class View:
    """An aten value: `shape` elements at base_flat[offset + sum(i_j * strides[j])]."""

    base: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    dtype: str
    name: str  # the aten value it stands for (node id, `node:k` for output k)

    @property
    def rank(self) -> int:
        return len(self.shape)

    def with_(self, shape, strides, offset=None, name=None, dtype=None) -> "View":
        return View(self.base, tuple(shape), tuple(strides), self.offset if offset is None else offset,
                    self.dtype if dtype is None else dtype, self.name if name is None else name)


@dataclass(frozen=True)
class Scalar:
    """A Python number argument (becomes a Const in a pointwise expression)."""

    value: float
    kind: str  # "bool" | "int" | "float"


Handler = Callable[["Ctx", "NodeArgs"], list]
HANDLERS: dict[str, Handler] = {}
# target -> one line saying how it lowers (markdown); docs/ops.md's support table is
# generated from it by scripts/gen_ops_doc.py
DOCS: dict[str, str] = {}


def _first_paragraph(text: Optional[str]) -> str:
    return " ".join((text or "").strip().split("\n\n")[0].split())


def register(*targets: str, doc: Optional[str] = None):
    """Register a lowering for `targets`; `doc` (default: the first paragraph of the
    lowering's docstring) describes it in docs/ops.md's support table."""
    def deco(fn: Handler) -> Handler:
        text = doc or _first_paragraph(fn.__doc__)
        for t in targets:
            if t in HANDLERS:
                raise RuntimeError(f"two lowerings registered for {t}")
            HANDLERS[t] = fn
            if text:
                DOCS[t] = text
        return fn
    return deco


@dataclass
class NodeArgs:
    """A node's arguments with tensor refs resolved to Views."""

    id: str
    target: str
    args: list
    kwargs: dict
    out_shapes: list[tuple[int, ...]]
    out_dtypes: list[str]

    def arg(self, i: int, name: str, default=None):
        if i < len(self.args):
            return self.args[i]
        return self.kwargs.get(name, default)

    def fail(self, code: str, message: str) -> GraphError:
        return GraphError(code, message, node=self.id)


@dataclass
class Ctx:
    tensors: dict[str, PrimTensor] = field(default_factory=dict)
    ops: list[PrimOp] = field(default_factory=list)
    # base tensor id -> value of a constant fill (folded into pointwise exprs)
    const_of: dict[str, float] = field(default_factory=dict)
    _materialized: dict[tuple, str] = field(default_factory=dict)
    _op_ids: set[str] = field(default_factory=set)

    # -- tensors and ops -------------------------------------------------------------
    def new_tensor(self, want_id: str, shape: Sequence[int], dtype: str, role="intermediate") -> str:
        tid, k = want_id, 1
        while tid in self.tensors:
            tid = f"{want_id}.{k}"
            k += 1
        self.tensors[tid] = PrimTensor(tid, tuple(int(s) for s in shape), dtype, role)
        return tid

    def emit(self, op_id: str, iter_dims: Sequence[IterDim], inputs: Sequence[Access], output: Access,
             body: Body, source: str) -> PrimOp:
        oid, k = op_id, 1
        while oid in self._op_ids:
            oid = f"{op_id}.{k}"
            k += 1
        self._op_ids.add(oid)
        op = PrimOp(oid, tuple(iter_dims), tuple(inputs), output, body, source)
        self.ops.append(op)
        return op

    def tensor_view(self, tid: str, name: Optional[str] = None) -> View:
        t = self.tensors[tid]
        return View(tid, t.shape, row_major_strides(t.shape), 0, t.dtype, name or tid)

    # -- relabel analysis ------------------------------------------------------------
    def relabel(self, v: View) -> Optional[tuple[Optional[int], ...]]:
        """For a view that is only a dim relabeling of its base, the base dim each view dim
        walks (None: size 1 or broadcast). None when the view needs a copy."""
        base = self.tensors[v.base]
        if v.offset != 0:
            return None
        bstr = row_major_strides(base.shape)
        by_stride = {bstr[b]: b for b in range(len(base.shape)) if base.shape[b] > 1}
        mapping: list[Optional[int]] = []
        used: set[int] = set()
        for size, stride in zip(v.shape, v.strides):
            if size == 1 or stride == 0:
                mapping.append(None)
                continue
            b = by_stride.get(stride)
            if b is None or b in used or base.shape[b] != size:
                return None
            used.add(b)
            mapping.append(b)
        if len(used) != len(by_stride):
            return None  # a base dim > 1 is not walked: the view selects a sub-range
        # Pair size-1 view dims with size-1 base dims in order (only matters for matmul
        # roles of size 1, where the Access should name the role's iteration dim).
        free_ones = [b for b in range(len(base.shape)) if base.shape[b] == 1]
        for j, size in enumerate(v.shape):
            if size == 1 and v.strides[j] != 0 and free_ones:
                mapping[j] = free_ones.pop(0)
        return tuple(mapping)

    def is_identity(self, v: View) -> bool:
        base = self.tensors[v.base]
        if v.shape != base.shape or v.offset != 0:
            return False
        rs = row_major_strides(base.shape)
        return all(s == 1 or a == b for s, a, b in zip(v.shape, v.strides, rs))

    def materialize(self, v: View, source: str) -> View:
        """A copy op realizing v as its own row-major tensor (cached per distinct view)."""
        if self.is_identity(v):
            return self.tensor_view(v.base, v.name)
        key = (v.base, v.shape, v.strides, v.offset, v.dtype)
        tid = self._materialized.get(key)
        if tid is None:
            tid = self.new_tensor(v.name, v.shape, v.dtype)
            smap = StridedMap(v.shape, v.strides, v.offset)
            self.emit_copy(tid, [(v.base, smap, (0,) * len(v.shape))], 0.0, source)
            self._materialized[key] = tid
        return self.tensor_view(tid, v.name)

    def ensure_relabel(self, v: View, source: str) -> View:
        """v itself when consumers can fold it, else its materialized copy."""
        return v if self.relabel(v) is not None else self.materialize(v, source)

    def emit_copy(self, out_tid: str, pieces: Sequence[tuple[str, StridedMap, tuple[int, ...]]],
                  pad_value: float, source: str) -> PrimOp:
        op = copy_op(self.tensors, out_tid, out_tid, pieces, pad_value, source)
        return self.emit(op.id, op.iter_dims, op.inputs, op.output, op.body, source)

    # -- iteration dims --------------------------------------------------------------
    @staticmethod
    def iter_dims_for(shape: Sequence[int], prefix: str = "d", kinds: Optional[Sequence[str]] = None,
                      keep: Sequence[int] = ()) -> tuple[list[IterDim], list[Optional[int]]]:
        """One iteration dim per tensor dim of size > 1 (or listed in keep); returns the
        dims and, per tensor dim, its iteration-dim index (None for size 1)."""
        iters: list[IterDim] = []
        index: list[Optional[int]] = []
        for j, s in enumerate(shape):
            if s == 1 and j not in keep:
                index.append(None)
                continue
            kind = kinds[j] if kinds else "parallel"
            index.append(len(iters))
            iters.append(IterDim(f"{prefix}{j}", int(s), kind))
        return iters, index

    def access(self, v: View, iter_of_dim: Sequence[Optional[int]], source: str) -> Access:
        """Access for reading view v where view dim j is walked by iteration dim
        iter_of_dim[j] (None for size-1/broadcast). Materializes v if it is not a
        relabeling of its base."""
        mapping = self.relabel(v)
        if mapping is None:
            v = self.materialize(v, source)
            mapping = self.relabel(v)
            assert mapping is not None
        base = self.tensors[v.base]
        dims: list[Optional[int]] = [None] * len(base.shape)
        for j, b in enumerate(mapping):
            if b is not None and iter_of_dim[j] is not None and (v.shape[j] > 1 or base.shape[b] == 1):
                dims[b] = iter_of_dim[j]
        return Access(v.base, tuple(dims))

    def const_value(self, v) -> Optional[float]:
        if isinstance(v, Scalar):
            return v.value
        if isinstance(v, View):
            return self.const_of.get(v.base)
        return None


def expr_fn(fn: str, *args: Expr, **attrs) -> Expr:
    from target.primitives import Call

    return Call(fn, tuple(args), tuple(sorted(attrs.items())))
