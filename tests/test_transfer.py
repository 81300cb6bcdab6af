"""Plan transfer (solver/spyre/transfer.py): a plan of one size of a graph carried to another."""
import pytest

import tests.primgraphs as primgraphs
from simulator.api import simulate
from simulator.timing import time_program
from simulator.validate import validate_program
from solver.planners import plan
from solver.spyre.transfer import NotTransferable, program_decisions, structure_key, transfer_decisions
from target.hardware import load_target

HW = load_target()
FAST = dict(time_limit_s=5, deterministic=True)


def test_sizes_of_one_graph_share_a_structure_key_and_other_graphs_do_not():
    assert structure_key(primgraphs.mlp(M=64)[0]) == structure_key(primgraphs.mlp(M=512, K=256)[0])
    assert structure_key(primgraphs.mlp()[0]) != structure_key(primgraphs.softmax()[0])


@pytest.mark.parametrize("builder, kw", [("softmax", dict(M=512, N=1024)), ("mlp", dict(M=256, K=512, N=384)),
                                         ("attention_scores", dict(B=4, S=256))])
def test_a_plan_carried_to_its_own_size_is_the_same_plan(builder, kw):
    """Every decision of the program survives the round trip program -> decisions -> program."""
    pg, _ = getattr(primgraphs, builder)(**kw)
    program = plan(pg, HW, "cpsat", **FAST)
    moved = transfer_decisions(pg, program_decisions(pg, program), pg, HW)
    assert moved is not None and moved.repairs == []
    assert time_program(moved.program, HW).total_us == time_program(program, HW).total_us


@pytest.mark.parametrize("builder, small, large", [
    ("softmax", dict(M=256, N=1024), dict(M=1024, N=1024)),
    ("mlp", dict(M=128, K=512, N=384), dict(M=512, K=512, N=384)),
    ("attention_scores", dict(B=2, S=128), dict(B=4, S=256)),
])
@pytest.mark.parametrize("direction", ["up", "down"])
def test_a_transferred_plan_is_valid_and_numerically_right(builder, small, large, direction):
    src_kw, dst_kw = (small, large) if direction == "up" else (large, small)
    src, _ = getattr(primgraphs, builder)(**src_kw)
    dst, _ = getattr(primgraphs, builder)(**dst_kw)
    program = plan(src, HW, "cpsat", **FAST)
    moved = transfer_decisions(src, program_decisions(src, program), dst, HW)
    assert moved is not None
    assert validate_program(moved.program, HW) == []
    res = simulate(moved.program, HW, inputs=primgraphs.inputs_for(dst), graph=dst, numerics=True)
    assert res.valid and res.max_rel_err < 2e-2, res.errors


def test_a_split_the_new_size_does_not_divide_shrinks_to_the_nearest_factor_that_does():
    """The softmax rows split 32 ways at M=512; at M=504 no split of 32 divides the rows, and
    the nearest factor below that does (28) takes its place (a split following the rows
    would want 32 as well). On the recalibrated timing model a small softmax runs faster on
    a few cores, so neither an 8-core source (M=512, N=256) nor a 36-row target (where the
    split that follows the rows, 2, beats keeping 18) would show the repair."""
    src, _ = primgraphs.softmax(M=512, N=1024)
    dst, _ = primgraphs.softmax(M=504, N=1024)
    program = plan(src, HW, "cpsat", **FAST)
    d = program_decisions(src, program)
    assert any(p.core_split.get("m") == 32 for p in d.ops.values())
    moved = transfer_decisions(src, d, dst, HW)
    assert moved is not None
    splits = {op.id: op.core_split.get("m", 1) for op in moved.program.ops if op.kind == "compute"}
    assert all(504 % f == 0 for f in splits.values()), splits
    assert any("m split 32 -> 28" in r for r in moved.repairs), moved.repairs


def test_a_tiled_dim_keeps_its_tile_extent():
    """A dim twice as long gets twice the tiles, so each tile's LX buffer keeps its size."""
    src, _ = primgraphs.softmax(M=512, N=1024)
    dst, _ = primgraphs.softmax(M=1024, N=1024)
    program = plan(src, HW, "cpsat", **FAST)
    d = program_decisions(src, program)
    for p in d.ops.values():
        p.temporal_tiles = {"m": 2}
    moved = transfer_decisions(src, d, dst, HW)
    assert moved is not None
    assert {moved.decisions.ops[op.id].temporal_tiles.get("m") for op in dst.ops} == {4}


def test_graphs_of_another_structure_are_refused():
    src, _ = primgraphs.mlp()
    program = plan(src, HW, "heuristic")
    with pytest.raises(NotTransferable):
        transfer_decisions(src, program_decisions(src, program), primgraphs.softmax()[0], HW)


def test_the_cpsat_planner_takes_a_plan_of_another_size_as_its_start_and_skips_the_solve():
    """`plan(..., hint=SizedPlan(pg, program))`: the plan of another size of the same graph
    is transferred (status TRANSFERRED), validated like every plan, and numerically right;
    a plan of another graph is no help and the planner solves as without a hint."""
    from solver.spyre.transfer import SizedPlan

    src, _ = primgraphs.softmax(M=512, N=1024)
    dst, _ = primgraphs.softmax(M=1024, N=1024)
    source = SizedPlan(src, plan(src, HW, "cpsat", **FAST))
    moved = plan(dst, HW, "cpsat", hint=source, **FAST)
    assert moved.stats.solver_status == "TRANSFERRED"
    res = simulate(moved, HW, inputs=primgraphs.inputs_for(dst), graph=dst, numerics=True)
    assert res.valid and res.max_rel_err < 2e-2
    other = plan(primgraphs.mlp()[0], HW, "cpsat", hint=source, **FAST)
    assert other.stats.solver_status in ("OPTIMAL", "FEASIBLE")


def test_a_transfer_that_stands_worse_against_the_baseline_than_its_source_is_solved_instead(monkeypatch):
    """The guard: with no growth allowed, even a good transfer is solved from (its plan the
    hint) instead of returned."""
    from solver.spyre import budget
    from solver.spyre.transfer import SizedPlan

    monkeypatch.setattr(budget, "TRANSFER_RATIO_GROWTH", 0.0)
    src, _ = primgraphs.softmax(M=512, N=1024)
    dst, _ = primgraphs.softmax(M=1024, N=1024)
    solved = plan(dst, HW, "cpsat", hint=SizedPlan(src, plan(src, HW, "cpsat", **FAST)), **FAST)
    assert solved.stats.solver_status in ("OPTIMAL", "FEASIBLE")


def _mlp_document(rows: int) -> dict:
    import torch

    from backend.capture import capture

    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64)).eval()
    return capture(model, (torch.randn(rows, 64),), name=f"mlp{rows}")


def test_the_compile_driver_transfers_a_new_size_of_a_graph_it_compiled_before():
    """The embedded compile path remembers its plans by graph structure: the second size of
    the same model is transferred (a wall-clock request), a deterministic one is solved."""
    from service import pipeline

    pipeline._sized_plans.clear()
    first = pipeline.compile_in_process(_mlp_document(64), planner="cpsat", time_limit_s=5)
    assert first["stats"]["solver_status"] != "TRANSFERRED"
    second = pipeline.compile_in_process(_mlp_document(256), planner="cpsat", time_limit_s=5)
    assert second["stats"]["solver_status"] == "TRANSFERRED"
    third = pipeline.compile_in_process(_mlp_document(512), planner="cpsat", time_limit_s=5, deterministic=True)
    assert third["stats"]["solver_status"] != "TRANSFERRED"


def _chain(rows: int):
    from lowering import lower_document
    from lowering.graph_format import GraphDocument
    from tests.service_helpers import chain_graph

    return lower_document(GraphDocument.model_validate(chain_graph(rows=rows, n_ops=4)))


def test_an_op_on_one_core_at_the_small_size_is_split_over_the_cores_at_eight_times_the_rows():
    """The source runs every op of a 4-op chain of 128 rows on one core; at 1024 rows the
    transfer splits them (a parallel dim the source left unsplit is split by its growth:
    8x the rows on 8 cores), which is faster than carrying them unsplit (the transfer keeps
    the faster of its two split policies)."""
    from dataclasses import replace

    from solver.oracle import checked_program

    src, dst = _chain(128), _chain(1024)
    d = program_decisions(src, plan(src, HW, "cpsat", **FAST))
    d = replace(d, ops={k: replace(p, core_split={}, core_slices=None, temporal_tiles={}) for k, p in d.ops.items()},
                restick_ops={}, resident={})
    one_core, issues = checked_program(src, HW, d)
    assert one_core is not None, issues
    assert all(o.core_split == {} or max(o.core_split.values()) == 1 for o in one_core.ops if o.kind == "compute")
    moved = transfer_decisions(src, d, dst, HW, src_program=one_core)
    assert moved is not None and validate_program(moved.program, HW) == []
    cores = {}
    for o in moved.program.ops:
        if o.kind == "compute":
            n = 1
            for f in o.core_split.values():
                n *= f
            cores[o.id] = n
    assert min(cores.values()) >= 8, cores
    res = simulate(moved.program, HW, inputs=primgraphs.inputs_for(dst), graph=dst, numerics=True)
    assert res.valid and res.max_rel_err < 2e-2, res.errors


def test_k_tiles_whose_partial_sums_no_longer_fit_are_re_chosen():
    """A matmul tiled along K at a few rows keeps its partial sums in LX; at many times the
    rows they no longer fit and every K tile would send them through device memory. The
    transfer re-derives the op's tiles (fewer or none) instead of carrying the K tiles."""
    from dataclasses import replace

    from solver.oracle import checked_program

    src, _ = primgraphs.mlp(M=256, K=2048, N=2048)
    dst, _ = primgraphs.mlp(M=8192, K=2048, N=2048)
    d = program_decisions(src, plan(src, HW, "heuristic"))
    mm = [op for op in src.ops if any(x.kind == "reduction" for x in op.iter_dims)]
    assert mm
    k = next(x.name for x in mm[0].iter_dims if x.kind == "reduction")
    d = replace(d, ops={**d.ops, mm[0].id: replace(d.ops[mm[0].id], temporal_tiles={k: 16})}, resident={})
    source, issues = checked_program(src, HW, d)
    assert source is not None, issues
    moved = transfer_decisions(src, d, dst, HW, src_program=source)
    assert moved is not None and validate_program(moved.program, HW) == []
    tiles = next(o.temporal_tiles for o in moved.program.ops if o.id == mm[0].id)
    assert tiles.get(k, 1) < 16, (tiles, moved.repairs)
    assert any(r.startswith(f"{mm[0].id}: tiles") for r in moved.repairs), moved.repairs


def test_a_split_whose_core_span_exceeds_the_limit_at_the_new_size_is_re_chosen():
    """Attention scores split over query rows and key columns: at 2048 tokens a core's
    access fits the per-core span, at 8192 (a 1 GB score tensor) it reaches across more
    than the limit. The transfer re-splits the op (the validator names it) instead of
    failing, and the plan validates."""
    from dataclasses import replace

    from solver.oracle import checked_program

    src, _ = primgraphs.attention_scores(B=8, S=2048)
    dst, _ = primgraphs.attention_scores(B=8, S=8192)
    d = program_decisions(src, plan(src, HW, "cpsat", **FAST))
    qk = next(op for op in src.ops if op.id == "qk")
    d = replace(d, ops={**d.ops, qk.id: replace(d.ops[qk.id], core_split={"m": 8, "n": 4}, core_slices=None,
                                                temporal_tiles={})}, resident={})
    source, issues = checked_program(src, HW, d)
    assert source is not None, issues
    moved = transfer_decisions(src, d, dst, HW, src_program=source)
    assert moved is not None and validate_program(moved.program, HW) == []
    assert any(r.startswith(f"{qk.id}: split") and "span" in r for r in moved.repairs), moved.repairs
    assert next(o.core_split for o in moved.program.ops if o.id == qk.id) != {"m": 8, "n": 4}


def test_an_uneven_tile_count_the_new_size_still_allows_is_kept():
    """Tiles are balanced (a count need not divide a core's units): K tiles of a projection
    whose K did not change keep their count at a new number of rows, where rounding them to
    a divisor (here 8 of 25 units -> 5) would change a decision the size change left alone."""
    from solver.plan import OpPlan
    from solver.spyre.transfer import _repair_op

    src, _ = primgraphs.mlp(M=256, K=1600, N=512)
    dst, _ = primgraphs.mlp(M=512, K=1600, N=512)
    s = plan(src, HW, "cpsat", **FAST)
    d = program_decisions(src, s)
    mm = d.ops["mm"]
    tiled = OpPlan(stick=mm.stick, core_split={"m": 4}, temporal_tiles={"k": 8})
    repairs: list[str] = []
    got = _repair_op(src.ops[0], dst.ops[0], tiled, dst, HW, repairs, False, src)
    assert got.temporal_tiles == {"k": 8}, repairs


def test_residencies_that_no_longer_all_fit_are_kept_by_the_traffic_they_save():
    """Two LX buffers live at once that fit one at a time: first fit in program order keeps
    the early, small one; placing by value (`_placed_by_value`'s CP-SAT placement with
    each buffer's saved traffic as its value) keeps the one worth more."""
    from solver.baseline.lx_cpsat import cpsat_place
    from solver.baseline.scratchpad import LxBuffer

    cap, stick = 1024, 128
    early = LxBuffer("early", 768, [0, 3], value=768 * 2)
    late = LxBuffer("late", 512, [1, 3], value=50_000)
    cpsat_place([early, late], cap, stick)
    assert late.address is not None and early.address is None
    # without values the spill traffic of each (uses x size) decides: the early one
    early, late = LxBuffer("early", 768, [0, 3]), LxBuffer("late", 512, [1, 3])
    cpsat_place([early, late], cap, stick)
    assert early.address is not None and late.address is None


def test_a_kv_cache_concat_past_the_span_is_re_split_by_what_its_cores_read():
    """Decode's `cat(past_key, new_key)` along the KV length: split over heads at 64 cached
    tokens a core's access fits the per-core span (96 KB here, a deployment's 256 MB), at 256
    it does not. A concat's core reads only its own part of the cache (the validator's view,
    `operand_box(copy_reads=True)`); judged as reading the whole cache no split would fit and
    the transfer would fail. It re-splits the concat over the batch and validates."""
    from dataclasses import replace

    import torch

    from backend.capture import capture
    from lowering import lower_document
    from lowering.graph_format import GraphDocument
    from solver.oracle import checked_program
    from tests.test_in_place_store import _span_variant

    hw = _span_variant(96 * 1024)

    class Step(torch.nn.Module):
        def forward(self, past, new):
            return torch.cat([past, new], dim=2) * 2.0

    def graph(S):
        args = (torch.randn(4, 2, S, 64).half(), torch.randn(4, 2, 1, 64).half())
        return lower_document(GraphDocument.model_validate(capture(Step(), args, name=f"kv_cat_{S}")))

    src, dst = graph(64), graph(256)
    cat = next(op for op in src.ops if op.body.kind == "copy" and len(op.inputs) == 2)
    heads = cat.iter_dims[1].name
    # row-major layouts (the batch outermost, so a batch split bounds a core's span)
    d = program_decisions(src, plan(src, hw, "heuristic-2026-06"))
    d = replace(d, ops={k: replace(p, core_split={heads: 2} if k == cat.id else p.core_split, core_slices=None,
                                   temporal_tiles={}) for k, p in d.ops.items()}, resident={})
    source, issues = checked_program(src, hw, d)
    assert source is not None, issues
    moved = transfer_decisions(src, d, dst, hw, src_program=source)
    assert moved is not None and validate_program(moved.program, hw) == []
    split = next(o.core_split for o in moved.program.ops if o.id == cat.id)
    assert split.get(cat.iter_dims[0].name, 1) > 1, (split, moved.repairs)
    assert any(r.startswith(f"{cat.id}: split") and "span" in r for r in moved.repairs), moved.repairs


def test_the_value_of_holding_a_tensor_is_its_bytes_times_its_write_and_reads():
    """`_traffic_saved`: the whole tensor per access (a tile buffer holds one tile of it, its
    footprint is not what holding it saves): softmax's `ex` is written once and read by the
    sum and the division."""
    from solver.spyre.transfer import _traffic_saved

    pg, _ = primgraphs.softmax(M=256, N=1024)
    saved = _traffic_saved(pg, plan(pg, HW, "naive"))
    assert saved["ex"] == 3 * 256 * 1024 * 2
    assert saved["mx"] == 2 * 256 * 2   # read by the subtraction only
    assert "p" not in saved             # the output: nobody reads it
