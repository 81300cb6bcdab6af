"""The in-place row store (`scatter`, target/primitives.py): its program form (output
aliasing its table, format v3), the validator's rules for it (`in_place`, unsplit row
dims), the functional run and the interpreter against FMS's own store, and the timing
model's price (the rows written, not the table's size)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from simulator.run import run_program
from simulator.timing import time_program
from simulator.validate import validate_program
from solver.planners import plan
from target.hardware import load_target
from target.interpreter import interpret
from target.superdsc import PROGRAM_VERSION, Program
from tests.lowering_helpers import DocBuilder, to_numpy

pytest.importorskip("fms.utils.spyre.paged")  # registers spyre::paged_attn_* and their CPU kernels

STORE = "spyre.paged_attn_store.default"
COMPUTE = "spyre.paged_attn_compute.default"
HW = load_target()


def _store_graph(NB: int, B: int, slots=None, with_compute: bool = False, seed: int = 0):
    """A paged store of B new fp16 tokens into caches of NB blocks of 16 (2 kv heads x 64),
    optionally followed by a decode attention reading the stored caches."""
    BS, KH, D = 16, 2, 64
    g = torch.Generator().manual_seed(seed)
    if slots is None:
        slots = (torch.randperm(NB * BS, generator=g)[:B]).reshape(B, 1)
    kc = torch.randn(NB, BS, KH, D, generator=g).half()
    vc = torch.randn(NB, BS, KH, D, generator=g).half()
    b = DocBuilder()
    k2, v2 = b.call(STORE, b.input(torch.randn(B, 1, KH, D, generator=g).half()),
                    b.input(torch.randn(B, 1, KH, D, generator=g).half()), b.input(kc, kind="buffer"),
                    b.input(vc, kind="buffer"), b.input(slots))
    outs = [k2, v2]
    if with_compute:
        table = torch.arange(B * 2).reshape(B, 2) % NB
        tkv = torch.full((B,), 20)
        out = b.call(COMPUTE, b.input(torch.randn(B, 1, 4, D, generator=g).half()), k2, v2, D ** -0.5,
                     b.input(tkv), b.input(torch.zeros(B, dtype=torch.int64)), b.input(table))
        outs = [out] + outs
    return b, b.check(*outs)


def _scatter_ops(prog: Program):
    return [o for o in prog.ops if o.opfunc == "scatter"]


@pytest.mark.parametrize("planner", ["naive", "heuristic"])
def test_store_is_in_place_and_runs_like_fms(planner):
    """Every store writes its output into its cache's bytes (alias_of the cache input), the
    program validates, and its functional run equals the interpreter and FMS's store
    (exactly: a store only moves values), duplicates and a negative slot included."""
    slots = torch.tensor([[5], [37], [5], [-1]])   # token 2 rewrites token 0's slot; -1 wraps to the last
    b, pg = _store_graph(4, 4, slots=slots)
    prog = plan(pg, HW, planner=planner, fallback=False)
    stores = _scatter_ops(prog)
    assert len(stores) == 2
    tm = prog.tensor_map()
    for o in stores:
        out, table = tm[o.prim["output"]["tensor"]], tm[o.prim["inputs"][0]["tensor"]]
        assert table.id in prog.inputs and out.memory.alias_of == table.id
        assert out.memory.offset == table.memory.offset and out.layout == table.layout
    assert validate_program(prog, HW) == []
    got = run_program(prog, b.values, HW)
    ref = interpret(pg, b.values)
    for g_, r_, want in zip(got, ref, torch.ops.spyre.paged_attn_store(*[torch.from_numpy(b.values[f"in{i}"])
                                                                         for i in range(5)])):
        np.testing.assert_array_equal(g_, r_)
        np.testing.assert_array_equal(g_, to_numpy(want))


def test_store_then_attention_reads_the_updated_cache_on_the_simulator():
    b, pg = _store_graph(6, 2, with_compute=True)
    prog = plan(pg, HW, planner="heuristic", fallback=False)
    assert validate_program(prog, HW) == []
    got = run_program(prog, b.values, HW)
    for g_, r_ in zip(got, interpret(pg, b.values)):
        np.testing.assert_allclose(g_.astype(np.float32), r_.astype(np.float32), atol=2e-2, rtol=2e-2)


def test_store_time_is_the_rows_written_not_the_cache():
    """The store's simulated time and device bytes do not grow with the cache (8 vs 512
    blocks) and grow with the rows written (1 vs 16 tokens)."""
    def store_timing(NB, B):
        _, pg = _store_graph(NB, B)
        prog = plan(pg, HW, planner="naive", fallback=False)
        rep = time_program(prog, HW)
        ops = [rep.op(o.id) for o in _scatter_ops(prog)]
        return sum(o.duration_us for o in ops), sum(o.hbm_write_bytes for o in ops)
    small, big, more = store_timing(8, 1), store_timing(512, 1), store_timing(512, 16)
    assert small == big
    # one row of each cache: 2 kv heads x 64 fp16 = 2 sticks of 128 bytes
    assert small[1] == 2 * 2 * 128
    assert more[1] == 16 * small[1] and more[0] > small[0]


def _program(planner="naive", **kw):
    b, pg = _store_graph(4, 2, **kw)
    return b, pg, plan(pg, HW, planner=planner, fallback=False)


def _codes(doc) -> set[str]:
    return {i.code for i in validate_program(doc, HW)}


def test_validator_refuses_a_store_that_is_not_in_place():
    _, _, prog = _program()
    doc = prog.to_dict()
    out = _scatter_ops(prog)[0].prim["output"]["tensor"]
    t = next(t for t in doc["tensors"] if t["id"] == out)
    t["memory"] = {"kind": "hbm", "offset": 1 << 24}   # its own bytes: not the cache's
    assert "in_place" in _codes(doc)


def test_validator_refuses_an_in_place_output_in_another_layout():
    _, _, prog = _program()
    doc = prog.to_dict()
    out = _scatter_ops(prog)[0].prim["output"]["tensor"]
    t = next(t for t in doc["tensors"] if t["id"] == out)
    t["layout"] = {"dim_map": [1, 0, 2, 3, 3], "device_size": [16, 4, 2, 1, 64], "stick_elems": 64}
    assert "in_place" in _codes(doc)


def test_validator_refuses_reading_the_old_cache_after_the_store():
    """A read-after-write hazard: the attention reading the cache input (its old value)
    after the store has updated those bytes in place."""
    _, _, prog = _program(with_compute=True)
    doc = prog.to_dict()
    store = _scatter_ops(prog)[0]
    old, new = store.prim["inputs"][0]["tensor"], store.prim["output"]["tensor"]
    after = [o for o in doc["ops"][[o["id"] for o in doc["ops"]].index(store.id) + 1:]
             if any(a["tensor"] == new for a in o["prim"]["inputs"])]
    assert after
    for a in after[0]["prim"]["inputs"]:
        if a["tensor"] == new:
            a["tensor"] = old
    assert "in_place" in _codes(doc)
    # and a program output naming the old value
    doc = prog.to_dict()
    doc["outputs"] = [old if t == new else t for t in doc["outputs"]]
    assert "in_place" in _codes(doc)


def test_validator_refuses_splitting_the_rows_of_a_store():
    """Two cores storing rows could land two writes of one slot in either order."""
    _, _, prog = _program()
    doc = prog.to_dict()
    op = next(o for o in doc["ops"] if o["opfunc"] == "scatter")
    row_dim = op["prim"]["iter_dims"][0]["name"]
    assert op["prim"]["iter_dims"][0]["size"] == 2
    op["core_split"] = {row_dim: 2}
    op["num_cores_used"] = 2
    op["core_slices"] = [{"core": c, "slice": {row_dim: c}} for c in range(2)]
    assert "split_uneven" in _codes(doc)


def test_alias_of_without_an_alias_copy_or_in_place_op_is_refused():
    """An ordinary op's output (the slot's block index) declared as sharing its input's bytes."""
    _, _, prog = _program()
    doc = prog.to_dict()
    op = next(o for o in doc["ops"] if o["opfunc"] == "floordiv")
    block, slots = op["prim"]["output"]["tensor"], op["prim"]["inputs"][0]["tensor"]
    t = next(t for t in doc["tensors"] if t["id"] == block)
    src = next(t for t in doc["tensors"] if t["id"] == slots)
    t["memory"] = {"kind": "hbm", "offset": src["memory"]["offset"], "alias_of": slots}
    assert "alias_illegal" in _codes(doc)


def test_a_v2_program_reads_as_v3():
    _, _, prog = _program()
    assert prog.version == PROGRAM_VERSION == 3
    doc = json.loads(prog.to_json())
    doc["version"] = 2
    assert Program.model_validate(doc).version == 3 and validate_program(doc, HW) == []
    doc["version"] = 4
    assert _codes(doc) == {"version"}


def test_backend_returns_a_new_cache_and_leaves_the_callers_as_fms_does():
    """FMS's store is functional (it clones): through the backend the step returns the
    updated caches, equal to FMS's, and the caller's cache tensors keep their old values,
    although on the device the store updated the cache's bytes in place."""
    from tests.test_paged_attention import _PagedStep, _paged_case

    torch._dynamo.reset()
    B, H, KH, D, BS, NB = 2, 4, 2, 64, 16, 6
    q, kc, vc, tkv, start, table = _paged_case(5, B, 1, H, KH, D, BS, NB, [40, 23], [3, 0])
    slots = torch.stack([table[i, (t - 1) // BS] * BS + (t - 1) % BS for i, t in enumerate(tkv.tolist())])[:, None]
    g = torch.Generator().manual_seed(7)
    args = (q.half(), torch.randn(B, 1, KH, D, generator=g).half(), torch.randn(B, 1, KH, D, generator=g).half(),
            kc.half(), vc.half(), slots, tkv, start, table)
    before = (args[3].clone(), args[4].clone())
    with torch.no_grad():
        want = _PagedStep()(*args)
        got = torch.compile(_PagedStep(), backend="sticksat", dynamic=False,
                            options={"planner": "heuristic", "strict": True})(*args)
    assert torch.equal(args[3], before[0]) and torch.equal(args[4], before[1])
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
    assert not torch.equal(got[1], before[0])


def _span_variant(span_bytes: int):
    """spyre.json with a smaller per-core span, so a small cache is a large one."""
    from target.hardware import TARGETS_DIR, hardware_from_dict

    doc = json.loads((TARGETS_DIR / "spyre.json").read_text())
    doc["params"]["per_core_span_bytes"]["value"] = span_bytes
    return hardware_from_dict(doc, origin="spyre with a small span")


@pytest.mark.parametrize("planner", ["naive", "cpsat"])
def test_the_caches_fixed_layout_bounds_a_cores_span(planner):
    """A cache larger than a core's span (32 KB against 20 KB here; a deployment's 537 MB
    against 256 MB): with the kv heads outermost (the layout the lowering fixes) a core
    split over kv heads reaches half of it, and the store-and-attend step plans and
    validates; laid out row-major no split fits (every core reaches every block)."""
    import dataclasses

    from solver.planners import PlannerFailed

    hw = _span_variant(20 * 1024)
    _, pg = _store_graph(8, 2, with_compute=True)
    caches = [t for t in pg.tensors.values() if t.dim_order is not None]
    assert caches and all(t.dim_order == (2, 0, 1, 3) for t in caches)
    prog = plan(pg, hw, planner=planner, fallback=False, time_limit_s=5)   # validated inside
    tm = prog.tensor_map()
    for t in caches:
        assert tm[t.id].layout.dim_order == [2, 0, 1, 3]
    assert validate_program(prog, hw) == []
    row_major = dataclasses.replace(pg, tensors={k: dataclasses.replace(t, dim_order=None)
                                                 for k, t in pg.tensors.items()})
    with pytest.raises(PlannerFailed, match="span_exceeded"):
        plan(row_major, hw, planner="naive", fallback=False)


def test_the_lower_bound_charges_the_rows_stored_not_the_cache():
    """An in-place store's compulsory bytes are its rows (and the indices), whatever the
    cache's size, and the bound stays below the simulated time of the plans."""
    from solver.lower_bound import lower_bound

    bounds = {}
    for NB in (8, 512):
        _, pg = _store_graph(NB, 4)
        lb = lower_bound(pg, HW)
        bounds[NB] = lb.compulsory_bytes
        for planner in ("naive", "heuristic"):
            prog = plan(pg, HW, planner=planner, fallback=False)
            assert lb.split_bound_us <= time_program(prog, HW).total_us * (1 + 1e-9)
    assert bounds[8] == bounds[512]
    assert bounds[8] < 8 * 16 * 2 * 64 * 2   # less than one cache of 8 blocks
