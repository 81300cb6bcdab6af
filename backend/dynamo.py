"""The `sticksat` torch.compile backend.

Registered through the `torch_dynamo_backends` entry point, so after installation
`torch.compile(model, backend="sticksat")` works without importing anything.

Path of one Dynamo graph: AOTAutograd with Inductor's decomposition table (the graph
Inductor would lower) -> partition by op support -> per supported region: graph
document -> validation -> compile_region (backend/region.py) -> CompiledRegion. The rest
runs in eager torch with one log line naming the ops; `strict` raises instead.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Optional, Sequence

import torch
import torch.fx

from backend.capture import CaptureError, classify_inputs, decomposition_table, graph_to_document
from backend.options import BackendOptions
from backend.partition import SticksatSupport, drop_assertions, fuse_supported, plan_partition
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

    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs):
        message = ("sticksat compiles inference graphs only: run the compiled model under torch.no_grad() "
                   "or torch.inference_mode(), or pass options={'on_grad': 'eager'} to run such calls in "
                   "eager torch")
        if opts.on_grad == "error" or opts.strict:
            raise SticksatBackendError(message)
        log.warning("sticksat: autograd is on, running this graph in eager torch")
        return gm.forward

    not_tensors = [type(t).__name__ for t in example_inputs if not isinstance(t, torch.Tensor)]
    if not_tensors:
        # Dynamo passes SymInts when it decided on dynamic shapes; format v1 is static.
        message = (f"graph has non-tensor inputs ({', '.join(sorted(set(not_tensors)))}): dynamic shapes are "
                   f"not supported; compile with torch.compile(..., dynamic=False)")
        if opts.strict:
            raise GraphError("symbolic_size", message)
        log.warning("sticksat: %s; running this graph in eager torch", message)
        return gm.forward

    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
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
    return compiler(gm, example_inputs)


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
    drop_assertions(gm)
    if not any(n.op == "call_function" for n in gm.graph.nodes):
        gm.sticksat_regions = []  # type: ignore[attr-defined]
        return gm  # nothing to compute: the graph only forwards its inputs
    names = {n.name for n in gm.graph.nodes}
    targets = _supported_targets()
    excluded: dict[str, str] = {}
    while True:
        try:
            return _compile_with(gm, input_kinds, input_names, opts, SticksatSupport(targets, excluded))
        except GraphError as e:
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
            return _eager_whole_graph(gm, f"the graph cannot be serialized ({e})", opts)
        validate_document(parse_document(doc), check_support=False)
        executable = _compile_region_or_eager(doc, opts)
        if executable is None:
            return gm
        region = CompiledRegion(doc, executable, returns_tuple=True)
        as_list = isinstance(gm.graph.output_node().args[0], list)

        def run(*args):
            outs = region.run(args)
            return list(outs) if as_list else outs

        run.sticksat_regions = [region]  # type: ignore[attr-defined]
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
        executable = _compile_region_or_eager(doc, opts)
        if executable is None:
            continue
        region = CompiledRegion(doc, executable, returns_tuple=isinstance(output, (tuple, list)))
        setattr(fused, node.target, RegionModule(region))
        regions.append(region)
    fused.recompile()
    # One line per compiled graph, written once every region compiled (a retry after a
    # lowering refusal does not repeat it).
    total = len(plan.supported) + len(plan.unsupported)
    log.warning("sticksat: %d of %d ops fall back to eager torch: %s", len(plan.unsupported), total, summary)
    fused.sticksat_regions = regions  # type: ignore[attr-defined]
    return fused


def _compile_region_or_eager(doc: dict, opts: BackendOptions):
    """compile_region, except that an unreachable service yields None (run this part in
    eager torch) when the user asked for that with on_service_error='eager'."""
    from backend.remote import ServiceUnavailable

    try:
        return compile_region(doc, opts)
    except ServiceUnavailable as e:
        if opts.on_service_error != "eager" or opts.strict:
            raise
        log.warning("sticksat: compile service unreachable (%s); running this graph in eager torch", e)
        return None


def _eager_whole_graph(gm: torch.fx.GraphModule, reason: str, opts: BackendOptions) -> Callable:
    if opts.strict:
        raise SticksatBackendError(f"sticksat (strict): {reason}")
    log.warning("sticksat: %s; running this graph in eager torch", reason)
    return gm
