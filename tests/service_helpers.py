"""Helpers for the service tests: a real `sticksat serve` process on 127.0.0.1 and small
graph documents built by hand (so the tests do not need torch)."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServiceProcess:
    """`sticksat serve` in a subprocess; stderr (JSON logs) goes to a file."""

    def __init__(self, store: Path, log: Path, args: list[str], command: Optional[list[str]] = None,
                 env: Optional[dict] = None):
        self.store = store
        self.log_path = log
        self.args = args
        self.command = command or [sys.executable, "-m", "service.cli"]
        self.env = env
        self.proc: Optional[subprocess.Popen] = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, ready_timeout_s: float = 180.0) -> "ServiceProcess":
        self.port = free_port()
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("HF_HUB_OFFLINE", "1")
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self.command + ["serve", "--host", "127.0.0.1", "--port", str(self.port), "--store", str(self.store)]
            + self.args, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + ready_timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server not ready within {ready_timeout_s} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if getattr(self, "_log", None):
            self._log.close()
        self.proc = None

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def log_events(self) -> list[dict]:
        events = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict):
                events.append(entry)
        return events

    def metric(self, name: str, labels: Optional[dict[str, str]] = None) -> float:
        """Sum of a Prometheus sample over the series matching `labels`."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        total = 0.0
        for line in text.splitlines():
            m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$", line)
            if not m or m.group(1) != name:
                continue
            found = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            if labels and any(found.get(k) != v for k, v in labels.items()):
                continue
            total += float(m.group(3))
        return total

    def wait_idle(self, timeout_s: float = 120.0) -> None:
        """Until no job is in flight (a job outlives a request that hit its deadline)."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.metric("sticksat_inflight_jobs") == 0:
                return
            time.sleep(0.1)
        raise AssertionError("the solver pool did not drain")


def _meta(shape: list[int], dtype: str) -> dict:
    stride, acc = [], 1
    for size in reversed(shape):
        stride.insert(0, acc)
        acc *= size
    return {"shape": shape, "stride": stride, "storage_offset": 0, "dtype": dtype}


def chain_graph(rows: int, n_ops: int = 2, cols: int = 64, dtype: str = "float16", name: str = "chain") -> dict:
    """x[rows, cols] → add/mul alternately n_ops times (each op reads x and the previous
    value) → output. Distinct (rows, cols, n_ops) give distinct graph hashes."""
    meta = _meta([rows, cols], dtype)
    nodes, prev = [], "x"
    for i in range(n_ops):
        target = "aten.add.Tensor" if i % 2 == 0 else "aten.mul.Tensor"
        nid = f"op{i}"
        nodes.append({"id": nid, "target": target,
                      "args": [{"kind": "tensor", "node": prev}, {"kind": "tensor", "node": "x"}],
                      "outputs": [meta]})
        prev = nid
    return {"format": "sticksat.graph", "version": 1, "name": name,
            "inputs": [{"id": "x", "kind": "user_input", "meta": meta}],
            "nodes": nodes, "outputs": [{"kind": "tensor", "node": prev}]}


def loaded_modules(prefixes: tuple[str, ...]) -> list[str]:
    """The modules of these top-level packages loaded in this process (run in a pool
    worker to see what the worker imported)."""
    return sorted(m for m in sys.modules if m.split(".")[0] in prefixes)
