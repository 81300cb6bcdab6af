"""Issue 31: `sticksat reoptimize` bounded per graph and stoppable.

- A re-solve past its wall-time limit is stopped (its worker killed) and the graph fails
  with "time limit"; the stored plan is kept. (Before: `--time-limit 20` on a large graph
  was still running at 150 s.)
- A re-solve past its memory limit fails that graph only.
- SIGINT (Ctrl-C) and SIGTERM of the driver stop the run within seconds and leave no
  worker process; SIGKILL of the driver leaves none either (they die with it).
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from service.batch import reoptimize as reopt
from service.batch.inventory import add_graphs
from service.store import ProgramStore

GRAPHS = Path(__file__).resolve().parent.parent / "benchmarks" / "graphs"
# A graph CP-SAT does not prove optimal within seconds: with the "whole" budget mode the
# re-solve searches for the whole time limit.
LONG = GRAPHS / "layers" / "llama31_8b_prefill512.json"


def _store_with(tmp_path, paths) -> str:
    url = str(tmp_path / "store.sqlite")
    store = ProgramStore(url)
    add_graphs(store, [str(p) for p in paths])
    store.close()
    return url


def _hog_memory(task):
    """A 'solve' that keeps allocating (what the probes saw: 9 MB/s for minutes)."""
    chunks = []
    while True:
        chunks.append(bytearray(256 * 2**20))


def test_a_graph_past_its_wall_time_limit_is_stopped_and_fails(tmp_path):
    url = _store_with(tmp_path, [LONG])
    started = time.monotonic()
    summary = reopt.reoptimize(url, budget_s=600.0, engine="local", jobs=1, graph_wall_s_limit=3.0)
    elapsed = time.monotonic() - started
    (row,) = summary.rows
    assert row.outcome == "failed" and row.error.startswith("time limit"), row
    assert elapsed < 300  # stopped by the 3 s limit, not after the 600 s budget


def test_a_graph_past_its_memory_limit_fails_alone(tmp_path):
    url = _store_with(tmp_path, [GRAPHS / "tiny" / "linear_tiny_m16_k64_n128.json"])
    summary = reopt.reoptimize(url, budget_s=1.0, engine="local", jobs=1, memory_bytes=3 * 2**30,
                               solve=_hog_memory)
    (row,) = summary.rows
    assert row.outcome == "failed" and "memory limit" in row.error, row


def _stat(pid: int):
    """(parent pid, state) from /proc, or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[1]), fields[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None:
                children.setdefault(stat[0], []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _alive(pids) -> list[int]:
    return [pid for pid in pids if (_stat(pid) or (0, "Z"))[1] != "Z"]


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [part.decode(errors="replace") for part in f.read().split(b"\0") if part]
    except FileNotFoundError:
        return []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_stopping_the_driver_leaves_no_worker(tmp_path, sig):
    url = _store_with(tmp_path, [LONG])
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "service.cli", "reoptimize", "--store", url, "--time-limit",
                             "600", "--jobs", "1", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, text=True)
    try:
        # wait for the solving worker (a python child that is not multiprocessing's tracker)
        deadline = time.time() + 120
        workers: list[int] = []
        while time.time() < deadline and not workers:
            time.sleep(0.2)
            workers = [pid for pid in _descendants(proc.pid) if "resource_tracker" not in " ".join(
                _cmdline(pid))]
        assert workers, "no worker started"
        time.sleep(3)  # the worker is solving
        everyone = _descendants(proc.pid)
        proc.send_signal(sig)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    if sig == signal.SIGINT:
        assert proc.returncode == 130, proc.stderr.read()[-2000:]
    elif sig == signal.SIGTERM:
        assert proc.returncode == 143, proc.stderr.read()[-2000:]
    deadline = time.time() + 10
    while _alive(everyone) and time.time() < deadline:
        time.sleep(0.1)
    assert _alive(everyone) == [], [(_cmdline(p)) for p in _alive(everyone)]
    store = ProgramStore(url)
    try:
        assert store.integrity_errors() == []
    finally:
        store.close()

