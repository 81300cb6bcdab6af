"""Turn a PyTorch model into the graph interchange document.

The graph is the one Inductor's GraphLowering would receive: Dynamo (or torch.export)
capture, AOTAutograd functionalization, Inductor's decomposition table, inference only.
"""
from __future__ import annotations

import math
import operator
from typing import Any, Iterable, Sequence

import torch
import torch.fx

from lowering.graph_format import MAX_CONSTANT_ELEMENTS, GraphDocument, without_unread_weights

_DTYPES = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float64: "float64",
    torch.int64: "int64",
    torch.int32: "int32",
    torch.int16: "int16",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.bool: "bool",
}


class CaptureError(RuntimeError):
    pass


# Export-time shape/dtype assertions: they compute nothing and check what the
# document's metadata already states.
ASSERTION_OPS = {
    torch.ops.aten._assert_tensor_metadata.default,
    torch.ops.aten._assert_scalar.default,
    torch.ops.aten.sym_constrain_range_for_size.default,
}


def decomposition_table() -> dict:
    # Inductor's lowering module registers decompositions as a side effect; the
    # table is incomplete (and select_decomp_table fails) without that import.
    import torch._inductor.lowering  # noqa: F401
    from torch._inductor.decomposition import select_decomp_table

    return select_decomp_table()


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise CaptureError(f"dtype {dtype} is not supported by the interchange format") from None


def target_name(target: Any) -> str:
    """`aten.addmm.default` for an OpOverload."""
    if isinstance(target, torch._ops.OpOverload):
        ns = target.namespace
        return f"{ns}.{target._opname}.{target._overloadname}"
    raise CaptureError(f"call target {target!r} is not an aten/prims op overload")


def _size(v: Any) -> int | dict:
    if isinstance(v, int):
        return int(v)
    if isinstance(v, torch.SymInt):
        node = v.node
        if node.is_constant() or node.has_hint() and not node.expr.free_symbols:
            return int(v)
        return {"sym": str(node.expr)}
    return int(v)


def tensor_meta(t: torch.Tensor) -> dict:
    return {
        "shape": [_size(s) for s in t.shape],
        "stride": [_size(s) for s in t.stride()],
        "storage_offset": _size(t.storage_offset()),
        "dtype": dtype_name(t.dtype),
    }


def arg_literal(value: Any, ref_of: dict) -> dict:
    if isinstance(value, torch.fx.Node):
        node_id, out_idx = ref_of[value]
        return {"kind": "tensor", "node": node_id, "output": out_idx}
    if isinstance(value, bool):
        return {"kind": "bool", "value": value}
    if isinstance(value, int):
        return {"kind": "int", "value": value}
    if isinstance(value, torch.SymInt):
        s = _size(value)
        return {"kind": "int", "value": s} if isinstance(s, int) else {"kind": "sym", "sym": s["sym"]}
    if isinstance(value, float):
        if math.isnan(value):
            return {"kind": "float", "value": "nan"}
        if math.isinf(value):
            return {"kind": "float", "value": "inf" if value > 0 else "-inf"}
        return {"kind": "float", "value": value}
    if value is None:
        return {"kind": "none"}
    if isinstance(value, torch.dtype):
        return {"kind": "dtype", "value": dtype_name(value)}
    if isinstance(value, str):
        return {"kind": "str", "value": value}
    if isinstance(value, (torch.device, torch.layout, torch.memory_format)):
        # Placement hints do not change the computation the service plans.
        return {"kind": "str", "value": str(value)}
    if isinstance(value, (list, tuple)):
        return {"kind": "list", "items": [arg_literal(v, ref_of) for v in value]}
    raise CaptureError(f"argument {value!r} of type {type(value).__name__} cannot be serialized")


def _outputs_of(node: torch.fx.Node) -> list[torch.Tensor]:
    val = node.meta.get("val")
    if val is None:
        raise CaptureError(f"node {node.name} ({node.target}) has no tensor metadata")
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)):
        return list(val)
    raise CaptureError(f"node {node.name} ({node.target}) produces a non-tensor value {type(val).__name__}")


def _constant_value(v: float | int | bool):
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def _constant(gm: torch.fx.GraphModule, node: torch.fx.Node) -> dict:
    """A `get_attr` tensor as a document constant (values included, size-limited)."""
    value: Any = gm
    for part in str(node.target).split("."):
        value = getattr(value, part)
    if not isinstance(value, torch.Tensor):
        raise CaptureError(f"attribute {node.target} is a {type(value).__name__}, not a tensor")
    if value.numel() > MAX_CONSTANT_ELEMENTS:
        raise CaptureError(f"tensor constant {node.target} has {value.numel()} elements; constants travel in "
                           f"the graph document, at most {MAX_CONSTANT_ELEMENTS} elements each")
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    # AOTAutograd calls the compiler under fake-tensor mode; the constant itself is real
    with unset_fake_temporarily():
        flat = value.detach().contiguous().reshape(-1).cpu()
        if flat.dtype in (torch.float16, torch.bfloat16):
            flat = flat.float()
        values = [_constant_value(v) for v in flat.tolist()]
    # the values are sent row-major: the constant's metadata says so
    shape = [int(d) for d in value.shape]
    stride = [math.prod(shape[i + 1:]) for i in range(len(shape))]
    meta = {"shape": shape, "stride": stride, "storage_offset": 0, "dtype": dtype_name(value.dtype)}
    return {"id": node.name, "meta": meta, "values": values}


def graph_to_document(
    gm: torch.fx.GraphModule,
    input_kinds: Sequence[str],
    input_names: Sequence[str] | None = None,
    name: str = "",
) -> dict:
    """Serialize an ATen-level FX graph. `input_kinds[i]` classifies placeholder i as
    user_input / parameter / buffer / constant. Weights are never included."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(input_kinds):
        raise CaptureError(f"{len(placeholders)} placeholders but {len(input_kinds)} input kinds")
    ref_of: dict[torch.fx.Node, tuple[str, int]] = {}
    inputs, nodes, outputs, constants = [], [], [], []
    for i, ph in enumerate(placeholders):
        val = ph.meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise CaptureError(f"graph input {ph.name} is not a tensor ({type(val).__name__}); "
                               "only tensor inputs are supported")
        inputs.append({
            "id": ph.name,
            "kind": input_kinds[i],
            "name": (input_names[i] if input_names else ph.name)[:512],
            "meta": tensor_meta(val),
        })
        ref_of[ph] = (ph.name, 0)
    for node in gm.graph.nodes:
        if node.op == "call_function":
            if node.target is operator.getitem:
                src, idx = node.args
                ref_of[node] = (ref_of[src][0], int(idx))
                continue
            if node.target in ASSERTION_OPS:
                continue
            outs = _outputs_of(node)
            nodes.append({
                "id": node.name,
                "target": target_name(node.target),
                "args": [arg_literal(a, ref_of) for a in node.args],
                "kwargs": {k: arg_literal(v, ref_of) for k, v in node.kwargs.items()},
                "outputs": [tensor_meta(t) for t in outs],
            })
            ref_of[node] = (node.name, 0)
        elif node.op == "output":
            (result,) = node.args
            flat = result if isinstance(result, (list, tuple)) else [result]
            for r in flat:
                if not isinstance(r, torch.fx.Node):
                    raise CaptureError(f"graph output {r!r} is not a tensor")
                nid, idx = ref_of[r]
                outputs.append({"kind": "tensor", "node": nid, "output": idx})
        elif node.op == "get_attr":
            constants.append(_constant(gm, node))
            ref_of[node] = (node.name, 0)
        elif node.op != "placeholder":
            raise CaptureError(f"unsupported FX node kind {node.op} ({node.name})")
    doc = {"format": "sticksat.graph", "version": 1, "name": name[:256],
           "inputs": inputs, "nodes": nodes, "outputs": outputs}
    if constants:
        doc["constants"] = constants
    GraphDocument.model_validate(doc)  # fail here, on the client, rather than at the service
    return doc


def classify_inputs(tensors: Iterable[Any], names: Iterable[str] = ()) -> list[str]:
    """Dynamo lifts parameters and buffers to graph inputs; its placeholder names and
    the Parameter type tell them apart from user inputs."""
    names = list(names)
    kinds = []
    for i, t in enumerate(tensors):
        nm = names[i] if i < len(names) else ""
        if isinstance(t, torch.nn.Parameter) or "_parameters_" in nm:
            kinds.append("parameter")
        elif "_buffers_" in nm:
            kinds.append("buffer")
        else:
            kinds.append("user_input")
    return kinds


def capture(model: torch.nn.Module, example_inputs: Sequence[Any], name: str = "") -> dict:
    """Capture `model(*example_inputs)` as a graph document without running its numerics.

    Works on meta tensors and meta-device models, so real-size layers can be captured
    without allocating their weights: torch.export traces with fake tensors, then
    Inductor's decomposition table is applied.
    """
    from torch.export import export

    with torch.no_grad():
        ep = export(model, tuple(example_inputs), strict=False)
        ep = ep.run_decompositions(decomposition_table())
    return exported_program_to_document(ep, name=name or type(model).__name__)


def exported_program_to_document(ep: "torch.export.ExportedProgram", name: str = "") -> dict:
    from torch.export.graph_signature import InputKind

    kind_of = {
        InputKind.USER_INPUT: "user_input",
        InputKind.PARAMETER: "parameter",
        InputKind.BUFFER: "buffer",
        InputKind.CONSTANT_TENSOR: "constant",
    }
    kinds, names = [], []
    for spec in ep.graph_signature.input_specs:
        if spec.kind not in kind_of:
            raise CaptureError(f"exported input {spec.arg.name} of kind {spec.kind.name} is not supported")
        kinds.append(kind_of[spec.kind])
        names.append(spec.target or spec.arg.name)
    return without_unread_weights(graph_to_document(ep.graph_module, kinds, names, name=name))
