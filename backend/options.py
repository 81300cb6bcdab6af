"""Options of the sticksat torch backend: `torch.compile(m, backend="sticksat",
options={...})`, with environment variables as defaults (documented in docs/backend.md)."""
from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any, Literal, Mapping, Optional

ENV_STRICT = "STICKSAT_STRICT"
ENV_URL = "STICKSAT_URL"

GradPolicy = Literal["error", "eager"]
Executor = Literal["interpreter", "simulator"]
ServiceErrorPolicy = Literal["error", "eager"]


class BackendOptionError(ValueError):
    pass


@dataclass(frozen=True)
class BackendOptions:
    # Raise instead of running unsupported ops (or uncapturable graphs) in eager torch.
    strict: bool = False
    # What to do when called with autograd on and inputs that require grad: the backend
    # compiles inference graphs only.
    on_grad: GradPolicy = "error"
    # Compile service URL; None compiles in process.
    url: Optional[str] = None
    # When the service cannot be reached: raise (default), or run the graph in eager
    # torch with a warning.
    on_service_error: ServiceErrorPolicy = "error"
    # In process: "simulator" (default) plans a SuperDSC program and runs it on the
    # simulator (real outputs plus a simulated latency); "interpreter" skips planning
    # and runs the lowered graph on the numpy reference interpreter.
    executor: Executor = "simulator"
    # Planner and solver budget, passed through to the compile step.
    planner: Optional[str] = None
    time_limit_s: Optional[float] = None
    # Graph name recorded in the documents (labels are not hashed).
    name: str = ""

    @classmethod
    def from_mapping(cls, options: Optional[Mapping[str, Any]] = None,
                     environ: Optional[Mapping[str, str]] = None) -> "BackendOptions":
        environ = os.environ if environ is None else environ
        known = {f.name for f in fields(cls)}
        options = dict(options or {})
        unknown = sorted(set(options) - known)
        if unknown:
            raise BackendOptionError(f"unknown sticksat option(s) {unknown}; known: {sorted(known)}")
        values: dict[str, Any] = {
            "strict": environ.get(ENV_STRICT, "").strip().lower() in ("1", "true", "yes", "on"),
            "url": environ.get(ENV_URL) or None,
        }
        values.update(options)
        if not isinstance(values["strict"], bool):
            raise BackendOptionError(f"option strict must be a bool, got {values['strict']!r}")
        if values.get("on_grad", "error") not in ("error", "eager"):
            raise BackendOptionError(f"option on_grad must be 'error' or 'eager', got {values['on_grad']!r}")
        if values.get("on_service_error", "error") not in ("error", "eager"):
            raise BackendOptionError(f"option on_service_error must be 'error' or 'eager', "
                                     f"got {values['on_service_error']!r}")
        if values.get("executor", "simulator") not in ("interpreter", "simulator"):
            raise BackendOptionError(f"option executor must be 'interpreter' or 'simulator', "
                                     f"got {values['executor']!r}")
        return cls(**values)
