"""The CP-SAT planner's strategies respect the per-core span (`strategies._spans_fit`): a split
whose core would reach across more than `per_core_span_bytes` of an operand is no strategy,
for every op (a KV-cache concat at batch 32 and 8k context: 537 MB), judged as the validator
judges it (a copy's inputs by the box its slice reads)."""
import torch

from backend.capture import capture
from lowering import lower_document
from lowering.graph_format import GraphDocument
from simulator.validate import validate_program
from solver.planners import plan
from solver.spyre.strategies import GraphContext, op_strategies
from target.geometry import first_slice_spans
from target.op_rules import split_granules
from tests.test_in_place_store import _span_variant

HW = _span_variant(96 * 1024)   # a 256 KB cache is a large one


class Step(torch.nn.Module):
    def forward(self, past, new):
        return torch.cat([past, new], dim=2) * 2.0


def _graph(S: int):
    args = (torch.randn(4, 2, S, 64).half(), torch.randn(4, 2, 1, 64).half())
    return lower_document(GraphDocument.model_validate(capture(Step(), args, name=f"kv_cat_{S}")))


def test_no_strategy_lets_a_core_span_past_the_limit_and_the_plan_validates():
    pg = _graph(256)
    ctx = GraphContext.build(pg, HW)
    for op in pg.ops:
        strategies = op_strategies(op, ctx)
        assert strategies, op.id
        for s in strategies:
            view = s.view
            names = [a.tensor for a in view.prim.inputs] + [view.prim.output.tensor]
            sticks = [view.layouts[n].stick_dim for n in names]
            gran = split_granules(view.prim, sticks[:-1], sticks[-1], [ctx.dtypes[n] for n in names], HW.stick_bytes)
            spans = first_slice_spans(view.prim, s.core_split, gran, {n: view.layouts[n] for n in names},
                                      {n: ctx.shapes[n] for n in names}, {n: ctx.dtypes[n] for n in names},
                                      copy_reads=True)
            assert max(spans.values()) <= HW.per_core_span_bytes, (op.id, s.core_split, spans)
    program = plan(pg, HW, "cpsat", time_limit_s=5, deterministic=True, fallback=False)
    assert validate_program(program, HW) == []



def test_the_baselines_span_reduction_judges_a_concat_by_what_its_cores_read():
    """The baseline re-divides every op whose core would span past the limit (upstream's
    span reduction). Judged with the cache whole, no split of a KV-cache concat fits and the
    reduction takes the one with the smallest span, which can still be over; judged by
    what each core reads, as the validator does, it finds a split that fits."""
    pg = _graph(256)
    for planner in ("heuristic", "naive"):
        program = plan(pg, HW, planner, fallback=False)
        assert validate_program(program, HW) == [], planner
