"""Bundle repair after a solve: the model checks resident windows one and two at a time
against the bundle's external-tensor limit; a longer chain of overlapping windows can still
break it. `repair_bundles` drops the residencies of the window groups inside the offending
bundles (and returns those groups: the solve adds them as no-goods for its next round)."""
from __future__ import annotations

from dataclasses import replace

from target.primitives import PrimGraph
from solver.emit import emit_program
from solver.oracle import checked_program
from solver.plan import PlanDecisions
from solver.spyre.model import SpyreModel

# the validator's codes of a bundle over the limit
BUNDLE_CODES = frozenset({"bundle_limit", "lx_cross_bundle"})


def repair_bundles(pg: PrimGraph, hw, sm: SpyreModel, d: PlanDecisions, max_steps: int = 8):
    """Emit and validate; while the only problems are bundles over the external-tensor
    limit, drop the residencies of the LX window groups inside the offending bundles.
    Returns (decisions, program or None, dropped groups, last issues)."""
    order = {o.id: k for k, o in enumerate(pg.ops)}
    groups: list[list[str]] = []
    issues: list = []
    for _ in range(max_steps):
        prog, issues = checked_program(pg, hw, d)
        if prog is not None:
            return d, prog, groups, []
        bundle_issues = [i for i in issues if getattr(i, "code", "") in BUNDLE_CODES]
        if not bundle_issues or len(bundle_issues) != len(issues):
            return d, None, groups, issues
        program = emit_program(pg, hw, d)
        bad_ops = set()
        for b in program.bundles:
            if len(b.external_tensors) > hw.bundle_tensor_limit or any(
                    i.code == "lx_cross_bundle" and i.op in b.ops for i in bundle_issues):
                bad_ops.update(order[o] for o in b.ops if o in order)
        bad = [ts for a, b, ts in sm.windows(set(d.resident)) if any(a <= k <= b for k in bad_ops)]
        if not bad:
            return d, None, groups, issues
        groups.extend(bad)
        resident = {t: r for t, r in d.resident.items() if not any(t in ts for ts in bad)}
        d = replace(d, resident=resident, bundle_starts=sm.bundle_starts(set(resident)))
    return d, None, groups, issues
