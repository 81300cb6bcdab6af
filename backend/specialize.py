"""Graphs with symbolic sizes: one static program per concrete shape, optionally padded to buckets.

Dynamo hands the backend a graph with symbolic sizes when the model is compiled with
`dynamic=True`, after an automatic-dynamic recompile, or when an input dim was marked with
`torch._dynamo.mark_dynamic` (which applies even under `dynamic=False`; FMS generate and
vLLM's Spyre plugin mark batch, sequence, mask and KV-cache dims). Graph format v1 is static,
so `ShapeSpecializer` is the callable returned for such a graph: at call time it reads the
concrete sizes, binds every SymInt input of the graph to its value, traces the bound graph
on the real inputs (AOTAutograd with Inductor's decompositions, like any static graph) and
compiles it, once per distinct key. The key is every argument's size, stride, offset and
dtype plus the values of the SymInt arguments: anything the static graph's document
depends on. A repeated shape is a dictionary hit here; the same specialized document from
another process or graph is a store hit at the service (its content hash keys the store).

Padding (`options={"buckets": ..., "pad_values": ...}`) rounds a symbolic size up before the
key is formed, so a serving loop needs a handful of programs. It is only correct where
the padded positions cannot reach the real outputs (they are masked), which only the user
knows: every input tensor that carries a padded dim needs a declared pad value, and
padding is refused for a size (a WARNING, that size compiled exactly) when the graph cannot
be cut back exactly: an output or input dim that is an expression of it (a KV cache that
grows by one, `s0 + 1`; a flattened `s0*s1`) rather than the size itself. Padding goes at
the end of the dim; outputs are narrowed back to the real size on every dim that is the
padded size.
"""
from __future__ import annotations

import logging
import math
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch
import torch.fx

log = logging.getLogger("sticksat")


class SpecializeError(RuntimeError):
    """The graph has an input the specializer cannot bind (not a tensor, int, float or bool)."""


def _expr(size: Any):
    """The sympy expression of a symbolic size, or None for a static one."""
    if isinstance(size, torch.SymInt):
        node = size.node
        if node.is_constant() or not node.expr.free_symbols:
            return None
        return node.expr
    return None


def is_symbolic(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    """True when Dynamo traced this graph with symbolic sizes: a SymInt (or other
    non-tensor) input, or a placeholder whose traced value has a symbolic size or stride."""
    if any(not isinstance(a, torch.Tensor) for a in example_inputs):
        return True
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(val, torch.Tensor) and any(_expr(s) is not None for s in (*val.shape, *val.stride())):
            return True
    return False


def shape_key(args: Sequence[Any], scalars: Sequence[int] = ()) -> tuple:
    """What a static graph's document depends on besides values: sizes, strides, offsets
    and dtypes of the tensors, and the values of the SymInt arguments and of the scalar
    tensors at positions `scalars` (both are bound into the graph)."""
    key = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and i in scalars:
            key.append((str(a.dtype), a.item()))
        elif isinstance(a, torch.Tensor):
            key.append((tuple(a.shape), tuple(a.stride()), a.storage_offset(), a.dtype))
        else:
            key.append((type(a).__name__, a))
    return tuple(key)


def scalar_positions(gm: torch.fx.GraphModule) -> list[int]:
    """Inputs Dynamo passes as 0-d tensors that stand for a Python number (under
    `dynamic=True` a module's float attribute is not specialized: the graph reads it with
    `.item()`). They are bound to their value like a SymInt."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return [i for i, n in enumerate(placeholders)
            if getattr(n.meta.get("grapharg"), "pass_arg_as_tensor", False)]


def bind_symbols(gm: torch.fx.GraphModule, values: dict[int, Any]) -> torch.fx.GraphModule:
    """A copy of `gm` whose placeholders at the positions of `values` are replaced by those
    constants (the SymInt arguments of one call, or the numbers behind scalar tensors); the
    copy takes only the other inputs."""
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]

    def substitute(node: torch.fx.Node, value: Any) -> None:
        for user in list(node.users):
            user.args = torch.fx.node.map_arg(user.args, lambda n: value if n is node else n)
            user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda n: value if n is node else n)

    for position, value in values.items():
        ph = placeholders[position]
        for user in list(ph.users):  # a scalar tensor's .item() is the number itself
            if user.op == "call_method" and user.target == "item":
                substitute(user, value)
                graph.erase_node(user)
        substitute(ph, value)
        graph.erase_node(ph)
    graph.lint()
    return torch.fx.GraphModule(gm, graph)


# --- buckets -------------------------------------------------------------------------------

_SOURCE_PART = re.compile(r"\['([^']*)'\]|\[(\d+)\]|\.(\w+)")


def input_path(source_name: str) -> str:
    """`L['past_key_value_states'][0][1]` -> `past_key_value_states.0.1`; `L['kwargs']['mask']`
    -> `mask` (the name the user passes the input by)."""
    parts = [m.group(1) or m.group(2) or m.group(3) for m in _SOURCE_PART.finditer(source_name)]
    if len(parts) > 1 and parts[0] == "kwargs":
        parts = parts[1:]
    return ".".join(parts)


def _matches(path: str, name: str) -> bool:
    """`name`'s components appear in `path`, whole and in a row: `past_key_value_states`
    names `past_key_value_states.0.1`, `mask` names `attn_kwargs.mask` (a `**kwargs` argument)."""
    return f".{name}." in f".{path}."


def round_up(size: int, rule: Any) -> int:
    """The bucket of `size`: the next multiple of an int rule, the next entry of a list
    rule (the size itself above the last entry)."""
    if isinstance(rule, int):
        return size if size <= 0 else math.ceil(size / rule) * rule
    for b in sorted(rule):
        if b >= size:
            return b
    return size


@dataclass
class PaddingPlan:
    """Which symbols of one graph are padded, how, and how to cut the outputs back."""

    rules: dict[Any, Any] = field(default_factory=dict)             # symbol -> bucket rule
    # per tensor input position: [(dim, symbol)] dims to pad, and the pad value
    pads: dict[int, tuple[list[tuple[int, Any]], float]] = field(default_factory=dict)
    # per SymInt input position: its symbol
    sym_inputs: dict[int, Any] = field(default_factory=dict)
    # per flat output position: [(dim, symbol)] dims to cut back
    cuts: dict[int, list[tuple[int, Any]]] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)           # symbol name -> why


def _value(node: torch.fx.Node) -> Any:
    return node.meta.get("example_value", node.meta.get("val"))


def _source(node: torch.fx.Node) -> str:
    grapharg = node.meta.get("grapharg")
    source = getattr(grapharg, "source", None)
    return getattr(source, "name", "") if source is not None else ""


def plan_padding(gm: torch.fx.GraphModule, buckets: dict[str, Any], pad_values: dict[str, Any]) -> PaddingPlan:
    """Resolve the user's `buckets` ("input.dim" -> rule) to this graph's symbols and
    check that padding them can be cut back exactly (see the module docstring)."""
    plan = PaddingPlan()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    paths = [input_path(_source(n)) or n.name for n in placeholders]
    for key, rule in buckets.items():
        name, _, dim = key.rpartition(".")
        for ph, path in zip(placeholders, paths):
            val = _value(ph)
            if not _matches(path, name) or not isinstance(val, torch.Tensor) or int(dim) >= val.dim():
                continue
            expr = _expr(val.shape[int(dim)])
            if expr is None:
                continue  # static in this graph (e.g. the prefill graph of a decode bucket)
            if not expr.is_Symbol:
                plan.refused[str(expr)] = f"{path} dim {dim} is {expr}, not a size of its own"
                continue
            plan.rules.setdefault(expr, rule)
    padded = set(plan.rules)

    def dims_of(val: torch.Tensor, where: str) -> Optional[list[tuple[int, Any]]]:
        dims = []
        for d, s in enumerate(val.shape):
            expr = _expr(s)
            if expr is None or not (expr.free_symbols & padded):
                continue
            if expr.is_Symbol:
                dims.append((d, expr))
            else:
                for sym in expr.free_symbols & padded:
                    plan.refused[str(sym)] = f"{where} dim {d} is {expr}, which padding cannot cut back"
        return dims

    for i, (ph, path) in enumerate(zip(placeholders, paths)):
        val = _value(ph)
        if isinstance(val, torch.SymInt):
            expr = _expr(val)
            if expr is not None and expr in padded:
                plan.sym_inputs[i] = expr
            continue
        if not isinstance(val, torch.Tensor):
            continue
        dims = dims_of(val, f"input {path}")
        if not dims:
            continue
        fill = next((v for k, v in pad_values.items() if _matches(path, k)), None)
        if fill is None:
            for _, sym in dims:
                plan.refused[str(sym)] = f"input {path} carries it and has no pad value (pad_values)"
            continue
        plan.pads[i] = (dims, float(fill) if isinstance(fill, str) else fill)
    outputs = gm.graph.output_node().args[0]
    flat = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    for j, out in enumerate(flat):
        val = _value(out) if isinstance(out, torch.fx.Node) else out
        if isinstance(val, torch.Tensor):
            dims = dims_of(val, f"output {j}")
            if dims:
                plan.cuts[j] = dims
        else:
            expr = _expr(val) if isinstance(val, torch.SymInt) else None
            if expr is not None and expr.free_symbols & padded:
                for sym in expr.free_symbols & padded:
                    plan.refused[str(sym)] = f"output {j} is the size expression {expr}"
    if plan.refused:
        keep = {s for s in plan.rules if str(s) not in plan.refused}
        plan.rules = {s: r for s, r in plan.rules.items() if s in keep}
        plan.pads = {i: (d, v) for i, (dims, v) in plan.pads.items()
                     if (d := [(k, s) for k, s in dims if s in keep])}
        plan.sym_inputs = {i: s for i, s in plan.sym_inputs.items() if s in keep}
        plan.cuts = {j: d for j, dims in plan.cuts.items() if (d := [(k, s) for k, s in dims if s in keep])}
    return plan


def _pad(t: torch.Tensor, dim: int, to: int, fill: Any) -> torch.Tensor:
    extra = to - t.shape[dim]
    if extra <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = extra
    return torch.cat([t, torch.full(shape, fill, dtype=t.dtype, device=t.device)], dim=dim)


# --- the callable -------------------------------------------------------------------------

@dataclass
class Specialization:
    """One concrete shape of a symbolic graph, compiled."""

    sizes: dict[str, int]          # symbol -> the size it was compiled for (padded size when padded)
    compiled: Callable
    compile_seconds: float
    calls: int = 0


class ShapeSpecializer:
    """The callable the backend returns for a Dynamo graph with symbolic sizes."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                 compile_static: Callable[..., Callable],
                 buckets: Optional[dict[str, Any]] = None, pad_values: Optional[dict[str, Any]] = None,
                 frame: Optional[dict] = None):
        for a in example_inputs:
            if not isinstance(a, (torch.Tensor, int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)):
                raise SpecializeError(f"graph input of type {type(a).__name__} cannot be bound to a value")
        self.gm = gm
        self._compile_static = compile_static
        self.frame = dict(frame or {})
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        scalars = scalar_positions(gm)
        self._scalars = frozenset(scalars)
        self.symbol_positions = [i for i, a in enumerate(example_inputs)
                                 if not isinstance(a, torch.Tensor) or i in scalars]
        self.symbol_names = {i: placeholders[i].name for i in self.symbol_positions}
        self.tensor_names = [n.name for i, n in enumerate(placeholders) if i not in self.symbol_names]
        self.padding = plan_padding(gm, buckets or {}, pad_values or {}) if buckets else PaddingPlan()
        for sym, why in self.padding.refused.items():
            log.warning("sticksat: padding of size %s refused for graph %s: %s; it compiles each exact size",
                        sym, self.frame.get("code", ""), why)
        self.specializations: dict[tuple, Specialization] = {}
        self.hits = 0
        self._lock = threading.Lock()

    @property
    def compiles(self) -> int:
        return len(self.specializations)

    def _symbol_values(self, args: Sequence[Any]) -> dict[Any, int]:
        """The concrete value of every padded symbol in this call."""
        values: dict[Any, int] = {}
        for i, sym in self.padding.sym_inputs.items():
            values[sym] = int(args[i])
        for i, (dims, _) in self.padding.pads.items():
            for d, sym in dims:
                values.setdefault(sym, int(args[i].shape[d]))
        return values

    def _pad_args(self, args: Sequence[Any], real: dict[Any, int]) -> tuple[list, dict[Any, int]]:
        target = {sym: round_up(v, self.padding.rules[sym]) for sym, v in real.items()}
        out = list(args)
        for i, sym in self.padding.sym_inputs.items():
            out[i] = target[sym]
        for i, (dims, fill) in self.padding.pads.items():
            t = out[i]
            for d, sym in dims:
                t = _pad(t, d, target[sym], fill)
            out[i] = t.contiguous() if t is not args[i] else t
        return out, target

    def __call__(self, *args: Any) -> Any:
        real = self._symbol_values(args) if self.padding.rules else {}
        target = real
        if real:
            args, target = self._pad_args(args, real)
        key = shape_key(args, self._scalars)
        with self._lock:
            spec = self.specializations.get(key)
            if spec is None:
                spec = self._specialize(args, key, real, target)
            else:
                self.hits += 1
            spec.calls += 1
        tensors = [a for i, a in enumerate(args) if i not in self.symbol_names]
        out = spec.compiled(*tensors)
        if real and any(target[s] != real[s] for s in real):
            out = self._cut(out, real)
        return out

    def _specialize(self, args: Sequence[Any], key: tuple, real: dict, target: dict) -> Specialization:
        values = {i: args[i].item() if isinstance(args[i], torch.Tensor) else args[i] for i in self.symbol_positions}
        bound = bind_symbols(self.gm, values)
        sizes = {self.symbol_names[i]: v for i, v in values.items() if i not in self._scalars}
        label = ", ".join(f"{k}={v}" for k, v in sizes.items())
        padded = [f"{s}={real[s]}->{target[s]}" for s in real if target[s] != real[s]]
        if padded:
            label += f" (padded {', '.join(padded)})"
        tensors = [a for i, a in enumerate(args) if i not in self.symbol_names]
        started = time.perf_counter()
        # Dynamo's recompile flag belongs to the frame's first program, not to every shape
        frame = {**self.frame, "recompile": self.frame.get("recompile", False) and not self.specializations}
        compiled = self._compile_static(bound, tensors, self.tensor_names, specialization={**frame, "sizes": label})
        spec = Specialization(sizes, compiled, time.perf_counter() - started)
        self.specializations[key] = spec
        return spec

    def _cut(self, out: Any, real: dict[Any, int]) -> Any:
        seq = isinstance(out, (list, tuple))
        flat = list(out) if seq else [out]
        for j, dims in self.padding.cuts.items():
            t = flat[j]
            for d, sym in dims:
                if t.shape[d] != real[sym]:
                    t = t.narrow(d, 0, real[sym])
            flat[j] = t
        if not seq:
            return flat[0]
        return type(out)(flat) if isinstance(out, tuple) else flat
