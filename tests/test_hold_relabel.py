"""The LX-hold step's relabel move (solver.spyre.fusion.hold._relabel_producer): when the
readers of a result read, on each core, a box one core of its producer made, but on another
core, the producer's side takes the readers' core order instead of the readers moving
(they keep their own LX chains). The rotary-like graph of test_copy_lx: neg split rows x
heads (core 4*i + j: rows i, head j), its permute/slice/cat copies split heads x rows in the
natural order (core 8*h + l: head h, rows l)."""
from __future__ import annotations

import numpy as np

from target.interpreter import interpret
from target.superdsc import LxMemory
from simulator.api import compare
from simulator.run import run_program
from simulator.timing import time_program
from simulator.validate import validate_program
from solver.emit import emit_program
from solver.plan import Residency
from solver.spyre.fusion import hold
from test_copy_lx import HW, H, L, E, _plan, rotary_graph


def test_producer_takes_the_readers_core_order():
    pg = rotary_graph()
    d = _plan({"h": 4, "l": 8}, resident=False)
    prog = emit_program(pg, HW, d)
    ops = hold._relabel_producer(pg, prog, d, "t", HW)
    assert ops is not None
    # neg runs rows i, head j on the core the copies read head j, rows i on: 8*j + i
    assert sorted(ops["neg"].core_slices) == sorted((8 * j + i, {"r": i, "n": j}) for i in range(8) for j in range(4))
    for oid in ("permute", "slice", "cat"):
        assert ops[oid] is d.ops[oid]            # the readers do not move
    d.ops = ops
    d.resident["t"] = Residency(lx_address=0)
    held = emit_program(pg, HW, d)
    assert validate_program(held, HW) == []
    assert isinstance(held.tensor_map()["t"].memory, LxMemory)
    x = np.random.default_rng(3).standard_normal((L, H * E)).astype(np.float16)
    assert compare(run_program(held, {"x": x}, HW), interpret(pg, {"x": x}))[0] == 0.0


def test_no_relabel_where_readers_already_read_their_own_cores_or_no_matching_exists():
    pg = rotary_graph()
    d = _plan({"h": 4, "l": 8}, resident=False)
    d.ops["neg"].core_slices = [(8 * j + i, {"r": i, "n": j}) for i in range(8) for j in range(4)]
    assert hold._relabel_producer(pg, emit_program(pg, HW, d), d, "t", HW) is None
    # every copy core reads all four heads of its rows: no one neg core made that
    d = _plan({"l": 32}, resident=False)
    assert hold._relabel_producer(pg, emit_program(pg, HW, d), d, "t", HW) is None


def test_hold_step_relabels_and_holds(monkeypatch):
    monkeypatch.setattr(hold, "HOLD_MIN_BYTES", 0)
    pg = rotary_graph()
    d = _plan({"h": 4, "l": 8}, resident=False)
    prog = emit_program(pg, HW, d)
    rep = time_program(prog, HW)
    held_d, held_prog, held_rep = hold.hold_in_lx(pg, HW, (d, prog, rep), None, 0.0)
    assert validate_program(held_prog, HW) == []
    assert isinstance(held_prog.tensor_map()["t"].memory, LxMemory)
    assert held_rep.total_us < rep.total_us
