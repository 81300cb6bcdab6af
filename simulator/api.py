"""The simulator facade: validate, time, run, compare.

`simulate(program, hw=None, inputs=None, graph=None, numerics=False, trace=None)`:
1. validates (simulator/validate.py); an invalid program is neither timed nor run;
2. times it with the timing model (simulator/timing.py);
3. with `numerics=True` runs it functionally (simulator/run.py) on `inputs` (or seeded
   random inputs) and, given the primitive graph it came from (callers lower a graph document
   first: the simulator sits below lowering), compares every output with the reference
   interpreter (target.interpreter.interpret); GraphMismatch when the graph is not the
   program's;
4. with `trace=PATH` writes a Chrome/Perfetto trace of the timing (simulator/trace.py);
   with `trace=True` returns it in `SimResult.trace`.

Errors: max_abs_err = max |out - ref| over all outputs; max_rel_err = max over outputs of
max |out - ref| / max |ref| (relative to the output's scale, so near-zero elements do not
blow it up). Both computed in float64 from the stored dtypes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Union

import numpy as np

from simulator.run import RunError, run_program
from simulator.timing import time_program
from simulator.trace import trace_document, write_trace
from simulator.validate import ProgramIssue, parse_program, validate_program
from target.hardware import load_target
from target.interpreter import InterpreterError, interpret
from target.primitives import PrimGraph
from target.superdsc import Program


class GraphMismatch(ValueError):
    """The reference graph given for numerics is not the one the program was compiled from
    (a client's mistake: the service answers it as a 422, like a graph error)."""

    code = "graph_mismatch"

    def __init__(self, message: str):
        self.message = message
        super().__init__(f"[{self.code}] {message}")

    def to_dict(self) -> dict:
        return {"code": self.code, "message": self.message, "node": None}


@dataclass
class SimResult:
    valid: bool
    errors: list[ProgramIssue]
    simulated_us: Optional[float] = None
    timing: Any = None                       # simulator.timing.TimingReport when timed
    outputs: Optional[list[np.ndarray]] = None
    reference: Optional[list[np.ndarray]] = None
    max_abs_err: Optional[float] = None
    max_rel_err: Optional[float] = None
    trace: Optional[dict] = None             # the Chrome/Perfetto trace document (trace=True)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        d: dict = {"valid": self.valid,
                   "errors": [e.to_json() for e in self.errors],
                   "simulated_us": self.simulated_us}
        if self.max_abs_err is not None or self.outputs is not None:
            d["max_abs_err"] = self.max_abs_err
            d["max_rel_err"] = self.max_rel_err
        if self.timing is not None:
            d["ops"] = len(self.timing.ops)
            d["hbm_read_bytes"] = self.timing.hbm_read_bytes
            d["hbm_write_bytes"] = self.timing.hbm_write_bytes
        if self.notes:
            d["notes"] = self.notes
        return d


def random_inputs(program: Program, graph: Optional[PrimGraph] = None, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs for every program input: floats ~ N(0, 1) (parameters scaled by 1/2),
    integer tensors used as a gather index uniform over the table's rows, other integers 1
    (attention masks), bools True; a graph constant its own values."""
    rng = np.random.default_rng(seed)
    tmap = program.tensor_map()
    bound: dict[str, int] = {}
    if graph is not None:
        for op in graph.ops:
            if op.body.kind == "gather" and len(op.inputs) > 1:
                table = graph.tensors[op.inputs[0].tensor]
                bound[op.inputs[1].tensor] = table.shape[op.body.axis]
    out = {}
    constants = graph.meta.get("constants", {}) if graph is not None else {}
    for name in dict.fromkeys(program.inputs):
        if name in constants:  # a graph constant has its values, not random ones
            out[name] = constants[name]
            continue
        t = tmap[name]
        shape = tuple(t.shape)
        if t.dtype in ("float16", "float32", "float64", "bfloat16"):
            a = rng.standard_normal(shape).astype(np.float32)
            if t.role != "user_input":
                a *= 0.5
            out[name] = a.astype(np.float16) if t.dtype == "float16" else a
        elif t.dtype == "bool":
            out[name] = np.ones(shape, dtype=bool)
        elif name in bound:
            out[name] = rng.integers(0, bound[name], size=shape).astype(np.int64)
        else:
            out[name] = np.ones(shape, dtype=np.int64)
    return out


def _check_graph_matches(prog: Program, pg: PrimGraph) -> None:
    """The reference graph must declare the program's inputs with the same
    shapes: GraphMismatch otherwise (numerics with another graph)."""
    tmap = prog.tensor_map()
    for role, names, graph_names in (("input", prog.inputs, pg.inputs),):
        if len(dict.fromkeys(names)) != len(dict.fromkeys(graph_names)):
            raise GraphMismatch(f"the program has {len(dict.fromkeys(names))} {role}s, "
                                               f"the graph {len(dict.fromkeys(graph_names))}")
        for name in names:
            t = tmap.get(name)
            g = pg.tensors.get(name)
            if t is None or g is None or tuple(t.shape) != tuple(g.shape):
                raise GraphMismatch(f"program {role} {name!r} "
                                 f"{'has shape ' + str(list(t.shape)) if t is not None else 'is undeclared'}, the graph "
                                 f"{'declares ' + str(list(g.shape)) if g is not None else 'has no such tensor'}")


def compare(outputs: list[np.ndarray], reference: list[np.ndarray]) -> tuple[float, float]:
    max_abs = 0.0
    max_rel = 0.0
    for o, r in zip(outputs, reference):
        o64 = np.asarray(o, dtype=np.float64)
        r64 = np.asarray(r, dtype=np.float64)
        if o64.shape != r64.shape:
            return float("inf"), float("inf")
        both_nan = np.isnan(o64) & np.isnan(r64)
        diff = np.where(both_nan, 0.0, np.abs(o64 - r64))
        same_inf = np.isinf(o64) & (o64 == r64)
        diff = np.where(same_inf, 0.0, diff)
        diff = np.where(np.isnan(diff), np.inf, diff)
        a = float(diff.max()) if diff.size else 0.0
        finite_ref = r64[np.isfinite(r64)]
        scale = float(np.abs(finite_ref).max()) if finite_ref.size else 0.0
        max_abs = max(max_abs, a)
        max_rel = max(max_rel, a / scale if scale > 0 else (0.0 if a == 0 else float("inf")))
    return max_abs, max_rel


def simulate(program: Union[Program, dict, str, bytes], hw=None, inputs: Optional[Mapping[str, np.ndarray]] = None,
             graph: Optional[PrimGraph] = None, numerics: bool = False, trace: Union[bool, str, None] = None, seed: int = 0,
             timing: bool = True) -> SimResult:
    if hw is None:
        hw = load_target()
    prog, issues = parse_program(program)
    if prog is None:
        return SimResult(valid=False, errors=issues)
    issues = validate_program(prog, hw)
    if issues:
        return SimResult(valid=False, errors=issues)
    res = SimResult(valid=True, errors=[])
    if timing:
        report = time_program(prog, hw)
        res.timing = report
        res.simulated_us = float(report.total_us)
        if trace is True:
            res.trace = trace_document(report)
        elif trace:
            write_trace(report, trace)
    if numerics or inputs is not None:
        pg = graph
        if pg is not None:
            _check_graph_matches(prog, pg)
        feed = dict(inputs) if inputs is not None else random_inputs(prog, pg, seed)
        try:
            res.outputs = run_program(prog, feed, hw)
        except RunError as e:
            res.valid = False
            res.errors.append(ProgramIssue("run_error", str(e)))
            return res
        if pg is not None:
            try:
                res.reference = interpret(pg, feed)
            except InterpreterError as e:
                raise GraphMismatch(f"the graph is not the one this program was compiled from: {e}") from None
            res.max_abs_err, res.max_rel_err = compare(res.outputs, res.reference)
        else:
            res.notes.append("no graph given: outputs not compared with a reference")
    return res
