"""Tensors whose device layout the graph fixes (`PrimTensor.dim_order`: FMS's paged KV cache,
kv heads outermost): the CP-SAT planner prices every op touching them in that order, keeps
their stick dim, and shares no strategy list with an op reading a tensor of the same shape
in another order."""
import dataclasses

from solver.spyre.strategies import GraphContext, op_strategies, structure_key
from target.hardware import load_target
from target.layout import default_dim_order
from tests.test_in_place_store import _store_graph

HW = load_target()


def _fixed(pg):
    return {t.id: tuple(t.dim_order) for t in pg.tensors.values() if t.dim_order is not None}


def test_ops_touching_a_fixed_layout_tensor_are_priced_in_its_order():
    _, pg = _store_graph(8, 2, with_compute=True)
    fixed = _fixed(pg)
    assert fixed and all(order != tuple(default_dim_order(4, 3)) for order in fixed.values())
    ctx = GraphContext.build(pg, HW)
    seen = 0
    for op in pg.ops:
        accs = list(op.inputs) + [op.output]
        touched = [k for k, a in enumerate(accs) if a.tensor in fixed]
        if not touched:
            continue
        for s in op_strategies(op, ctx):
            # a list may be shared by ops of one structure (the two stores): by position
            priced = list(s.view.prim.inputs) + [s.view.prim.output]
            for k in touched:
                t = accs[k].tensor
                lay = s.view.layouts[priced[k].tensor]
                if lay.stick_dim == ctx.possible_sticks[t][0]:   # not a restickified copy
                    assert tuple(lay.dim_order) == fixed[t], (op.id, t, lay.dim_order)
                    seen += 1
    assert seen   # the stores write and the attention's gathers read the caches


def test_a_fixed_layout_weight_keeps_its_stick_dim():
    """The cache arrives as a buffer (a load-time role whose stick is otherwise the planner's
    choice); a layout the graph fixes is a contract, its stick included."""
    _, pg = _store_graph(8, 2, with_compute=True)
    ctx = GraphContext.build(pg, HW)
    caches = [t for t in _fixed(pg) if t not in {op.output.tensor for op in pg.ops}]
    assert caches and all(pg.tensors[t].role == "buffer" for t in caches)
    for t in caches:
        assert t not in ctx.free_inputs and ctx.possible_sticks[t] == [len(pg.tensors[t].shape) - 1]


def test_a_strategy_list_is_not_shared_across_fixed_and_free_orders():
    _, pg = _store_graph(8, 2, with_compute=True)
    ctx = GraphContext.build(pg, HW)
    op = next(op for op in pg.ops if any(a.tensor in _fixed(pg) for a in op.inputs))
    freed = dataclasses.replace(pg, tensors={k: dataclasses.replace(t, dim_order=None)
                                             for k, t in pg.tensors.items()})
    assert structure_key(op, ctx) != structure_key(op, GraphContext.build(freed, HW))
