"""Hardware variants for bundle tests: spyre.json with another bundle rule or LX persistence."""
import json
from typing import Optional

from target.hardware import TARGETS_DIR, hardware_from_dict


def spyre_variant(rule: Optional[str] = None, lx_persists: Optional[bool] = None):
    """spyre.json with the bundle limit counted by `rule` and/or LX persistence set."""
    doc = json.loads((TARGETS_DIR / "spyre.json").read_text())
    if rule is not None:
        doc["params"]["bundle_tensor_limit"]["rule"] = rule
    if lx_persists is not None:
        doc["params"]["lx_persists_across_bundles"]["value"] = lx_persists
    return hardware_from_dict(doc, origin="spyre variant")


def strict_bundles():
    """The program model before issue 11: every device-memory tensor counts against the
    limit and LX contents die at a bundle boundary."""
    return spyre_variant(rule="device_memory", lx_persists=False)
