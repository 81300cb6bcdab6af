"""Synthetic IOPDDL instances at contest scale (30k-65k nodes), seeded and deterministic.

They resemble the contest's large instances in the ways that decide solver time and memory
(measured on the shared instance S, 28,526 nodes): nodes in program order, most live for a
few steps and some (parameters) for a large part of the program; about half of the edges
are functions (an elementwise consumer takes its producer's layout: one finite entry per
row), so follower chains are long; strategies per node mostly 2-4, a quarter 8-30, a few
hubs with hundreds; dense resharding tables between the layout-rich nodes; memory tight
(every node on its least usage peaks at about 91% of the limit, the largest usages 20-30x
over it); node costs mostly zero, edge costs spread over six orders of magnitude.

A strategy is a layout label out of a shared label space; a label shards the tensor by a
factor (usage = size / factor, compute = flops / factor). Resharding costs size x a
pseudo-random factor of the label pair, zero for equal labels. Nothing here comes from the
contest's other instances.

`python benchmarks/iopddl_synthetic.py --nodes 40000 --seed 1 --out FILE.json` writes one;
`instance_path(nodes, seed, dense)` generates into a cache directory on first use (the files
are hundreds of MB: never committed).
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

FORBIDDEN = 10**18
LABELS = 1024  # the shared layout-label space
CACHE = Path(os.environ.get("IOPDDL_SYNTH_DIR", "/tmp/sticksat-iopddl-synth"))


def _label_factor() -> np.ndarray:
    """Shard factor of each label: label 0 replicated, then 2, 4, 8, 16, 32 in bands."""
    f = np.ones(LABELS, dtype=np.int64)
    bands = [(1, 8, 2), (8, 40, 4), (40, 160, 8), (160, 480, 16), (480, LABELS, 32)]
    for a, b, v in bands:
        f[a:b] = v
    return f


def _pair_factor(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cost factor of resharding label a into label b (0 when equal), in [0.05, 2.05)."""
    h = (a.astype(np.int64) * 7919 + b.astype(np.int64) * 104729 + (a * b) % 31) % 1000
    return np.where(a == b, 0.0, 0.05 + h / 500.0)


def generate(nodes: int, seed: int, dense: float = 1.0) -> dict:
    """The instance as the contest's JSON document. `dense` scales how many nodes are
    layout-rich (8-30 strategies) and hubs (hundreds of strategies)."""
    rng = np.random.default_rng(seed)
    n = nodes
    factor = _label_factor()
    # node kinds: parameters (inputs living long), elementwise (followers), compute ops
    kind = rng.choice(3, size=n, p=[0.08, 0.55, 0.37])
    kind[0] = 0
    # strategies per node (compute and parameters; elementwise take their producer's)
    k = rng.choice([1, 2, 4, 4, 4, 6], size=n)
    rich = rng.random(n) < 0.25 * dense
    k[rich] = rng.integers(8, 31, size=int(rich.sum()))
    hub = rng.random(n) < 0.004 * dense
    k[hub] = rng.integers(100, 500, size=int(hub.sum()))
    size = np.exp(rng.normal(13.0, 2.2, size=n)).astype(np.int64) + 1  # bytes, 1e3..1e9
    size = np.minimum(size, 2**28)
    labels: list[np.ndarray] = [np.zeros(0, np.int64)] * n
    producers: list[list[int]] = [[] for _ in range(n)]
    hubs = np.flatnonzero(hub & (kind == 0))
    for i in range(n):
        if i > 0 and kind[i] != 0:
            # the main input: a recent node; more inputs for compute ops, some long-range
            main = max(0, i - 1 - int(rng.geometric(0.5)) + 1)
            ins = [main]
            if kind[i] == 2:
                for _ in range(int(rng.integers(0, 3))):
                    j = int(rng.integers(0, i)) if rng.random() < 0.3 else max(0, i - int(rng.integers(1, 12)))
                    if j not in ins:
                        ins.append(j)
                if len(hubs) and rng.random() < 0.15:
                    h = int(hubs[rng.integers(0, len(hubs))])
                    if h < i and h not in ins:
                        ins.append(h)
            producers[i] = ins
        if kind[i] == 1 and producers[i]:
            labels[i] = labels[producers[i][0]]  # an elementwise op keeps its input's layouts
        else:
            # the replicated layout (label 0) is always among them
            pick = rng.choice(np.arange(1, LABELS if k[i] > 40 else 160), size=min(k[i], LABELS) - 1, replace=False)
            labels[i] = np.sort(np.concatenate([[0], pick]))
    # intervals: from the node's position to one past its last consumer
    last = np.arange(n) + 1
    for i in range(n):
        for j in producers[i]:
            last[j] = max(last[j], i + 1)
    params = np.flatnonzero(kind == 0)
    # some parameters live to the end of the program (weights kept for the backward pass)
    keep = params[rng.random(len(params)) < 0.25]
    last[keep] = n
    start = np.arange(n)
    empty = rng.random(n) < 0.05
    last[empty] = start[empty]
    node_costs, node_usages = [], []
    flops = (size * rng.uniform(0.5, 4.0, size=n)).astype(np.int64)
    for i in range(n):
        f = factor[labels[i]]
        node_usages.append(size[i] // f)
        if kind[i] == 2:
            # compute split by the factor, plus a layout-dependent overhead
            c = flops[i] // f + (size[i] * _pair_factor(labels[i], labels[i][::-1]) / 8).astype(np.int64)
        else:
            c = np.zeros(len(f), dtype=np.int64)
        node_costs.append(c)
    e_nodes, e_costs = [], []
    for i in range(n):
        for pos, j in enumerate(producers[i]):
            lu, lv = labels[j], labels[i]
            if kind[i] == 1 and pos == 0:
                # follower: strategy t of i is the producer's strategy t (same label)
                t = np.full((len(lu), len(lv)), FORBIDDEN, dtype=np.int64)
                t[np.arange(len(lu)), np.arange(len(lu))] = 0
            else:
                t = (size[j] * _pair_factor(lu[:, None], lv[None, :])).astype(np.int64)
                if rng.random() < 0.1:
                    # some layout pairs an op cannot consume at all
                    t[rng.random(t.shape) < 0.2] = FORBIDDEN
                    t[np.arange(len(lu)), np.minimum(np.arange(len(lu)), len(lv) - 1)] = 0
            e_nodes.append([j, i])
            e_costs.append(t.reshape(-1))
    ivs = np.stack([start, last], axis=1)
    tl_pts = np.zeros(n + 2, dtype=np.int64)
    mins = np.array([u.min() for u in node_usages])
    live = ivs[:, 1] > ivs[:, 0]
    np.add.at(tl_pts, ivs[live, 0], mins[live])
    np.add.at(tl_pts, ivs[live, 1], -mins[live])
    peak = int(np.cumsum(tl_pts).max())
    limit = int(peak / 0.91)
    return {"problem": {
        "name": f"synthetic-{n}-s{seed}" + ("" if dense == 1.0 else f"-d{dense:g}"),
        "nodes": {"intervals": ivs.tolist(), "costs": [c.tolist() for c in node_costs],
                  "usages": [u.tolist() for u in node_usages]},
        "edges": {"nodes": e_nodes, "costs": e_costs},
        "usage_limit": limit}}


def write(doc: dict, path: Path) -> None:
    """JSON in the contest's layout, written table by table (json.dumps of the whole
    document would hold several copies of its text)."""
    tmp = path.with_suffix(".tmp")
    p = doc["problem"]
    with open(tmp, "w") as f:
        f.write('{"problem": {"name": "%s", "nodes": {"intervals": ' % p["name"])
        f.write(repr(p["nodes"]["intervals"]).replace(" ", ""))
        for key in ("costs", "usages"):
            f.write(f', "{key}": ' + repr(p["nodes"][key]).replace(" ", ""))
        f.write('}, "edges": {"nodes": ' + repr(p["edges"]["nodes"]).replace(" ", "") + ', "costs": [')
        for e, t in enumerate(p["edges"]["costs"]):
            if e:
                f.write(",")
            f.write("[" + ",".join(map(str, t.tolist())) + "]")
        f.write(']}, "usage_limit": %d}}\n' % p["usage_limit"])
    tmp.rename(path)


def instance_path(nodes: int, seed: int, dense: float = 1.0) -> Path:
    """The cached instance file, generated on first use."""
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / (f"synthetic-{nodes}-s{seed}" + ("" if dense == 1.0 else f"-d{dense:g}") + ".json")
    if not path.exists():
        write(generate(nodes, seed, dense), path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=40000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dense", type=float, default=1.0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.out:
        write(generate(a.nodes, a.seed, a.dense), Path(a.out))
        print(a.out)
    else:
        print(instance_path(a.nodes, a.seed, a.dense))


if __name__ == "__main__":
    main()
