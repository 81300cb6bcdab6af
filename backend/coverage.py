"""Coverage report: what of each compiled Dynamo graph runs on device and what on CPU.

For every graph the backend compiles it records one `GraphCoverage` (aten ops inside
compiled sticksat regions vs ops left to eager torch, the regions, the fallback ops by
target, the reason when the whole graph runs in eager torch, whether Dynamo compiled the
frame before or resumed after a graph break) and logs it as one INFO line on the
`sticksat` logger.

    compiled = torch.compile(model, backend="sticksat", dynamic=False)
    with backend.track_coverage() as cov:      # only the graphs compiled in this block
        compiled(*inputs)
    cov.device_fraction, cov.fallback_ops, cov.graph_breaks
    backend.coverage_report()                  # every graph compiled in this process

Counts are of the ATen graph AOTAutograd gives (after Inductor's decompositions), compute
nodes only (`call_function`, without the `getitem` bookkeeping of multi-output ops). A
graph that runs in eager torch before it reaches AOTAutograd (grad mode, dynamic shapes)
has no ATen graph: its count is of Dynamo's torch-level ops (`level="torch"`).
"""
from __future__ import annotations

import collections
import contextlib
import logging
import operator
import threading
from dataclasses import asdict, dataclass, field
from typing import Iterator, Optional

import torch
import torch.fx

log = logging.getLogger("sticksat")

# Whole-graph fallback reasons (GraphCoverage.reason's leading word).
GRAD_MODE = "grad_mode"
DYNAMIC_SHAPES = "dynamic_shapes"
SERIALIZATION = "serialization_error"
SERVICE_UNREACHABLE = "service_unreachable"
ZERO_SIZE = "zero_size"


@dataclass
class GraphCoverage:
    """One Dynamo graph compiled by the sticksat backend."""

    index: int                     # order of compilation in this process (from 1)
    code: str = ""                 # the frame Dynamo compiled: "forward (modeling_llama.py:345)"
    compile_id: str = ""           # Dynamo's "frame/compile" id, e.g. "0/0"; "0/1" is a recompile of frame 0
    total_ops: int = 0             # compute nodes of the graph
    device_ops: int = 0            # ... inside compiled sticksat regions
    cpu_ops: int = 0               # ... run by eager torch
    regions: int = 0               # compiled sticksat regions
    fallback_ops: dict[str, int] = field(default_factory=dict)  # target -> count of the cpu ops
    reason: Optional[str] = None   # why the whole graph runs in eager torch ("dynamic_shapes: ...")
    level: str = "aten"            # "aten", or "torch" when the graph never reached AOTAutograd
    recompile: bool = False        # Dynamo compiled this frame before (a guard failed)
    graph_break: bool = False      # the frame is Dynamo's resume function after a graph break
    compile_seconds: float = 0.0
    # for one concrete shape of a graph with symbolic sizes, compiled at call time: the
    # symbols' values ("s27=5, s75=3", and "(padded s27=5->8)")
    sizes: str = ""

    @property
    def device_fraction(self) -> float:
        return self.device_ops / self.total_ops if self.total_ops else 1.0

    def summary(self) -> str:
        where = f" [{self.code}{', ' + self.compile_id if self.compile_id else ''}]" if self.code else ""
        line = (f"sticksat: graph {self.index}{where}: {self.device_ops} of {self.total_ops} "
                f"{'ops' if self.level == 'aten' else 'torch-level ops'} on device in {self.regions} "
                f"region{'s' if self.regions != 1 else ''}, {self.cpu_ops} on CPU")
        if self.fallback_ops:
            line += f" ({format_histogram(self.fallback_ops)})"
        if self.reason:
            line += f"; whole graph in eager torch: {self.reason}"
        if self.sizes:
            line += f"; specialized for {self.sizes}"
        flags = [f for f, on in (("recompile", self.recompile), ("after a graph break", self.graph_break)) if on]
        if flags:
            line += f"; {', '.join(flags)}"
        return line + f"; compiled in {self.compile_seconds:.2f} s"

    def to_dict(self) -> dict:
        return {**asdict(self), "device_fraction": self.device_fraction}


@dataclass
class CoverageReport:
    """Totals over a set of compiled graphs plus the per-graph entries."""

    graphs: list[GraphCoverage]

    @property
    def total_ops(self) -> int:
        return sum(g.total_ops for g in self.graphs)

    @property
    def device_ops(self) -> int:
        return sum(g.device_ops for g in self.graphs)

    @property
    def cpu_ops(self) -> int:
        return sum(g.cpu_ops for g in self.graphs)

    @property
    def regions(self) -> int:
        return sum(g.regions for g in self.graphs)

    @property
    def device_fraction(self) -> float:
        return self.device_ops / self.total_ops if self.total_ops else 1.0

    @property
    def fallback_ops(self) -> dict[str, int]:
        total: collections.Counter = collections.Counter()
        for g in self.graphs:
            total.update(g.fallback_ops)
        return dict(sorted(total.items()))

    @property
    def graph_breaks(self) -> int:
        """Graphs Dynamo compiled from a resume function, i.e. after a graph break."""
        return sum(g.graph_break for g in self.graphs)

    @property
    def recompiles(self) -> int:
        return sum(g.recompile for g in self.graphs)

    @property
    def eager_graphs(self) -> list[GraphCoverage]:
        """Graphs that run entirely in eager torch, with their reasons."""
        return [g for g in self.graphs if g.reason]

    @property
    def compile_seconds(self) -> float:
        return sum(g.compile_seconds for g in self.graphs)

    def summary(self) -> str:
        text = (f"{self.device_ops} of {self.total_ops} ops on device ({100 * self.device_fraction:.1f}%) "
                f"in {self.regions} regions over {len(self.graphs)} graphs "
                f"({self.graph_breaks} graph breaks, {self.recompiles} recompiles)")
        if self.fallback_ops:
            text += f"; on CPU: {format_histogram(self.fallback_ops)}"
        for g in self.eager_graphs:
            text += f"; graph {g.index} in eager torch: {g.reason}"
        return text

    def to_dict(self) -> dict:
        return {"total_ops": self.total_ops, "device_ops": self.device_ops, "cpu_ops": self.cpu_ops,
                "device_fraction": self.device_fraction, "regions": self.regions, "graphs": len(self.graphs),
                "graph_breaks": self.graph_breaks, "recompiles": self.recompiles,
                "fallback_ops": self.fallback_ops, "compile_seconds": self.compile_seconds,
                "per_graph": [g.to_dict() for g in self.graphs]}


def format_histogram(hist: dict[str, int]) -> str:
    return ", ".join(f"{name} x{count}" for name, count in sorted(hist.items()))


# --- the process-wide record ------------------------------------------------------------

_lock = threading.Lock()
_graphs: list[GraphCoverage] = []
_MAX_REMEMBERED = 4096  # per-graph entries kept (totals of older ones are folded below)
_folded: list[GraphCoverage] = []  # at most one entry: the sum of forgotten graphs
_counter = 0
_trackers: list[list[GraphCoverage]] = []
_seen_codes: collections.Counter = collections.Counter()


def coverage_report() -> CoverageReport:
    """Every graph the backend compiled in this process since the last reset_coverage()
    (the oldest per-graph entries beyond 4,096 are kept only in the totals)."""
    with _lock:
        return CoverageReport(list(_folded) + list(_graphs))


def reset_coverage() -> None:
    global _counter
    with _lock:
        _graphs.clear()
        _folded.clear()
        _seen_codes.clear()
        _counter = 0


@contextlib.contextmanager
def track_coverage() -> Iterator[CoverageReport]:
    """A report that fills with the graphs compiled while the block runs (a model's first
    call compiles it; later calls compile only on a recompile or a new graph)."""
    report = CoverageReport([])
    with _lock:
        _trackers.append(report.graphs)
    try:
        yield report
    finally:
        with _lock:
            _trackers.remove(report.graphs)


def record(entry: GraphCoverage) -> GraphCoverage:
    """Number the entry, keep it, and log its one INFO line."""
    global _counter
    with _lock:
        _counter += 1
        entry.index = _counter
        _graphs.append(entry)
        if len(_graphs) > _MAX_REMEMBERED:
            _fold(_graphs.pop(0))
        for tracker in _trackers:
            tracker.append(entry)
    log.info("%s", entry.summary())
    return entry


def _fold(old: GraphCoverage) -> None:
    if not _folded:
        _folded.append(GraphCoverage(index=0, code="(older graphs)"))
    f = _folded[0]
    f.total_ops += old.total_ops
    f.device_ops += old.device_ops
    f.cpu_ops += old.cpu_ops
    f.regions += old.regions
    f.fallback_ops = dict(collections.Counter(f.fallback_ops) + collections.Counter(old.fallback_ops))
    f.recompile = f.recompile or old.recompile
    f.compile_seconds += old.compile_seconds


def dynamo_frame() -> dict:
    """What Dynamo tells about the graph being compiled: the frame's code, its compile id,
    whether it recompiles the frame or resumes it after a graph break. Empty outside a
    Dynamo compile (compile_graph called directly)."""
    info: dict = {}
    try:
        from torch._guards import CompileContext, TracingContext

        compile_id = CompileContext.current_compile_id()
        ctx = TracingContext.try_get()
    except Exception:  # noqa: BLE001 - private API: coverage must never break a compile
        return info
    code = None
    if ctx is not None and getattr(ctx, "traced_code", None):
        code = ctx.traced_code[0]
    if code is not None:
        filename = code.co_filename.rsplit("/", 1)[-1]
        info["code"] = f"{code.co_name} ({filename}:{code.co_firstlineno})"
        info["graph_break"] = code.co_name.startswith("torch_dynamo_resume_in_")
    if compile_id is not None and compile_id.frame_id is not None:
        info["compile_id"] = f"{compile_id.frame_id}/{compile_id.frame_compile_id}"
        info["recompile"] = bool(compile_id.frame_compile_id)
    elif code is not None:
        key = (code.co_filename, code.co_firstlineno, code.co_name)
        with _lock:
            info["recompile"] = _seen_codes[key] > 0
            _seen_codes[key] += 1
    return info


# --- counting ---------------------------------------------------------------------------

def compute_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The nodes that compute: ATen calls (or, in a Dynamo graph, torch calls, methods
    and modules), without getitem."""
    return [n for n in gm.graph.nodes
            if n.op in ("call_function", "call_method", "call_module") and n.target is not operator.getitem]


def node_label(node: torch.fx.Node) -> str:
    if node.op == "call_method":
        return f"Tensor.{node.target}"
    if node.op == "call_module":
        return f"module:{node.target}"
    from backend.partition import op_label

    return op_label(node)


def histogram(nodes) -> dict[str, int]:
    return dict(collections.Counter(node_label(n) for n in nodes))
