"""Live intervals on compressed time: the maximal live sets and the event-point timeline
that memory rows, presolve and the group search count usage on."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


def maximal_live_sets(intervals: Sequence[tuple[int, int]]) -> list[list[int]]:
    """The distinct live sets not contained in another one: a live set can only be maximal
    at a time step after which some interval ends (the set shrinks next)."""
    starts: dict[int, list[int]] = {}
    ends: dict[int, list[int]] = {}
    for n, (a, b) in enumerate(intervals):
        if b > a:
            starts.setdefault(a, []).append(n)
            ends.setdefault(b, []).append(n)
    times = sorted(set(starts) | set(ends))
    live: set[int] = set()
    rows: list[list[int]] = []
    grown = False
    for t in times:
        if t in ends:
            if grown and live:
                rows.append(sorted(live))
            live.difference_update(ends[t])
            grown = False
        if t in starts:
            live.update(starts[t])
            grown = True
    if grown and live:
        rows.append(sorted(live))
    return rows


@dataclass
class Timeline:
    """Live intervals on compressed time: usage only changes where an interval starts or
    ends, so the distinct event points are the only time steps that matter. Node n covers
    compressed steps [start[n], end[n]) (empty intervals: start == end)."""

    start: np.ndarray
    end: np.ndarray
    n_steps: int

    @classmethod
    def build(cls, intervals: Sequence[tuple[int, int]]) -> "Timeline":
        pts = sorted({p for a, b in intervals if b > a for p in (a, b)})
        index = {p: i for i, p in enumerate(pts)}
        start = np.array([index[a] if b > a else 0 for a, b in intervals], dtype=np.int64)
        end = np.array([index[b] if b > a else 0 for a, b in intervals], dtype=np.int64)
        return cls(start, end, max(0, len(pts) - 1))

    def profile(self, per_node: np.ndarray) -> np.ndarray:
        """Sum of `per_node` values live at each compressed step."""
        diff = np.zeros(self.n_steps + 1, dtype=np.int64)
        np.add.at(diff, self.start, per_node)
        np.add.at(diff, self.end, -per_node)
        return np.cumsum(diff)[: self.n_steps]
