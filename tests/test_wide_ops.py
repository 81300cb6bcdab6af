"""Ops wider than a bundle (solver.bundles.split_wide_copies) and tensors the device cannot
hold (solver.capacity.check_fits).

`aten.cat` of six or more program inputs took seven or more of a bundle's six tensor
slots, so every planner's program failed validation (`bundle_limit`) and the service
answered 500. Now it plans in every planner, under both bundle rules, and the program's
outputs equal the reference interpreter's exactly (a copy moves values, it does not
round them). A tensor no plan can hold is refused before planning with `does_not_fit`
(a 422), never `planner_failed`."""
from __future__ import annotations

import json

import numpy as np
import pytest

from hw_variants import strict_bundles
from lowering import lower_document
from lowering.errors import GraphError
from lowering.validate import parse_document
from service import pipeline
from simulator.api import simulate
from solver import planners
from solver.bundles import split_wide_copies
from solver.capacity import DoesNotFit, check_fits
from solver.planners import plan

HW = pipeline.load_hardware("spyre")


def _meta(shape, dtype="float16"):
    stride, acc = [], 1
    for s in reversed(shape):
        stride.insert(0, acc)
        acc *= s
    return {"shape": list(shape), "stride": stride, "storage_offset": 0, "dtype": dtype}


def _ref(node):
    return {"kind": "tensor", "node": node, "output": 0}


def cat_document(n: int, dim: int = 1, through_relu: int = 0) -> dict:
    """cat of n inputs along `dim` (widths 64, 32, 96, ... so pieces differ), the first
    `through_relu` of them passed through a relu first (intermediates among the pieces)."""
    widths = [(32, 64, 96)[i % 3] for i in range(n)]
    shapes = [[16, w] if dim == 1 else [w, 64] for w in widths]
    nodes, parts = [], []
    for i in range(n):
        if i < through_relu:
            nodes.append({"id": f"r{i}", "target": "aten.relu.default", "args": [_ref(f"x{i}")],
                          "outputs": [_meta(shapes[i])]})
            parts.append(_ref(f"r{i}"))
        else:
            parts.append(_ref(f"x{i}"))
    out = [16, sum(widths)] if dim == 1 else [sum(widths), 64]
    nodes.append({"id": "cat", "target": "aten.cat.default",
                  "args": [{"kind": "list", "items": parts}, {"kind": "int", "value": dim}],
                  "outputs": [_meta(out)]})
    return {"format": "sticksat.graph", "version": 1, "name": f"cat{n}",
            "inputs": [{"id": f"x{i}", "kind": "user_input", "meta": _meta(shapes[i])} for i in range(n)],
            "nodes": nodes, "outputs": [_ref("cat")]}


@pytest.mark.parametrize("planner", ["naive", "heuristic", "cpsat"])
@pytest.mark.parametrize("n", [6, 7, 16])
def test_a_wide_cat_plans_in_every_planner_with_exact_numerics(planner, n):
    pg = lower_document(parse_document(cat_document(n)))
    program = plan(pg, HW, planner=planner, time_limit_s=2, deterministic=True, fallback=False)
    assert program.stats.planner == planner
    result = simulate(program, HW, graph=pg, numerics=True)
    assert result.valid, result.errors
    assert len(result.outputs) == 1 and result.max_abs_err == 0.0
    assert len(program.bundles) >= 2  # the cat spans more than one kernel


@pytest.mark.parametrize("case", [dict(n=7, dim=0), dict(n=9, through_relu=4), dict(n=16, dim=0, through_relu=8)])
def test_wide_cats_along_other_dims_and_of_intermediates(case):
    pg = lower_document(parse_document(cat_document(**case)))
    for planner in ("naive", "heuristic"):
        program = plan(pg, HW, planner=planner, fallback=False)
        result = simulate(program, HW, graph=pg, numerics=True)
        assert result.valid and result.max_abs_err == 0.0, (planner, result.errors)


def test_under_the_strict_rule_every_tensor_counts():
    hw = strict_bundles()  # every device-memory tensor takes a slot: a tree of several levels
    pg = lower_document(parse_document(cat_document(16)))
    split = split_wide_copies(pg, hw)
    io = set(split.inputs) | set(split.outputs)
    from solver.bundles import op_slots

    assert all(op_slots(op, io, hw) <= hw.bundle_tensor_limit for op in split.ops)
    assert len(split.ops) > 4
    program = plan(pg, hw, planner="heuristic", fallback=False)
    result = simulate(program, hw, graph=pg, numerics=True)
    assert result.valid and result.max_abs_err == 0.0, result.errors


def test_a_cat_that_fits_is_left_alone():
    pg = lower_document(parse_document(cat_document(4)))
    assert split_wide_copies(pg, HW) is pg


def test_the_service_compiles_a_wide_cat():
    outcome = pipeline.compile_job(pipeline.CompileJob(
        document=json.dumps(cat_document(7)), options=pipeline.resolve_options("heuristic", strict=True)))
    assert outcome.status == "ok", outcome.error


# -- tensors the device cannot hold ------------------------------------------------------

def relu_document(shape, dtype="float16") -> dict:
    return {"format": "sticksat.graph", "version": 1, "name": "big",
            "inputs": [{"id": "x", "kind": "user_input", "meta": _meta(shape, dtype)}],
            "nodes": [{"id": "relu", "target": "aten.relu.default", "args": [_ref("x")],
                       "outputs": [_meta(shape, dtype)]}],
            "outputs": [_ref("relu")]}


def _never_planned(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a planner ran on a graph that cannot fit")
    for name in ("naive", "heuristic", "cpsat"):
        planners.ensure_registered(name)
        monkeypatch.setitem(planners.PLANNERS, name, refuse)


@pytest.mark.parametrize("shape,dtype,node,fragment", [
    # the case: a user input arrives sticked on its last dim, padded 1 -> 64: 256 GiB
    ([2**31 - 1, 1], "float16", "x", "usable device memory"),
    # 16 GiB written by one op: some core's slice spans past 32 x 256 MiB
    ([2**16, 2**16], "float32", "relu", "a core can address"),
])
def test_a_tensor_the_device_cannot_hold_is_refused_before_planning(monkeypatch, shape, dtype, node, fragment):
    _never_planned(monkeypatch)
    pg = lower_document(parse_document(relu_document(shape, dtype)))
    for planner in ("naive", "heuristic", "cpsat"):
        with pytest.raises(DoesNotFit) as info:
            plan(pg, HW, planner=planner, fallback=True)
        err = info.value
        assert isinstance(err, GraphError) and err.code == "does_not_fit" and err.node == node
        assert fragment in err.message and err.nbytes > err.limit


def test_what_just_fits_is_not_refused():
    # 8 GiB written by one op: exactly 32 x 256 MiB
    check_fits(lower_document(parse_document(relu_document([2**15, 2**16], "float32"))), HW)
    # a [2^31 - 1, 1] intermediate may be sticked on dim 0 (4 GiB); only the user input is padded 64x
    from solver.capacity import min_device_bytes

    pg = lower_document(parse_document(relu_document([2**31 - 1, 1])))
    assert min_device_bytes(pg.tensors["relu"], HW) == 2**31 * 2
    assert min_device_bytes(pg.tensors["x"], HW, stick_dim=1) == (2**31 - 1) * 64 * 2


def test_the_service_answers_does_not_fit_as_a_graph_error():
    outcome = pipeline.compile_job(pipeline.CompileJob(
        document=json.dumps(relu_document([2**31 - 1, 1])), options=pipeline.resolve_options("naive")))
    assert outcome.status == "graph_error" and outcome.error["code"] == "does_not_fit"
    assert outcome.error["node"] == "x" and outcome.error["bytes"] == (2**31 - 1) * 64 * 2


def test_numerics_of_a_split_cat_are_the_inputs_in_order():
    pg = lower_document(parse_document(cat_document(7)))
    program = plan(pg, HW, planner="naive", fallback=False)
    rng = np.random.default_rng(0)
    feed = {t: rng.standard_normal(pg.tensors[t].shape).astype(np.float16) for t in pg.inputs}
    result = simulate(program, HW, inputs=feed)
    want = np.concatenate([feed[f"x{i}"] for i in range(7)], axis=1)
    np.testing.assert_array_equal(np.asarray(result.outputs[0], dtype=np.float16), want)


def test_over_http_a_wide_cat_is_200_and_a_too_big_tensor_422(tmp_path):
    from fastapi.testclient import TestClient

    from service.app import ServiceConfig, create_app

    with TestClient(create_app(ServiceConfig(store_path=str(tmp_path / "store.sqlite"), workers=1))) as client:
        import time

        deadline = time.time() + 120
        while client.get("/readyz").status_code != 200 and time.time() < deadline:
            time.sleep(0.1)
        wide = client.post("/compile", json={"graph": cat_document(7), "options": {"planner": "heuristic"}})
        assert wide.status_code == 200, wide.text
        big = client.post("/compile", json={"graph": relu_document([2**31 - 1, 1]),
                                            "options": {"planner": "heuristic"}})
    assert big.status_code == 422 and big.json()["code"] == "does_not_fit" and big.json()["node"] == "x"
    assert "274877906816 bytes" in big.json()["detail"]
