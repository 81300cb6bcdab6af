"""Default locations on disk (kept apart from the HTTP package: the batch commands use them)."""
from __future__ import annotations

import os


def default_store_path() -> str:
    """$XDG_DATA_HOME/sticksat/store.sqlite (~/.local/share/... without it)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "sticksat", "store.sqlite")
