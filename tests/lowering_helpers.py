"""Shared by the lowering tests: capture a module with the values of its graph inputs,
lower it, run the reference interpreter and compare with torch eager."""
from __future__ import annotations

import numpy as np
import torch

from backend.capture import decomposition_table, exported_program_to_document
from lowering import lower_document
from lowering.graph_format import GraphDocument
from target.interpreter import interpret

# Tolerances (elementwise |a-b| <= atol + rtol*|b|, on outputs normalised by their scale):
# fp32 programs agree with eager to float32 rounding (different summation orders);
# fp16 programs round every intermediate to fp16, eager keeps some in fp32.
# bfloat16 keeps 8 mantissa bits (fp16: 11), so its per-op rounding is 8x coarser.
TOLERANCE = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-2, 2e-2), torch.bfloat16: (6e-2, 6e-2)}


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
    ids = {inp.id for inp in doc.inputs}   # unread weights are not document inputs
    values = {}
    for spec in ep.graph_signature.input_specs:
        if spec.kind.name == "USER_INPUT":
            values[spec.arg.name] = to_numpy(next(user))
        elif spec.arg.name in ids:
            values[spec.arg.name] = to_numpy(state[spec.target])
    assert set(values) >= ids, f"document inputs without values: {sorted(ids - set(values))}"
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
    finite = np.abs(want[np.isfinite(want)])
    scale = max(1.0, float(finite.max()) if finite.size else 1.0)
    same = (got == want) | (np.isnan(got) & np.isnan(want))  # covers matching infinities
    with np.errstate(invalid="ignore"):
        err = np.where(same, 0.0, np.abs(got - want))
    bad = ~(err <= atol * scale + rtol * np.abs(np.where(same, 0.0, want)))
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.size} elements differ; "
                           f"max abs err {float(err.max()):.3g} (scale {scale:.3g})")


def lower_and_run(model, example_inputs):
    doc, values = capture_with_values(model, example_inputs)
    pg = lower_document(doc)
    return pg, interpret(pg, values)


# -- hand-built documents: call aten ops eagerly and record them as graph nodes ---------
class Ref:
    def __init__(self, node: str, output: int, value: torch.Tensor):
        self.node, self.output, self.value = node, output, value


def _overload(target: str):
    ns, name, overload = target.split(".")
    return getattr(getattr(getattr(torch.ops, ns), name), overload)


class DocBuilder:
    """Builds a graph document op by op while computing each op eagerly with torch, so a
    test gets both the document and the values eager torch produces."""

    def __init__(self):
        self.inputs, self.nodes, self.outputs, self.values = [], [], [], {}
        self._n = 0

    def input(self, value: torch.Tensor, kind: str = "user_input", name: str = "") -> Ref:
        iid = name or f"in{len(self.inputs)}"
        self.inputs.append({"id": iid, "kind": kind, "meta": _meta(value)})
        self.values[iid] = to_numpy(value)
        return Ref(iid, 0, value)

    def call(self, target: str, *args, **kwargs):
        self._n += 1
        nid = f"n{self._n}_{target.split('.')[1]}"
        unwrap = lambda a: a.value if isinstance(a, Ref) else [unwrap(x) for x in a] if isinstance(a, list) else a
        result = _overload(target)(*[unwrap(a) for a in args], **{k: unwrap(v) for k, v in kwargs.items()})
        outs = list(result) if isinstance(result, (tuple, list)) else [result]
        self.nodes.append({"id": nid, "target": target, "args": [_arg(a) for a in args],
                           "kwargs": {k: _arg(v) for k, v in kwargs.items()},
                           "outputs": [_meta(o) for o in outs]})
        refs = [Ref(nid, k, o) for k, o in enumerate(outs)]
        return refs if isinstance(result, (tuple, list)) else refs[0]

    def document(self, *outputs: Ref) -> GraphDocument:
        return GraphDocument.model_validate({
            "format": "sticksat.graph", "version": 1, "name": "test", "inputs": self.inputs, "nodes": self.nodes,
            "outputs": [{"kind": "tensor", "node": r.node, "output": r.output} for r in outputs]})

    def check(self, *outputs: Ref, dtype=None):
        """Lower, interpret, compare every output with the eager value; returns the PrimGraph."""
        doc = self.document(*outputs)
        pg = lower_document(doc)
        got = interpret(pg, self.values)
        for k, (g, r) in enumerate(zip(got, outputs)):
            want = to_numpy(r.value)
            assert g.shape == want.shape, f"output {k}: shape {g.shape} vs {want.shape}"
            if want.dtype.kind in "biu":
                assert g.dtype == want.dtype, f"output {k}: dtype {g.dtype} vs {want.dtype}"
                assert (g == want).all(), f"output {k}: integer values differ"
            else:
                dt = dtype or (r.value.dtype if r.value.dtype in TOLERANCE else torch.float32)
                assert_close(g, want, dt, f"output {k}")
        return pg


def _meta(t: torch.Tensor) -> dict:
    from backend.capture import tensor_meta

    return tensor_meta(t)


def _arg(a):
    import math

    if isinstance(a, Ref):
        return {"kind": "tensor", "node": a.node, "output": a.output}
    if isinstance(a, bool):
        return {"kind": "bool", "value": a}
    if isinstance(a, int):
        return {"kind": "int", "value": a}
    if isinstance(a, float):
        if math.isinf(a):
            return {"kind": "float", "value": "inf" if a > 0 else "-inf"}
        return {"kind": "float", "value": a}
    if a is None:
        return {"kind": "none"}
    if isinstance(a, torch.dtype):
        from backend.capture import dtype_name

        return {"kind": "dtype", "value": dtype_name(a)}
    if isinstance(a, (str, torch.device)):
        return {"kind": "str", "value": str(a)}
    if isinstance(a, (list, tuple)):
        return {"kind": "list", "items": [_arg(x) for x in a]}
    raise TypeError(f"cannot encode {a!r}")
