"""One graph region that sticksat compiles and runs, and the seam for how it does so.

    executable = compile_region(doc, options)      # doc: graph document (dict)
    region = CompiledRegion(doc, executable, returns_tuple=True)
    outputs = region.run(torch_args)               # torch in, torch out

`compile_region` is the seam: today it validates and lowers the document in process and
runs the lowered primitive graph on lowering's numpy reference interpreter. The
simulator (run the planned SuperDSC program) and the HTTP service (POST the document to
STICKSAT_URL) replace what it returns; anything with `run(inputs_by_id) -> arrays` and
an optional `last_latency_us` fits.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol, Sequence

import numpy as np
import torch

from backend.options import BackendOptions
from lowering.graph_format import GraphDocument
from lowering.lower import constant_inputs
from lowering.validate import parse_document, validate_document

log = logging.getLogger("sticksat")

_TORCH_DTYPES = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "float64": torch.float64, "int64": torch.int64, "int32": torch.int32, "int16": torch.int16,
    "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
}


class Executable(Protocol):
    """A compiled region: graph-input id -> array in, graph outputs (document order) out."""

    def run(self, inputs_by_id: dict[str, np.ndarray]) -> Sequence[np.ndarray]: ...


@dataclass
class InterpreterExecutable:
    """Runs the lowered primitive graph on lowering's numpy reference interpreter."""

    prim_graph: Any
    executor: str = "interpreter"
    last_latency_us: Optional[float] = None  # the interpreter does not model time

    def run(self, inputs_by_id: dict[str, np.ndarray]) -> Sequence[np.ndarray]:
        from target.interpreter import interpret

        return interpret(self.prim_graph, inputs_by_id)


class SimulatedProgramExecutable:
    """A planned SuperDSC program, run on the simulator. The program is validated and
    timed here against the local hardware description before it is accepted, whoever
    planned it (this process or the service): a program for another machine description
    (digest mismatch) or one the validator rejects is an error, never silently wrong
    numbers."""

    executor = "simulator"

    def __init__(self, program: dict):
        from simulator.api import simulate
        from target.hardware import load_target
        from target.superdsc import Program

        self.program = Program.model_validate(program)
        self.hw = load_target(self.program.hardware)
        if self.program.stats.hardware_digest != self.hw.digest:
            raise RuntimeError(
                f"the program was planned for {self.program.hardware} digest "
                f"{self.program.stats.hardware_digest[:12]}, this client has {self.hw.digest[:12]}: "
                f"the two sides disagree on the machine description")
        verdict = simulate(self.program, hw=self.hw)
        if not verdict.valid:
            head = "; ".join(f"{e.code}: {e.message}" for e in verdict.errors[:3])
            raise RuntimeError(f"the planner returned a program the simulator rejects: {head}")
        self.last_latency_us: Optional[float] = verdict.simulated_us

    def run(self, inputs_by_id: dict[str, np.ndarray]) -> Sequence[np.ndarray]:
        from simulator.run import run_program

        return run_program(self.program, inputs_by_id, self.hw)


def compile_region(doc: dict, options: BackendOptions) -> Executable:
    """Validate one region's document and return how to run it:
    - a service URL (option `url` or $STICKSAT_URL): the service plans it and the
      returned program runs on the local simulator (backend/remote.py);
    - executor "simulator": plan it in process and run the program on the simulator;
    - executor "interpreter" (default): lower it and run lowering's reference interpreter."""
    document = parse_document(doc)
    validate_document(document)
    from backend.remote import compile_remote_executable, service_url

    url = service_url(options.url)
    if url is not None:
        return compile_remote_executable(doc, options, url)
    if options.executor == "simulator":
        from service.pipeline import compile_in_process

        program = compile_in_process(document, planner=options.planner, time_limit_s=options.time_limit_s,
                                     strict=options.strict)
        return SimulatedProgramExecutable(program)
    from lowering import lower_document

    return InterpreterExecutable(lower_document(document))


@dataclass
class RunInfo:
    """What the last region run did (for the demo and tests; H3 adds simulated time)."""

    graph_hash: str
    executor: str
    wall_seconds: float
    latency_us: Optional[float] = None


_last_run: list[RunInfo] = []
# The regions compiled in this process, newest last (bounded: a long-lived process
# recompiling many graphs must not keep every document alive).
_MAX_REMEMBERED = 64
_compiled: list["CompiledRegion"] = []


def last_run_info() -> Optional[RunInfo]:
    return _last_run[-1] if _last_run else None


def compiled_regions() -> list["CompiledRegion"]:
    """Regions compiled so far in this process (at most the last 64), oldest first."""
    return list(_compiled)


def forget_compiled_regions() -> None:
    _compiled.clear()
    _last_run.clear()


def to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16
        t = t.float()
    return t.contiguous().numpy()


def to_torch(array: np.ndarray, meta: dict) -> torch.Tensor:
    """The region's output as a tensor with the shape, dtype and (where it is a dense
    layout) strides the traced graph promised: AOTAutograd regenerates output views
    from their base with as_strided, which reads the base's memory layout."""
    dtype = _TORCH_DTYPES[meta["dtype"]]
    shape = tuple(meta["shape"])
    value = torch.from_numpy(np.ascontiguousarray(array))
    if tuple(value.shape) != shape:
        if value.numel() != int(np.prod(shape, dtype=np.int64)):
            raise RuntimeError(f"sticksat region returned shape {tuple(value.shape)}, expected {shape}")
        value = value.reshape(shape)
    value = value.to(dtype)
    stride = tuple(meta["stride"])
    if stride != value.stride() and _dense(shape, stride):
        out = torch.empty_strided(shape, stride, dtype=dtype)
        out.copy_(value)
        return out
    return value


def _dense(shape: tuple, stride: tuple) -> bool:
    """True when (shape, stride) is a permutation of a contiguous layout."""
    dims = sorted((s, n) for s, n in zip(stride, shape) if n != 1)
    expected = 1
    for s, n in dims:
        if s != expected:
            return False
        expected *= n
    return True


@dataclass
class CompiledRegion:
    """A region's document plus its executable, callable with torch tensors."""

    doc: dict
    executable: Executable
    # The traced region returned a tuple (vs a single tensor): keep that structure.
    returns_tuple: bool = True
    graph_hash: str = field(init=False)

    def __post_init__(self):
        document = GraphDocument.model_validate(self.doc)
        self.graph_hash = document.graph_hash()
        self._input_ids = [i.id for i in document.inputs]
        self._constants = constant_inputs(document)  # the graph's own tensor constants
        self._output_metas = []
        metas = {i.id: [i.meta] for i in document.inputs}
        metas.update({n.id: n.outputs for n in document.nodes})
        for ref in document.outputs:
            self._output_metas.append(metas[ref.node][ref.output].model_dump(mode="json"))
        _compiled.append(self)
        del _compiled[:-_MAX_REMEMBERED]

    def run(self, args: Sequence[torch.Tensor]) -> Any:
        if len(args) != len(self._input_ids):
            raise RuntimeError(f"region expects {len(self._input_ids)} inputs, got {len(args)}")
        inputs = {i: to_numpy(a) for i, a in zip(self._input_ids, args)}
        inputs.update(self._constants)
        start = time.perf_counter()
        arrays = self.executable.run(inputs)
        _last_run[:] = [RunInfo(self.graph_hash, getattr(self.executable, "executor", type(self.executable).__name__),
                                time.perf_counter() - start, getattr(self.executable, "last_latency_us", None))]
        if len(arrays) != len(self._output_metas):
            raise RuntimeError(f"region returned {len(arrays)} outputs, expected {len(self._output_metas)}")
        outputs = tuple(to_torch(a, m) for a, m in zip(arrays, self._output_metas))
        return outputs if self.returns_tuple else outputs[0]


class RegionModule(torch.nn.Module):
    """A CompiledRegion in place of a fused FX submodule (partitioned graphs)."""

    def __init__(self, region: CompiledRegion):
        super().__init__()
        self.region = region

    def forward(self, *args):
        return self.region.run(args)
