"""Op order: a topological order that runs each chain of ops straight into its consumer.

Only consecutive ops can form a fused coarse-tiled kernel (`target.superdsc.
fused_group_key`), so the order a graph arrives in decides which chains can fuse at all.
Captured graphs list ops in source order, which often puts an independent branch in the
middle of a chain: in a gated MLP `silu(x @ Wg) * (x @ Wu)` the up projection sits between
the activation chain and the product that consumes both.

`chain_order` walks the graph depth first from its outputs and, at every op, schedules its
operands' producers smallest dependency cone first, so the largest (usually the longest)
branch is the last one before the op: it runs straight into it. Ties keep source order. A
cone is counted over the ops not yet scheduled, so work shared with an earlier branch does
not make a branch look long. The result is a valid execution order of the same ops.
"""
from __future__ import annotations

from dataclasses import replace

from target.primitives import PrimGraph


def _cones(pg: PrimGraph) -> list[int]:
    """Per op index, a bitmask of the ops it depends on (itself included)."""
    producer = {op.output.tensor: i for i, op in enumerate(pg.ops)}
    cones: list[int] = []
    for i, op in enumerate(pg.ops):  # pg.ops is topological: producers come first
        acc = 1 << i
        for a in op.inputs:
            p = producer.get(a.tensor)
            if p is not None:
                acc |= cones[p]
        cones.append(acc)
    return cones


def chain_order(pg: PrimGraph) -> PrimGraph:
    """`pg` with its ops reordered (module docstring); the same object when nothing moves."""
    producer = {op.output.tensor: i for i, op in enumerate(pg.ops)}
    cones = _cones(pg)
    done_mask = 0
    order: list[int] = []
    roots = [producer[t] for t in pg.outputs if t in producer]
    roots += [i for i in range(len(pg.ops)) if i not in set(roots)]  # ops no output needs
    for root in roots:
        stack: list[tuple[int, bool]] = [(root, False)]
        while stack:
            i, expanded = stack.pop()
            if done_mask >> i & 1:
                continue
            if expanded:
                done_mask |= 1 << i
                order.append(i)
                continue
            stack.append((i, True))
            deps: list[int] = []
            for a in pg.ops[i].inputs:
                p = producer.get(a.tensor)
                if p is not None and not done_mask >> p & 1 and p not in deps:
                    deps.append(p)
            pending = {p: (cones[p] & ~done_mask).bit_count() for p in deps}
            # the stack runs the last pushed first: push the largest pending cone first so
            # it runs last, right before op i (ties: source order)
            for p in sorted(deps, key=lambda p: (-pending[p], -p)):
                stack.append((p, False))
    if order == list(range(len(pg.ops))):
        return pg
    return replace(pg, ops=[pg.ops[i] for i in order])
