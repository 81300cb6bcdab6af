"""The one partition step (solver/bundles.py): bundle cuts for every planner, on the
hardware file's rule (what the per-bundle limit counts, whether LX survives a boundary)."""
from target.primitives import Access, Call, In, IterDim, PointwiseBody, PrimGraph, PrimOp, PrimTensor
from target.hardware import load_target
from target.superdsc import LxMemory
from simulator.validate import bundle_slots_of, validate_program
from solver.bundles import OpSequence, fit_residencies, partition
from solver.emit import fit_bundles
from solver.emit import emit_program, op_sequence
from solver.naive import plan_naive
from solver.plan import Residency
from solver.planners import plan
from tests.hw_variants import strict_bundles

HW = load_target()
STRICT = strict_bundles()


def _seq(refs, io, lx=None, per_tile=(), keys=None):
    return OpSequence(refs=[frozenset(r) for r in refs], io=frozenset(io), lx_ranges=dict(lx or {}),
                      per_tile=frozenset(per_tile), kernel_key=keys or [None] * len(refs))


# each op reads its own parameter w_i and the previous intermediate: 8 ops, 4 parameters fit
# a bundle on Spyre (x + 4 weights + the pool = 6 slots)
REFS = [{"x", "w0", "t1"}] + [{f"t{i}", f"w{i}", f"t{i + 1}"} for i in range(1, 8)]
IO = {"x", "t8"} | {f"w{i}" for i in range(8)}


def test_greedy_cut_at_the_limit_counts_inputs_outputs_and_the_pool():
    part = partition(_seq(REFS, IO), HW)
    assert part.bundle_of == [0, 0, 0, 0, 1, 1, 1, 1] and part.fits
    # the old rule counts every device-memory tensor: 2 ops per bundle (x w0 t1 w1 t2 = 5, +w2 t3 = 7)
    assert partition(_seq(REFS, IO), STRICT).bundle_of == [0, 0, 1, 1, 2, 2, 3, 3]


def test_cut_inside_an_lx_range_only_where_lx_persists():
    lx = {"t4": (3, 4)}   # a3 writes t4 into LX, a4 reads it
    assert partition(_seq(REFS, IO, lx), HW).bundle_of == [0, 0, 0, 0, 1, 1, 1, 1]
    strict = partition(_seq(REFS, IO, {"t2": (1, 2)}), STRICT)
    assert strict.bundle_of[1] == strict.bundle_of[2] and strict.fits   # cut moved before a1


def test_a_tile_buffer_is_never_cut_even_where_lx_persists():
    lx = {"t4": (3, 4)}
    part = partition(_seq(REFS, IO, lx, per_tile={"t4"}), HW)
    assert part.bundle_of[3] == part.bundle_of[4] and part.fits   # cut moved before a3
    assert part.bundle_of == [0, 0, 0, 1, 1, 1, 1, 2]


def test_a_forced_cut_avoids_splitting_a_fused_run():
    keys = [None, None, (4, 32), (4, 32), (4, 32), None, None, None]   # a2..a4: one fused kernel
    part = partition(_seq(REFS, IO, keys=keys), HW)
    assert part.bundle_of[2] == part.bundle_of[3] == part.bundle_of[4] and part.fits
    assert part.bundle_of[1] != part.bundle_of[2]
    # a run too long for one bundle is split where the limit says
    keys = [(4, 32)] * 8
    assert partition(_seq(REFS, IO, keys=keys), HW).bundle_of == [0, 0, 0, 0, 1, 1, 1, 1]


def test_fit_residencies_drops_only_where_lx_dies_at_a_boundary():
    lx = {f"t{i}": (i - 1, i) for i in range(1, 8)}   # every intermediate in LX
    assert fit_residencies(_seq(REFS, IO, lx), HW) == []
    dropped = fit_residencies(_seq(REFS, IO, lx), STRICT)
    assert dropped
    left = {t: r for t, r in lx.items() if t not in dropped}
    assert partition(_seq(REFS, IO, left), STRICT).fits


def _add_chain(n=8):
    tensors = {"t0": PrimTensor("t0", (64, 64), "float16", "user_input")}
    ops = []
    for i in range(n):
        tensors[f"w{i}"] = PrimTensor(f"w{i}", (64, 64), "float16", "parameter")
        tensors[f"t{i + 1}"] = PrimTensor(f"t{i + 1}", (64, 64), "float16")
        ops.append(PrimOp(f"a{i}", (IterDim("m", 64), IterDim("n", 64)),
                          (Access(f"t{i}", (0, 1)), Access(f"w{i}", (0, 1))), Access(f"t{i + 1}", (0, 1)),
                          PointwiseBody(Call("add", (In(0), In(1))))))
    return PrimGraph("chain", tensors, ops, ["t0"] + [f"w{i}" for i in range(n)], [f"t{n}"])


def test_fit_bundles_on_decisions_and_the_emitter_agree():
    pg = _add_chain()
    for hw in (HW, STRICT):
        d = plan_naive(pg, hw)
        for i in range(1, 8):
            d.resident[f"t{i}"] = Residency(((i - 1) % 2) * 8192)
        fitted, dropped = fit_bundles(pg, hw, d)
        assert (dropped == []) == hw.lx_persists_across_bundles
        prog = emit_program(pg, hw, fitted)
        assert validate_program(prog, hw) == []
        seq, starts = op_sequence(pg, hw, fitted)
        assert [o.bundle for o in prog.ops] == partition(seq, hw, starts).bundle_of
        assert max(bundle_slots_of(prog, hw).values()) <= hw.bundle_tensor_limit


def test_heuristic_keeps_every_residency_on_a_layer_graph():
    """The baseline's LX plan is no longer cut back for bundles on Spyre (issue 11: it lost
    5-16 residencies per layer graph), and some LX value is read in a later bundle."""
    from benchmarks.suite import GRAPHS_DIR, read_document_text
    from lowering import lower_document
    from lowering.graph_format import GraphDocument

    pg = lower_document(GraphDocument.from_json(read_document_text(GRAPHS_DIR / "layers" / "gpt2_block512.json")))
    prog = plan(pg, HW, "heuristic")
    assert any("0 dropped for bundle limits" in n for n in prog.stats.notes), prog.stats.notes
    crossing = [t.id for t in prog.tensors if isinstance(t.memory, LxMemory)
                and prog.ops[t.memory.live_from].bundle != prog.ops[t.memory.live_to].bundle]
    assert crossing
    strict = plan(pg, STRICT, "heuristic")
    assert not any("0 dropped for bundle limits" in n for n in strict.stats.notes)
    assert validate_program(strict, STRICT) == []
