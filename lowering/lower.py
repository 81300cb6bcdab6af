"""Entry point: lower a graph interchange document to a PrimGraph.

Walks the document's nodes in order, resolves each argument (tensor refs to the
producing value's View), calls the op family's lowering, checks every output's shape
and dtype against the node's declared metadata, then drops ops no graph output needs and
folds layout-only copies into their producers (lowering/fold_layouts.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

from lowering.aten import HANDLERS
from lowering.aten.context import Ctx, NodeArgs, View
from lowering.aten.conv import Unavailable
from lowering.errors import GraphError
from lowering.fold_layouts import fold_layouts
from lowering.graph_format import (
    BoolArg, DTypeArg, FloatArg, GraphConstant, GraphDocument, IntArg, ListArg, NoneArg, StrArg, SymArg, SymSize, TensorMeta,
    TensorRef,
)
from target.primitives import PrimGraph

SUPPORTED_TARGETS: frozenset[str] = frozenset(HANDLERS)

ArgGetter = Callable[[int, str, Any], Any]


@dataclass(frozen=True)
class ArgLimit:
    """An argument-dependent limit of a supported target: `ok(arg)` says whether the node's
    arguments are lowerable (`arg(i, name, default)` reads positional arg i or kwarg
    `name`); `text` says which arguments are supported (docs/ops.md's table shows it)."""

    ok: Callable[[ArgGetter], bool]
    text: str


def _div_mode_ok(arg: ArgGetter) -> bool:
    return arg(2, "rounding_mode", None) in (None, "floor", "trunc")


_DIV_MODE = "rounding_mode None, floor or trunc"

# The lowerings refuse the same cases with unsupported_op.
ARG_LIMITS: dict[str, ArgLimit] = {
    "aten.convolution.default": ArgLimit(lambda arg: not arg(6, "transposed", False), "not transposed"),
    "aten._scaled_dot_product_flash_attention_for_cpu.default": ArgLimit(
        lambda arg: not arg(3, "dropout_p", 0.0), "dropout_p = 0"),
    "aten.scaled_dot_product_attention.default": ArgLimit(lambda arg: not arg(4, "dropout_p", 0.0), "dropout_p = 0"),
    "aten.gelu.default": ArgLimit(lambda arg: arg(1, "approximate", "none") in ("none", "tanh"),
                                  "approximate none or tanh"),
    "aten.div.Tensor_mode": ArgLimit(_div_mode_ok, _DIV_MODE),
    "aten.div.Scalar_mode": ArgLimit(_div_mode_ok, _DIV_MODE),
    # mixture-of-experts routing (lowering/aten/moe.py)
    "aten.topk.default": ArgLimit(lambda arg: arg(3, "largest", True) is not False, "largest=True"),
    "aten.histc.default": ArgLimit(lambda arg: float(arg(2, "min", 0)) < float(arg(3, "max", 0)), "min < max"),
    "aten.searchsorted.Tensor": ArgLimit(lambda arg: arg(5, "sorter", None) is None, "no sorter"),
    "aten.scatter_reduce.two": ArgLimit(lambda arg: arg(4, "reduce", None) in ("sum", "prod", "amax", "amin", "mean"),
                                        "reduce sum, prod, amax, amin or mean (mean of integers unsupported)"),
}


def node_supported(target: str, args: Sequence[Any] = (), kwargs: Optional[Mapping[str, Any]] = None) -> bool:
    """Whether a node can be lowered. `args`/`kwargs` are the node's arguments as plain
    Python values (tensor arguments may be anything); the argument-dependent limits
    (`ARG_LIMITS`) are transposed convolution, attention dropout, gelu's approximate and
    div's rounding mode. lower_document reports the same cases as unsupported_op."""
    if target not in HANDLERS:
        return False
    kwargs = kwargs or {}

    def arg(i: int, name: str, default=None):
        return args[i] if i < len(args) else kwargs.get(name, default)

    limit = ARG_LIMITS.get(target)
    return limit is None or bool(limit.ok(arg))


def _static_shape(meta: TensorMeta, where: str, node: str | None) -> tuple[int, ...]:
    for s in meta.shape:
        if isinstance(s, SymSize):
            raise GraphError("symbolic_size", f"{where} has symbolic size {s.sym!r}; format v1 needs static shapes",
                             node)
    return tuple(int(s) for s in meta.shape)


def _resolve(arg, values: dict, node_id: str):
    if isinstance(arg, TensorRef):
        key = (arg.node, arg.output)
        if key not in values:
            raise GraphError("dangling_ref", f"reference to unknown value {arg.node}:{arg.output}", node_id)
        v = values[key]
        if isinstance(v, Unavailable):
            raise GraphError("unsupported_op", f"uses output {arg.output} of {arg.node}: {v.why}", node_id)
        return v
    if isinstance(arg, (IntArg, BoolArg, StrArg, DTypeArg)):
        return arg.value
    if isinstance(arg, FloatArg):
        return float(arg.value) if isinstance(arg.value, str) else arg.value
    if isinstance(arg, NoneArg):
        return None
    if isinstance(arg, ListArg):
        return [_resolve(a, values, node_id) for a in arg.items]
    if isinstance(arg, SymArg):
        raise GraphError("symbolic_size", f"symbolic argument {arg.sym!r}; format v1 needs static shapes", node_id)
    raise GraphError("bad_argument", f"unknown argument {arg!r}", node_id)


def constant_values(c: GraphConstant) -> list[float]:
    """A constant's values as floats (non-finite ones travel as strings)."""
    return [float(v) for v in c.values]


def _lower_constant(ctx: Ctx, c: GraphConstant, inputs: list[str]) -> View:
    """A constant whose elements are all equal is a fill (folded into its pointwise
    consumers as `Const`, like `full`); any other is a graph input of role "constant"
    whose values the runner takes from the document (`constant_inputs`)."""
    shape = _static_shape(c.meta, f"constant {c.id}", c.id)
    vals = constant_values(c)
    first = vals[0] if vals else 0.0
    if all(v == first or (math.isnan(v) and math.isnan(first)) for v in vals):
        from lowering.aten.indexing import emit_fill

        return emit_fill(ctx, NodeArgs(c.id, "constant", [], {}, [shape], [c.meta.dtype]), shape,
                         c.meta.dtype, first)
    tid = ctx.new_tensor(c.id, shape, c.meta.dtype, role="constant")
    inputs.append(tid)
    return ctx.tensor_view(tid)


def constant_inputs(doc: GraphDocument) -> dict[str, "np.ndarray"]:
    """The values of the document's constants that lower to graph inputs, by tensor id:
    what a runner passes besides the caller's inputs."""
    import numpy as np

    from target.interpreter import numpy_dtype

    out = {}
    for c in doc.constants:
        vals = constant_values(c)
        if vals and any(v != vals[0] for v in vals):
            out[c.id] = np.asarray(vals, dtype=np.float64).astype(numpy_dtype(c.meta.dtype)).reshape(
                [int(x) for x in c.meta.shape])
    return out


def lower_document(doc: GraphDocument, fold: bool = True) -> PrimGraph:
    """`doc` as a PrimGraph; `fold=False` keeps the layout copies fold_layouts removes (for
    comparing the two)."""
    ctx = Ctx()
    values: dict[tuple[str, int], Any] = {}
    inputs = []
    for inp in doc.inputs:
        shape = _static_shape(inp.meta, f"input {inp.id}", inp.id)
        tid = ctx.new_tensor(inp.id, shape, inp.meta.dtype, role=inp.kind)
        values[(inp.id, 0)] = ctx.tensor_view(tid)
        inputs.append(tid)
    for c in doc.constants:
        values[(c.id, 0)] = _lower_constant(ctx, c, inputs)
    for node in doc.nodes:
        handler = HANDLERS.get(node.target)
        if handler is None:
            raise GraphError("unsupported_op", f"{node.target} has no lowering", node.id)
        shapes = [_static_shape(m, f"output {k} of {node.id}", node.id) for k, m in enumerate(node.outputs)]
        na = NodeArgs(node.id, node.target, [_resolve(a, values, node.id) for a in node.args],
                      {k: _resolve(a, values, node.id) for k, a in node.kwargs.items()},
                      shapes, [m.dtype for m in node.outputs])
        try:
            outs = handler(ctx, na)
        except GraphError:
            raise
        except (TypeError, ValueError, IndexError, KeyError, AttributeError, ArithmeticError) as e:
            # malformed arguments reach a lowering as wrong Python types or counts
            raise GraphError("bad_argument", f"{node.target}: cannot lower these arguments ({e})", node.id) from e
        except (AssertionError, RecursionError) as e:
            # shapes or ranks a lowering assumed it would never see (the validator names
            # the known cases precisely; this keeps the rest a client error, not a crash)
            why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            raise GraphError("bad_argument", f"{node.target}: cannot lower a node with these arguments and "
                             f"shapes (inputs {[list(getattr(a, 'shape', ())) for a in na.args if hasattr(a, 'shape')]}, "
                             f"outputs {[list(s) for s in shapes]}; {why})", node.id) from e
        if len(outs) != len(node.outputs):
            raise GraphError("shape_mismatch", f"{node.target} produces {len(outs)} outputs, "
                             f"the node declares {len(node.outputs)}", node.id)
        for k, (out, shape, meta) in enumerate(zip(outs, shapes, node.outputs)):
            if isinstance(out, View):
                if tuple(out.shape) != shape:
                    raise GraphError("shape_mismatch", f"output {k} has shape {list(out.shape)}, "
                                     f"the node declares {list(shape)}", node.id)
                if out.dtype != meta.dtype:
                    raise GraphError("dtype_mismatch", f"output {k} has dtype {out.dtype}, "
                                     f"the node declares {meta.dtype}", node.id)
            values[(node.id, k)] = out
    outputs = []
    for ref in doc.outputs:
        v = _resolve(ref, values, ref.node)
        outputs.append(ctx.materialize(v, ref.node).base)
    pg = _dead_code_eliminated(PrimGraph(doc.name or "graph", ctx.tensors, ctx.ops, inputs, outputs,
                                         source_hash=doc.graph_hash()))
    if fold:
        pg = fold_layouts(pg)
    if doc.constants:
        pg.meta["constants"] = constant_inputs(doc)
    return pg


def _dead_code_eliminated(g: PrimGraph) -> PrimGraph:
    needed = set(g.outputs)
    kept = []
    for op in reversed(g.ops):
        if op.output.tensor in needed:
            kept.append(op)
            needed.update(a.tensor for a in op.inputs)
    kept.reverse()
    tensors = {tid: t for tid, t in g.tensors.items() if tid in needed or t.role != "intermediate"}
    return PrimGraph(g.name, tensors, kept, g.inputs, g.outputs, g.source_hash, g.meta)


