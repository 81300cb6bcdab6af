"""Foundation Model Stack (`ibm-fms`) architectures compiled with the sticksat backend in
strict mode, fp32 and fp16, against eager FMS in the same dtype (tests/fms_zoo.py: tiny
configs, random weights).

Families whose graphs contain ops the lowering does not have yet are expected to fail in
strict mode naming those ops (xfail strict: the test turns red once the ops land, so the
mark is removed then)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("fms")

import backend  # noqa: E402
from backend.region import forget_compiled_regions  # noqa: E402
from tests.fms_zoo import FMS_FAMILIES, build  # noqa: E402

# family -> the ops its graph needs that sticksat cannot lower yet
MISSING_OPS: dict[str, tuple[str, ...]] = {}
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2}


def _cases():
    for family in FMS_FAMILIES:
        for dtype in (torch.float32, torch.float16):
            marks = []
            if family in MISSING_OPS:
                from torch._dynamo.exc import BackendCompilerFailed

                marks = [pytest.mark.xfail(strict=True, raises=BackendCompilerFailed,
                                           reason=f"needs {', '.join(MISSING_OPS[family])}")]
            yield pytest.param(family, dtype, id=f"{family}-{str(dtype).split('.')[-1]}", marks=marks)


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


@pytest.mark.parametrize("family,dtype", list(_cases()))
def test_fms_family_runs_on_device_strict(family, dtype):
    torch._dynamo.reset()
    forget_compiled_regions()
    model, inputs = build(family, dtype)
    args, kwargs = inputs(torch.Generator().manual_seed(0))
    args = tuple(a.to(dtype) if a.is_floating_point() else a for a in args)
    compiled = torch.compile(model, backend="sticksat", dynamic=False,
                             options={"planner": "heuristic", "strict": True})
    with torch.no_grad():
        want = _first(model(*args, **kwargs))
        with backend.track_coverage() as cov:
            try:
                got = _first(compiled(*args, **kwargs))
            except Exception as e:  # noqa: BLE001 - an expected failure must name the missing op
                if family in MISSING_OPS:
                    assert any(op in str(e) for op in MISSING_OPS[family]), str(e)[:2000]
                raise
    assert got.shape == want.shape and got.dtype == want.dtype
    error = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
    assert error <= TOLERANCE[dtype], error
    assert cov.graphs and cov.device_fraction == 1.0 and not cov.eager_graphs and cov.graph_breaks == 0
