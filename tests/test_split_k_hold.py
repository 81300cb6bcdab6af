"""Split-K readers of held results (solver/spyre/split_k_hold.py): a matmul reading a wide
intermediate along K takes, split over the producer's rows x columns, exactly what each core
wrote, and that result stays in LX instead of crossing device memory twice."""
from __future__ import annotations

from dataclasses import replace

import pytest

from target.primitives import Access, Call, In, IterDim, MatmulBody, PointwiseBody, PrimGraph, PrimOp, PrimTensor
from target.hardware import load_target
from target.superdsc import LxMemory
from simulator.timing import time_program
from simulator.validate import validate_program
from solver.emit import emit_program
from solver.spyre import steps
from solver.spyre.cpsat_planner import plan_cpsat
from solver.spyre.split_k_hold import hold_for_split_k, split_k_candidates

HW = load_target("spyre")
# 4096 rows: the solve's plan runs the gate projection, the activation and the product as
# row-tiled kernels after an untiled up projection; the model has tied optima here and which one
# the solve returns moves with the judge and the seed, so the tests that need a particular
# solved plan set it (`_product_on_the_up_split`) instead of taking the solve's.
MLP = (4096, 1024, 4096)
# a narrower product: the solve fuses gate/up/act/product into one kernel at 4 row tiles,
# the producing kernel whose tile count a split-K reader must not share
FUSED_MLP = (4096, 1024, 2048)
# fewer rows: on the judge of 792eb35 (split-K combines per output tile, loads and compute in
# series) the 4096-row down projection is no longer split-K; at 512 rows the solve splits it
# m8 x k4 and the step holds the product for it
HELD_MLP = (512, 1024, 4096)


def _without_split_k(monkeypatch):
    """The planner's post-solve steps without the split-K step (and so without its runner-up)."""
    monkeypatch.setattr(steps, "POST_SOLVE_STEPS", tuple(s for s in steps.POST_SOLVE_STEPS if s.name != "split-K"))

def gated_mlp(M: int, K: int, F: int, extra_reader: bool = False) -> PrimGraph:
    """y = down(silu(gate(x)) * up(x)); `extra_reader`: the product is also a graph output's
    input, so it must reach device memory anyway."""
    bf = "bfloat16"
    ts = [PrimTensor("x", (M, K), bf, "user_input"), PrimTensor("wg", (F, K), bf, "parameter"),
          PrimTensor("wu", (F, K), bf, "parameter"), PrimTensor("wd", (K, F), bf, "parameter"),
          PrimTensor("g", (M, F), bf), PrimTensor("u", (M, F), bf), PrimTensor("a", (M, F), bf),
          PrimTensor("h", (M, F), bf), PrimTensor("y", (M, K), bf)]

    def mm(i, x, w, out, n, k):
        return PrimOp(i, (IterDim("m", M), IterDim("n", n), IterDim("k", k, "reduction")),
                      (Access(x, (0, 2)), Access(w, (1, 2))), Access(out, (0, 1)), MatmulBody(0, 1, 2))
    par = (IterDim("d0", M), IterDim("d1", F))
    ops = [mm("gate", "x", "wg", "g", F, K),
           PrimOp("act", par, (Access("g", (0, 1)),), Access("a", (0, 1)), PointwiseBody(Call("silu", (In(0),)))),
           mm("up", "x", "wu", "u", F, K),
           PrimOp("prod", par, (Access("a", (0, 1)), Access("u", (0, 1))), Access("h", (0, 1)),
                  PointwiseBody(Call("mul", (In(0), In(1))))),
           mm("down", "h", "wd", "y", K, F)]
    outputs = ["y"]
    if extra_reader:
        ts.append(PrimTensor("hn", (M, F), bf))
        ops.append(PrimOp("neg", par, (Access("h", (0, 1)),), Access("hn", (0, 1)),
                          PointwiseBody(Call("neg", (In(0),)))))
        outputs.append("hn")
    return PrimGraph("gated_mlp", {t.id: t for t in ts}, ops, ["x", "wg", "wu", "wd"], outputs)


def _simulated(pg, d):
    program = emit_program(pg, HW, d)
    assert validate_program(program, HW) == []
    return program, time_program(program, HW).total_us


def test_down_projection_reads_the_held_product_split_k(monkeypatch):
    pg = gated_mlp(*HELD_MLP)
    d = plan_cpsat(pg, HW, deterministic=True, time_limit_s=5)
    program, us = _simulated(pg, d)
    assert any("split-K over a held result" in n for n in d.stats["notes"])
    split = d.ops["down"].core_split
    assert split.get("k", 1) > 1 and split.get("m", 1) > 1
    h = program.tensor_map()["h"]
    assert isinstance(h.memory, LxMemory) and not h.memory.per_tile
    # the step is what made it: without it the same solve ends slower, with h in device memory
    _without_split_k(monkeypatch)
    d0 = plan_cpsat(pg, HW, deterministic=True, time_limit_s=5)
    program0, us0 = _simulated(pg, d0)
    assert not isinstance(program0.tensor_map()["h"].memory, LxMemory)
    assert us < 0.95 * us0


def test_nothing_moves_when_the_result_has_another_reader(monkeypatch):
    pg = gated_mlp(*MLP, extra_reader=True)
    _without_split_k(monkeypatch)
    d = plan_cpsat(pg, HW, deterministic=True, time_limit_s=5)
    program, us = _simulated(pg, d)
    assert hold_for_split_k(pg, HW, d, program, us).best is None


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_only_faster_plans_are_returned(scale):
    """The step keeps a variant only when the whole program simulates faster than the time it
    is told the plan takes: told a time no variant beats, it returns nothing."""
    pg = gated_mlp(*MLP)
    d = plan_cpsat(pg, HW, deterministic=True, time_limit_s=5, fuse=False)
    program, us = _simulated(pg, d)
    got = hold_for_split_k(pg, HW, d, program, us * scale)
    if scale < 1.0:
        assert got.best is None
    elif got.best is not None:
        assert got.us < us
        assert _simulated(pg, got.best[0])[1] == pytest.approx(got.us)


def test_the_fastest_slower_variant_is_handed_back_for_a_second_look(monkeypatch):
    """Told a time no variant beats, the step returns nothing better, and hands back its
    fastest valid variant as `runner_up` (the planner judges it again after its last fewer-tiles
    pass); when a variant is faster, that one is returned and nothing is handed back."""
    from solver.spyre.fusion.trial import issues_of

    pg = gated_mlp(*HELD_MLP)
    _without_split_k(monkeypatch)
    d = plan_cpsat(pg, HW, deterministic=True, time_limit_s=5)
    program, us = _simulated(pg, d)
    got = hold_for_split_k(pg, HW, d, program, us * 0.5)
    assert got.best is None and got.runner_up is not None
    variant = got.runner_up
    assert not issues_of(variant, HW) and variant[2].total_us >= us * 0.5
    split = variant[0].ops["down"].core_split
    assert split.get("k", 1) > 1
    assert isinstance(variant[1].tensor_map()["h"].memory, LxMemory)
    # the fastest: no variant the step would try at the told time of its own is faster
    improved = hold_for_split_k(pg, HW, d, program, variant[2].total_us + 1e-6)
    assert improved.best is not None and improved.us == pytest.approx(variant[2].total_us)
    assert improved.runner_up is None


def test_candidates_are_k_reads_of_single_reader_intermediates():

    got = [(op.id, slot) for op, slot in split_k_candidates(gated_mlp(*MLP))]
    # gate and up read x, a graph input; down reads the product along K
    assert got == [("down", 0)]
    assert split_k_candidates(gated_mlp(*MLP, extra_reader=True)) == []


def test_reader_at_the_producing_kernels_tile_count_stays_a_kernel_of_its_own(monkeypatch):
    """The program makes one kernel of any consecutive ops with equal tile and core counts:
    a split-K reader tiled like the kernel that made its input would join that kernel and
    read other cores' parts mid-loop (invalid). The step cuts a bundle on each side of the
    reader (LX persists across it), so that variant is valid and the reader runs alone."""
    from target.superdsc import tile_count
    from solver.spyre.split_k_hold import _kernel_members, _kernel_splits, _reader_split, _try
    from solver.spyre.tile_buffers import kernel_numbers

    assert HW.lx_persists_across_bundles
    pg = gated_mlp(*FUSED_MLP)
    _without_split_k(monkeypatch)
    d = plan_cpsat(pg, HW, deterministic=True, time_limit_s=5)
    program, _ = _simulated(pg, d)
    members = _kernel_members(program, "prod")
    assert len(members) > 1, "the product's producer should be a fused kernel"
    ops = {o.id: o for o in program.ops}
    tiles = tile_count(ops["prod"])
    by_id = {op.id: op for op in pg.ops}
    prod, reader = by_id["prod"], by_id["down"]
    p_split = {k: v for k, v in d.ops["prod"].core_split.items() if v > 1}
    factors = [p_split.get(prod.iter_dims[i].name, 1) for i in prod.output.dims]
    splits = _kernel_splits(pg, members, prod, "h", factors)
    r_split = _reader_split(prod, splits["prod"], reader, "h")
    assert r_split is not None
    # no cut the plan had already: the reader follows the kernel in one bundle
    d.bundle_starts = [s for s in d.bundle_starts if s != "down"]
    got = _try(pg, HW, d, members, splits, 1, reader, r_split, "n", tiles, "h")
    assert got is not None
    variant = got[1]
    assert validate_program(variant, HW) == []
    index = {o.id: k for k, o in enumerate(variant.ops)}
    kernel = kernel_numbers(variant)
    assert tile_count(variant.ops[index["down"]]) == tile_count(variant.ops[index["prod"]]) == tiles
    assert kernel.get(index["down"]) != kernel.get(index["prod"])
    assert isinstance(variant.tensor_map()["h"].memory, LxMemory)


def test_a_step_cut_by_the_deadline_says_so():
    """The split-K step and the fewer-tiles pass note when the deadline stopped them before
    their last try (a plan's notes then tell a cut step from one that found nothing); with
    time left they add no such note."""
    import time

    from solver.spyre.fusion.retile import fewer_tiles_pass
    from solver.spyre.fusion.trial import trial

    pg = gated_mlp(*MLP)
    d = plan_cpsat(pg, HW, deterministic=True, time_limit_s=5, fuse=False)
    program, us = _simulated(pg, d)
    got = hold_for_split_k(pg, HW, d, program, us, time.perf_counter() - 1.0)
    assert got.best is None and got.cut
    assert not hold_for_split_k(pg, HW, d, program, us, None).cut
    # a plan with a kernel that loses to loop overhead: fewer tiles has trials to make
    tiled = plan_cpsat(pg, HW, deterministic=True, time_limit_s=5)
    tr = trial(pg, HW, tiled)
    assert fewer_tiles_pass(pg, HW, tr, None, 0.0)[1] == []
    assert fewer_tiles_pass(pg, HW, tr, time.perf_counter() - 1.0, 0.0)[1] == [
        "fewer tiles: stopped early (time limit) after 0 trials"]


def _product_on_the_up_split(shape=MLP):
    """The gated MLP at MLP and a solved plan of it whose product sits on the up projection's
    core split (m8 x n4), not the activation's (the gate projection and the activation on
    m4 x n8), untiled, with the down projection split-K (m8 x k4), the gate projection's
    result and the product held whole in LX, bundle cuts before the gate projection and the
    product. It is one of the model's tied optima on the judge of 1f6d2d1 (the CP-SAT solve
    returns it at seed 3; at seed 1 the product takes the activation's split): set here
    explicitly so the tests below do not depend on the solve's tie-break. The sticks and
    input sticks are the solve's."""
    from solver.plan import Residency

    pg = gated_mlp(*shape)
    solved = plan_cpsat(pg, HW, deterministic=True, time_limit_s=5, fuse=False)
    splits = {"gate": {"m": 4, "n": 8}, "act": {"d0": 4, "d1": 8}, "up": {"m": 8, "n": 4},
              "prod": {"d0": 8, "d1": 4}, "down": {"m": 8, "k": 4}}
    d = replace(solved, ops={o: replace(solved.ops[o], core_split=split, temporal_tiles={}, core_slices=None)
                             for o, split in splits.items()},
                resident={"g": Residency(0), "h": Residency(0)}, bundle_starts=["gate", "prod"],
                op_order=["up", "gate", "act", "prod", "down"], stats={})
    _simulated(pg, d)   # valid as it stands
    return pg, d


def _after_the_solve(pg, d):
    """`d` through the planner's post-solve steps without the split-K step (what
    `plan_cpsat` does with a plan it solved; deterministic: no deadline)."""
    from solver.spyre.model import build_model

    strategies = build_model(pg, HW, d)[1]
    # the fusion runner-up goes through the split-K step too
    kept = tuple(s for s in steps.POST_SOLVE_STEPS if s.name not in ("split-K", "fusion runner-up"))
    return steps.post_solve(pg, HW, d, deadline=None, strategies=strategies, steps=kept).decisions


def test_a_resplit_product_reads_an_input_held_by_an_earlier_kernel_from_device_memory():
    """A product that is a kernel of its own reads `u`, held in LX by the up projection on the
    product's planned split. Re-split for the split-K reader, the product's cores would look
    for slices of `u` their LX does not hold (lx_slice_mismatch): the variant reads `u` from
    device memory instead, and is faster. No solve leaves such a plan behind once the merge
    has run (the product joins a kernel), so the premise is set explicitly: the plan of
    `_product_on_the_up_split` with `u` as its one residency."""
    from solver.plan import Residency
    from solver.spyre.split_k_hold import _kernel_members

    pg, solved = _product_on_the_up_split()
    d = replace(solved, resident={"u": Residency(0)})
    program, us = _simulated(pg, d)
    held = [t for t in ("a", "u") if isinstance(program.tensor_map()[t].memory, LxMemory)]
    assert held and _kernel_members(program, "prod") == ["prod"], \
        "the premise: the product, a kernel of its own, reads an input held in LX by an earlier kernel"
    got = hold_for_split_k(pg, HW, d, program, us)
    assert got.best is not None and got.us < us
    plan, variant, _ = got.best
    assert validate_program(variant, HW) == []
    assert plan.ops["prod"].core_split != d.ops["prod"].core_split
    assert isinstance(variant.tensor_map()["h"].memory, LxMemory)
    assert not any(isinstance(variant.tensor_map()[t].memory, LxMemory) for t in held)


def test_a_member_the_merge_puts_on_its_producers_split_joins_the_kernel(monkeypatch):
    """In `_product_on_the_up_split` the run gate -> act -> product keeps its planned splits
    (the product's differs from the activation's, so the product stays untiled: it would read
    other cores' parts), and merging it with the up projection's kernel re-splits gate and act
    onto the up projection's split, the product's. The merge then tries the product inside
    the kernel too: valid and faster than the plan that leaves it a kernel of its own."""
    from solver.spyre.fusion import merge
    from solver.spyre.split_k_hold import _kernel_members

    pg, solved = _product_on_the_up_split()
    d = _after_the_solve(pg, solved)
    program, us = _simulated(pg, d)
    assert d.ops["prod"].temporal_tiles
    assert {"gate", "act", "prod"} <= set(_kernel_members(program, "prod"))
    monkeypatch.setattr(merge, "_with_joining_members", lambda *a: None)
    d0 = _after_the_solve(pg, solved)
    program0, us0 = _simulated(pg, d0)
    assert not d0.ops["prod"].temporal_tiles and _kernel_members(program0, "prod") == ["prod"]
    assert us < 0.8 * us0
