"""A portfolio over the machine's cores: the anytime search (`search.optimize`) run by several
processes at once with different seeds, the best answer kept.

The search's Python phases (message passing, kicks, min-sum windows) use one core; only its
CP-SAT windows use more. `portfolio` forks `runs - 1` children (the problem is shared with
them copy-on-write, nothing is serialized to start them), each runs `optimize` with one
CP-SAT worker and its own seed on the same clock, and sends back its choice as raw int64
bytes (no pickling); the parent runs its own search meanwhile and keeps the cheapest
feasible answer (checked by `evaluate`). A child that fails or does not answer by the
deadline counts as no answer. Memory: each child holds its own search state (on S about
0.7 GB each).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time
from typing import Optional

import numpy as np

from solver.core.problem import StrategyProblem, evaluate
from solver.core.search import SearchResult, optimize


def _child(problem: StrategyProblem, time_limit_s: float, seed: int, started: float, conn) -> None:
    try:
        res = optimize(problem, time_limit_s=time_limit_s, workers=1, seed=seed, started=started)
        conn.send_bytes(b"" if res.choice is None else np.asarray(res.choice, dtype=np.int64).tobytes())
    except BaseException:      # the parent counts it as no answer
        conn.send_bytes(b"")
    finally:
        conn.close()


def portfolio(problem: StrategyProblem, time_limit_s: float, runs: int = 2, seed: int = 1,
              started: Optional[float] = None, log=None) -> SearchResult:
    """The best of `runs` searches run at once (module docstring); the parent's own result
    (its phases and bound) with the best choice found by any of them. `runs` <= 1: one
    search with two CP-SAT workers, as `optimize`."""
    started = time.perf_counter() if started is None else started
    if runs <= 1 or not hasattr(os, "fork"):
        return optimize(problem, time_limit_s=time_limit_s, workers=2, seed=seed, started=started, log=log)
    ctx = mp.get_context("fork")
    kids = []
    for k in range(1, runs):
        parent_end, child_end = ctx.Pipe(duplex=False)
        # the child's clock is the parent's, 1.5% shorter: it answers before the parent's final check
        p = ctx.Process(target=_child, args=(problem, 0.985 * time_limit_s, seed + k, started, child_end), daemon=True)
        p.start()
        child_end.close()
        kids.append((p, parent_end))
    res = optimize(problem, time_limit_s=time_limit_s, workers=1, seed=seed, started=started, log=log)
    best = res.cost if res.choice is not None and res.feasible else None
    choice = res.choice
    found = {"parent": best}
    for k, (p, conn) in enumerate(kids, start=1):
        got = None
        if conn.poll(max(0.0, started + time_limit_s - time.perf_counter())):
            try:
                raw = conn.recv_bytes()
            except EOFError:
                raw = b""
            if raw:
                got = np.frombuffer(raw, dtype=np.int64).tolist()
        conn.close()
        p.join(timeout=0.1)
        if p.is_alive():
            p.kill()
        if got is not None and len(got) == problem.num_nodes:
            ev = evaluate(problem, got)
            found[f"seed {seed + k}"] = ev.cost if ev.feasible else None
            if ev.feasible and (best is None or ev.cost < best):
                best, choice = ev.cost, got
    stats = dict(res.stats)
    stats["portfolio"] = found
    return SearchResult(choice, best, best is not None, res.bound, time.perf_counter() - started, stats)
