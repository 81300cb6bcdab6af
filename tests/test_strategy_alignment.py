"""Strategy space: a chain of ops can keep its intermediates in LX only if the pruned
strategy lists hold, for every producer/reader pair, strategies that slice the tensor alike.
`align_strategies` adds them; `make_strategy` must not reject a split because an operand it
reads whole would take a coarser granule that cuts the same slices."""
from __future__ import annotations

from pathlib import Path

from lowering import lower_document
from target.op_rules import stick_options
from target.primitives import Access, Call, In, IterDim, PointwiseBody, PrimGraph, PrimOp, PrimTensor
from lowering.validate import parse_document
from target.hardware import load_target
from solver.spyre.model import build_model
from solver.baseline.passes import plan_heuristic
from solver.spyre.schedule import chain_order
from solver.spyre.strategies import GraphContext, compatible_residency, make_strategy

HW = load_target()
LAYERS = Path(__file__).resolve().parent.parent / "benchmarks" / "graphs" / "layers"


def _masked_rows(B=4, S=512):
    """scores [B,S,S] with a row vector and a column vector (int64, like a causal mask's
    index rows) broadcast into one pointwise op."""
    ts = {"s": PrimTensor("s", (B, S, S), "float16", "user_input"),
          "rows": PrimTensor("rows", (S,), "int64", "user_input"),
          "cols": PrimTensor("cols", (S,), "int64", "user_input"),
          "o": PrimTensor("o", (B, S, S), "float16")}
    op = PrimOp("mask", (IterDim("b", B), IterDim("q", S), IterDim("k", S)),
                (Access("s", (0, 1, 2)), Access("rows", (1,)), Access("cols", (2,))), Access("o", (0, 1, 2)),
                PointwiseBody(Call("add", (In(0), Call("sub", (In(1), In(2)))))))
    return PrimGraph("masked", ts, [op], ["s", "rows", "cols"], ["o"])


def test_a_coarser_granule_that_cuts_the_same_slices_does_not_forbid_a_split():
    """Sticked on k, the row vector (read whole: any stick) can only be sticked on its one
    dim, q, whose granule then becomes 16 int64 elements; 512 rows split 8 ways is still 64
    rows a core either way, so the split stands."""
    pg = _masked_rows()
    op = pg.ops[0]
    ctx = GraphContext.build(pg, HW)
    ch = next(c for c in stick_options(op) if c.output == 2)
    assert make_strategy(op, ctx, ch, {"b": 4, "q": 8}) is not None


def _all_cores(s) -> bool:
    n = 1
    for f in s.core_split.values():
        n *= f
    return n == HW.cores


def _chain_can_reside(strategies, chain, ops) -> bool:
    """Starting from a cheapest strategy of the chain's first op on every core, is there
    one strategy per later op of `chain` (each reading the previous one's output), each on
    every core, with every link LX-compatible?"""
    wide = [s for s in strategies[chain[0]] if _all_cores(s)]
    least = min(s.cost_ns(HW) for s in wide)
    # every strategy tied at the cheapest (which of them a list puts first is arbitrary)
    alive = [s for s in wide if s.cost_ns(HW) <= least * 1.001]
    for prev, cur in zip(chain, chain[1:]):
        slot = next(i for i, a in enumerate(ops[cur].inputs) if a.tensor == ops[prev].output.tensor)
        alive = [s for s in strategies[cur]
                 if _all_cores(s) and any(compatible_residency(p, s, slot) for p in alive)]
        if not alive:
            return False
    return True


def test_attention_chain_of_a_prefill_layer_can_stay_in_lx():
    """Scores, mask, the softmax ops and the PV product of a real-size prefill layer: alone,
    each op's cheapest 32-core splits disagree (equally cheap in device memory); aligned,
    the slicing of the cheapest scores strategy runs through the whole chain."""
    doc = parse_document((LAYERS / "llama31_8b_prefill512.json").read_text())
    pg = chain_order(lower_document(doc))
    ops = {o.id: o for o in pg.ops}
    attn = [o.id for o in pg.ops if o.id.endswith((".scores", ".masked", ".probs.amax", ".probs.sub",
                                                    ".probs.exp", ".probs.sum", ".probs", ".grouped"))]
    chain = [attn[0]] + [o for o in attn[1:] if not o.endswith(("amax", "sum"))]
    assert len(chain) == 6 and ops[chain[0]].body.kind == ops[chain[-1]].body.kind == "matmul"
    _, strategies, _ = build_model(pg, HW, plan_heuristic(pg, HW))
    assert _chain_can_reside(strategies, chain, ops)
    # the reductions on the side read the same slices
    for red, src in (("probs.amax", "masked"), ("probs.sum", "probs.exp")):
        r = next(o for o in attn if o.endswith(red))
        s = next(o for o in attn if o.endswith(src))
        assert _chain_can_reside(strategies, [s, r], ops)
