"""The fusion search's nested-heads merge candidate (`solver.spyre.fusion.merge._nested_heads`):
two K-tiled projections of one input merged with the first on a coarser split, so the
second reads its rows on chip."""
from __future__ import annotations

from dataclasses import replace

from target.hardware import load_target
from tests.primgraphs import gated_projections

HW = load_target()


def test_the_first_head_takes_the_smallest_split_whose_rows_hold_the_seconds():
    """Both projections on m8 x n4, K-tiled in kernels of their own: the candidate puts the
    first on m4 x n8 (each core's 128 rows of x hold the 64 the second reads on that core;
    m2 x n16 and n32 would nest too, with larger boxes). In one kernel the second then reads
    x on chip: no device-memory bytes of x. A first head that already nests, or heads
    sharing no input, give no candidate."""
    from solver.emit import emit_program
    from simulator.timing import time_program
    from simulator.validate import validate_program
    from solver.plan import OpPlan, PlanDecisions
    from solver.spyre.fusion.merge import _nested_heads

    M, K, N = 512, 2048, 4096
    pg = gated_projections(M, K, N)
    split = {"m": 8, "n": 4}
    d = PlanDecisions("test", ops={"mm1": OpPlan(core_split=dict(split), temporal_tiles={"k": 8}),
                                   "mm2": OpPlan(core_split=dict(split), temporal_tiles={"k": 8}),
                                   "mul": OpPlan(core_split=dict(split))},
                      bundle_starts=["mm2", "mul"])
    prog = emit_program(pg, HW, d)
    nested = _nested_heads(prog, HW, d.ops, ["mm1"], ["mm2"])
    assert nested is not None and nested["mm1"].core_split == {"m": 4, "n": 8}
    assert nested["mm2"].core_split == split
    merged = replace(d, ops=nested, bundle_starts=["mul"])
    prog2 = emit_program(pg, HW, merged)
    assert not validate_program(prog2, HW)
    rep = time_program(prog2, HW)
    second = rep.op("mm2")
    assert second.fused_group is not None and second.fused_group == rep.op("mm1").fused_group
    assert any("x already on chip" in e for e in second.effects)
    assert second.hbm_read_bytes == K * N * 2          # its weight only
    # a first head that already nests, or heads sharing no input: no candidate
    d_nested = replace(d, ops={**d.ops, "mm1": OpPlan(core_split={"m": 4, "n": 8}, temporal_tiles={"k": 8})})
    assert _nested_heads(emit_program(pg, HW, d_nested), HW, d_nested.ops, ["mm1"], ["mm2"]) is None
    assert _nested_heads(prog, HW, d.ops, ["mm1"], ["mul"]) is None


def test_merging_two_k_tiled_projections_tries_the_nested_split(monkeypatch):
    """A gated MLP's projections (512 x 4096 x 14336) K-tiled in kernels of their own on
    m8 x n4, the second's result held in LX for the product: merged on one split neither
    kernel double-buffers its weight stream beside the held result, so the plain merges do
    not pay; the first on m4 x n8 in the same kernel does (the second reads its rows on
    chip). Without the nested candidate nothing is merged."""
    from solver.plan import OpPlan, PlanDecisions, Residency
    from solver.spyre.fusion import merge
    from solver.spyre.fusion.trial import issues_of, trial

    pg = gated_projections(512, 4096, 14336)
    tiled = dict(core_split={"m": 8, "n": 4}, temporal_tiles={"k": 64})
    d = PlanDecisions("test", ops={"mm1": OpPlan(**tiled), "mm2": OpPlan(**tiled),
                                   "mul": OpPlan(core_split={"m": 8, "n": 4})},
                      bundle_starts=["mm2", "mul"], resident={"y2": Residency(0)})
    tr = trial(pg, HW, d)
    assert tr is not None and not issues_of(tr, HW)
    merged = merge.merge_adjacent(pg, HW, tr, [["mm1"], ["mm2"]], None, 0.0)
    assert merged[0].ops["mm1"].core_split == {"m": 4, "n": 8} and not issues_of(merged, HW)
    assert merged[2].op("mm1").fused_group == merged[2].op("mm2").fused_group is not None
    assert merged[2].total_us < 0.97 * tr[2].total_us
    monkeypatch.setattr(merge, "_nested_heads", lambda *a, **k: None)
    plain = merge.merge_adjacent(pg, HW, tr, [["mm1"], ["mm2"]], None, 0.0)
    assert plain[2].total_us == tr[2].total_us
