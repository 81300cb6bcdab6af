"""Convert a torch.export *serialized* program into the graph interchange document.

Accepted input: the exported-program JSON that `torch._export.serde.serialize.serialize(ep)`
produces (`.exported_program`), which is also the `models/model.json` entry of a `.pt2`
archive written by `torch.export.save`; or the archive bytes themselves. Only that JSON
entry is read: the weights and sample inputs in the archive are never opened (they may be
pickles). Parsing is plain JSON walking (schema: torch/_export/serde/schema.py, schema
version 8 and later, where every argument records whether it was positional or keyword).

The program must already be decomposed the way the torch backend decomposes
(`ep.run_decompositions(backend.capture.decomposition_table())`), so that its ops are the
ones the lowering knows; an undecomposed op (e.g. aten.linear) is reported as
`unsupported_op` by validation, like any other unsupported op.

The result is the same document `backend.capture.capture` produces from the live
ExportedProgram: the same node ids (FX node names survive serialization), targets, args,
metadata and therefore the same graph hash.
"""
from __future__ import annotations

import io
import json
import math
import zipfile
from typing import Any, Union

from lowering.errors import GraphError
from lowering.graph_format import GraphDocument, without_unread_weights
from lowering.validate import MAX_DOCUMENT_BYTES, parse_document

# torch/_export/serde/schema.py: ScalarType. Types the interchange format has no name for
# (complex, float8, unsigned > 8 bit) are rejected.
_SCALAR_TYPES = {
    1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float16", 7: "float32",
    8: "float64", 12: "bool", 13: "bfloat16",
}
# How the torch backend writes these placement hints (str() of the torch object).
_MEMORY_FORMATS = {1: "torch.contiguous_format", 2: "torch.channels_last",
                   3: "torch.channels_last_3d", 4: "torch.preserve_format"}
_LAYOUTS = {1: "torch.sparse_coo", 2: "torch.sparse_csr", 3: "torch.sparse_csc", 4: "torch.sparse_bsr",
            5: "torch.sparse_bsc", 6: "torch._mkldnn", 7: "torch.strided"}
_POSITIONAL, _KEYWORD = 1, 2

# Export-time metadata assertions compute nothing (backend/capture.py drops them too).
_ASSERTION_TARGETS = {
    "aten._assert_tensor_metadata.default",
    "aten._assert_scalar.default",
    "aten.sym_constrain_range_for_size.default",
}
_MIN_SCHEMA_MAJOR = 8
_MODEL_ENTRY = "models/model.json"


def read_export_archive(data: bytes) -> str:
    """The exported-program JSON inside a `.pt2` archive (torch.export.save)."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as e:
        raise GraphError("schema", f"not a .pt2 archive: {e}") from None
    with archive:
        entries = [i for i in archive.infolist() if i.filename.endswith("/" + _MODEL_ENTRY)
                   or i.filename == _MODEL_ENTRY]
        if len(entries) != 1:
            raise GraphError("schema", f"a .pt2 archive with one '{_MODEL_ENTRY}' entry is required "
                             f"(found {len(entries)})")
        entry = entries[0]
        # Checked before decompressing: a small archive may inflate to anything.
        if entry.file_size > MAX_DOCUMENT_BYTES:
            raise GraphError("schema", f"{entry.filename} is {entry.file_size} bytes; the limit is "
                             f"{MAX_DOCUMENT_BYTES}")
        raw = archive.read(entry)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise GraphError("schema", f"{entry.filename} is not UTF-8: {e}") from None


def document_from_export(raw: Union[bytes, str, dict], name: str = "") -> GraphDocument:
    """Serialized exported program (JSON text, dict, or .pt2 archive bytes) -> document.

    Raises GraphError for anything malformed or outside format v1; never anything else."""
    return parse_document(export_to_document_dict(raw, name))


def export_to_document_dict(raw: Union[bytes, str, dict], name: str = "") -> dict:
    if isinstance(raw, (bytes, bytearray)) and bytes(raw[:4]) == b"PK\x03\x04":
        raw = read_export_archive(bytes(raw))
    if isinstance(raw, (bytes, bytearray, str)):
        if len(raw) > MAX_DOCUMENT_BYTES:
            raise GraphError("schema", f"exported program is {len(raw)} bytes; the limit is {MAX_DOCUMENT_BYTES}")
        try:
            # torch's serializer writes non-finite floats as the strings "Infinity",
            # "-Infinity", "NaN"; bare NaN tokens are not JSON and are refused.
            program = json.loads(raw, parse_constant=_refuse_constant)
        except (ValueError, UnicodeDecodeError) as e:
            raise GraphError("schema", f"exported program is not valid JSON: {e}") from None
        except RecursionError:
            raise GraphError("schema", "exported program is nested too deeply") from None
    else:
        program = raw
    try:
        return _Converter(program).document(name)
    except GraphError:
        raise
    except RecursionError:
        raise GraphError("schema", "exported program is nested too deeply") from None
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        # A structurally broken program: report it, never a traceback.
        raise GraphError("schema", f"malformed exported program: {type(e).__name__}: {e}") from None


def _refuse_constant(token: str) -> Any:
    raise ValueError(f"{token} is not valid JSON")


def _obj(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise GraphError("schema", f"{where}: expected an object, got {type(value).__name__}")
    return value


def _list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise GraphError("schema", f"{where}: expected a list, got {type(value).__name__}")
    return value


def _union(value: Any, where: str) -> tuple[str, Any]:
    """torch serializes a union as a one-key object {"as_int": 3}."""
    value = _obj(value, where)
    if len(value) != 1:
        raise GraphError("schema", f"{where}: expected a one-key union object, got keys {sorted(value)}")
    (tag, inner), = value.items()
    return tag, inner


def _float(value: Any) -> Any:
    if isinstance(value, str):
        special = {"Infinity": "inf", "-Infinity": "-inf", "NaN": "nan"}
        if value not in special:
            raise GraphError("schema", f"float value {value!r} is not a number")
        return special[value]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GraphError("schema", f"float value {value!r} is not a number")
    value = float(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise GraphError("schema", f"{where}: expected an integer, got {value!r}")
    return value


class _Converter:
    def __init__(self, program: Any):
        self.program = _obj(program, "exported program")
        version = self.program.get("schema_version")
        major = version.get("major") if isinstance(version, dict) else None
        if not isinstance(major, int) or major < _MIN_SCHEMA_MAJOR:
            raise GraphError("schema", f"exported-program schema version {major} is too old; version "
                             f"{_MIN_SCHEMA_MAJOR}+ (torch >= 2.6) records argument kinds")
        module = _obj(self.program.get("graph_module"), "graph_module")
        self.graph = _obj(module.get("graph"), "graph_module.graph")
        self.signature = _obj(module.get("signature"), "graph_module.signature")
        self.tensor_values = _obj(self.graph.get("tensor_values", {}), "graph.tensor_values")
        self.sym_int_values = _obj(self.graph.get("sym_int_values", {}), "graph.sym_int_values")
        # tensor name -> (node id, output index)
        self.ref_of: dict[str, tuple[str, int]] = {}

    # -- metadata ---------------------------------------------------------------------
    def _size(self, value: Any, where: str) -> Any:
        tag, inner = _union(value, where)
        if tag == "as_int":
            return _int(inner, where)
        if tag == "as_expr":
            expr = _obj(inner, where).get("expr_str", "?")
            return {"sym": str(expr)[:256]}
        raise GraphError("schema", f"{where}: unknown size form {tag}")

    def _meta(self, tensor_name: str, node_id: str) -> dict:
        meta = self.tensor_values.get(tensor_name)
        if meta is None:
            raise GraphError("schema", f"tensor '{tensor_name}' has no entry in graph.tensor_values", node_id)
        meta = _obj(meta, f"tensor_values[{tensor_name}]")
        dtype = _SCALAR_TYPES.get(meta.get("dtype"))
        if dtype is None:
            raise GraphError("dtype_mismatch", f"tensor '{tensor_name}' has scalar type {meta.get('dtype')}, "
                             f"which format v1 does not carry", node_id)
        where = f"tensor_values[{tensor_name}]"
        return {
            "shape": [self._size(s, where + ".sizes") for s in _list(meta.get("sizes"), where + ".sizes")],
            "stride": [self._size(s, where + ".strides") for s in _list(meta.get("strides"), where + ".strides")],
            "storage_offset": self._size(meta.get("storage_offset", {"as_int": 0}), where + ".storage_offset"),
            "dtype": dtype,
        }

    # -- arguments --------------------------------------------------------------------
    def _tensor_ref(self, value: Any, node_id: str) -> dict:
        tensor_name = _obj(value, "tensor argument").get("name")
        if tensor_name not in self.ref_of:
            # Left for validation to report as a dangling reference with full context.
            return {"kind": "tensor", "node": str(tensor_name), "output": 0}
        ref_node, index = self.ref_of[tensor_name]
        return {"kind": "tensor", "node": ref_node, "output": index}

    def _sym_int(self, value: Any, node_id: str) -> dict:
        tag, inner = _union(value, "sym int")
        if tag == "as_int":
            return {"kind": "int", "value": _int(inner, "sym int")}
        return {"kind": "sym", "sym": str(inner)[:256]}

    def _optional_tensor(self, value: Any, node_id: str) -> dict:
        tag, inner = _union(value, "optional tensor")
        if tag == "as_none":
            return {"kind": "none"}
        if tag == "as_tensor":
            return self._tensor_ref(inner, node_id)
        raise GraphError("schema", f"optional tensor form {tag} is unknown", node_id)

    def _arg(self, value: Any, node_id: str) -> dict:
        tag, inner = _union(value, f"argument of node '{node_id}'")
        scalar = {
            "as_none": lambda v: {"kind": "none"},
            "as_tensor": lambda v: self._tensor_ref(v, node_id),
            "as_int": lambda v: {"kind": "int", "value": _int(v, "int argument")},
            "as_float": lambda v: {"kind": "float", "value": _float(v)},
            "as_bool": lambda v: {"kind": "bool", "value": _bool(v)},
            "as_string": lambda v: {"kind": "str", "value": _str(v)},
            "as_scalar_type": lambda v: {"kind": "dtype", "value": self._scalar_type(v, node_id)},
            "as_memory_format": lambda v: {"kind": "str", "value": _enum(_MEMORY_FORMATS, v, "memory format")},
            "as_layout": lambda v: {"kind": "str", "value": _enum(_LAYOUTS, v, "layout")},
            "as_device": lambda v: {"kind": "str", "value": _device(v)},
            "as_sym_int": lambda v: self._sym_int(v, node_id),
            "as_optional_tensor": lambda v: self._optional_tensor(v, node_id),
        }
        if tag in scalar:
            return scalar[tag](inner)
        element = {
            "as_tensors": lambda v: self._tensor_ref(v, node_id),
            "as_ints": lambda v: {"kind": "int", "value": _int(v, "int list")},
            "as_floats": lambda v: {"kind": "float", "value": _float(v)},
            "as_bools": lambda v: {"kind": "bool", "value": _bool(v)},
            "as_strings": lambda v: {"kind": "str", "value": _str(v)},
            "as_sym_ints": lambda v: self._sym_int(v, node_id),
            "as_optional_tensors": lambda v: self._optional_tensor(v, node_id),
        }
        if tag in element:
            return {"kind": "list", "items": [element[tag](v) for v in _list(inner, tag)]}
        if tag in ("as_int_lists", "as_float_lists"):
            convert = (lambda v: {"kind": "int", "value": _int(v, "int")}) if tag == "as_int_lists" \
                else (lambda v: {"kind": "float", "value": _float(v)})
            return {"kind": "list", "items": [{"kind": "list", "items": [convert(x) for x in _list(row, tag)]}
                                              for row in _list(inner, tag)]}
        if tag in ("as_sym_float", "as_sym_floats", "as_sym_bool", "as_sym_bools"):
            raise GraphError("symbolic_size", f"node '{node_id}' has a symbolic argument ({tag}); format v1 "
                             f"takes static shapes only", node_id)
        raise GraphError("unsupported_op", f"node '{node_id}' has an argument of kind {tag}, which format v1 "
                         f"does not carry", node_id)

    def _scalar_type(self, value: Any, node_id: str) -> str:
        dtype = _SCALAR_TYPES.get(value)
        if dtype is None:
            raise GraphError("dtype_mismatch", f"node '{node_id}' uses scalar type {value}, which format v1 "
                             f"does not carry", node_id)
        return dtype

    # -- graph ------------------------------------------------------------------------
    def _inputs(self) -> list[dict]:
        specs = _list(self.signature.get("input_specs"), "signature.input_specs")
        graph_inputs = _list(self.graph.get("inputs"), "graph.inputs")
        if len(specs) != len(graph_inputs):
            raise GraphError("schema", f"{len(specs)} input specs for {len(graph_inputs)} graph inputs")
        inputs = []
        for spec in specs:
            kind, body = _union(spec, "input spec")
            body = _obj(body, f"input spec {kind}")
            if kind == "user_input":
                arg_tag, arg = _union(body.get("arg"), "user input")
                if arg_tag != "as_tensor":
                    raise GraphError("schema", f"user input of kind {arg_tag}: only tensor inputs are supported")
                tensor_name, label = _obj(arg, "user input").get("name"), None
                input_kind = "user_input"
            elif kind in ("parameter", "buffer", "tensor_constant"):
                tensor_name = _obj(body.get("arg"), f"{kind} arg").get("name")
                label = body.get({"parameter": "parameter_name", "buffer": "buffer_name",
                                  "tensor_constant": "tensor_constant_name"}[kind])
                input_kind = {"tensor_constant": "constant"}.get(kind, kind)
            else:
                raise GraphError("schema", f"exported input of kind {kind} is not supported "
                                 f"(tensor user inputs, parameters, buffers and constants are)")
            if not isinstance(tensor_name, str):
                raise GraphError("schema", f"input spec {kind} has no tensor name")
            inputs.append({"id": tensor_name, "kind": input_kind,
                           "name": str(label if label else tensor_name)[:512],
                           "meta": self._meta(tensor_name, tensor_name)})
            self.ref_of[tensor_name] = (tensor_name, 0)
        return inputs

    def _node(self, raw: Any, position: int) -> dict | None:
        raw = _obj(raw, f"graph.nodes[{position}]")
        target = raw.get("target")
        if not isinstance(target, str):
            raise GraphError("schema", f"graph.nodes[{position}] has no target")
        outputs = _list(raw.get("outputs", []), f"graph.nodes[{position}].outputs")
        node_id = raw.get("name") if isinstance(raw.get("name"), str) else self._first_output_name(outputs, position)
        if not target.startswith(("torch.ops.aten.", "torch.ops.prims.")):
            raise GraphError("unsupported_op", f"node '{node_id}' calls {target}, which is not an aten/prims "
                             f"op (symbolic-size arithmetic and higher-order ops are outside format v1)", node_id)
        short_target = target[len("torch.ops."):]
        if short_target in _ASSERTION_TARGETS:
            return None
        args, kwargs = [], {}
        for k, named in enumerate(_list(raw.get("inputs", []), f"node '{node_id}' inputs")):
            named = _obj(named, f"node '{node_id}' input {k}")
            value = self._arg(named.get("arg"), node_id)
            kind = named.get("kind")
            if kind == _KEYWORD:
                kwargs[_str(named.get("name"))] = value
            elif kind == _POSITIONAL:
                if kwargs:
                    raise GraphError("schema", f"node '{node_id}': positional argument after keyword arguments",
                                     node_id)
                args.append(value)
            else:
                raise GraphError("schema", f"node '{node_id}' input {k} has argument kind {kind!r}; "
                                 f"positional (1) or keyword (2) is required", node_id)
        metas = []
        for out in outputs:
            tag, inner = _union(out, f"node '{node_id}' output")
            names = [inner] if tag == "as_tensor" else _list(inner, "outputs") if tag == "as_tensors" else None
            if names is None:
                if tag in ("as_sym_int", "as_sym_float", "as_sym_bool"):
                    raise GraphError("symbolic_size", f"node '{node_id}' ({short_target}) computes a symbolic "
                                     f"size; format v1 takes static shapes only", node_id)
                raise GraphError("unsupported_op", f"node '{node_id}' ({short_target}) has an output of kind "
                                 f"{tag}; only tensor outputs are supported", node_id)
            for tensor in names:
                tensor_name = _obj(tensor, "tensor output").get("name")
                if not isinstance(tensor_name, str):
                    raise GraphError("schema", f"node '{node_id}' has an unnamed output", node_id)
                self.ref_of[tensor_name] = (node_id, len(metas))
                metas.append(self._meta(tensor_name, node_id))
        if not metas:
            raise GraphError("unsupported_op", f"node '{node_id}' ({short_target}) produces no tensor", node_id)
        node = {"id": node_id, "target": short_target, "args": args, "outputs": metas}
        if kwargs:
            node["kwargs"] = kwargs
        return node

    @staticmethod
    def _first_output_name(outputs: list, position: int) -> str:
        for out in outputs:
            if isinstance(out, dict) and isinstance(out.get("as_tensor"), dict):
                return str(out["as_tensor"].get("name"))
        return f"node_{position}"

    def _outputs(self) -> list[dict]:
        specs = _list(self.signature.get("output_specs"), "signature.output_specs")
        refs = []
        for spec in specs:
            kind, body = _union(spec, "output spec")
            if kind != "user_output":
                raise GraphError("schema", f"exported output of kind {kind} is not supported (inference graphs "
                                 f"without buffer mutation have only user outputs)")
            tag, arg = _union(_obj(body, "user output").get("arg"), "user output")
            if tag != "as_tensor":
                raise GraphError("schema", f"graph output of kind {tag}: only tensor outputs are supported")
            refs.append(self._tensor_ref(arg, ""))
        return refs

    def document(self, name: str) -> dict:
        inputs = self._inputs()
        nodes = [n for k, raw in enumerate(_list(self.graph.get("nodes"), "graph.nodes"))
                 if (n := self._node(raw, k)) is not None]
        return without_unread_weights({"format": "sticksat.graph", "version": 1, "name": name[:256],
                                       "inputs": inputs, "nodes": nodes, "outputs": self._outputs()})


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise GraphError("schema", f"expected a boolean, got {value!r}")
    return value


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise GraphError("schema", f"expected a string, got {value!r}")
    return value


def _enum(table: dict[int, str], value: Any, what: str) -> str:
    if value not in table:
        raise GraphError("schema", f"unknown {what} {value!r}")
    return table[value]


def _device(value: Any) -> str:
    value = _obj(value, "device")
    index = value.get("index")
    return f"{_str(value.get('type'))}:{index}" if index is not None else _str(value.get("type"))
