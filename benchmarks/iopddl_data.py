"""Where the shared IOPDDL contest instances are on this machine.

The instances are not part of the repository: they sit in a `shared/iopddl/` folder beside a
checkout (or beside one of its parent folders, so a clone made anywhere under the same
workspace finds them). `IOPDDL_DIR` overrides the search.
"""
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def shared_instances_dir() -> Path:
    if os.environ.get("IOPDDL_DIR"):
        return Path(os.environ["IOPDDL_DIR"])
    for folder in ROOT.parents:
        candidate = folder / "shared" / "iopddl"
        if (candidate / "best_known.csv").exists():
            return candidate
    return ROOT.parent / "shared" / "iopddl"  # absent: callers skip or say where they looked
