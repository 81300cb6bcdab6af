"""Options of the sticksat torch backend: `torch.compile(m, backend="sticksat",
options={...})`, with environment variables as defaults (documented in docs/backend.md)."""
from __future__ import annotations

import math
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
    # Padding of symbolic sizes (backend/specialize.py): "input.dim" -> a multiple (int) or
    # a ladder of sizes (list); the input is named as the model's forward receives it
    # ("input_ids.1", "mask.3", "past_key_value_states.2" for every layer's K and V).
    buckets: Optional[Mapping[str, Any]] = None
    # The value each input with a padded dim is padded with ("input" -> finite number;
    # torch.finfo(dtype).min for an additive attention mask). Padding is refused for
    # inputs without one.
    pad_values: Optional[Mapping[str, Any]] = None

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
        values["buckets"] = _buckets(values.get("buckets"))
        values["pad_values"] = _pad_values(values.get("pad_values"))
        return cls(**values)


def _buckets(raw: Any) -> Optional[dict[str, Any]]:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise BackendOptionError(f"option buckets must map 'input.dim' to a multiple or a list of sizes, got {raw!r}")
    out: dict[str, Any] = {}
    for key, rule in raw.items():
        name, _, dim = str(key).rpartition(".")
        if not name or not dim.isdigit():
            raise BackendOptionError(f"buckets key {key!r} must be 'input.dim' (e.g. 'input_ids.1')")
        if isinstance(rule, bool) or not (isinstance(rule, int) and rule > 0 or isinstance(rule, (list, tuple))
                                          and rule and all(isinstance(b, int) and not isinstance(b, bool)
                                                           and b > 0 for b in rule)):
            raise BackendOptionError(f"buckets[{key!r}] must be a positive int (a multiple) or a list of "
                                     f"positive sizes, got {rule!r}")
        out[str(key)] = rule if isinstance(rule, int) else tuple(sorted(rule))
    return out


def _pad_values(raw: Any) -> Optional[dict[str, Any]]:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise BackendOptionError(f"option pad_values must map input names to numbers, got {raw!r}")
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise BackendOptionError(f"pad_values[{key!r}] must be a number, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BackendOptionError(f"pad_values[{key!r}] must be a number, got {value!r}")
        if not math.isfinite(value):
            # an additive mask padded with -inf hides every key from a padded query row:
            # its softmax is NaN, and the next layer's attention multiplies that row's
            # values by 0 for the real rows, which is NaN again
            raise BackendOptionError(f"pad_values[{key!r}] must be finite, got {value!r}: pad an additive "
                                     f"attention mask with the dtype's lowest finite value "
                                     f"(torch.finfo(dtype).min), not -inf")
        out[str(key)] = value
    return out
