"""Shared by the lowering tests: capture a module with the values of its graph inputs,
lower it, run the reference interpreter and compare with torch eager."""
from __future__ import annotations

import numpy as np
import torch

from backend.capture import decomposition_table, exported_program_to_document
from lowering import lower_document
from lowering.graph_format import GraphDocument
from lowering.interpreter import interpret

# Tolerances (elementwise |a-b| <= atol + rtol*|b|, on outputs normalised by their scale):
# fp32 programs agree with eager to float32 rounding (different summation orders);
# fp16 programs round every intermediate to fp16, eager keeps some in fp32.
TOLERANCE = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-2, 2e-2)}


def to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.contiguous().numpy()


def capture_with_values(model: torch.nn.Module, example_inputs) -> tuple[GraphDocument, dict]:
    """The graph document and, per graph input id, the array it takes."""
    with torch.no_grad():
        ep = torch.export.export(model, tuple(example_inputs), strict=False)
        ep = ep.run_decompositions(decomposition_table())
    doc = GraphDocument.model_validate(exported_program_to_document(ep, name=type(model).__name__))
    state = dict(ep.state_dict)
    state.update(ep.constants)
    user = iter(example_inputs)
    values = {}
    for spec, inp in zip(ep.graph_signature.input_specs, doc.inputs):
        if inp.kind == "user_input":
            values[inp.id] = to_numpy(next(user))
        else:
            values[inp.id] = to_numpy(state[spec.target])
    return doc, values


def eager_outputs(model, example_inputs) -> list[np.ndarray]:
    with torch.no_grad():
        out = model(*example_inputs)
    flat = []

    def walk(o):
        if isinstance(o, torch.Tensor):
            flat.append(to_numpy(o))
        elif isinstance(o, (list, tuple)):
            for x in o:
                walk(x)
        elif isinstance(o, dict) or hasattr(o, "to_tuple"):
            for x in (o.values() if isinstance(o, dict) else o.to_tuple()):
                walk(x)
    walk(out)
    return flat


def assert_close(got: np.ndarray, want: np.ndarray, dtype: torch.dtype, what: str = "") -> None:
    rtol, atol = TOLERANCE[dtype]
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} vs {want.shape}"
    scale = max(1.0, float(np.max(np.abs(want))) if want.size else 1.0)
    err = np.abs(got - want)
    bad = err > atol * scale + rtol * np.abs(want)
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.size} elements differ; "
                           f"max abs err {float(err.max()):.3g} (scale {scale:.3g})")


def lower_and_run(model, example_inputs):
    doc, values = capture_with_values(model, example_inputs)
    pg = lower_document(doc)
    return pg, interpret(pg, values)
