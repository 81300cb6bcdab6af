"""Strategy pricing served from caches returns exactly what pricing each op alone returns
(`solver.spyre.strategies`): the lists shared between graph contexts of one target
(`op_strategies`), the offers and pricing shared by ops of one structure
(`align_strategies`), and `Strategy.cost_ns` without computing the operand boxes. The
sample: two encoder layers of the irregular suite's T5 (identical layers, so the sharing
is exercised) with their neighbours."""
from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from lowering import lower_document
from lowering.graph_format import GraphDocument
from target.hardware import load_target
from solver.naive import plan_naive
from solver.spyre import strategies as st
from solver.spyre.depth.segments import subgraph
from solver.spyre.schedule import chain_order
from solver.spyre.start import default_hint

HW = load_target()
T5 = Path(__file__).resolve().parent.parent / "benchmarks" / "graphs" / "irregular" / "t5_base_12x12_src512_tgt128.json.gz"


def _fingerprint(S: dict) -> list:
    return [(oid, s.key(), s.input_sticks, s.out_stick, s.out_lx_bytes, s.reduction_split,
             sorted(s.any_forbidden.items()), s.may_reside, sorted(s.parts.combos.items()))
            for oid in sorted(S) for s in S[oid]]


@pytest.fixture(scope="module")
def two_layers():
    pg = chain_order(lower_document(GraphDocument.from_json(gzip.decompress(T5.read_bytes()).decode())))
    # encoder layers 2 and 3 of 12 (66 ops each) and a few ops around them
    sub = subgraph(pg, list(range(190, 340)), "t5#two_layers")
    hint, _ = default_hint(sub, HW)
    return sub, hint


def _strategies(sub, hint, share: bool):
    ctx = st.GraphContext.build(sub, HW, hint.input_sticks)
    naive = plan_naive(sub, HW, input_sticks={t: s for t, s in ctx.input_sticks.items() if t in sub.inputs})
    S = {op.id: st.op_strategies(op, ctx, required=st.required_from(op, (hint, naive))) for op in sub.ops}
    return ctx, S, st.align_strategies(sub, ctx, S, share_by_structure=share)


def test_shared_pricing_returns_exactly_the_strategies_of_pricing_each_op_alone(two_layers):
    sub, hint = two_layers
    st.clear_shared_cache()
    ctx, fresh, alone = _strategies(sub, hint, share=False)
    # the sample has repeated structure: fewer lists than ops, and alignment adds to them
    assert len(ctx.cache) < len(sub.ops)
    assert sum(map(len, alone.values())) > sum(map(len, fresh.values()))
    # a second context of the same target is served from the shared lists (same objects)
    ctx2, cached, shared = _strategies(sub, hint, share=True)
    some = sub.ops[0].id
    assert cached[some] is fresh[some]
    assert _fingerprint(cached) == _fingerprint(fresh)
    assert _fingerprint(shared) == _fingerprint(alone)


def test_cost_ns_is_the_all_device_memory_price(two_layers):
    sub, hint = two_layers
    ctx = st.GraphContext.build(sub, HW, hint.input_sticks)
    for op in sub.ops[:40]:
        for s in st.op_strategies(op, ctx):
            assert s.cost_ns(HW) == s.parts.cost((False,) * len(op.inputs), False, HW).total_ns
