"""Hostile-operator probes of the compile service (issue 31), each against a fresh real
`sticksat serve` on 127.0.0.1, measured the same way: the requests sent and their
statuses, the 5xx among them, the peak RSS of the server process and of its workers
(sampled every 50 ms from /proc), and the worst /healthz latency (probed every 50 ms
while the probe runs). Not a unit test: the tests reproduce each failure; this prints
the numbers docs/reliability.md reports.

    .venv/bin/python benchmarks/probe_service.py [--only NAME] [--json out.json]

Probes: idle (nothing sent: the machine's baseline), reports (a flood of report requests for a 5,000-op program), bodies (eight
concurrent 986 KiB bodies), wall (cpsat with time_limit_s 2 on the llama prefill layer),
wall_big (the same on a 5,000-node chain),
idle_kill (an idle worker SIGKILLed, a compile at once), retry_after (nine cpsat jobs of
3 s for one worker, then one more), disk_full (the store on a 4 MiB tmpfs, filled; root
only).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from service_helpers import ServiceProcess, chain_graph  # noqa: E402

LAYERS = REPO / "benchmarks" / "graphs" / "layers"


def _rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                pass
    return out


class Watch:
    """Samples server and worker RSS and probes /healthz until stopped."""

    def __init__(self, server: ServiceProcess):
        self.server, self.stop_at = server, None
        self.server_peak = self.worker_peak = 0
        self.healthz_worst = 0.0
        self.healthz_failed = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._rss, daemon=True),
                         threading.Thread(target=self._healthz, daemon=True)]

    def __enter__(self):
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        for t in self._threads:
            t.join(60)

    def _rss(self):
        pid = self.server.proc.pid
        while not self._stop.is_set():
            self.server_peak = max(self.server_peak, _rss_kib(pid))
            for child in _children(pid):
                self.worker_peak = max(self.worker_peak, _rss_kib(child))
            time.sleep(0.05)

    def _healthz(self):
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                try:
                    ok = client.get(self.server.url + "/healthz").status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.healthz_worst = max(self.healthz_worst, time.perf_counter() - t0)
                self.healthz_failed += 0 if ok else 1
                time.sleep(0.05)

    def numbers(self) -> dict:
        return {"server_rss_peak_mib": round(self.server_peak / 1024), "worker_rss_peak_mib":
                round(self.worker_peak / 1024), "healthz_worst_s": round(self.healthz_worst, 3),
                "healthz_failed": self.healthz_failed}


def _start(base: Path, args: list[str], store: Path | None = None) -> ServiceProcess:
    return ServiceProcess(store or base / "store.sqlite", base / "server.log", args).start()


def _statuses(responses) -> dict:
    out: dict[str, int] = {}
    for r in responses:
        key = str(r.status_code) if isinstance(r, httpx.Response) else type(r).__name__
        out[key] = out.get(key, 0) + 1
    return out


def _many(fn, items, workers):
    def safe(item):
        try:
            return fn(item)
        except httpx.HTTPError as exc:
            return exc
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(safe, items))


def probe_idle(base: Path) -> dict:
    """No requests: what /healthz and RSS look like on this machine with nothing to do (a
    shared machine's load shows here)."""
    server = _start(base, ["--workers", "1", "--queue-limit", "8"])
    try:
        with Watch(server) as watch:
            time.sleep(20)
        return {"requests": 0, "statuses": {}, **watch.numbers()}
    finally:
        server.stop()


def probe_reports(base: Path) -> dict:
    server = _start(base, ["--workers", "1", "--queue-limit", "8", "--max-nodes", "5000"])
    try:
        graph = chain_graph(rows=64, n_ops=5000, name="big-report")
        resp = httpx.post(server.url + "/compile", json={"graph": graph, "options": {"planner": "naive"}},
                          timeout=600)
        resp.raise_for_status()
        key = resp.json()["key"]
        other = httpx.post(server.url + "/compile", json={"graph": graph, "options": {"planner": "heuristic"}},
                           timeout=600).json()["key"]
        paths = [f"/programs/{key}/report", f"/programs/{key}/report?format=json",
                 f"/programs/{key}/report?against={other}", f"/programs/{other}/report"] * 6
        started = time.perf_counter()
        with Watch(server) as watch:
            responses = _many(lambda p: httpx.get(server.url + p, timeout=600), paths, len(paths))
        return {"requests": len(paths), "statuses": _statuses(responses), "seconds": round(time.perf_counter() - started, 1),
                **watch.numbers()}
    finally:
        server.stop()


def probe_bodies(base: Path) -> dict:
    server = _start(base, ["--workers", "1", "--queue-limit", "8", "--max-nodes", "5000"])
    try:
        bodies = []
        for i in range(8):
            n = 3000
            while True:
                body = json.dumps({"graph": chain_graph(rows=64 + i, n_ops=n, name=f"body{i}"),
                                   "options": {"planner": "naive"}}).encode()
                if len(body) > 986 * 1024:
                    break
                n += 100
            bodies.append(body)
        with Watch(server) as watch:
            responses = _many(lambda b: httpx.post(server.url + "/compile", content=b, timeout=600,
                                                   headers={"content-type": "application/json"}), bodies, 8)
        return {"requests": 8, "body_kib": round(len(bodies[0]) / 1024), "statuses": _statuses(responses),
                **watch.numbers()}
    finally:
        server.stop()


def probe_wall(base: Path) -> dict:
    server = _start(base, ["--workers", "1", "--queue-limit", "8"])
    try:
        graph = json.loads((LAYERS / "llama31_8b_prefill512.json").read_text())
        with Watch(server) as watch:
            t0 = time.perf_counter()
            resp = httpx.post(server.url + "/compile", json={"graph": graph, "options": {
                "planner": "cpsat", "time_limit_s": 2}}, timeout=600)
            wall = time.perf_counter() - t0
        body = resp.json()
        return {"requests": 1, "statuses": {str(resp.status_code): 1}, "wall_s": round(wall, 1),
                "complete": body.get("complete"), "planner": (body.get("stats") or {}).get("planner"),
                **watch.numbers()}
    finally:
        server.stop()


def probe_wall_big(base: Path) -> dict:
    """cpsat, time_limit_s 2, on a 5,000-node chain (the size the probes of issue 31 used)."""
    server = _start(base, ["--workers", "1", "--queue-limit", "8", "--max-nodes", "5000"])
    try:
        graph = chain_graph(rows=64, n_ops=5000, name="wall-big")
        with Watch(server) as watch:
            t0 = time.perf_counter()
            resp = httpx.post(server.url + "/compile", json={"graph": graph, "options": {
                "planner": "cpsat", "time_limit_s": 2}}, timeout=900)
            wall = time.perf_counter() - t0
        body = resp.json()
        return {"requests": 1, "statuses": {str(resp.status_code): 1}, "wall_s": round(wall, 1),
                "complete": body.get("complete"), "planner": (body.get("stats") or {}).get("planner"),
                "code": body.get("code"), **watch.numbers()}
    finally:
        server.stop()


def probe_idle_kill(base: Path) -> dict:
    server = _start(base, ["--workers", "1", "--queue-limit", "8"])
    try:
        responses = []
        with Watch(server) as watch:
            for i in range(10):
                httpx.get(server.url + "/readyz", timeout=60)
                time.sleep(1.0)  # the fresh worker warmed
                for pid in _children(server.proc.pid):
                    if "resource_tracker" not in open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace"):
                        os.kill(pid, signal.SIGKILL)
                responses.append(httpx.post(server.url + "/compile", json={
                    "graph": chain_graph(rows=32 + i, name=f"idle{i}"), "options": {"planner": "naive"}}, timeout=120))
        return {"requests": len(responses), "statuses": _statuses(responses), **watch.numbers()}
    finally:
        server.stop()


def probe_retry_after(base: Path) -> dict:
    server = _start(base, ["--workers", "1", "--queue-limit", "8"])
    try:
        graph = json.loads((REPO / "benchmarks" / "graphs" / "tiny" / "gpt2_tiny_block16.json").read_text())
        bodies = []
        for i in range(10):
            g = dict(graph, name=f"retry{i}")
            bodies.append({"graph": g, "options": {"planner": "cpsat", "time_limit_s": 3 + 0.01 * i}})
        with Watch(server) as watch:
            with ThreadPoolExecutor(9) as pool:
                futures = [pool.submit(httpx.post, server.url + "/compile", json=b, timeout=600) for b in bodies[:9]]
                time.sleep(2.0)
                last = httpx.post(server.url + "/compile", json=bodies[9], timeout=600)
                responses = [f.result() for f in futures] + [last]
        return {"requests": 10, "statuses": _statuses(responses), "last_status": last.status_code,
                "retry_after_s": last.headers.get("retry-after"), **watch.numbers()}
    finally:
        server.stop()


def probe_disk_full(base: Path) -> dict:
    mount = base / "tmpfs"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)]).returncode != 0:
        return {"skipped": "cannot mount a tmpfs"}
    try:
        server = ServiceProcess(mount / "store.sqlite", base / "server.log",
                                ["--workers", "1", "--min-free-bytes", "65536"]).start()
        try:
            ok = httpx.post(server.url + "/compile", json={"graph": chain_graph(rows=64, name="pre"),
                                                           "options": {"planner": "naive"}}, timeout=120)
            with open(mount / "junk", "wb") as f:
                try:
                    while True:
                        f.write(b"\0" * 65536)
                        f.flush()
                except OSError:
                    pass
            with Watch(server) as watch:
                responses = [httpx.post(server.url + "/compile", json={"graph": chain_graph(rows=64, n_ops=3 + i,
                                                                                              name=f"full{i}"),
                                                                       "options": {"planner": "naive"}}, timeout=120)
                             for i in range(5)]
                ready = httpx.get(server.url + "/readyz", timeout=10)
                hit = httpx.post(server.url + "/compile", json={"graph": chain_graph(rows=64, name="pre"),
                                                                "options": {"planner": "naive"}}, timeout=120)
            (mount / "junk").unlink()
            after = httpx.get(server.url + "/readyz", timeout=10)
            return {"requests": len(responses) + 3, "statuses": _statuses(responses + [hit]),
                    "first": ok.status_code, "retry_after_s": responses[0].headers.get("retry-after"),
                    "readyz_full": ready.status_code, "readyz_after_freeing": after.status_code, **watch.numbers()}
        finally:
            server.stop()
    finally:
        subprocess.run(["umount", "-l", str(mount)])


PROBES = {"idle": probe_idle, "reports": probe_reports, "bodies": probe_bodies, "wall": probe_wall, "wall_big": probe_wall_big,
          "idle_kill": probe_idle_kill,
          "retry_after": probe_retry_after, "disk_full": probe_disk_full}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", choices=sorted(PROBES))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    results = {}
    for name in args.only or list(PROBES):
        with tempfile.TemporaryDirectory(prefix=f"probe-{name}-") as tmp:
            print(f"probe {name} ...", file=sys.stderr, flush=True)
            results[name] = PROBES[name](Path(tmp))
            print(f"  {json.dumps(results[name])}", file=sys.stderr, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
