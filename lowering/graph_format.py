"""The graph interchange document, format v1 (documented in docs/graph-format.md).

A client (the torch backend, or anyone) sends this JSON; the service never receives
weights, pickles or code. Every model is strict and bounded so a malformed or hostile
document fails in validation with a precise message instead of deep inside the solver.
"""
from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

FORMAT_NAME = "sticksat.graph"
FORMAT_VERSION = 1

MAX_NODES = 20_000
MAX_RANK = 8
MAX_ARGS = 64
MAX_LIST = 1024
# A tensor constant travels with its values, so it is bounded like a literal: what a model
# creates as a constant (mask scalars, small index tables) fits; weights never do.
MAX_CONSTANT_ELEMENTS = 4096
MAX_CONSTANTS = 256

DType = Literal["float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool"]

Ident = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_.\-]*$")]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class SymSize(_Strict):
    """A symbolic size. Format v1 only carries it so validation can name it precisely."""

    sym: Annotated[str, Field(max_length=256)]


Size = Union[Annotated[int, Field(ge=0, le=2**40)], SymSize]


class TensorMeta(_Strict):
    shape: Annotated[list[Size], Field(max_length=MAX_RANK)]
    stride: Annotated[list[Size], Field(max_length=MAX_RANK)]
    storage_offset: Size = 0
    dtype: DType


class TensorRef(_Strict):
    kind: Literal["tensor"] = "tensor"
    node: Ident
    output: Annotated[int, Field(ge=0, le=16)] = 0


class IntArg(_Strict):
    kind: Literal["int"] = "int"
    value: Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]


class FloatArg(_Strict):
    kind: Literal["float"] = "float"
    # JSON has no inf/nan: they travel as strings.
    value: Union[float, Literal["inf", "-inf", "nan"]]


class BoolArg(_Strict):
    kind: Literal["bool"] = "bool"
    value: bool


class NoneArg(_Strict):
    kind: Literal["none"] = "none"


class StrArg(_Strict):
    """Enum-like string arguments (e.g. gelu's approximate='tanh', a memory format)."""

    kind: Literal["str"] = "str"
    value: Annotated[str, Field(max_length=64)]


class DTypeArg(_Strict):
    kind: Literal["dtype"] = "dtype"
    value: DType


class SymArg(_Strict):
    """A symbolic int argument (rejected by v1 validation, named precisely)."""

    kind: Literal["sym"] = "sym"
    sym: Annotated[str, Field(max_length=256)]


class ListArg(_Strict):
    kind: Literal["list"] = "list"
    items: Annotated[list["Arg"], Field(max_length=MAX_LIST)]


Arg = Annotated[
    Union[TensorRef, IntArg, FloatArg, BoolArg, NoneArg, StrArg, DTypeArg, SymArg, ListArg],
    Field(discriminator="kind"),
]
ListArg.model_rebuild()


class GraphInput(_Strict):
    id: Ident
    kind: Literal["user_input", "parameter", "buffer", "constant"]
    # The model's own name for it (parameter FQN); informational, not hashed.
    name: Annotated[str, Field(max_length=512)] = ""
    meta: TensorMeta


ConstantValue = Union[bool, int, float, Literal["inf", "-inf", "nan"]]


class GraphConstant(_Strict):
    """A tensor constant of the graph (an FX `get_attr` tensor: e.g. the 0-d int64 scalars
    an attention-mask builder creates): its values in row-major order, non-finite floats
    as strings like float literals. Referenced by id like a graph input."""

    id: Ident
    meta: TensorMeta
    values: Annotated[list[ConstantValue], Field(max_length=MAX_CONSTANT_ELEMENTS)]


class Node(_Strict):
    id: Ident
    target: Annotated[str, Field(max_length=128, pattern=r"^(aten|prims|transformers|moe|spyre)\.[A-Za-z0-9_]+\.[A-Za-z0-9_]+$")]
    args: Annotated[list[Arg], Field(max_length=MAX_ARGS)] = []
    kwargs: Annotated[dict[Ident, Arg], Field(max_length=MAX_ARGS)] = {}
    outputs: Annotated[list[TensorMeta], Field(max_length=16)]


def _tensor_ids(value: Any, into: set[str]) -> None:
    if isinstance(value, dict):
        if value.get("kind") == "tensor" and isinstance(value.get("node"), str):
            into.add(value["node"])
        for v in value.values():
            _tensor_ids(v, into)
    elif isinstance(value, list):
        for v in value:
            _tensor_ids(v, into)


def without_unread_weights(doc: dict) -> dict:
    """`doc` (a document as a dict) without the parameters, buffers and constants no node and
    no output reads: an exported model's dead weights (a rotary table kept for reference,
    an attention module's empty placeholder tensors) are not part of its computation. Both
    export paths (live capture and a serialized program) apply it, so they stay equal."""
    read: set[str] = set()
    _tensor_ids(doc.get("nodes", []), read)
    _tensor_ids(doc.get("outputs", []), read)
    inputs = [i for i in doc.get("inputs", []) if i.get("kind") == "user_input" or i.get("id") in read]
    return {**doc, "inputs": inputs}


class GraphDocument(_Strict):
    format: Literal["sticksat.graph"] = FORMAT_NAME
    version: Literal[1] = FORMAT_VERSION
    name: Annotated[str, Field(max_length=256)] = ""
    inputs: Annotated[list[GraphInput], Field(max_length=MAX_NODES)]
    nodes: Annotated[list[Node], Field(max_length=MAX_NODES)]
    constants: Annotated[list[GraphConstant], Field(max_length=MAX_CONSTANTS)] = []
    outputs: Annotated[list[TensorRef], Field(min_length=1, max_length=MAX_NODES)]

    # -- canonical form and hash -------------------------------------------------------
    def canonical_json(self) -> str:
        """The hashed form: labels (graph name, parameter names) are left out, so two
        clients sending the same computation share one store entry."""
        data = self.model_dump(mode="json")
        data.pop("name", None)
        for inp in data["inputs"]:
            inp.pop("name", None)
        if not data["constants"]:
            del data["constants"]  # documents without constants hash as before they existed
        return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)

    def graph_hash(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | bytes) -> "GraphDocument":
        return cls.model_validate_json(text)
