"""The five tiny models captured, lowered and run on the reference interpreter agree with
torch eager (tolerances in lowering_helpers.TOLERANCE: fp32 1e-4, fp16 2e-2, relative to
each output's scale). fp16 for four of the models is marked slow: capture dominates."""
import numpy as np
import pytest
import torch

from target.interpreter import interpret
from tests.lowering_helpers import assert_close, capture_with_values, eager_outputs
from tests.models import TINY_MODEL_NAMES, tiny_model
from lowering import lower_document

_CACHE: dict = {}


def _lowered(name, dtype):
    key = (name, dtype)
    if key not in _CACHE:
        model, inputs = tiny_model(name, dtype)
        doc, values = capture_with_values(model, inputs)
        _CACHE[key] = (model, inputs, values, lower_document(doc))
    return _CACHE[key]


CASES = [pytest.param(n, torch.float32, id=f"{n}-fp32") for n in TINY_MODEL_NAMES] + [
    pytest.param(n, torch.float16, id=f"{n}-fp16", marks=() if n == "gpt2" else pytest.mark.slow)
    for n in TINY_MODEL_NAMES]


@pytest.mark.parametrize("name,dtype", CASES)
def test_tiny_model_matches_eager(name, dtype):
    model, inputs, values, pg = _lowered(name, dtype)
    got = interpret(pg, values)
    want = eager_outputs(model, inputs)
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype, f"{name} output {k}: dtype {g.dtype} vs eager {w.dtype}"
        assert_close(g, w, dtype, f"{name} output {k}")
    kinds = {op.kind for op in pg.ops}
    assert {"matmul", "pointwise", "reduce"} <= kinds
    assert all(op.source for op in pg.ops)


@pytest.mark.parametrize("name", ["gpt2", "resnet"])
def test_tiny_model_other_inputs(name):
    # the lowered graph is a function of its user input, not of the example it was captured with
    model, _, values, pg = _lowered(name, torch.float32)
    _, other = tiny_model(name, seed=3)
    user = next(i for i in pg.inputs if pg.tensors[i].role == "user_input")
    values = dict(values, **{user: other[0].numpy()})
    got = interpret(pg, values)
    assert not np.array_equal(got[0], interpret(pg, _lowered(name, torch.float32)[2])[0])
    assert_close(got[0], eager_outputs(model, other)[0], torch.float32, name)
