"""The entry point `uvicorn service.app:app_from_env --factory` (docs/service.md). The
service itself lives in the `service.http` package; this module only re-exports its
factory and config, imported on first use so that nothing importing this module for
`default_store_path` pulls in FastAPI."""
from __future__ import annotations

from typing import Any

from service.locations import default_store_path

__all__ = ["app_from_env", "config_from_env", "create_app", "ServiceConfig", "DEFAULT_MAX_BODY_BYTES",
           "default_store_path"]

_LAZY = {"app_from_env": "service.http.app", "create_app": "service.http.app",
         "config_from_env": "service.http.config", "ServiceConfig": "service.http.config",
         "DEFAULT_MAX_BODY_BYTES": "service.http.config"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'service.app' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
