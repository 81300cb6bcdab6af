"""The `sticksat` torch.compile backend.

Registered through the `torch_dynamo_backends` entry point, so after installation
`torch.compile(model, backend="sticksat")` works without importing anything.

Path of one Dynamo graph: AOTAutograd with Inductor's decomposition table (the graph
Inductor would lower) -> partition by op support -> per supported region: graph
document -> validation -> compile_region (backend/region.py) -> CompiledRegion. The rest
runs in eager torch with one log line naming the ops; `strict` raises instead.
"""
from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Any, Callable, Optional, Sequence

import torch
import torch.fx

from backend import coverage
from backend.capture import CaptureError, classify_inputs, decomposition_table, graph_to_document
from backend.options import BackendOptions
from backend.partition import (SticksatSupport, drop_assertions, fuse_supported, plan_partition,
                               simplify_as_strided)
from backend.region import CompiledRegion, RegionModule, compile_region
from lowering.errors import GraphError
from lowering.validate import parse_document, validate_document

log = logging.getLogger("sticksat")


class SticksatBackendError(RuntimeError):
    """The backend cannot (or, in strict mode, will not) compile this graph."""


def _supported_targets() -> frozenset[str]:
    from lowering.validate import supported_targets

    return supported_targets()


def sticksat_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                     options: Optional[dict] = None, **kwargs: Any) -> Callable:
    """Dynamo backend entry point. `options` is torch.compile's `options=` dict; extra
    keyword options (when called directly) are merged into it."""
    kwargs.pop("mode", None)  # torch.compile passes mode=None through; it has no meaning here
    opts = BackendOptions.from_mapping({**(options or {}), **kwargs})
    _compile_started.at = time.perf_counter()

    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs):
        message = ("sticksat compiles inference graphs only: run the compiled model under torch.no_grad() "
                   "or torch.inference_mode(), or pass options={'on_grad': 'eager'} to run such calls in "
                   "eager torch")
        if opts.on_grad == "error" or opts.strict:
            raise SticksatBackendError(message)
        return _eager_dynamo_graph(gm, f"{coverage.GRAD_MODE}: autograd is on and an input requires grad "
                                       f"(on_grad='eager')")

    from backend.specialize import ShapeSpecializer, SpecializeError, is_symbolic

    if is_symbolic(gm, example_inputs):
        # Symbolic sizes: one static program per concrete shape, compiled at call time.
        try:
            return ShapeSpecializer(gm, example_inputs, functools.partial(compile_static, opts=opts),
                                    buckets=opts.buckets, pad_values=opts.pad_values, frame=coverage.dynamo_frame())
        except SpecializeError as e:
            message = f"{e}; compile with torch.compile(..., dynamic=False)"
            if opts.strict:
                raise GraphError("symbolic_size", message) from None
            return _eager_dynamo_graph(gm, f"{coverage.DYNAMIC_SHAPES}: {message}")
        finally:
            _compile_started.at = None
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    return compile_static(gm, list(example_inputs), names, opts=opts)


def compile_static(gm: torch.fx.GraphModule, example_inputs: list, names: Sequence[str],
                   opts: Optional[BackendOptions] = None, specialization: Optional[dict] = None) -> Callable:
    """AOTAutograd (Inductor's decompositions) then `compile_graph` on a Dynamo graph whose
    inputs are all tensors with static sizes. `specialization` (the Dynamo frame and the
    sizes, from backend.specialize) labels the coverage entry of a graph compiled at call
    time for one concrete shape of a symbolic graph."""
    opts = opts or BackendOptions()
    kinds = classify_inputs(example_inputs, names)
    from torch._dynamo.backends.common import aot_autograd

    def fw_compiler(aot_gm: torch.fx.GraphModule, aot_inputs: Sequence[Any]) -> Callable:
        # In inference mode AOTAutograd keeps Dynamo's flat inputs in order; if it ever
        # adds or drops some, every input is labelled a user input (labels only).
        placeholders = [n for n in aot_gm.graph.nodes if n.op == "placeholder"]
        same = len(placeholders) == len(kinds)
        return compile_graph(aot_gm, kinds if same else ["user_input"] * len(placeholders),
                             names if same else None, opts)

    compiler = aot_autograd(fw_compiler=fw_compiler, decompositions=decomposition_table())
    if specialization is None:
        return compiler(gm, example_inputs)
    _specialization.frame = specialization
    _compile_started.at = time.perf_counter()
    try:
        return compiler(gm, example_inputs)
    finally:
        _specialization.frame = None


# When the current Dynamo graph's compile started (its coverage entry's compile time
# includes AOTAutograd's trace).
_compile_started = threading.local()
# The Dynamo frame and concrete sizes of a specialization compiled at call time (outside
# Dynamo's compile, so its frame is not Dynamo's current one).
_specialization = threading.local()


def _eager_dynamo_graph(gm: torch.fx.GraphModule, reason: str) -> Callable:
    """The whole Dynamo graph runs in eager torch: a WARNING naming the reason, and a
    coverage entry counting its torch-level ops as CPU ops."""
    log.warning("sticksat: running this graph in eager torch: %s", reason)
    nodes = coverage.compute_nodes(gm)
    _record(total=len(nodes), device=0, regions=0, fallback=coverage.histogram(nodes), reason=reason,
            level="torch")
    return gm.forward


def _record(total: int, device: int, regions: int, fallback: dict[str, int], reason: Optional[str] = None,
            level: str = "aten") -> coverage.GraphCoverage:
    started = getattr(_compile_started, "at", None)
    _compile_started.at = None
    seconds = time.perf_counter() - started if started is not None else 0.0
    frame = getattr(_specialization, "frame", None) or coverage.dynamo_frame()
    return coverage.record(coverage.GraphCoverage(
        index=0, total_ops=total, device_ops=device, cpu_ops=total - device, regions=regions,
        fallback_ops=dict(sorted(fallback.items())), reason=reason, level=level, compile_seconds=seconds, **frame))


# Lowering errors that mean "sticksat cannot run this node" (argument-dependent limits
# such as grouped convolution): outside strict mode the node joins the eager fallback.
# Other codes (shape/dtype mismatch) would mean lowering disagrees with torch: raised.
_FALLBACK_CODES = frozenset({"unsupported_op", "bad_argument"})


def compile_graph(gm: torch.fx.GraphModule, input_kinds: Sequence[str], input_names: Optional[Sequence[str]],
                  opts: BackendOptions) -> Callable:
    """Compile one ATen-level inference graph: one region if every op is supported,
    else supported regions fused into submodules and the rest left to eager torch.

    An op the support table accepts can still be refused by the lowering for its
    arguments; that node is then excluded and the graph partitioned again (at most once
    per node), so the fallback log line names it too."""
    if getattr(_compile_started, "at", None) is None:
        _compile_started.at = time.perf_counter()  # called directly, not through sticksat_backend
    drop_assertions(gm)
    simplify_as_strided(gm)
    if not any(n.op == "call_function" for n in gm.graph.nodes):
        gm.sticksat_regions = []  # type: ignore[attr-defined]
        _record(total=0, device=0, regions=0, fallback={})
        return gm  # nothing to compute: the graph only forwards its inputs
    names = {n.name for n in gm.graph.nodes}
    targets = _supported_targets()
    excluded: dict[str, str] = {}
    while True:
        try:
            return _compile_with(gm, input_kinds, input_names, opts, SticksatSupport(targets, excluded))
        except GraphError as e:
            if e.code == "zero_size" and not opts.strict:
                # an empty tensor (e.g. a KV cache before its first token): format v1 has none
                return _eager_whole_graph(gm, f"{coverage.ZERO_SIZE}: {e.message}", opts)
            if opts.strict or e.code not in _FALLBACK_CODES or e.node not in names or e.node in excluded:
                raise
            excluded[e.node] = f"{e.code}: {e.message}"


def _copy_graph_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy to partition (fusing rewrites the graph in place); node names and meta
    (shallow) are kept, so document ids stay the FX node names."""
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    return torch.fx.GraphModule(gm, graph)


def _compile_with(gm: torch.fx.GraphModule, input_kinds: Sequence[str], input_names: Optional[Sequence[str]],
                  opts: BackendOptions, support: SticksatSupport) -> Callable:
    plan = plan_partition(gm, support)
    if plan.fully_supported:
        try:
            doc = graph_to_document(gm, input_kinds, input_names, name=opts.name)
        except CaptureError as e:
            return _eager_whole_graph(gm, f"{coverage.SERIALIZATION}: the graph cannot be serialized ({e})", opts)
        validate_document(parse_document(doc), check_support=False)
        executable = _compile_region_or_eager(doc, opts, "this graph")
        if executable is None:
            return _eager_whole_graph(gm, f"{coverage.SERVICE_UNREACHABLE} (on_service_error='eager')", opts,
                                      logged=True)
        region = CompiledRegion(doc, executable, returns_tuple=True)
        as_list = isinstance(gm.graph.output_node().args[0], list)

        def run(*args):
            outs = region.run(args)
            return list(outs) if as_list else outs

        run.sticksat_regions = [region]  # type: ignore[attr-defined]
        total = len(coverage.compute_nodes(gm))
        run.sticksat_coverage = _record(total=total, device=total, regions=1, fallback={})  # type: ignore[attr-defined]
        return run

    summary = plan.fallback_summary()
    if opts.strict:
        raise GraphError("unsupported_op", f"ops sticksat cannot lower (strict mode): {summary}",
                         plan.unsupported[0].name)
    fused = _copy_graph_module(gm)
    # Keyed by placeholder name: fusing may replace the placeholder node objects (torch
    # 2.13's partitioner does), and a lookup by node would then label weights user inputs.
    placeholders = [n.name for n in fused.graph.nodes if n.op == "placeholder"]
    kind_of = dict(zip(placeholders, input_kinds))
    name_of = dict(zip(placeholders, input_names or placeholders))
    regions = []
    device_ops = 0
    if plan.supported:
        fused = fuse_supported(fused, support)
    for node in list(fused.graph.nodes):
        if node.op != "call_module" or not str(node.target).startswith("fused_"):
            continue
        sub = getattr(fused, node.target)
        sub_kinds, sub_names = [], []
        for arg in node.args:
            # A region input is an input of the whole graph (keeps its kind), a tensor
            # constant of it, or a value computed by eager torch, which the region receives
            # like a user input.
            key = arg.name if isinstance(arg, torch.fx.Node) and arg.op == "placeholder" else None
            if isinstance(arg, torch.fx.Node) and arg.op == "get_attr":
                sub_kinds.append("constant")  # a tensor constant the outer graph passes in
            else:
                sub_kinds.append(kind_of.get(key, "user_input"))
            sub_names.append(name_of.get(key, arg.name if isinstance(arg, torch.fx.Node) else ""))
        try:
            doc = graph_to_document(sub, sub_kinds, sub_names, name=f"{opts.name}:{node.target}".strip(":"))
        except CaptureError as e:
            log.warning("sticksat: region %s cannot be serialized (%s); it runs in eager torch", node.target, e)
            continue
        validate_document(parse_document(doc), check_support=False)
        output = sub.graph.output_node().args[0]
        executable = _compile_region_or_eager(doc, opts, f"region {node.target}")
        if executable is None:
            continue
        region = CompiledRegion(doc, executable, returns_tuple=isinstance(output, (tuple, list)))
        setattr(fused, node.target, RegionModule(region))
        regions.append(region)
        device_ops += len(coverage.compute_nodes(sub))
    fused.recompile()
    # What runs on CPU: the unsupported ops, and the ops of any region that could not be
    # compiled (their own warning says why), counted from the final graph.
    cpu_nodes = [n for n in coverage.compute_nodes(fused)
                 if not (n.op == "call_module" and isinstance(getattr(fused, str(n.target), None), RegionModule))]
    for n in list(cpu_nodes):
        if n.op == "call_module":  # a fused region left to eager torch: count its ops
            cpu_nodes.remove(n)
            cpu_nodes.extend(coverage.compute_nodes(getattr(fused, str(n.target))))
    fallback = coverage.histogram(cpu_nodes)
    total = device_ops + len(cpu_nodes)
    # One WARNING per compiled graph, written once every region compiled (a retry after a
    # lowering refusal does not repeat it), then the coverage entry's INFO line.
    log.warning("sticksat: %d of %d ops fall back to eager torch: %s", len(cpu_nodes), total,
                coverage.format_histogram(fallback))
    fused.sticksat_regions = regions  # type: ignore[attr-defined]
    fused.sticksat_coverage = _record(total=total, device=device_ops, regions=len(regions),  # type: ignore[attr-defined]
                                      fallback=fallback)
    return fused


def _compile_region_or_eager(doc: dict, opts: BackendOptions, what: str):
    """compile_region, except that an unreachable service yields None (run this part in
    eager torch) when the user asked for that with on_service_error='eager'."""
    from backend.remote import ServiceUnavailable

    try:
        return compile_region(doc, opts)
    except ServiceUnavailable as e:
        if opts.on_service_error != "eager" or opts.strict:
            raise
        log.warning("sticksat: compile service unreachable (%s); running %s in eager torch", e, what)
        return None


def _eager_whole_graph(gm: torch.fx.GraphModule, reason: str, opts: BackendOptions,
                       logged: bool = False) -> Callable:
    """The whole ATen graph runs in eager torch: a WARNING naming the reason (unless the
    caller already wrote one) and a coverage entry."""
    if opts.strict:
        raise SticksatBackendError(f"sticksat (strict): {reason}")
    if not logged:
        log.warning("sticksat: running this graph in eager torch: %s", reason)
    nodes = coverage.compute_nodes(gm)
    gm.sticksat_coverage = _record(total=len(nodes), device=0, regions=0,  # type: ignore[attr-defined]
                                   fallback=coverage.histogram(nodes), reason=reason)
    return gm
