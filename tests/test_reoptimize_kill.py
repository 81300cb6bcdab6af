"""A `sticksat reoptimize` run SIGKILLed mid-way (driver and its worker processes) and
rerun with the same budget: every graph is processed exactly once, what the killed run
committed stays as it was, and the store is intact (integrity, every program valid).
On both store backends."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from service.batch.inventory import add_graphs
from service.store import ProgramStore
from test_store_backends import store_url  # noqa: F401 - the fixture

TINY = Path(__file__).resolve().parent.parent / "benchmarks" / "graphs" / "tiny"
NAMES = ("bmm_tiny_b4_m32_k64_n32", "gpt2_tiny_block16", "linear_tiny_m16_k64_n128", "llama_tiny_decode32")


def _command(url):
    return [sys.executable, "-m", "service.cli", "reoptimize", "--store", url, "--time-limit", "1", "--jobs", "1",
            "--json"]


def test_killed_run_then_rerun_processes_each_graph_once(store_url, tmp_path):
    store = ProgramStore(store_url)
    add_graphs(store, [str(TINY / f"{n}.json") for n in NAMES])
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    log = tmp_path / "killed-run.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(_command(store_url), stdout=subprocess.DEVNULL, stderr=err, env=env,
                                start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None and not store.reoptimizations():
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its pool worker, mid-run
        proc.wait(timeout=30)
    first = {r.graph_hash: r for r in store.reoptimizations()}
    assert 1 <= len(first) < len(NAMES), f"not killed mid-way ({len(first)} processed): {log.read_text()[-2000:]}"
    assert store.integrity_errors() == []

    rerun = subprocess.run(_command(store_url), capture_output=True, text=True, env=env, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    summary = json.loads(rerun.stdout)
    outcomes = [r["outcome"] for r in summary["rows"]]
    # what the first run committed is skipped (or, proven optimal, not even considered)
    assert sum(o.startswith("skipped") for o in outcomes) == len(first)
    assert sum(o == "new" for o in outcomes) == len(NAMES) - len(first)

    rows = store.reoptimizations()
    assert sorted(r.graph_hash for r in rows) == sorted(h for h, _ in store.graph_hashes())  # once each
    for r in rows:
        if r.graph_hash in first:
            assert (r.run_id, r.finished_at) == (first[r.graph_hash].run_id, first[r.graph_hash].finished_at)
        else:
            assert r.run_id == summary["run_id"]
    assert store.integrity_errors() == []
    from service import pipeline
    from target.superdsc import Program
    from simulator.validate import validate_program

    hw = pipeline.load_hardware("spyre")
    programs = [p for h, _ in store.graph_hashes() for p in store.programs_for_graph(h)]
    assert len(programs) == len(NAMES)
    for p in programs:
        assert validate_program(Program.from_json(p.program), hw) == []
