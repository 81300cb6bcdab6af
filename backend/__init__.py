"""The sticksat torch backend (`torch.compile(model, backend="sticksat")`).

    import backend
    report = backend.coverage_report()     # what ran on device vs CPU, per compiled graph
    with backend.track_coverage() as cov:  # only the graphs compiled inside the block
        compiled(*inputs)
    serve = backend.bucketed(compiled, buckets=(64, 128, 256))  # one program per bucket

Names resolve lazily, so importing a light submodule (backend.options) does not import torch.
"""
from __future__ import annotations

_EXPORTS = {
    "coverage_report": "backend.coverage",
    "track_coverage": "backend.coverage",
    "reset_coverage": "backend.coverage",
    "CoverageReport": "backend.coverage",
    "GraphCoverage": "backend.coverage",
    "bucketed": "backend.bucketing",
    "BucketError": "backend.bucketing",
    "sticksat_backend": "backend.dynamo",
    "SticksatBackendError": "backend.dynamo",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'backend' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
