"""Load test of the compile service (not a unit test; `tests/test_service_load.py` runs a
short version): concurrent clients against a real `sticksat serve` on 127.0.0.1 for a
bounded time.

Each client loops over a mix of requests until the time is up:
  55% POST /compile of a graph drawn from a pool (chain graphs of several sizes and the
      tiny benchmark graphs, naive or heuristic planner): the first request for a graph
      solves, later ones are store hits or join the solve in flight;
  25% POST /simulate of a program the client got back;
  20% GET /programs/{key} of a program the client got back.
A 503 must be problem+json `pool_full`/`not_ready` with an integer Retry-After >= 1;
the client waits that long (capped by the time left) and retries. Any other non-200
status, a transport error or a malformed answer is an error.

Afterwards every key a 200 /compile returned is fetched again: each must still be
served (nothing lost). The summary has request counts per route and status, latency
percentiles (p50/p90/p99) per route, the Retry-After values seen and how many retries
made after waiting succeeded.

    .venv/bin/python benchmarks/load_test.py --clients 16 --seconds 60 --workers 1 --queue-limit 4 \
        [--json out.json] [--write docs/reliability.md]

With --write, the results replace the block between the load-test markers of the doc,
stamped with the date and the machine.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from service_helpers import ServiceProcess, chain_graph  # noqa: E402

from bench_service import machine  # noqa: E402  (benchmarks/ is on the path: this file's directory)

START, END = "<!-- load_test:start -->", "<!-- load_test:end -->"
TINY = REPO / "benchmarks" / "graphs" / "tiny"


def graph_pool(n_chain: int = 24) -> list[dict]:
    """Distinct chain graphs (sizes and lengths vary; distinct hashes) plus the tiny
    benchmark graphs: with many graphs, solves go on all through the run instead of the
    store answering everything after the first minute."""
    graphs = [chain_graph(rows=32 * (1 + i % 8), n_ops=2 + (i // 8) % 24, cols=64 * (1 + (i // 192) % 2),
                          name=f"load{i}") for i in range(n_chain)]
    graphs += [json.loads(p.read_text()) for p in sorted(TINY.glob("*.json"))]
    return graphs


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[k]


class Recorder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latency: dict[str, list[float]] = {}
        self.statuses: dict[str, dict[int, int]] = {}
        self.errors: list[str] = []
        self.retry_after: list[int] = []
        self.retries_after_wait = 0
        self.retries_after_wait_ok = 0
        self.keys: set[str] = set()
        self.crashed: list[str] = []  # 500 worker_crashed: the job a killed worker ran
        self.kills: list[int] = []

    def record(self, route: str, status: int, seconds: float) -> None:
        with self.lock:
            self.latency.setdefault(route, []).append(seconds)
            by_status = self.statuses.setdefault(route, {})
            by_status[status] = by_status.get(status, 0) + 1

    def error(self, message: str) -> None:
        with self.lock:
            if len(self.errors) < 50:
                self.errors.append(message)
            else:
                self.errors[-1] = f"... and more ({message})"


def _check_503(resp: httpx.Response) -> tuple[bool, int, str]:
    """(honest, retry_after_s, why not)."""
    ctype = resp.headers.get("content-type", "")
    if not ctype.startswith("application/problem+json"):
        return False, 0, f"503 with content-type {ctype!r}"
    try:
        code = resp.json().get("code")
    except ValueError:
        return False, 0, "503 body is not JSON"
    if code not in ("pool_full", "not_ready"):
        return False, 0, f"503 with code {code!r}"
    raw = resp.headers.get("retry-after")
    if raw is None or not raw.isdigit() or int(raw) < 1:
        return False, 0, f"503 with Retry-After {raw!r}"
    return True, int(raw), ""


def client_loop(url: str, graphs: list[dict], until: float, rec: Recorder, seed: int) -> None:
    rng = random.Random(seed)
    programs: list[tuple[str, dict]] = []  # (key, program)
    with httpx.Client(base_url=url, timeout=300) as http:
        while time.time() < until:
            roll = rng.random()
            if roll < 0.55 or not programs:
                graph = rng.choice(graphs)
                planner = rng.choice(["naive", "heuristic"])
                route, method, path = "/compile", "POST", "/compile"
                payload = {"graph": graph, "options": {"planner": planner, "deterministic": True}}
            elif roll < 0.80:
                key, program = rng.choice(programs)
                route, method, path = "/simulate", "POST", "/simulate"
                payload = {"program": program}
            else:
                key, _ = rng.choice(programs)
                route, method, path = "/programs/{key}", "GET", f"/programs/{key}"
                payload = None
            waited = False
            while True:
                started = time.perf_counter()
                try:
                    resp = http.request(method, path, json=payload)
                except httpx.HTTPError as exc:
                    rec.error(f"{route}: {type(exc).__name__}: {exc}")
                    break
                seconds = time.perf_counter() - started
                rec.record(route, resp.status_code, seconds)
                if waited:
                    with rec.lock:
                        rec.retries_after_wait += 1
                        rec.retries_after_wait_ok += resp.status_code == 200
                if resp.status_code == 503:
                    honest, retry_after, why = _check_503(resp)
                    if not honest:
                        rec.error(f"{route}: {why}")
                        break
                    with rec.lock:
                        rec.retry_after.append(retry_after)
                    left = until - time.time()
                    if left <= retry_after:
                        break  # the run ends before the server said to come back
                    time.sleep(retry_after)
                    waited = True
                    continue
                if resp.status_code == 500 and "worker_crashed" in resp.text:
                    # the one job a killed worker was running (--kill-every); requests that
                    # joined the same job all get its 500, so jobs are counted by key
                    import re

                    job = re.search(r"running job (\S+) died", resp.text)
                    with rec.lock:
                        rec.crashed.append(job.group(1) if job else f"{route}#{len(rec.crashed)}")
                    break
                if resp.status_code != 200:
                    rec.error(f"{route}: {resp.status_code} {resp.text[:200]}")
                    break
                try:
                    body = resp.json()
                except ValueError:
                    rec.error(f"{route}: 200 with a body that is not JSON")
                    break
                if route == "/compile":
                    if not body.get("key") or not body.get("program", {}).get("ops"):
                        rec.error("/compile: 200 without key or program")
                    else:
                        programs.append((body["key"], body["program"]))
                        with rec.lock:
                            rec.keys.add(body["key"])
                elif route == "/simulate" and body.get("valid") is not True:
                    rec.error(f"/simulate: a program the service returned is not valid: {body.get('issues')}")
                break


def worker_pids(server_pid: int) -> list[int]:
    """The solver worker processes of a `sticksat serve` (its spawned children, not
    multiprocessing's resource tracker)."""
    pids = []
    try:
        children = Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text().split()
    except OSError:
        return pids
    for child in children:
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"spawn_main" in cmdline:
            pids.append(int(child))
    return pids


def killer(server_pid: int, every_s: float, until: float, rec: Recorder, seed: int) -> None:
    """SIGKILL a random solver worker every `every_s` seconds (fault injection)."""
    import signal

    rng = random.Random(seed)
    while time.time() + every_s < until:
        time.sleep(every_s)
        pids = worker_pids(server_pid)
        if pids:
            pid = rng.choice(pids)
            try:
                os.kill(pid, signal.SIGKILL)
                with rec.lock:
                    rec.kills.append(pid)
            except ProcessLookupError:
                pass


def run_load(url: str, clients: int, seconds: float, seed: int = 0, n_graphs: int = 24,
             kill_every_s: float | None = None, server_pid: int | None = None) -> dict:
    graphs = graph_pool(n_graphs)
    rec = Recorder()
    until = time.time() + seconds
    threads = [threading.Thread(target=client_loop, args=(url, graphs, until, rec, seed + i))
               for i in range(clients)]
    if kill_every_s and server_pid:
        threads.append(threading.Thread(target=killer, args=(server_pid, kill_every_s, until, rec, seed)))
    started = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.time() - started
    lost = []
    with httpx.Client(base_url=url, timeout=60) as http:
        for key in sorted(rec.keys):
            resp = http.get(f"/programs/{key}")
            if resp.status_code != 200:
                lost.append(key)
    routes = {}
    for route, values in sorted(rec.latency.items()):
        ok = values
        routes[route] = {
            "requests": len(values),
            "statuses": {str(k): v for k, v in sorted(rec.statuses[route].items())},
            "p50_ms": round(1000 * percentile(ok, 50), 1),
            "p90_ms": round(1000 * percentile(ok, 90), 1),
            "p99_ms": round(1000 * percentile(ok, 99), 1),
            "max_ms": round(1000 * max(ok), 1),
        }
    everything = [v for values in rec.latency.values() for v in values]
    total = sum(len(v) for v in rec.latency.values())
    return {
        "clients": clients, "seconds": round(elapsed, 1), "requests": total,
        "requests_per_s": round(total / elapsed, 1) if elapsed else 0.0,
        "routes": routes,
        "all": {"p50_ms": round(1000 * percentile(everything, 50), 1),
                "p90_ms": round(1000 * percentile(everything, 90), 1),
                "p99_ms": round(1000 * percentile(everything, 99), 1)},
        "errors": rec.errors,
        "retry_after_s": {"count": len(rec.retry_after), "min": min(rec.retry_after, default=None),
                          "max": max(rec.retry_after, default=None)},
        "retries_after_waiting": rec.retries_after_wait, "retries_after_waiting_ok": rec.retries_after_wait_ok,
        "programs_returned": len(rec.keys), "programs_lost": lost,
        "workers_killed": len(rec.kills), "jobs_failed_by_kills": len(set(rec.crashed)),
        "requests_failed_by_kills": len(rec.crashed),
    }


def markdown(result: dict, args) -> str:
    lines = [
        f"Measured {datetime.date.today().isoformat()} on {machine()}: `benchmarks/load_test.py --clients "
        f"{result['clients']} --seconds {args.seconds:g} --graphs {args.graphs} --workers {args.workers} "
        f"--queue-limit {args.queue_limit}" + (f" --kill-every {args.kill_every:g}" if args.kill_every else "") + "` "
        f"(naive and heuristic planners; latencies are client wall time, 503s included).",
        "",
        f"{result['requests']} requests in {result['seconds']} s ({result['requests_per_s']}/s); "
        f"errors: {len(result['errors'])}; programs returned by /compile: {result['programs_returned']}, "
        f"lost: {len(result['programs_lost'])}; 503s: {result['retry_after_s']['count']} "
        f"(Retry-After {result['retry_after_s']['min']}-{result['retry_after_s']['max']} s), "
        f"{result['retries_after_waiting_ok']} of {result['retries_after_waiting']} retries after waiting "
        f"Retry-After succeeded."
        + (f" Fault injection: {result['workers_killed']} workers SIGKILLed, {result['jobs_failed_by_kills']} "
           f"jobs ({result['requests_failed_by_kills']} requests) failed with 500 worker_crashed: the job each "
           f"killed worker was running."
           if result["workers_killed"] else ""),
        "",
        "| route | requests | statuses | p50 ms | p90 ms | p99 ms | max ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for route, r in result["routes"].items():
        statuses = ", ".join(f"{k}: {v}" for k, v in r["statuses"].items())
        lines.append(f"| `{route}` | {r['requests']} | {statuses} | {r['p50_ms']} | {r['p90_ms']} | "
                     f"{r['p99_ms']} | {r['max_ms']} |")
    a = result["all"]
    lines.append(f"| all | {result['requests']} | | {a['p50_ms']} | {a['p90_ms']} | {a['p99_ms']} | |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--queue-limit", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--graphs", type=int, default=200, help="distinct chain graphs in the request pool")
    ap.add_argument("--kill-every", type=float, default=None, metavar="S",
                    help="SIGKILL a random solver worker every S seconds (fault injection; needs the service "
                         "started here)")
    ap.add_argument("--url", default=None, help="an already running service (default: start one on loopback)")
    ap.add_argument("--json", default=None, help="write the summary here")
    ap.add_argument("--write", default=None, help="replace the load-test block of this markdown doc")
    args = ap.parse_args()
    server = None
    url = args.url
    tmp = tempfile.TemporaryDirectory(prefix="sticksat-load-")
    if url is None:
        base = Path(tmp.name)
        server = ServiceProcess(base / "store.sqlite", base / "server.log",
                                ["--workers", str(args.workers), "--queue-limit", str(args.queue_limit)]).start()
        url = server.url
    try:
        result = run_load(url, args.clients, args.seconds, args.seed, args.graphs, args.kill_every,
                          server.proc.pid if server is not None and server.proc is not None else None)
    finally:
        if server is not None:
            server.stop()
        tmp.cleanup()
    text = markdown(result, args)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    if args.write:
        doc = Path(args.write)
        content = doc.read_text()
        if START in content and END in content:
            head, rest = content.split(START, 1)
            _, tail = rest.split(END, 1)
            doc.write_text(head + START + "\n" + text + "\n" + END + tail)
        else:
            raise SystemExit(f"{doc} has no {START} ... {END} block")
    ok = (not result["errors"] and not result["programs_lost"]
          and result["jobs_failed_by_kills"] <= result["workers_killed"])
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
