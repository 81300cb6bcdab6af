"""Validation of a client's graph document, with one precise error per problem.

Two layers:
- `parse_document` turns raw JSON (or a dict) into a `GraphDocument`; schema violations
  become `GraphError("schema", ...)` carrying the JSON path and, when the path is inside
  a node or input, that node's id.
- `validate_document` checks what the schema cannot express: unique ids, references that
  resolve, a graph that is a DAG in definition order, static sizes, structurally
  consistent metadata, and (optionally) that every op can be lowered, with its arguments
  matching the op's schema: no more positional arguments than it takes, no keyword it
  does not have, none given twice, none required left out (`op_schemas.json`, which
  scripts/gen_op_schemas.py generates offline out of the pinned operator registry; the
  service reads only that file).

Shape/dtype errors that need shape inference (e.g. matmul inner sizes) are raised by the
lowering with the same codes (`shape_mismatch`, `dtype_mismatch`).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator, Union

from pydantic import ValidationError

from lowering.errors import GraphError
from lowering.graph_format import (
    FloatArg,
    GraphDocument,
    ListArg,
    Node,
    SymArg,
    SymSize,
    TensorMeta,
    TensorRef,
)

# A document larger than this is rejected before JSON parsing (the node/list bounds in
# the schema would reject it later anyway, after costing the memory to parse it).
MAX_DOCUMENT_BYTES = 64 * 1024 * 1024

_MAX_PATH_CHARS = 240

# Ops whose output dtype is stated by an explicit argument: (position, keyword).
_DTYPE_ARG_OPS: dict[str, tuple[int | None, str]] = {
    "prims.convert_element_type.default": (1, "dtype"),
    "aten._to_copy.default": (None, "dtype"),
    "aten.full.default": (None, "dtype"),
    "aten.arange.default": (None, "dtype"),
    "aten.arange.start": (None, "dtype"),
    "aten.arange.start_step": (None, "dtype"),
    "aten.zeros.default": (None, "dtype"),
    "aten.ones.default": (None, "dtype"),
    "aten.empty.memory_format": (None, "dtype"),
    "aten.scalar_tensor.default": (None, "dtype"),
}


# -- parsing ---------------------------------------------------------------------------


def _reject_constant(token: str) -> Any:
    raise ValueError(f"{token} is not valid JSON (non-finite floats travel as the strings "
                     f"'inf', '-inf', 'nan')")


def parse_document(raw: Union[bytes, str, dict]) -> GraphDocument:
    """Parse and schema-check a graph document. Never raises anything but GraphError."""
    if isinstance(raw, (bytes, bytearray, str)):
        if len(raw) > MAX_DOCUMENT_BYTES:
            raise GraphError("schema", f"document is {len(raw)} bytes; the limit is {MAX_DOCUMENT_BYTES}")
        try:
            data = json.loads(raw, parse_constant=_reject_constant)
        except UnicodeDecodeError as e:
            raise GraphError("schema", f"document is not UTF-8: {e}") from None
        except ValueError as e:  # json.JSONDecodeError is a ValueError
            raise GraphError("schema", f"invalid JSON: {e}") from None
        except RecursionError:
            raise GraphError("schema", "document is nested too deeply") from None
    elif isinstance(raw, dict):
        data = raw
    else:
        raise GraphError("schema", f"a graph document is a JSON object, not {type(raw).__name__}")
    if not isinstance(data, dict):
        raise GraphError("schema", f"a graph document is a JSON object, not {type(data).__name__}")
    try:
        return GraphDocument.model_validate(data)
    except ValidationError as e:
        raise _schema_error(e, data) from None
    except RecursionError:
        raise GraphError("schema", "document is nested too deeply") from None


def _schema_error(err: ValidationError, data: dict) -> GraphError:
    first = err.errors(include_url=False)[0]
    path, node_id = json_path(first["loc"], data)
    more = err.error_count() - 1
    suffix = f" (and {more} more schema error{'s' if more > 1 else ''})" if more else ""
    return GraphError("schema", f"{path or '<document>'}: {first['msg']}{suffix}", node_id)


def json_path(loc: tuple, data: Any) -> tuple[str, str | None]:
    """Render pydantic's error location as a JSON path, dropping discriminated-union tags
    (pydantic inserts the tag, e.g. 'tensor', as a path element that is not in the
    document), and find the id of the node or graph input the path lies in."""
    parts: list[str] = []
    node_id: str | None = None
    current = data
    for depth, item in enumerate(loc):
        if isinstance(item, int):
            parts.append(f"[{item}]")
            current = current[item] if isinstance(current, list) and 0 <= item < len(current) else None
        else:
            if isinstance(current, dict) and item not in current and current.get("kind") == item:
                continue  # a union tag, not a key
            parts.append(f".{item}" if parts else str(item))
            current = current.get(item) if isinstance(current, dict) else None
        if depth == 1 and loc[0] in ("nodes", "inputs") and isinstance(current, dict):
            ident = current.get("id")
            node_id = ident if isinstance(ident, str) else None
    path = "".join(parts)
    if len(path) > _MAX_PATH_CHARS:  # a pathologically deep location: keep both ends
        keep = _MAX_PATH_CHARS // 2
        path = f"{path[:keep]}...{path[-keep:]}"
    return path, node_id


# -- semantic checks -------------------------------------------------------------------


@dataclass(frozen=True)
class _Definition:
    index: int  # position in definition order: inputs first, then nodes
    outputs: int  # how many outputs a reference may select from


def iter_tensor_refs(args: Any) -> Iterator[TensorRef]:
    """Every tensor reference among a node's args/kwargs, depth first."""
    items = args.values() if isinstance(args, dict) else args
    for a in items:
        if isinstance(a, TensorRef):
            yield a
        elif isinstance(a, ListArg):
            yield from iter_tensor_refs(a.items)


def _iter_sym_args(args: Any) -> Iterator[SymArg]:
    items = args.values() if isinstance(args, dict) else args
    for a in items:
        if isinstance(a, SymArg):
            yield a
        elif isinstance(a, ListArg):
            yield from _iter_sym_args(a.items)


def _node_refs(node: Node) -> list[TensorRef]:
    return list(iter_tensor_refs(node.args)) + list(iter_tensor_refs(node.kwargs))


def find_problems(doc: GraphDocument, check_support: bool = True) -> list[GraphError]:
    """All problems found, in a stable order (structure first, then metadata, then op
    support). A problem in the structure stops the later checks, which assume it."""
    problems = non_finite_problems(doc)
    if problems:
        return problems
    problems = _check_ids(doc)
    if problems:
        return problems
    problems = _check_references(doc)
    if problems:
        return problems
    problems = _check_metadata(doc)
    if check_support:
        problems += _check_support(doc)
    return problems


def validate_document(doc: GraphDocument, check_support: bool = True) -> None:
    """Raise the first problem as a GraphError naming its node.

    `check_support=False` skips the op-support check: the torch backend validates a
    whole graph first and then partitions unsupported ops out to eager torch."""
    problems = find_problems(doc, check_support=check_support)
    if problems:
        raise problems[0]


def _check_ids(doc: GraphDocument) -> list[GraphError]:
    seen: dict[str, str] = {}
    problems = []
    entries = ([(i.id, "graph input") for i in doc.inputs] + [(c.id, "constant") for c in doc.constants]
               + [(n.id, "node") for n in doc.nodes])
    for ident, what in entries:
        if ident in seen:
            problems.append(GraphError(
                "duplicate_id", f"id '{ident}' is used by a {seen[ident]} and again by a {what}; "
                f"ids of inputs, constants and nodes share one namespace", ident))
        else:
            seen[ident] = what
    return problems


def _check_references(doc: GraphDocument) -> list[GraphError]:
    defs: dict[str, _Definition] = {}
    for i, inp in enumerate(doc.inputs):
        defs[inp.id] = _Definition(i, 1)
    for c in doc.constants:
        defs[c.id] = _Definition(-1, 1)  # defined before everything, like an input
    base = len(doc.inputs)
    for i, node in enumerate(doc.nodes):
        defs[node.id] = _Definition(base + i, len(node.outputs))

    node_ids = {n.id for n in doc.nodes}
    problems: list[GraphError] = []
    forward: list[tuple[Node, str]] = []  # (user, a node listed after it)
    deps: dict[str, list[str]] = {}
    for i, node in enumerate(doc.nodes):
        position = base + i
        node_deps = deps.setdefault(node.id, [])
        for ref in _node_refs(node):
            problem = _check_ref(ref, defs, f"node '{node.id}'", node.id)
            if problem:
                problems.append(problem)
                continue
            if ref.node == node.id:
                problems.append(GraphError("cycle", f"node '{node.id}' uses its own output", node.id))
                continue
            if ref.node in node_ids:
                node_deps.append(ref.node)  # node -> node edges only: inputs close no loop
            if defs[ref.node].index > position:
                forward.append((node, ref.node))
    for k, ref in enumerate(doc.outputs):
        problem = _check_ref(ref, defs, f"graph output {k}", ref.node)
        if problem:
            problems.append(problem)
    if forward and not problems:
        loop = _find_cycle([n.id for n in doc.nodes], deps)
        if loop:
            shown = loop if len(loop) <= 12 else loop[:6] + [f"... ({len(loop) - 11} more)"] + loop[-5:]
            problems.append(GraphError("cycle", f"dependency cycle: {' -> '.join(shown)}", loop[0]))
        else:
            problems += [GraphError("use_before_definition",
                                    f"node '{user.id}' uses '{used}', which is defined later; nodes must be "
                                    f"listed in a topological order", user.id) for user, used in forward]
    return problems


def _find_cycle(order: list[str], deps: dict[str, list[str]]) -> list[str] | None:
    """One dependency loop (first id repeated at the end), searching from nodes in
    document order; iterative, linear in nodes + edges (a hostile document may be
    20,000 nodes listed backwards)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    for root in order:
        if state.get(root):
            continue
        path: list[str] = [root]
        state[root] = 1
        iters = [iter(deps.get(root, ()))]
        while iters:
            dep = next(iters[-1], None)
            if dep is None:
                state[path.pop()] = 2
                iters.pop()
                continue
            mark = state.get(dep)
            if mark == 1:
                return path[path.index(dep):] + [dep]
            if mark is None:
                state[dep] = 1
                path.append(dep)
                iters.append(iter(deps.get(dep, ())))
    return None


def _check_ref(ref: TensorRef, defs: dict[str, _Definition], user: str, node_id: str) -> GraphError | None:
    target = defs.get(ref.node)
    if target is None:
        return GraphError("dangling_ref", f"{user} refers to '{ref.node}', which is neither a graph "
                          f"input nor a node", node_id)
    if ref.output >= target.outputs:
        return GraphError("dangling_ref", f"{user} refers to output {ref.output} of '{ref.node}', "
                          f"which has {target.outputs} output{'s' if target.outputs != 1 else ''}", node_id)
    return None


def _meta_problems(meta: TensorMeta, where: str, node_id: str) -> list[GraphError]:
    problems = []
    for field_name, values in (("shape", meta.shape), ("stride", meta.stride),
                               ("storage_offset", [meta.storage_offset])):
        for axis, v in enumerate(values):
            if isinstance(v, SymSize):
                at = f"{field_name}[{axis}]" if field_name != "storage_offset" else field_name
                problems.append(GraphError(
                    "symbolic_size", f"{where} has symbolic {at} = {v.sym}; format v1 takes static "
                    f"shapes only (compile with dynamic=False or mark the size static)", node_id))
    if len(meta.shape) != len(meta.stride):
        problems.append(GraphError(
            "shape_mismatch", f"{where} has a rank-{len(meta.shape)} shape but "
            f"{len(meta.stride)} strides", node_id))
        return problems
    if problems:
        return problems
    for axis, size in enumerate(meta.shape):
        if size == 0:
            problems.append(GraphError(
                "zero_size", f"{where} has shape {list(meta.shape)} with a zero-size dim {axis}; "
                f"sticksat compiles no empty tensors (run such a graph in eager torch)", node_id))
            return problems
    # The last element addressed must lie in a storage the format can describe (sizes are
    # bounded by 2^40 elements): a stride or offset beyond it addresses no real storage.
    last = meta.storage_offset + sum((size - 1) * stride for size, stride in zip(meta.shape, meta.stride))
    if last >= MAX_STORAGE_ELEMENTS:
        problems.append(GraphError(
            "bad_strides", f"{where} with shape {list(meta.shape)}, strides {list(meta.stride)} and storage "
            f"offset {meta.storage_offset} addresses element {last}, beyond any storage "
            f"(at most {MAX_STORAGE_ELEMENTS} elements)", node_id))
    return problems


# Sizes in the format are at most 2^40 (graph_format.Size); so is the storage a tensor views.
MAX_STORAGE_ELEMENTS = 2**40


def non_finite_problems(doc: GraphDocument) -> list[GraphError]:
    """Bare NaN/Infinity literals (or numbers such as 1e999 that overflow to infinity)
    in float arguments or constant values: JSON has no such numbers, and the canonical
    form (hash) cannot hold them. Non-finite floats travel as the strings 'inf', '-inf',
    'nan'."""
    def bad(value: Any) -> bool:
        return isinstance(value, float) and not math.isfinite(value)

    def walk(args: Any) -> Iterator[float]:
        stack = [args]
        while stack:
            a = stack.pop()
            if isinstance(a, (list, tuple)):
                stack.extend(a)
            elif isinstance(a, dict):
                stack.extend(a.values())
            elif isinstance(a, ListArg):
                stack.extend(a.items)
            elif isinstance(a, FloatArg) and bad(a.value):
                yield a.value

    hint = "non-finite floats travel as the strings 'inf', '-inf', 'nan'"
    problems = []
    for node in doc.nodes:
        for value in walk([list(node.args), dict(node.kwargs)]):
            problems.append(GraphError("schema", f"node '{node.id}' has a float argument {value!r} written as a "
                                       f"bare NaN/Infinity or an overflowing literal; {hint}", node.id))
            break
    for c in doc.constants:
        if any(bad(v) for v in c.values):
            problems.append(GraphError("schema", f"constant '{c.id}' has a value written as a bare NaN/Infinity "
                                       f"or an overflowing literal; {hint}", c.id))
    return problems


def _check_metadata(doc: GraphDocument) -> list[GraphError]:
    problems: list[GraphError] = []
    for inp in doc.inputs:
        problems += _meta_problems(inp.meta, f"graph input '{inp.id}'", inp.id)
    for c in doc.constants:
        where = f"constant '{c.id}'"
        meta_problems = _meta_problems(c.meta, where, c.id)
        problems += meta_problems
        if not meta_problems:
            numel = math.prod(c.meta.shape)
            if len(c.values) != numel:
                problems.append(GraphError("shape_mismatch", f"{where} has shape {list(c.meta.shape)} "
                                           f"({numel} elements) but {len(c.values)} values", c.id))
    for node in doc.nodes:
        for k, meta in enumerate(node.outputs):
            where = f"output {k} of node '{node.id}'" if len(node.outputs) > 1 else f"node '{node.id}'"
            problems += _meta_problems(meta, where, node.id)
        for sym in _iter_sym_args(list(node.args) + list(node.kwargs.values())):
            problems.append(GraphError(
                "symbolic_size", f"node '{node.id}' ({node.target}) has a symbolic argument {sym.sym}; "
                f"format v1 takes static shapes only", node.id))
        problems += _dtype_problems(node)
    return problems


def _dtype_problems(node: Node) -> list[GraphError]:
    """Structural dtype check: an op that states its result dtype as an argument must
    produce that dtype."""
    rule = _DTYPE_ARG_OPS.get(node.target)
    if rule is None or not node.outputs:
        return []
    position, keyword = rule
    arg = node.kwargs.get(keyword)
    if arg is None and position is not None and position < len(node.args):
        arg = node.args[position]
    stated = getattr(arg, "value", None) if getattr(arg, "kind", None) == "dtype" else None
    if stated is None or stated == node.outputs[0].dtype:
        return []
    return [GraphError("dtype_mismatch", f"node '{node.id}' ({node.target}) asks for dtype {stated} "
                       f"but declares an output of dtype {node.outputs[0].dtype}", node.id)]


def supported_targets() -> frozenset[str]:
    # Imported lazily: the lowering package may import this module.
    from lowering import SUPPORTED_TARGETS

    return frozenset(SUPPORTED_TARGETS)


def _plain(arg: Any) -> Any:
    """An argument as the plain Python value lowering's support check reads."""
    if isinstance(arg, ListArg):
        return [_plain(a) for a in arg.items]
    if isinstance(arg, (TensorRef, SymArg)):
        return arg
    return getattr(arg, "value", None)


@lru_cache(maxsize=1)
def op_schemas() -> dict[str, dict[str, Any]]:
    """Target -> {"args": positional parameter names, "required": how many of them have no
    default, "kwargs": keyword-only parameter names} (lowering/op_schemas.json)."""
    data = json.loads(Path(__file__).with_name("op_schemas.json").read_text())
    return data["ops"]


def _names(names: list[str]) -> str:
    return ", ".join(names) if names else "none"


def signature_problems(node: Node) -> list[GraphError]:
    """The node's arguments against its target's schema (nothing for a target without
    one): extra positional arguments, unknown keywords and arguments given both ways are
    `unexpected_argument`; a required parameter given neither way is `missing_argument`."""
    schema = op_schemas().get(node.target)
    if schema is None:
        return []
    params, keyword_only = schema["args"], schema["kwargs"]
    out: list[GraphError] = []
    n = len(node.args)
    if n > len(params):
        out.append(GraphError("unexpected_argument",
                              f"node '{node.id}' passes {n} positional arguments to {node.target}, which takes at "
                              f"most {len(params)} ({_names(params)})", node.id))
    positional = set(params[:n])
    for key in node.kwargs:
        if key in positional:
            out.append(GraphError("unexpected_argument", f"node '{node.id}' passes {key!r} to {node.target} both by "
                                                         f"position and by keyword", node.id))
        elif key not in params and key not in keyword_only:
            out.append(GraphError("unexpected_argument",
                                  f"node '{node.id}' passes keyword {key!r} to {node.target}, which has no such "
                                  f"parameter (it takes {_names(params + keyword_only)})", node.id))
    missing = [p for p in params[:schema["required"]] if p not in positional and p not in node.kwargs]
    if missing:
        out.append(GraphError("missing_argument", f"node '{node.id}' leaves out the required argument"
                                                  f"{'s' if len(missing) > 1 else ''} {_names(missing)} of "
                                                  f"{node.target}", node.id))
    return out


def _check_support(doc: GraphDocument) -> list[GraphError]:
    from lowering import node_supported

    supported = supported_targets()
    signatures = [p for n in doc.nodes if n.target in supported for p in signature_problems(n)]
    if signatures:  # the support check reads arguments by position: it needs them right
        return signatures
    missing = [n for n in doc.nodes if n.target not in supported]
    refused = [n for n in doc.nodes if n.target in supported and not node_supported(
        n.target, [_plain(a) for a in n.args], {k: _plain(v) for k, v in n.kwargs.items()})]
    problems = []
    if missing:
        all_targets = sorted({n.target for n in missing})
        problems += [GraphError("unsupported_op", f"node '{n.id}' uses {n.target}, which sticksat cannot lower "
                                f"(unsupported in this graph: {', '.join(all_targets)})", n.id) for n in missing]
    problems += [GraphError("unsupported_op", f"node '{n.id}' uses {n.target} with arguments sticksat cannot "
                            f"lower (e.g. grouped or transposed convolution, attention dropout)", n.id)
                 for n in refused]
    order = {n.id: k for k, n in enumerate(doc.nodes)}
    return sorted(problems, key=lambda p: order[p.node])

