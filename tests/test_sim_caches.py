"""The memo caches of the validator, the timing model and the emitter (target.geometry
`set_caches`) change no result: every emit / validate / time call a planner makes gives the
same programs, the same issues in the same order and the same timings to the last bit with
the caches on (cold and warm) as on the reference path; and a program that differs from one
already judged in a single field that matters is judged on its own."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import simulator.lx_checks as lx_checks
import solver.emit as emit_mod
from benchmarks.bench_simulator import canonical, record_calls, sim_functions
from lowering import lower_document
from lowering.graph_format import GraphDocument
from target import geometry
from target.geometry import make_layout
from target.hardware import load_target
from target.superdsc import CoreSlice, HbmMemory, LxMemory, Program
from simulator.timing import time_program
from simulator.validate import validate_program
from solver.planners import plan
from tests import primgraphs

ROOT = Path(__file__).resolve().parents[1]
FUNCS = sim_functions()


@pytest.fixture(scope="module")
def hw():
    return load_target()


@pytest.fixture(autouse=True)
def caches_on():
    geometry.set_caches(True)
    geometry.clear_caches()
    yield
    geometry.set_caches(True)


def _layer(name: str):
    doc = json.loads((ROOT / "benchmarks" / "graphs" / "layers" / f"{name}.json").read_text())
    return lower_document(GraphDocument.model_validate(doc))


def _record(fn):
    """Run fn() and return every (name, args) call it made to the three functions, wherever
    they were imported, and fn's result."""
    return record_calls(fn)


def _replay(calls):
    return [canonical(n, FUNCS[n](*a, **k)) for n, a, k in calls]


def _same_on_every_path(calls):
    geometry.set_caches(False)
    ref = _replay(calls)
    geometry.set_caches(True)
    geometry.clear_caches()
    cold = _replay(calls)
    warm = _replay(calls)
    for (n, _, _), r, c, w in zip(calls, ref, cold, warm):
        assert c == r, f"{n}: cached (cold) differs from the reference"
        assert w == r, f"{n}: cached (warm) differs from the reference"
    return ref


TINY = ["mlp", "softmax", "attention_scores", "copies", "embedding", "colsum"]


@pytest.mark.parametrize("planner", ["naive", "heuristic", "cpsat"])
def test_tiny_graphs_every_planner(hw, planner):
    def run():
        return [plan(getattr(primgraphs, g)()[0], hw, planner, time_limit_s=2, deterministic=True) for g in TINY]
    calls, programs = _record(run)
    assert {n for n, _, _ in calls} >= {"emit_program", "validate_program"}
    _same_on_every_path(calls)
    # and the final programs themselves
    _same_on_every_path([("validate_program", (p, hw), {}) for p in programs]
                        + [("time_program", (p, hw), {}) for p in programs])


@pytest.fixture(scope="module")
def layer_cpsat(hw):
    """The calls of a cpsat plan of the BERT-base layer (its fusion search emits, validates
    and times the graph dozens of times) and the program: LX residencies, tile buffers, fused
    coarse-tiled kernels. (The GPT-2 block's plan has no tiled kernel on the recalibrated
    timing model: its 512-row projections lose more to re-reading their weights every row
    tile than tiling gains.)"""
    pg = _layer("bert_base_layer512")
    calls, program = _record(lambda: plan(pg, hw, "cpsat", time_limit_s=2, deterministic=True))
    return pg, calls, program


def test_cpsat_search_calls(hw, layer_cpsat):
    _, calls, program = layer_cpsat
    ref = _same_on_every_path(calls)
    assert sum(n == "validate_program" for n, _, _ in calls) >= 5
    assert any(r for (n, _, _), r in zip(calls, ref) if n == "validate_program"), \
        "the search met no invalid trial: the replay compared no issue list"
    assert any(getattr(t.memory, "per_tile", False) for t in program.tensors)


@pytest.mark.parametrize("graph,planner", [("gpt2_block512", "heuristic"), ("bert_base_layer512", "naive")])
def test_layer_planner_calls(hw, graph, planner):
    pg = _layer(graph)
    calls, _ = _record(lambda: plan(pg, hw, planner, time_limit_s=2, deterministic=True))
    assert calls
    _same_on_every_path(calls)


# -- one field changed: judged on its own ---------------------------------------------------------
@pytest.fixture(scope="module")
def fused_program(layer_cpsat):
    return layer_cpsat[2]


def _tensor(p: Program, tid: str):
    return next(t for t in p.tensors if t.id == tid)


def _swap_slices(q: Program, k: int, a: int, b: int) -> None:
    """Op k of q with cores a and b swapping their work slices (its own CoreSlice objects:
    the emitter shares one list between ops with the same split)."""
    cs = [CoreSlice(core=c.core, slice=dict(c.slice)) for c in q.ops[k].core_slices]
    cs[a].slice, cs[b].slice = cs[b].slice, cs[a].slice
    q.ops[k].core_slices = cs


def _mutants(p: Program):
    """(what, program) pairs: p with one field of one op or tensor changed."""
    out = []
    tm = p.tensor_map()
    lx = [t for t in p.tensors if isinstance(t.memory, LxMemory)]
    for k, o in enumerate(p.ops):
        split = {n: f for n, f in o.core_split.items() if f > 1}
        if split:
            n, f = next(iter(split.items()))
            q = p.model_copy(deep=True)
            q.ops[k].core_split = {**q.ops[k].core_split, n: f * 3}
            out.append((f"split {o.id} {n} x3", q))
            if len(o.core_slices) >= 2:
                q = p.model_copy(deep=True)
                _swap_slices(q, k, 0, 1)
                out.append((f"core slices of {o.id}: two cores swapped", q))
        if o.temporal_tiles:
            n = next(iter(o.temporal_tiles))
            q = p.model_copy(deep=True)
            q.ops[k].temporal_tiles = {**q.ops[k].temporal_tiles, n: 4096}
            out.append((f"tiles {o.id} {n}=4096", q))
            q = p.model_copy(deep=True)
            q.ops[k].temporal_tiles = {**q.ops[k].temporal_tiles, n: float(o.temporal_tiles[n])}
            out.append((f"float tiles {o.id} {n}", q))
        if split and o.prim:
            # the op's output sticked on a dim its split cuts: the split must now be in
            # whole sticks
            names = [d["name"] for d in o.prim["iter_dims"]]
            t = tm[o.prim["output"]["tensor"]]
            for j, d in enumerate(o.prim["output"]["dims"]):
                if d is not None and names[d] in split and j != t.layout.dim_order[-1] and t.memory.kind == "hbm":
                    q = p.model_copy(deep=True)
                    _tensor(q, t.id).layout = make_layout(t.shape, t.dtype, j, load_target().stick_bytes)
                    out.append((f"restuck {t.id} on split dim {j}", q))
                    break
    for t in lx:
        q = p.model_copy(deep=True)
        _tensor(q, t.id).memory.size_per_core = max(0, t.memory.size_per_core - 2 * load_target().stick_bytes)
        out.append((f"LX size of {t.id} two sticks short", q))
    for a, b in zip(lx, lx[1:]):
        if a.memory.live_to >= b.memory.live_from and b.memory.live_to >= a.memory.live_from:
            q = p.model_copy(deep=True)
            _tensor(q, b.id).memory.lx_address = a.memory.lx_address
            out.append((f"LX address of {b.id} onto {a.id}", q))
    for t in p.tensors:
        if isinstance(t.memory, HbmMemory) and len(t.shape) >= 2 and t.role == "intermediate" \
                and not t.memory.alias_of and tm[t.id].layout.dim_order[-1] != 0:
            q = p.model_copy(deep=True)
            lay = _tensor(q, t.id).layout
            lay.device_size = [s * 2 for s in lay.device_size]  # another layout, same tensor
            out.append((f"device_size of {t.id} doubled", q))
            break
    sb = load_target().stick_bytes
    for t in p.tensors:
        # the same tensor in another valid layout: sticked on another dim (the ops' stick
        # rules and splits see it), or its outer dims in another order (the spans do)
        if len(t.shape) < 2 or t.memory.kind != "hbm" or t.memory.alias_of:
            continue
        order = list(t.layout.dim_order)
        q = p.model_copy(deep=True)
        _tensor(q, t.id).layout = make_layout(t.shape, t.dtype, order[0], sb)
        out.append((f"stick of {t.id} on dim {order[0]}", q))
        if len(order) >= 3:
            q = p.model_copy(deep=True)
            _tensor(q, t.id).layout = make_layout(t.shape, t.dtype, order[-1], sb, order[1:-1] + order[:1] + order[-1:])
            out.append((f"dim order of {t.id} rotated", q))
            q = p.model_copy(deep=True)
            _tensor(q, t.id).layout = make_layout(t.shape, t.dtype, order[-1], sb, order[-1:] + order[:-1])
            out.append((f"group of {t.id}'s sticks outermost", q))
    # a few of each kind, spread over the program (each mutant is validated four times)
    kinds: dict[str, list] = {}
    for w, q in out:
        kinds.setdefault(" ".join(w.split(" ")[:2]) if w.startswith(("LX", "dim", "core")) else w.split(" ")[0],
                         []).append((w, q))
    return [m for ms in kinds.values() for m in ms[::max(1, len(ms) // 4)][:4]]


def _timing_or_error(q, hw):
    try:
        rep = time_program(q, hw)
    except Exception as e:  # an invalid program may not time: then both paths fail alike
        return type(e).__name__
    return rep.to_dict(), [(o.op_id, sorted(o.per_core.items())) for o in rep.ops]


def test_one_field_changed_is_judged_on_its_own(hw, fused_program):
    p = fused_program
    assert validate_program(p, hw) == []
    base_us = time_program(p, hw).total_us
    mutants = _mutants(p)
    for kind in ("split ", "core slices ", "tiles ", "float tiles ", "LX size ", "LX address ", "device_size ",
                 "stick of ", "dim order ", "group of ", "restuck "):
        assert any(w.startswith(kind) for w, _ in mutants), kind
    caught = 0
    for what, q in mutants:
        # the reference verdict, then the cached one right after the original (warm caches)
        # (the fusion search times trials before it validates them: invalid programs too)
        geometry.set_caches(False)
        ref_issues = [i.to_json() for i in validate_program(q, hw)]
        ref_time = _timing_or_error(q, hw)
        geometry.set_caches(True)
        geometry.clear_caches()
        assert validate_program(p, hw) == []
        time_program(p, hw)
        got = [i.to_json() for i in validate_program(q, hw)]
        assert got == ref_issues, what
        assert _timing_or_error(q, hw) == ref_time, what
        # and the original is still judged as before after the mutant
        assert validate_program(p, hw) == [], what
        assert time_program(p, hw).total_us == base_us, what
        caught += bool(ref_issues)
    # most single-field changes of a tight plan break it: the comparison above compared issues
    assert caught >= len(mutants) // 2, caught


def test_core_slices_of_an_lx_producer(hw, fused_program):
    """Two programs identical but for one LX producer's core -> slice map: the second's readers
    no longer find on each core what they read (lx_slice_mismatch / kernel order), which a
    cache keyed without the slices would miss."""
    p = fused_program
    tm = p.tensor_map()
    found = 0
    for k, o in enumerate(p.ops):
        t = tm.get(o.prim["output"]["tensor"]) if o.prim else None
        if t is None or not isinstance(t.memory, LxMemory) or len(o.core_slices) < 2:
            continue
        q = p.model_copy(deep=True)
        _swap_slices(q, k, 0, -1)
        geometry.set_caches(False)
        ref = [i.to_json() for i in validate_program(q, hw)]
        geometry.set_caches(True)
        assert validate_program(p, hw) == []
        got = [i.to_json() for i in validate_program(q, hw)]
        assert got == ref
        if any(i["code"] in ("lx_slice_mismatch", "kernel_tile_order") for i in ref):
            found += 1
            if found >= 2:
                break
    assert found >= 1


def test_emit_lx_sizes_follow_the_plan(hw, layer_cpsat):
    """emit_program's memoized LX sizing: decisions that differ from ones already emitted in
    one LX producer's split or tiles give that producer's tensor its own size."""
    from dataclasses import replace

    from target.op_rules import legal_core_splits
    from target.geometry import op_granules
    pg, calls, _ = layer_cpsat
    d = next(a[2] for n, a, _ in reversed(calls) if n == "emit_program" and a[2].resident)
    prims = {op.id: op for op in pg.ops}
    changed = 0
    for t, r in d.resident.items():
        prod = next((op for op in pg.ops if op.output.tensor == t), None)
        if prod is None or prod.id not in d.ops:
            continue
        geometry.set_caches(True)
        base = emit_mod.emit_program(pg, hw, d)
        tm = base.tensor_map()
        lay = {x.id: x.layout for x in base.tensors}
        dts = {x.id: x.dtype for x in base.tensors}
        cur = {n: f for n, f in d.ops[prod.id].core_split.items() if f > 1}
        for split in legal_core_splits(prims[prod.id], op_granules(prims[prod.id], lay, dts, hw.stick_bytes), hw.cores):
            if split == cur or not split:
                continue
            ops = dict(d.ops)
            ops[prod.id] = replace(ops[prod.id], core_split=dict(split), core_slices=None)
            d2 = replace(d, ops=ops, resident={x: replace(v, size_per_core=None) if x == t else v
                                               for x, v in d.resident.items()})
            try:
                got = emit_mod.emit_program(pg, hw, d2).model_dump(mode="json")
            except ValueError:
                continue
            geometry.set_caches(False)
            ref = emit_mod.emit_program(pg, hw, d2).model_dump(mode="json")
            geometry.set_caches(True)
            assert got == ref
            new_size = next(x for x in got["tensors"] if x["id"] == t)["memory"]["size_per_core"]
            changed += new_size != tm[t].memory.size_per_core
            break
        if changed >= 2:
            break
    assert changed >= 1


def test_caches_stay_bounded(hw, fused_program):
    for c in geometry._CACHES:
        assert c.maxsize <= 4096
    p = fused_program
    for _ in range(3):
        validate_program(p, hw)
        time_program(p, hw)
    for c in geometry._CACHES:
        assert len(c.data) <= c.maxsize
        if c.max_bytes is not None:
            assert 0 <= c.nbytes <= c.max_bytes
            assert c.nbytes == sum(c.weigh(v) for v in c.data.values())
    stats = geometry.cache_stats()
    assert stats["validate.op_geometry"][1] > 0 and stats["timing.op_geometry"][1] > 0


def test_lru_evicts_by_count_and_bytes():
    lru = geometry.LRU(3, "test.lru", max_bytes=10, weigh=len)
    try:
        made = []

        def make(v):
            made.append(v)
            return v
        assert lru.get("a", lambda: make("xxxx")) == "xxxx"
        assert lru.get("b", lambda: make("yyyy")) == "yyyy"
        assert lru.get("a", lambda: make("never")) == "xxxx"      # a hit: not made again
        assert lru.get("c", lambda: make("zzzz")) == "zzzz"       # 12 bytes > 10: b (least recent) goes
        assert list(lru.data) == ["a", "c"] and lru.nbytes == 8
        lru.get("d", lambda: make("w"))
        lru.get("e", lambda: make("v"))                           # 4 entries > 3: a goes
        assert list(lru.data) == ["c", "d", "e"] and lru.nbytes == 6
        assert lru.get("big", lambda: make("q" * 50)) == "q" * 50  # alone over the budget: still kept
        assert list(lru.data) == ["big"] and lru.nbytes == 50
        assert made == ["xxxx", "yyyy", "zzzz", "w", "v", "q" * 50]
        assert (lru.hits, lru.misses) == (1, 6)
    finally:
        geometry._CACHES.remove(lru)


def test_timing_judges_a_producers_core_slices_on_their_own(hw):
    """A fused kernel member reads on chip what its own cores produced: with the producer's
    core -> slice map permuted (everything else equal) the read is no longer served on chip,
    and the cached timing must see that (the per-core boxes come from the slices)."""
    from tests.test_timing import _plan, unary_chain
    pg = unary_chain(2048, 2048, n_ops=3)
    d = _plan({"op1": {"r": 32}, "op2": {"r": 32}, "op3": {"r": 32}}, tiles={"op1": {"r": 4}, "op2": {"r": 4}})
    p = emit_mod.emit_program(pg, hw, d)
    base = time_program(p, hw)
    assert "fused: t1 produced on chip" in base.op("op2").effects
    q = p.model_copy(deep=True)
    _swap_slices(q, 0, 0, -1)
    geometry.set_caches(False)
    ref = time_program(q, hw)
    geometry.set_caches(True)
    assert time_program(p, hw).to_dict() == base.to_dict()  # the original's geometry cached
    got = time_program(q, hw)
    assert "fused: t1 produced on chip" not in ref.op("op2").effects
    assert got.to_dict() == ref.to_dict()
    assert got.total_us != base.total_us


def test_threads_share_the_caches(hw, fused_program):
    """Worker threads validating and timing programs at once (the service renders reports in
    threads) get the reference results."""
    from concurrent.futures import ThreadPoolExecutor
    programs = [fused_program] + [q for _, q in _mutants(fused_program)[::4][:5]]

    def judge(q):
        return [i.to_json() for i in validate_program(q, hw)], _timing_or_error(q, hw)
    geometry.set_caches(False)
    ref = [judge(q) for q in programs]
    geometry.set_caches(True)
    geometry.clear_caches()
    order = [i for _ in range(3) for i in range(len(programs))]
    order = order[1::2] + order[::2]
    with ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda i: (i, judge(programs[i])), order))
    for i, res in got:
        assert res == ref[i], i


def test_vectorized_tile_order_matches_the_reference():
    """`lx_checks.tile_order_problem` (all cores at once) says what the per-core reference
    says, message included, on random producer / reader tile boxes."""
    import numpy as np
    rng = np.random.default_rng(7)
    seen = set()
    for _ in range(1500):
        rank = int(rng.integers(0, 4))
        n_pc, n_rc = int(rng.integers(1, 6)), int(rng.integers(1, 6))
        pcores = sorted(rng.choice(8, n_pc, replace=False).tolist())
        rcores = sorted(rng.choice(8, n_rc, replace=False).tolist())
        tp, tr = int(rng.integers(1, 5)), int(rng.integers(1, 5))
        plo = rng.integers(0, 4, (n_pc, tp, rank))
        phi = plo + rng.integers(0, 5, (n_pc, tp, rank))
        rlo = rng.integers(0, 4, (n_rc, tr, rank))
        rhi = rlo + rng.integers(-1, 4, (n_rc, tr, rank))
        if rng.random() < 0.5:
            # readers tiled like the producer (the common case): each reader box inside
            # the producer's box of the same core in a random tile i (i <= j mostly)
            for ci, c in enumerate(rcores):
                if c not in pcores:
                    continue
                row = pcores.index(c)
                for j in range(tr):
                    i = min(tp - 1, max(0, j - int(rng.integers(-1, 2))))
                    rlo[ci, j], rhi[ci, j] = plo[row, i], phi[row, i]
        pbox, rbox = (pcores, plo, phi), (rcores, rlo, rhi)
        want = lx_checks.tile_order_problem_ref(pbox, rbox)
        assert lx_checks.tile_order_problem(pbox, rbox) == want
        seen.add(None if want is None else want.split(" ")[2])
    assert seen == {None, "reads", "needs"}  # every verdict met


def test_loop_nests_parsed_once_per_content(hw, fused_program):
    """`geometry.parsed_prim` serves equal JSON from one parse, and a nest edited in place
    (the same dict the cache saw) is parsed afresh: the validator judges the edit."""
    import copy

    q = fused_program.model_copy(deep=True)
    assert validate_program(q, hw) == []
    o = next(o for o in q.ops if o.kind == "compute" and o.prim and o.prim["iter_dims"])
    first = geometry.parsed_prim(o.prim)
    assert geometry.parsed_prim(copy.deepcopy(o.prim)) is first
    o.prim["iter_dims"][0]["size"] += 1
    edited = geometry.parsed_prim(o.prim)
    assert edited.iter_dims[0].size == first.iter_dims[0].size + 1
    assert any(i.code == "shape_mismatch" and i.op == o.id for i in validate_program(q, hw))
    # a malformed nest raises what op_from_json raises, every time (never cached)
    bad = copy.deepcopy(o.prim)
    del bad["output"]
    for _ in range(2):
        with pytest.raises(KeyError):
            geometry.parsed_prim(bad)
