"""Builds keyed apart (lowering/version.py): the compiler version in every store key carries
a fingerprint of the code that decides what a program is, so an upgrade never serves the
old build's programs as current; `sticksat store adopt` takes them over deliberately,
after this build's simulator validates and times them again."""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import replace
from pathlib import Path

from lowering.version import (BUILD_FINGERPRINT, COMPILER_VERSION, FINGERPRINT_PACKAGES, PACKAGE_VERSION,
                              source_fingerprint)
from service import pipeline
from service.batch.inventory import adopt_programs, compile_into_store
from service.cli import main
from service.store import ProgramStore, program_key

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "benchmarks" / "graphs" / "tiny"


def test_the_version_carries_the_fingerprint():
    assert COMPILER_VERSION.startswith(PACKAGE_VERSION) and COMPILER_VERSION.endswith(BUILD_FINGERPRINT[:16])
    assert COMPILER_VERSION != PACKAGE_VERSION


def test_the_fingerprint_follows_the_code_that_makes_programs(tmp_path):
    for package in FINGERPRINT_PACKAGES + ("service",):
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    base = source_fingerprint(tmp_path)
    assert base == BUILD_FINGERPRINT  # a copy of the same code is the same build
    (tmp_path / "service" / "app.py").write_text("# the service is not part of a program\n")
    assert source_fingerprint(tmp_path) == base
    for changed in ("solver/emit.py", "target/targets/spyre.json", "simulator/timing.py", "lowering/lower.py"):
        path = tmp_path / changed
        original = path.read_bytes()
        path.write_bytes(original + b"\n")
        assert source_fingerprint(tmp_path) != base, changed
        path.write_bytes(original)
    assert source_fingerprint(tmp_path) == base


def _old_build_row(store: ProgramStore, graph_hash: str, version: str):
    """The current row of `graph_hash` rewritten as if another build had made it."""
    options = pipeline.resolve_options(None, None, False, None)
    hw = pipeline.load_hardware(options.target)
    current = store.get_program(program_key(graph_hash, COMPILER_VERSION, options.options_hash(), hw.digest))
    old_key = program_key(graph_hash, version, options.options_hash(), hw.digest)
    store.put_program(replace(current, key=old_key, compiler_version=version))
    return current, old_key


def _ready(client) -> None:
    deadline = time.time() + 120
    while client.get("/readyz").status_code != 200 and time.time() < deadline:
        time.sleep(0.1)


def test_an_old_builds_program_is_not_served_until_adopted(tmp_path, capsys):
    from fastapi.testclient import TestClient

    from service.app import ServiceConfig, create_app

    path = str(tmp_path / "store.sqlite")
    store = ProgramStore(path)
    document = json.loads((TINY / "linear_tiny_m16_k64_n128.json").read_text())
    from lowering.validate import parse_document

    graph_hash = parse_document(document).graph_hash()
    store.put_graph(graph_hash, json.dumps(document), "linear")
    # the old build: same package version, other code. Its row is under the key the old
    # scheme (package version only) made; a second old row holds a program that no longer validates
    assert compile_into_store(store, graph_hash, as_default=True, planner="heuristic") is not None
    current, old_key = _old_build_row(store, graph_hash, PACKAGE_VERSION)
    broken = json.loads(current.program)
    for tensor in broken["tensors"]:   # every tensor past the end of device memory
        if tensor["memory"]["kind"] == "hbm":
            tensor["memory"]["offset"] = 2**50
    _, bad_key = _old_build_row(store, graph_hash, "0.0.9")
    store.put_program(replace(store.get_program(bad_key), program=json.dumps(broken), stats={"simulated_us": 0.1}))
    store.quarantine(current.key, "test: as if this build had never compiled it")
    with TestClient(create_app(ServiceConfig(store_path=path, workers=1))) as client:
        _ready(client)
        reply = client.post("/compile", json={"graph": document})
        assert reply.status_code == 200, reply.text
        assert reply.json()["cached"] is False and reply.json()["compiler_version"] == COMPILER_VERSION
    # adopting: the broken one (faster on paper) is refused, the sound one adopted
    store.quarantine(current.key, "test: drop this build's row again")
    [row] = adopt_programs(store)
    assert row["outcome"] == "adopted" and row["from_version"] == PACKAGE_VERSION
    adopted = store.get_program(current.key)
    assert adopted.complete and adopted.compiler_version == COMPILER_VERSION
    assert adopted.stats["adopted_from"]["key"] == old_key and adopted.program == current.program
    assert adopted.stats["simulated_us"] == current.stats["simulated_us"]
    with TestClient(create_app(ServiceConfig(store_path=path, workers=1))) as client:
        _ready(client)
        reply = client.post("/compile", json={"graph": document})
        assert reply.json()["cached"] is True and reply.json()["stats"]["adopted_from"]["key"] == old_key
    assert main(["store", "adopt", "--store", path]) == 0
    assert "current: linear" in capsys.readouterr().out
