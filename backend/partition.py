"""Split an ATen FX graph into regions sticksat runs and ops eager torch runs.

A node is supported when its op is in `lowering.SUPPORTED_TARGETS` and the interchange
document can describe it (tensor values of a known dtype with static shapes, literal
arguments it can serialize). Everything else stays in the FX graph and runs in torch.
"""
from __future__ import annotations

import collections
import operator
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional

import torch
import torch.fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from backend.capture import ASSERTION_OPS, CaptureError, arg_literal, dtype_name, target_name


def _static_tensor(value) -> bool:
    if not isinstance(value, torch.Tensor):
        return False
    try:
        dtype_name(value.dtype)
    except CaptureError:
        return False
    sizes = list(value.shape) + list(value.stride()) + [value.storage_offset()]
    return all(isinstance(s, int) for s in sizes)


def _node_values(node: torch.fx.Node) -> list:
    val = node.meta.get("val")
    return list(val) if isinstance(val, (list, tuple)) else [val]


def _lowering_accepts(target: str, args, kwargs) -> bool:
    # Argument-dependent limits (grouped convolution, attention dropout, ...) live with
    # the lowering; tensor arguments may be passed as FX nodes.
    from lowering import node_supported

    return node_supported(target, args, kwargs)


class SticksatSupport(OperatorSupportBase):
    """`excluded`: node name -> why the lowering refused that node's arguments."""

    def __init__(self, supported_targets: Iterable[str], excluded: Optional[Mapping[str, str]] = None):
        self.supported_targets = frozenset(supported_targets)
        self.excluded = dict(excluded or {})

    def is_node_supported(self, submodules: Mapping[str, torch.nn.Module], node: torch.fx.Node) -> bool:
        if node.op != "call_function" or node.name in self.excluded:
            return False
        if node.target is operator.getitem:
            source = node.args[0]
            return isinstance(source, torch.fx.Node) and self.is_node_supported(submodules, source)
        try:
            name = target_name(node.target)
        except CaptureError:
            return False
        if name not in self.supported_targets or not _lowering_accepts(name, node.args, node.kwargs):
            return False
        if not all(_static_tensor(v) for v in _node_values(node)):
            return False
        for arg in node.all_input_nodes:
            if not all(_static_tensor(v) for v in _node_values(arg)):
                return False
        try:
            # Literal arguments must be expressible in the document (the tensor refs are
            # resolved later; a placeholder map suffices to test the literals).
            refs = {a: ("x", 0) for a in node.all_input_nodes}
            for a in list(node.args) + list(node.kwargs.values()):
                arg_literal(a, refs)
        except CaptureError:
            return False
        return True


def op_label(node: torch.fx.Node) -> str:
    try:
        return target_name(node.target)
    except CaptureError:
        return getattr(node.target, "__name__", str(node.target))


def drop_assertions(gm: torch.fx.GraphModule) -> None:
    """Export-time metadata assertions compute nothing; they would otherwise be reported
    as fallback ops and split regions."""
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target in ASSERTION_OPS and not node.users:
            gm.graph.erase_node(node)
    gm.recompile()


def _row_major_restride(size, stride) -> bool:
    """True when `stride` is the row-major layout of `size` on every dim of size > 1 (the
    strides of size-1 dims never select an element)."""
    expected = 1
    for n, st in reversed(list(zip(size, stride))):
        if n != 1 and st != expected:
            return False
        expected *= n
    return True


def simplify_as_strided(gm: torch.fx.GraphModule) -> int:
    """Rewrite `aten.as_strided(x, size, stride)` as `aten.view(x, size)` where the two
    are the same values: x is contiguous from storage offset 0, the sizes hold as many
    elements, and `stride` is the row-major layout of `size` on every dim of size > 1.
    AOTAutograd emits such restrides after keepdim reductions (adaptive average pooling
    in Swin's pooler: `as_strided(mean, [1, 64, 1, 1], [64, 1, 64, 64])`); the lowering
    has no general as_strided (its result depends on the source's storage layout, which
    graph documents do not carry). Returns how many nodes were rewritten."""
    aten = torch.ops.aten
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.as_strided.default:
            continue
        src = node.args[0]
        size = node.args[1] if len(node.args) > 1 else node.kwargs.get("size")
        stride = node.args[2] if len(node.args) > 2 else node.kwargs.get("stride")
        offset = node.args[3] if len(node.args) > 3 else node.kwargs.get("storage_offset")
        val = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
        if not isinstance(val, torch.Tensor) or not _static_tensor(val) or offset not in (None, 0):
            continue
        if not all(isinstance(v, int) for v in list(size) + list(stride)) or len(size) != len(stride):
            continue
        numel = 1
        for n in size:
            numel *= n
        if (not val.is_contiguous() or val.storage_offset() != 0 or numel != val.numel()
                or not _row_major_restride(size, stride)):
            continue
        with gm.graph.inserting_before(node):
            view = gm.graph.call_function(aten.view.default, (src, list(size)))
        view.meta = dict(node.meta)
        node.replace_all_uses_with(view)
        gm.graph.erase_node(node)
        count += 1
    if count:
        gm.recompile()
    return count


@dataclass
class PartitionPlan:
    supported: list[torch.fx.Node]
    unsupported: list[torch.fx.Node]

    @property
    def fully_supported(self) -> bool:
        return not self.unsupported

    def fallback_histogram(self) -> dict[str, int]:
        return dict(collections.Counter(op_label(n) for n in self.unsupported))

    def fallback_summary(self) -> str:
        hist = self.fallback_histogram()
        return ", ".join(f"{name} x{count}" for name, count in sorted(hist.items()))


def plan_partition(gm: torch.fx.GraphModule, support: SticksatSupport) -> PartitionPlan:
    compute = [n for n in gm.graph.nodes if n.op == "call_function"]
    supported, unsupported = [], []
    for node in compute:
        (supported if support.is_node_supported({}, node) else unsupported).append(node)
    # getitem of an unsupported op is bookkeeping, not an op that fell back.
    unsupported = [n for n in unsupported if n.target is not operator.getitem]
    return PartitionPlan(supported, unsupported)


def fuse_supported(gm: torch.fx.GraphModule, support: SticksatSupport) -> torch.fx.GraphModule:
    """The graph with each supported region replaced by a call to a `fused_<k>` submodule."""
    partitioner = CapabilityBasedPartitioner(gm, support, allows_single_node_partition=True)
    partitions = partitioner.propose_partitions()
    return partitioner.fuse_partitions(partitions)
