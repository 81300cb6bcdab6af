"""IOPDDL (ASPLOS 2025 contest) instances: load them into a StrategyProblem, check solutions.

Format (google/iopddl, example.json): problem.nodes.{intervals,costs,usages},
problem.edges.{nodes,costs} with each edge table flattened row-major over the strategies of
its first then second node, problem.usage_limit (optional). Entries of 1e18 are forbidden.
The evaluator follows the contest's reference `Evaluate`: usage is counted on [start, end).
"""
from __future__ import annotations

import gzip
import json
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np

from solver.core.problem import Evaluation, StrategyProblem, evaluate

_MAX_NODES = 1_000_000


def _field(obj, key: str, where: str):
    if not isinstance(obj, dict) or key not in obj:
        raise ValueError(f"{where}.{key} is missing")
    return obj[key]


def _int_list(x, where: str) -> np.ndarray:
    try:
        arr = np.asarray(x)
    except (ValueError, TypeError):
        arr = None
    if not isinstance(x, list) or arr is None or arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iuf"):
        raise ValueError(f"{where} must be a list of numbers")
    return arr.astype(np.int64)


def problem_from_dict(data: dict) -> StrategyProblem:
    """A StrategyProblem from a contest document; ValueError naming the offending field
    when the document is malformed."""
    p = _field(data, "problem", "instance")
    nodes = _field(p, "nodes", "problem")
    edges = _field(p, "edges", "problem")
    costs = _field(nodes, "costs", "problem.nodes")
    usages = _field(nodes, "usages", "problem.nodes")
    intervals = _field(nodes, "intervals", "problem.nodes")
    for name, lst in (("costs", costs), ("usages", usages), ("intervals", intervals)):
        if not isinstance(lst, list):
            raise ValueError(f"problem.nodes.{name} must be a list")
    if len(costs) > _MAX_NODES:
        raise ValueError(f"problem.nodes.costs: too many nodes ({len(costs)} > {_MAX_NODES})")
    n = len(costs)
    if len(usages) != n or len(intervals) != n:
        raise ValueError(f"problem.nodes: {n} costs, {len(usages)} usages and {len(intervals)} "
                         "intervals (one of each per node)")
    node_costs, node_usages, ivs = [], [], []
    for i in range(n):
        c = _int_list(costs[i], f"problem.nodes.costs[{i}]")
        u = _int_list(usages[i], f"problem.nodes.usages[{i}]")
        if not len(c):
            raise ValueError(f"problem.nodes.costs[{i}]: node {i} has no strategy")
        if len(u) != len(c):
            raise ValueError(f"problem.nodes.usages[{i}]: {len(u)} usages for {len(c)} strategies")
        iv = _int_list(intervals[i], f"problem.nodes.intervals[{i}]")
        if len(iv) != 2:
            raise ValueError(f"problem.nodes.intervals[{i}] must be [start, end]")
        node_costs.append(c)
        node_usages.append(u)
        ivs.append((int(iv[0]), int(iv[1])))
    e_nodes = _field(edges, "nodes", "problem.edges")
    e_costs = _field(edges, "costs", "problem.edges")
    if not isinstance(e_nodes, list) or not isinstance(e_costs, list) or len(e_nodes) != len(e_costs):
        raise ValueError("problem.edges.nodes and problem.edges.costs must be lists of equal length")
    edge_nodes, edge_costs = [], []
    for e, (pair, table) in enumerate(zip(e_nodes, e_costs)):
        pair = _int_list(pair, f"problem.edges.nodes[{e}]")
        if len(pair) != 2:
            raise ValueError(f"problem.edges.nodes[{e}]: only two-node edges are supported")
        u, v = int(pair[0]), int(pair[1])
        if not (0 <= u < n and 0 <= v < n):
            raise ValueError(f"problem.edges.nodes[{e}]: node index out of range 0..{n - 1}")
        t = _int_list(table, f"problem.edges.costs[{e}]")
        want = len(node_costs[u]) * len(node_costs[v])
        if len(t) != want:
            raise ValueError(f"problem.edges.costs[{e}]: {len(t)} entries, expected {want} "
                             f"({len(node_costs[u])} x {len(node_costs[v])} strategies of nodes {u}, {v})")
        edge_nodes.append((u, v))
        edge_costs.append(t)
    limit = p.get("usage_limit")
    if limit is not None and (not isinstance(limit, (int, float)) or isinstance(limit, bool)):
        raise ValueError("problem.usage_limit must be a number")
    return StrategyProblem(
        node_costs=node_costs, node_usages=node_usages, intervals=ivs,
        edges=edge_nodes,  # type: ignore[arg-type]
        edge_costs=edge_costs,
        usage_limit=int(limit) if limit is not None else None,
        name=str(p.get("name", "")),
    )


def load_instance(path: str | Path) -> StrategyProblem:
    """An instance file (.json or .json.gz): the fast reader when the document is in the
    plain integer layout (every contest instance), json.load otherwise."""
    path = Path(path)
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    try:
        return _problem_from_bytes(data)
    except _NotPlain:
        pass
    return problem_from_dict(json.loads(data))


# -- fast reading --------------------------------------------------------------------------------
# Contest instances reach hundreds of MB of integers; json.load turns each into a Python int
# in a list (about 40 bytes per entry: gigabytes and a minute on the largest). This reader
# finds the document's structure from its brackets, quotes and colons only (two per table)
# and converts each array of integers with vectorized numpy passes over its bytes, in
# bounded chunks, into one flat int64 array whose slices are the tables. Anything it does not
# expect (floats, escapes, strings in arrays, other shapes) sends the document to json.load
# and `problem_from_dict`, which also names the offending field of a malformed one.
class _NotPlain(Exception):
    """The document is not in the plain integer layout the fast reader handles."""


_STRUCTURAL = bytes(1 if chr(i) in '[]{}":' else 0 for i in range(256))  # a translate table
_CHUNK = 1 << 24  # bytes per vectorized pass (bounds the temporaries)
_BRACKETS_TO_SPACES = bytes.maketrans(b"[]", b"  ")
_ARRAY_BYTES = b"0123456789-,[] \t\r\n"


def _structure(buf: np.ndarray) -> np.ndarray:
    """Positions of the bytes [ ] { } " : in order."""
    out = [np.flatnonzero(np.frombuffer(buf[a:a + _CHUNK].tobytes().translate(_STRUCTURAL), dtype=np.uint8)) + a
           for a in range(0, len(buf), _CHUNK)]
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def _ints(data: bytes, a: int, b: int) -> np.ndarray:
    """Every integer in data[a:b] (an array of integer arrays without its outer brackets),
    in order: numpy's text reader on chunks cut at commas, brackets read as spaces."""
    out = []
    while a < b:
        end = b if b - a <= _CHUNK else data.find(b",", a + _CHUNK, b)
        end = b if end < 0 else end
        piece = data[a:end]
        if piece.translate(None, _ARRAY_BYTES):
            raise _NotPlain("not a plain integer array")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a partial read warns: not plain
            try:
                out.append(np.fromstring(piece.translate(_BRACKETS_TO_SPACES), dtype=np.int64, sep=","))
            except (ValueError, DeprecationWarning) as e:
                raise _NotPlain(str(e)) from None
        a = end + 1
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def _commas_before(buf: np.ndarray, points: np.ndarray) -> np.ndarray:
    """For sorted byte positions: how many commas lie between the first one and each (only
    differences are used)."""
    out = np.zeros(len(points), dtype=np.int64)
    base = 0
    if not len(points):
        return out
    for a in range(int(points[0]), int(points[-1]) + 1, _CHUNK):
        lo, hi = np.searchsorted(points, [a, a + _CHUNK])
        commas = np.flatnonzero(buf[a:a + _CHUNK] == 44)
        out[lo:hi] = base + np.searchsorted(commas, points[lo:hi] - a)
        base += len(commas)
    return out


class _Reader:
    """The document's containers from its structural bytes alone: an object is a dict of
    its keys, an array is (open, close, its child containers), a scalar is its text."""

    def __init__(self, data: bytes):
        self.data = data
        self.buf = np.frombuffer(data, dtype=np.uint8)
        self.pos_array = _structure(self.buf)
        self.pos = self.pos_array.tolist()
        chars = self.buf[self.pos_array]
        # leaf[i]: structural byte i opens a row that closes at byte i + 1 (integers only)
        self.leaf = np.zeros(len(chars), dtype=bool)
        self.leaf[:-1] = (chars[:-1] == ord("[")) & (chars[1:] == ord("]"))
        self.k = 0

    def _next(self) -> tuple[int, str]:
        if self.k >= len(self.pos):
            raise _NotPlain("unexpected end")
        p = self.pos[self.k]
        self.k += 1
        return p, chr(self.data[p])

    def document(self) -> dict:
        p, c = self._next()
        if c != "{" or self.data[:p].strip():
            raise _NotPlain("not an object")
        doc = self._object()
        if self.k != len(self.pos) or self.data[self.pos[-1] + 1:].strip():
            raise _NotPlain("trailing text")
        return doc

    def _string(self, p: int) -> str:
        q, c = self._next()
        if c != '"':
            raise _NotPlain("a structural byte inside a string")
        s = self.data[p + 1:q]
        if b"\\" in s:
            raise _NotPlain("escapes")
        return s.decode()

    def _object(self) -> dict:
        out: dict = {}
        while True:
            q, c = self._next()
            if c == "}":
                return out
            if c != '"':
                raise _NotPlain("an object key expected")
            key = self._string(q)
            colon, c = self._next()
            if c != ":" or self.k >= len(self.pos):
                raise _NotPlain("a colon expected")
            r = self.pos[self.k]
            text = self.data[colon + 1:r].strip()
            if text:  # a scalar, up to the next key or the end of the object
                out[key] = text.rstrip(b",").strip().decode()
                continue
            r, c = self._next()
            if c == '"':
                out[key] = self._string(r)
            elif c == "{":
                out[key] = self._object()
            elif c == "[":
                out[key] = self._array(r)
            else:
                raise _NotPlain("a value expected")

    def _array(self, p: int) -> tuple:
        children = []
        leaves = np.zeros((0, 2), dtype=np.int64)
        while True:
            # a run of integer rows ([ then ] in the structure) in one vectorized step
            run = self.leaf[self.k::2]
            r = int(np.argmin(run)) if not run.all() else len(run)
            if r:
                spans = self.pos_array[self.k:self.k + 2 * r].reshape(-1, 2)
                leaves = spans if not len(leaves) else np.concatenate([leaves, spans])
                self.k += 2 * r
            q, c = self._next()
            if c == "]":
                return (p, q, children, leaves)
            if c == "[":
                children.append(self._array(q))
            elif c == "{":
                children.append(self._object())
            else:
                raise _NotPlain(f"{c!r} inside an array")

    def rows(self, arr) -> list[np.ndarray]:
        """An array of integer arrays as one flat int64 array's slices, one per row."""
        if not isinstance(arr, tuple) or arr[2]:
            raise _NotPlain("not an array of integer arrays")
        o, c, _, leaves = arr
        if not len(leaves):
            if self.data[o + 1:c].strip():
                raise _NotPlain("integers outside rows")
            return []
        commas = _commas_before(self.buf, leaves.reshape(-1)).reshape(-1, 2)
        counts = commas[:, 1] - commas[:, 0] + 1  # a row of integers only: its commas + 1
        vals = _ints(self.data, o + 1, c)
        if int(counts.sum()) != len(vals):
            raise _NotPlain("integers outside rows, or an empty row")
        ends = np.cumsum(counts).tolist()
        return [vals[a:b] for a, b in zip([0] + ends[:-1], ends)]


def _problem_from_bytes(data: bytes) -> StrategyProblem:
    """The fast path of `load_instance`; _NotPlain when the document needs json.load (a
    malformed one included: the slow path names the field)."""
    reader = _Reader(data)
    doc = reader.document()
    try:
        p = doc["problem"]
        nodes, edges = p["nodes"], p["edges"]
        costs, usages, intervals = (reader.rows(nodes[k]) for k in ("costs", "usages", "intervals"))
        e_nodes, e_costs = reader.rows(edges["nodes"]), reader.rows(edges["costs"])
    except (KeyError, TypeError) as e:
        raise _NotPlain(f"missing {e}") from None
    n = len(costs)
    if n > _MAX_NODES or len(usages) != n or len(intervals) != n or len(e_nodes) != len(e_costs):
        raise _NotPlain("lengths")
    k = np.array([len(c) for c in costs], dtype=np.int64)
    if (k == 0).any() or any(len(u) != len(c) for u, c in zip(usages, costs)) \
            or any(len(iv) != 2 for iv in intervals) or any(len(e) != 2 for e in e_nodes):
        raise _NotPlain("row lengths")
    ends = np.array(e_nodes, dtype=np.int64).reshape(-1, 2)
    if len(ends) and (ends.min() < 0 or ends.max() >= n):
        raise _NotPlain("edge ends")
    if len(ends) and (np.array([len(t) for t in e_costs]) != k[ends[:, 0]] * k[ends[:, 1]]).any():
        raise _NotPlain("table sizes")
    limit = p.get("usage_limit")
    if limit in (None, "null"):
        limit = None
    else:
        try:
            limit = int(limit)
        except (TypeError, ValueError):
            raise _NotPlain("usage_limit") from None
    name = p.get("name", "")
    return StrategyProblem(node_costs=costs, node_usages=usages,
                           intervals=[(int(a), int(b)) for a, b in intervals],
                           edges=[(int(u), int(v)) for u, v in ends], edge_costs=e_costs,
                           usage_limit=limit, name=name if isinstance(name, str) else str(name))


def evaluate_solution(problem: StrategyProblem, solution: Sequence[int]) -> Evaluation:
    """Feasibility and total cost of a contest solution (one strategy index per node)."""
    return evaluate(problem, solution)


def load_best_known(csv_path: str | Path) -> dict[str, int]:
    out = {}
    for line in Path(csv_path).read_text().splitlines()[1:]:
        cols = line.split(",")
        if len(cols) >= 4 and cols[3]:
            out[cols[0]] = int(cols[3])
    return out
