"""Plan decisions -> program (solver/emit.py) and the naive planner."""
import numpy as np
import pytest

from target.primitives import Access, Call, In, IterDim, MatmulBody, PointwiseBody, PrimOp, PrimTensor
from lowering.version import COMPILER_VERSION
from target.hardware import load_target
from target.superdsc import HbmMemory, LxMemory, Program
from simulator.validate import external_tensors, validate_program
from solver.emit import EmitError, emit_program
from solver.naive import plan_naive
from solver.plan import OpPlan, PlanDecisions, Residency, restick_id
from solver.planners import plan
from tests.hw_variants import spyre_variant, strict_bundles
from tests.primgraphs import ALL, attention_scores, copies, softmax

HW = load_target()
STRICT = strict_bundles()


def _two_consumers():
    pg, _ = attention_scores(B=2, S=128, D=64)
    pg.tensors["q2"] = PrimTensor("q2", (2, 128, 64), "float16", "user_input")
    pg.tensors["s2"] = PrimTensor("s2", (2, 128, 128), "float16")
    pg.ops.append(PrimOp("qk2", pg.ops[0].iter_dims, (Access("q2", (0, 1, 3)), Access("k", (0, 2, 3))),
                         Access("s2", (0, 1, 2)), MatmulBody(1, 2, 3)))
    pg.inputs.append("q2")
    pg.outputs.append("s2")
    return pg


def test_one_restickify_shared_by_all_consumers():
    pg = _two_consumers()
    prog = plan(pg, HW, planner="naive")
    rest = [o for o in prog.ops if o.kind == "restickify"]
    assert len(rest) == 1 and rest[0].src == "k" and rest[0].dst == restick_id("k", 1)
    readers = [o.id for o in prog.ops if o.prim and any(a["tensor"] == restick_id("k", 1)
                                                         for a in o.prim["inputs"])]
    assert readers == ["qk", "qk2"]
    assert [o.id for o in prog.ops].index(rest[0].id) < [o.id for o in prog.ops].index("qk")
    t = prog.tensor_map()[restick_id("k", 1)]
    # [2, 128, 64] fp16 sticked on dim 1: 2 sticks of 64 right before their elements
    assert t.layout.dim_map == [0, 2, 1, 1] and t.layout.device_size == [2, 64, 2, 64]
    assert t.layout.dim_order == [0, 2, 1]


def test_naive_plan_valid_for_every_hand_graph():
    for name, build in ALL.items():
        pg, _ = build()
        prog = plan(pg, HW, "naive")
        assert validate_program(prog, HW) == []
        assert prog.stats.planner == "naive"
        assert prog.stats.hardware_digest == HW.digest and prog.stats.compiler_version == COMPILER_VERSION
        for t in prog.tensors:
            assert isinstance(t.memory, HbmMemory)
            assert t.memory.offset % HW.stick_bytes == 0
        # outermost parallel dim split evenly as far as the cores allow
        for o in prog.ops:
            assert o.num_cores_used == len(o.core_slices) >= 1


def test_resident_chain_gets_lx_live_ranges_and_relayout():
    pg, _ = softmax(M=64, N=256)
    d = plan_naive(pg, HW)
    for op_id in ("amax", "sub", "exp", "sum", "div"):
        d.ops[op_id].core_split = {"m": 32}
    base = 0
    for t in ("mx", "sh", "ex", "sm"):
        d.resident[t] = Residency(lx_address=base)
        base += 8192
    prog = emit_program(pg, HW, d)
    assert validate_program(prog, HW) == []
    tm = prog.tensor_map()
    ex = tm["ex"].memory
    order = [o.id for o in prog.ops]
    assert isinstance(ex, LxMemory) and ex.live_from == order.index("exp") and ex.live_to == order.index("div")
    # per core: 2 rows x 256 fp16 = 1024 bytes
    assert ex.size_per_core == 1024
    assert isinstance(tm["x"].memory, HbmMemory) and isinstance(tm["p"].memory, HbmMemory)
    assert len({o.bundle for o in prog.ops}) == 1


def _exp_chain(n=12):
    from target.primitives import PrimGraph
    tensors = {"t0": PrimTensor("t0", (64, 64), "float16", "user_input")}
    ops = []
    for i in range(n):
        tensors[f"t{i + 1}"] = PrimTensor(f"t{i + 1}", (64, 64), "float16")
        ops.append(PrimOp(f"e{i}", (IterDim("m", 64), IterDim("n", 64)), (Access(f"t{i}", (0, 1)),),
                          Access(f"t{i + 1}", (0, 1)), PointwiseBody(Call("exp", (In(0),)))))
    return PrimGraph("chain", tensors, ops, ["t0"], [f"t{n}"])


def test_bundles_respect_the_external_tensor_limit():
    """Counted as the old program model did (every device-memory tensor; LX dies at a
    bundle boundary): a chain of 12 ops needs several bundles."""
    hw = STRICT
    pg = _exp_chain()
    prog = plan(pg, hw, planner="naive")
    assert len(prog.bundles) > 1
    for b in prog.bundles:
        assert len(b.external_tensors) <= hw.bundle_tensor_limit
        assert set(b.external_tensors) == external_tensors(prog, b.ops)
    # residency forbids a cut: keep t3..t5 in LX, the cut must not fall between e2 and e5
    d = plan_naive(pg, hw)
    d.resident["t3"] = Residency(0)
    d.resident["t4"] = Residency(4096)
    prog = emit_program(pg, hw, d)
    assert validate_program(prog, hw) == []
    b = {o.id: o.bundle for o in prog.ops}
    assert b["e2"] == b["e3"] == b["e4"]


def test_intermediates_in_device_memory_share_one_slot():
    """On Spyre the limit counts program inputs and outputs, and all device-memory
    intermediates together as one pool (torch-spyre fusion.py before PR #3069): the chain
    is one bundle (t0, t12 and the pool: 3 of 6 slots)."""
    pg = _exp_chain()
    prog = plan(pg, HW, planner="naive")
    assert len(prog.bundles) == 1 and len(prog.bundles[0].external_tensors) == 13
    assert validate_program(prog, HW) == []


def test_alias_copy_shares_bytes():
    pg, _ = copies()
    d = plan_naive(pg, HW)
    d.ops["reshape"].alias = True
    prog = emit_program(pg, HW, d)
    assert validate_program(prog, HW) == []
    tm = prog.tensor_map()
    assert tm["r"].memory.alias_of == "x" and tm["r"].memory.offset == tm["x"].memory.offset
    assert prog.ops[0].alias and prog.ops[0].ex_unit == "dma"
    d.ops["transpose"].alias = True
    with pytest.raises(EmitError):
        emit_program(pg, HW, d)


def test_explicit_core_slices_and_bundle_starts():
    pg, _ = softmax(M=64, N=256)
    d = plan_naive(pg, HW)
    d.ops["exp"] = OpPlan(core_split={"m": 4}, core_slices=[(3, {"m": 0}), (2, {"m": 1}), (1, {"m": 2}),
                                                             (0, {"m": 3})])
    d.bundle_starts = ["exp"]
    prog = emit_program(pg, HW, d)
    assert validate_program(prog, HW) == []
    exp = next(o for o in prog.ops if o.id == "exp")
    assert [c.core for c in exp.core_slices] == [3, 2, 1, 0] and exp.num_cores_used == 4
    assert exp.bundle == 1 and prog.ops[0].bundle == 0


def test_program_json_roundtrip():
    pg, _ = attention_scores()
    prog = plan(pg, HW, planner="naive")
    again = Program.from_json(prog.to_json())
    assert again == prog and validate_program(again, HW) == []


def test_restickify_of_a_resident_tensor_reads_what_each_core_holds():
    """k2 lives in LX sliced by batch; the copy sticked on s goes to device memory: the
    restickify follows the producer's slicing, so every core reads its own LX slice."""
    from target.primitives import Const
    pg, _ = attention_scores(B=2, S=128, D=64)
    pg.tensors["k2"] = PrimTensor("k2", (2, 128, 64), "float16")
    scale = PrimOp("scale", (IterDim("b", 2), IterDim("s", 128), IterDim("d", 64)), (Access("k", (0, 1, 2)),),
                   Access("k2", (0, 1, 2)), PointwiseBody(Call("mul", (In(0), Const(0.5)))))
    qk = pg.ops[0]
    pg.ops[:] = [scale, PrimOp("qk", qk.iter_dims, (qk.inputs[0], Access("k2", (0, 2, 3))), qk.output, qk.body)]
    d = plan_naive(pg, HW)
    d.ops["scale"].core_split = {"s": 2}
    d.resident["k2"] = Residency(0)
    prog = emit_program(pg, HW, d)
    assert validate_program(prog, HW) == []
    rest = next(o for o in prog.ops if o.kind == "restickify")
    assert rest.core_split == {"d1": 2}


def test_decisions_naming_unknown_ops_or_copies_are_rejected():
    pg, _ = softmax()
    d = plan_naive(pg, HW)
    d.ops["nope"] = OpPlan()
    with pytest.raises(EmitError):
        emit_program(pg, HW, d)
    d = plan_naive(pg, HW)
    d.restick_ops[restick_id("x", 0)] = OpPlan()
    with pytest.raises(EmitError):
        emit_program(pg, HW, d)
    d = plan_naive(pg, HW)
    d.resident["x"] = Residency(0)     # a graph input cannot live in LX
    with pytest.raises(EmitError):
        emit_program(pg, HW, d)


def test_naive_reduces_spans_over_the_per_core_limit():
    """x[512, 4096] @ w[4096, 65536] fp16: w is 512 MiB. Split over m alone, every core would
    address all of w; the naive plan must split so each core's span fits 256 MB (the
    torch-spyre span-reduction pass), then spend the remaining cores on m."""
    M, K, N = 512, 4096, 65536
    ts = {"x": PrimTensor("x", (M, K), "float16", "user_input"),
          "w": PrimTensor("w", (K, N), "float16", "parameter"), "y": PrimTensor("y", (M, N), "float16")}
    op = PrimOp("mm", (IterDim("m", M), IterDim("n", N), IterDim("k", K, "reduction")),
                (Access("x", (0, 2)), Access("w", (2, 1))), Access("y", (0, 1)), MatmulBody(0, 1, 2))
    from target.primitives import PrimGraph
    pg = PrimGraph("big", ts, [op], ["x", "w"], ["y"])
    d = plan_naive(pg, HW)
    split = d.ops["mm"].core_split
    assert split != {"m": 32}
    prog = emit_program(pg, HW, d)
    assert validate_program(prog, HW) == []
    d.ops["mm"].core_split = {"m": 32}
    assert "span_exceeded" in {i.code for i in validate_program(emit_program(pg, HW, d), HW)}


def _add_chain():
    """t_{i+1} = t_i + w_i over 8 ops, each reading its own parameter."""
    from target.primitives import PrimGraph
    tensors = {"t0": PrimTensor("t0", (64, 64), "float16", "user_input")}
    ops = []
    for i in range(8):
        tensors[f"w{i}"] = PrimTensor(f"w{i}", (64, 64), "float16", "parameter")
        tensors[f"t{i + 1}"] = PrimTensor(f"t{i + 1}", (64, 64), "float16")
        ops.append(PrimOp(f"a{i}", (IterDim("m", 64), IterDim("n", 64)),
                          (Access(f"t{i}", (0, 1)), Access(f"w{i}", (0, 1))), Access(f"t{i + 1}", (0, 1)),
                          PointwiseBody(Call("add", (In(0), In(1))))))
    return PrimGraph("chain2", tensors, ops, ["t0"] + [f"w{i}" for i in range(8)], ["t8"])


def test_bundle_cut_moves_before_an_lx_range_when_the_limit_hits_inside_it():
    """A chain where each op adds device-memory tensors: the greedy cut would fall inside the
    live range of an LX-resident tensor; where LX dies at a bundle boundary the emitter
    cuts before the range instead."""
    hw = STRICT
    pg = _add_chain()
    d = plan_naive(pg, hw)
    # greedy fills bundle 0 with a0..a2 (6 tensors) and would cut before a3, inside the live
    # range of t3 (a2 -> a3): the cut moves back before a2
    d.resident["t3"] = Residency(0)
    prog = emit_program(pg, hw, d)
    assert validate_program(prog, hw) == []
    b = {o.id: o.bundle for o in prog.ops}
    assert b["a2"] == b["a3"] and b["a1"] != b["a2"]
    for bd in prog.bundles:
        assert len(bd.external_tensors) <= hw.bundle_tensor_limit


def test_bundle_cut_inside_an_lx_range_where_lx_persists():
    """On Spyre LX contents survive a bundle boundary: the greedy cut stays where the limit
    hits (pool + t0 + w0..w3 = 6 slots, so a4 starts bundle 1), inside t4's live range
    (a3 -> a4), the program is valid and its functional run matches the interpreter. The
    same program on a target whose LX is wiped at a bundle boundary reads garbage."""
    from target.interpreter import interpret
    from simulator.api import compare
    from simulator.run import run_program
    from tests.primgraphs import inputs_for

    pg = _add_chain()
    d = plan_naive(pg, HW)
    d.resident["t4"] = Residency(0)
    prog = emit_program(pg, HW, d)
    assert validate_program(prog, HW) == []
    b = {o.id: o.bundle for o in prog.ops}
    assert b["a3"] == 0 and b["a4"] == 1
    inp = inputs_for(pg)
    ref = interpret(pg, inp)
    assert compare(run_program(prog, inp, HW), ref)[1] < 2e-3
    wiped = spyre_variant(lx_persists=False)
    assert not compare(run_program(prog, inp, wiped), ref)[1] < 2e-3   # NaN or wrong
    assert "lx_cross_bundle" in {i.code for i in validate_program(prog.to_dict() | {"stats": {
        **prog.stats.model_dump(), "hardware_digest": wiped.digest}}, wiped)}