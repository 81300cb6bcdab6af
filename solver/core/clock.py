"""The caller's clock: one wall-clock limit for a whole run (reading the instance included),
the phases it was spent on, and `OutOfTime` for the steps that cannot return part of their
work (presolve, merging, message-passing sweeps): they raise it past the deadline and the
search answers with the best solution it already holds.

The phase table reports each phase's seconds as a share of the limit; the shares sum to at
most 1 when the run kept its limit (the reserve at the end pays for the last checks)."""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Optional


class OutOfTime(Exception):
    """The run's deadline passed inside a step that has nothing partial to return."""


def check_deadline(deadline: Optional[float]) -> None:
    if deadline is not None and time.perf_counter() > deadline:
        raise OutOfTime()


@dataclass
class PhaseClock:
    limit_s: float
    started: float = field(default_factory=time.perf_counter)
    # kept free at the end: the final expansion and evaluation, the caller's own check
    reserve_s: float = 0.0
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def deadline(self) -> float:
        """When the search must have stopped (the limit minus the reserve)."""
        return self.started + self.limit_s - self.reserve_s

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def record(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.record(name, time.perf_counter() - t)

    def table(self) -> list[dict]:
        """One row per phase in the order first seen, plus what no phase accounted for."""
        rows = [{"phase": k, "seconds": round(v, 2), "share": round(v / self.limit_s, 4) if self.limit_s > 0 else None}
                for k, v in self.seconds.items()]
        other = self.elapsed() - sum(self.seconds.values())
        if other > 0.005:
            rows.append({"phase": "other", "seconds": round(other, 2),
                         "share": round(other / self.limit_s, 4) if self.limit_s > 0 else None})
        return rows
