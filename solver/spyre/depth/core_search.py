"""The core's search over the Spyre strategy problem: one search for both front ends (issue 30).

A large graph (one without a repeated block, or what lies around the repeated block of one)
is planned whole as an instance of the generic strategy problem (`solver.core`, the
IOPDDL shape) and searched by the core's anytime search (`solver.core.search.optimize`:
node merging, min-sum message passing, kicks, CP-SAT and min-sum windows), instead of
window by window with a CP-SAT model each:

- a node per op; its states are its strategies (`solver.spyre.strategies.op_strategies`,
  aligned for residency as the single-graph model's are), each twice when its output may
  stay LX-resident: (strategy, in device memory) and (strategy, resident). A node per
  weight whose layout is chosen (`GraphContext.free_inputs`): its states are its stick dims;
- node cost: the op's priced time (`Strategy.parts`, the timing model's own per-op
  analysis, in the single-graph model's units) with its inputs in device memory and its
  output where the state puts it, + 1 ns per idle core (the model's tie-break), + the
  restickify of a fixed-layout input it reads in another layout;
- a copy node per tensor read by several ops (its states: the layout written x the one
  restickified copy its readers share, or none; the copy's price is the node's cost), as
  the model's one restickify per (tensor, layout): the T5 position bias read by 24 layers
  in another layout is copied once;
- edge cost, producer (or copy node) state x reader state: the restickify the reader needs
  when the tensor is in device memory in another layout; when the producer keeps it
  resident, the reader's time saved by reading it from LX, and forbidden unless the reader
  reads each core's slice from the one that core wrote (`compatible_residency`; no
  restickify of a resident tensor) and any-layout operands never see a stick they forbid;
- memory: a resident state uses its per-core LX sticks over the tensor's live window
  [producer, last reader], the limit is the LX capacity: the IOPDDL memory rule is the
  model's capacity rule (addresses are placed after the search, first-fit; what does not
  fit goes to device memory);
- the bundle rule (the bundle holding a group of overlapping resident windows stays within
  `bundle_tensor_limit` by the target's counting rule) is not pairwise: it is repaired after
  the search against the emitted program, by dropping in each offending bundle the longest
  residency that meets it, until the program validates (`validated`).
Where the pairwise form approximates the model: a reader wanting a second other layout
pays a private restickify, and an op reading several resident operands saves the sum of
their single savings. The plan read back is emitted, validated and simulated
(that, not the search's objective, decides what is kept), then the post-solve steps
(fused kernels, LX relayouts) run on it as they do after a single-graph solve.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Optional

import numpy as np
from ortools.sat.python import cp_model

from target.op_rules import default_choice
from target.primitives import PrimGraph
from simulator.timing import time_program
from solver.core.problem import FORBIDDEN_COST, StrategyProblem, evaluate
from solver.core.search import optimize
from solver.naive import plan_naive
from solver.emit import emit_program
from solver.oracle import checked_program, issue_text
from solver.plan import OpPlan, PlanDecisions, Residency
from solver.spyre import steps
from solver.spyre.bundle_repair import BUNDLE_CODES
from solver.spyre.cost_model import to_units
from solver.spyre.depth.segments import crossings, keep_part, merge, out_stick, reader_index, subgraph
from solver.spyre.model import SpyreModel, first_fit_in_windows
from solver.spyre.start import default_hint, valid_or_naive
from solver.spyre.strategies import (
    GraphContext, Strategy, align_strategies, compatible_residency, op_strategies, required_from,
)

# The large-graph path: the core's search (True) or the windows heuristic before it
# (`windows.plan_windows` + `improve_windows`; kept to measure against, and for deterministic
# mode: the core's search runs on the wall clock).
USE_CORE_SEARCH = True

# Below this many seconds for a piece, its heuristic plan stands (building the problem and
# the search's first phases take about that on a few hundred ops).
MIN_CORE_S = 1.0
# Building the problem takes about 4 ms per op on this machine idle (strategies, pricing),
# twice that loaded: a piece with less than MIN_CORE_S + CORE_S_PER_OP per op keeps its
# heuristic plan rather than overrun its time.
CORE_S_PER_OP = 0.008
# Strategies are aligned for residency (`align_strategies`, 3-4 s on 500-800 ops) only when
# the piece has at least this many seconds per op.
ALIGN_S_PER_OP = 0.02
# The search is skipped (the start is read back) when less than this is left for it.
MIN_SEARCH_S = 0.3
# Of a piece's seconds left once its problem is built, the share the core's search gets; the
# rest is for reading the plan back, validating it and the post-solve steps (fused kernels).
SEARCH_SHARE = 0.6
# When no first-fit order packs the residencies the search chose, the CP-SAT packing gets
# PACK_SHARE of the piece's time left, at most PACK_MAX_S (on 8 layers, 8 of 285 left out
# after 1 s cost 7.7 ms of 85 ms; 3.8 s packed them all).
PACK_SHARE = 0.2
PACK_MAX_S = 5.0
# The post-solve steps run in windows of about this many ops (each a whole number of bundles):
# their trials emit and simulate the window, not the whole graph.
FUSION_WINDOW_OPS = 80
# The post-solve steps stop this many read-back checks (emit, validate, simulate the piece)
# before the piece's deadline: the fused plan is checked once more after them.
FUSION_CHECK_FACTOR = 2.0


@dataclass
class SpyreStrategyProblem:
    """A graph's Spyre strategy problem in the core's form and how to read a choice back.
    `nodes[n]`: ("op", op id), ("input", tensor) or ("copy", tensor); `states[n]`: per
    core strategy, (strategy index, resident) for an op, the stick dim for a weight, (the
    layout written, the restickified copy's layout or None) for a copy node."""

    pg: PrimGraph
    ctx: GraphContext
    strategies: dict[str, list[Strategy]]
    problem: StrategyProblem
    nodes: list[tuple[str, str]]
    states: list[list]
    window: dict[str, tuple[int, int]]        # residency candidate -> [producer, last reader] positions
    saving: dict[str, int]                    # residency candidate -> largest single-read saving (units)
    pos: dict[str, int]                       # op id -> position in pg.ops
    producer: dict = field(default_factory=dict)  # tensor -> the op that writes it


def _restick_units(ctx: GraphContext, hw, t: str, stick) -> int:
    # the single-graph model's price of a restickify through device memory (it needs only
    # the context and the target)
    return SpyreModel._restick_cost(SimpleNamespace(hw=hw, ctx=ctx), t, stick)


def spyre_strategies(pg: PrimGraph, hw, hint_d: PlanDecisions, ctx: GraphContext,
                     align: bool = True) -> dict[str, list[Strategy]]:
    """Each op's strategies as the single-graph model has them (the hint's and the naive
    plan's always among them; aligned for residency when `align`)."""
    naive_d = plan_naive(pg, hw, input_sticks={t: s for t, s in ctx.input_sticks.items() if t in pg.inputs})
    out = {}
    for op in pg.ops:
        out[op.id] = op_strategies(op, ctx, required=required_from(op, (hint_d, naive_d)))
    return align_strategies(pg, ctx, out) if align else out


def build_problem(pg: PrimGraph, hw, ctx: GraphContext, strategies: dict[str, list[Strategy]]) -> SpyreStrategyProblem:
    """The Spyre strategy problem of `pg` (module docstring) in the core's form."""
    pos = {op.id: i for i, op in enumerate(pg.ops)}
    producer = {op.output.tensor: op for op in pg.ops}
    readers: dict[str, list[tuple[str, int]]] = {}
    for op in pg.ops:
        for i, a in enumerate(op.inputs):
            readers.setdefault(a.tensor, []).append((op.id, i))
    outputs = set(pg.outputs)
    cap = hw.lx_capacity_bytes
    stick_bytes = hw.stick_bytes
    restick: dict = {}

    def restick_cost(t, stick) -> int:
        # priced by what the price depends on (shape, dtype, layout from and to): the
        # layers of a stack share their prices
        key = (ctx.shapes[t], ctx.dtypes[t], ctx.possible_sticks[t][0], stick)
        if key not in restick:
            restick[key] = _restick_units(ctx, hw, t, stick)
        return restick[key]

    compat_cache: dict = {}

    def compatible(sp_: Strategy, sc: Strategy, slot: int) -> bool:
        # strategies are shared by ops of one structure (`op_strategies`' cache)
        key = (id(sp_), id(sc), slot)
        got = compat_cache.get(key)
        if got is None:
            got = compat_cache[key] = compatible_residency(sp_, sc, slot)
        return got

    # residency candidates, as the single-graph model allows them
    may_reside: dict[str, list[int]] = {}
    window: dict[str, tuple[int, int]] = {}
    for t, rs in readers.items():
        p = producer.get(t)
        if p is None or t in outputs:
            continue
        ok = [k for k, s in enumerate(strategies[p.id]) if not s.reduction_split and not s.alias
              and s.out_lx_bytes <= cap]
        if not ok or any(all(s.alias for s in strategies[o]) for o, _ in rs):
            continue
        may_reside[t] = ok
        window[t] = (pos[p.id], max(pos[o] for o, _ in rs))

    n_readers: dict[str, int] = {}
    for op in pg.ops:
        for t in {a.tensor for a in op.inputs}:
            n_readers[t] = n_readers.get(t, 0) + 1

    def shared_fixed(t: str) -> bool:
        # a fixed input read by several ops: its restickifies are its copy node's (below)
        return n_readers.get(t, 0) >= 2

    nodes: list[tuple[str, str]] = []
    states: list[list] = []
    node_of: dict[str, int] = {}           # op id or free input tensor -> node
    node_costs, usages, intervals = [], [], []
    for op in pg.ops:
        t = op.output.tensor
        S = strategies[op.id]
        st = [(k, False) for k in range(len(S))] + [(k, True) for k in may_reside.get(t, ())]
        node_of[op.id] = len(nodes)
        nodes.append(("op", op.id))
        states.append(st)
        idle = [max(0, hw.cores - math.prod(s.core_split.values())) for s in S]
        n_in = len(op.inputs)
        cost = []
        for k, r in st:
            s = S[k]
            c = to_units(s.parts.cost((False,) * n_in, r).body_ns) + to_units(s.parts.base.extra_ns) + idle[k]
            for i, a in enumerate(op.inputs):
                if a.tensor in producer or a.tensor in ctx.free_inputs:
                    continue
                have = ctx.input_sticks.get(a.tensor)
                if have in s.any_forbidden.get(i, ()):
                    c = FORBIDDEN_COST
                    break
                want = s.input_sticks[i]
                if want is not None and want != have and not shared_fixed(a.tensor):
                    c += restick_cost(a.tensor, want)
            cost.append(min(c, FORBIDDEN_COST))
        node_costs.append(cost)
        lx = [S[k].out_lx_bytes // stick_bytes if r else 0 for k, r in st]
        usages.append(lx)
        a, b = window.get(t, (pos[op.id], pos[op.id]))
        intervals.append((a, b + 1))
    for t in sorted(ctx.free_inputs):
        if t not in readers:
            continue
        node_of[t] = len(nodes)
        nodes.append(("input", t))
        states.append(list(ctx.possible_sticks[t]))
        node_costs.append([0] * len(ctx.possible_sticks[t]))
        usages.append([0] * len(ctx.possible_sticks[t]))
        intervals.append((0, 0))

    edges, tables = [], []
    saving: dict[str, int] = {}

    def source_sticks(t: str) -> list:
        """The layout t has in device memory, per state of its source node (one entry
        for a fixed input, which has no node)."""
        if t in producer:
            return [strategies[producer[t].id][k].out_stick for k, _ in states[node_of[producer[t].id]]]
        if t in node_of:
            return list(states[node_of[t]])
        return [ctx.input_sticks.get(t)]

    def add_edge(u: int, v: int, table: np.ndarray) -> None:
        finite = table < FORBIDDEN_COST
        if finite.any():
            table = np.where(finite, table - table[finite].min(), FORBIDDEN_COST)
        if table.any():
            edges.append((u, v))
            tables.append(table)

    def read_row(t: str, op, sl: list[int], have: set, st_o: list) -> np.ndarray:
        """Per reader state: the restickifies it needs when t is in device memory in the
        layouts `have` (forbidden when an any-layout operand would see one it forbids)."""
        S_o = strategies[op.id]
        row = np.zeros(len(st_o), dtype=np.int64)
        first = next(iter(have))
        for c, (k, _) in enumerate(st_o):
            s = S_o[k]
            need = set()
            for i in sl:
                if first in s.any_forbidden.get(i, ()):
                    row[c] = FORBIDDEN_COST
                    break
                want = s.input_sticks[i]
                if want is not None and want not in have:
                    need.add(want)
            else:
                row[c] = sum(restick_cost(t, w) for w in need)
        return row

    # a tensor read by several ops gets a copy node: (its device-memory layout, the one
    # restickified copy shared by its readers or none), as the model's one restickify per
    # (tensor, layout); its readers pay only for a second other layout
    reader_slots: dict[str, list[tuple]] = {}
    for op in pg.ops:
        slots: dict[str, list[int]] = {}
        for i, a in enumerate(op.inputs):
            slots.setdefault(a.tensor, []).append(i)
        for t, sl in slots.items():
            reader_slots.setdefault(t, []).append((op, sl))
    copy_node: dict[str, int] = {}
    for t, rs in reader_slots.items():
        if len(rs) < 2 or (t not in producer and t not in node_of and t not in ctx.input_sticks):
            continue
        have = list(dict.fromkeys(source_sticks(t)))
        wanted = {strategies[op.id][k].input_sticks[i] for op, sl in rs for k in range(len(strategies[op.id]))
                  for i in sl} - {None}
        if not wanted - set(have):
            continue
        st = [(p, w) for p in have for w in [None] + sorted(wanted - {p})]
        copy_node[t] = len(nodes)
        nodes.append(("copy", t))
        states.append(st)
        node_costs.append([restick_cost(t, w) if w is not None else 0 for _, w in st])
        usages.append([0] * len(st))
        intervals.append((0, 0))
        src = producer[t].id if t in producer else (t if t in node_of else None)
        if src is not None:
            u = node_of[src]
            resident = [r for _, r in states[u]] if t in producer else [False] * len(states[u])
            table = np.array([[0 if p == sj and not (rj and w is not None) else FORBIDDEN_COST for p, w in st]
                              for sj, rj in zip(source_sticks(t), resident)], dtype=np.int64)
            edges.append((u, copy_node[t]))
            tables.append(table)
    for op in pg.ops:
        S_o = strategies[op.id]
        st_o = states[node_of[op.id]]
        n_in = len(op.inputs)
        slots = {}
        for i, a in enumerate(op.inputs):
            slots.setdefault(a.tensor, []).append(i)
        for t, sl in slots.items():
            if t in copy_node:
                m = copy_node[t]
                add_edge(m, node_of[op.id], np.stack([read_row(t, op, sl, {p} | ({w} if w is not None else set()), st_o)
                                                       for p, w in states[m]]))
            src = producer[t].id if t in producer else (t if t in ctx.free_inputs else None)
            if src is None:
                continue
            u = node_of[src]
            st_p = states[u]
            if t in copy_node:
                table = np.zeros((len(st_p), len(st_o)), dtype=np.int64)
            else:
                # device-memory reads: a row per distinct layout the producer writes
                by_stick: dict = {}
                sticks = source_sticks(t)
                for stick in sticks:
                    if stick not in by_stick:
                        by_stick[stick] = read_row(t, op, sl, {stick}, st_o)
                table = np.stack([by_stick[stick] for stick in sticks])
            if nodes[u][0] == "op" and t in may_reside:
                # resident reads: the reader's time saved, where it can read LX slices
                S_p = strategies[src]
                gain = np.zeros(len(st_o), dtype=np.int64)
                lx_in = tuple(i in sl for i in range(n_in))
                for c, (k, r) in enumerate(st_o):
                    parts = S_o[k].parts
                    gain[c] = to_units(parts.cost((False,) * n_in, r).body_ns) - to_units(parts.cost(lx_in, r).body_ns)
                saving[t] = max(saving.get(t, 0), int(gain.max(initial=0)))
                compat: dict = {}
                for j, (kp, rp) in enumerate(st_p):
                    if not rp:
                        continue
                    if kp not in compat:
                        compat[kp] = np.array([all(compatible(S_p[kp], S_o[k], i) for i in sl)
                                               for k, _ in st_o])
                    table[j] = np.where(compat[kp], -gain, FORBIDDEN_COST)
            add_edge(u, node_of[op.id], table)
    problem = StrategyProblem(node_costs, usages, intervals, edges, tables,
                              usage_limit=cap // stick_bytes, name=pg.name)
    return SpyreStrategyProblem(pg, ctx, strategies, problem, nodes, states, window, saving, pos, producer)


def choice_of(sp: SpyreStrategyProblem, d: PlanDecisions) -> list[int]:
    """A plan as a choice of states (the start of the search): each op's strategy, its
    output resident when the plan keeps it so and may (0 where the plan's is not listed);
    each copy node the layout its readers most want besides the one written."""
    out: list[int] = []
    for (kind, key), st in zip(sp.nodes, sp.states):
        if kind == "input":
            have = d.input_sticks.get(key, sp.ctx.input_sticks.get(key))
            out.append(st.index(have) if have in st else 0)
        elif kind == "op":
            op = sp.pg.ops[sp.pos[key]]
            plan = d.ops.get(key, OpPlan())
            ch = plan.stick or default_choice(op)
            split = {k: v for k, v in plan.core_split.items() if v > 1}
            k = next((k for k, s in enumerate(sp.strategies[key])
                      if s.stick == ch and s.core_split == split and s.alias == plan.alias), 0)
            r = op.output.tensor in d.resident
            out.append(st.index((k, r)) if (k, r) in st else st.index((k, False)))
        else:
            out.append(0)
    node = {key: n for n, (kind, key) in enumerate(sp.nodes) if kind != "copy"}
    for n, ((kind, t), st) in enumerate(zip(sp.nodes, sp.states)):
        if kind != "copy":
            continue
        if t in node and sp.nodes[node[t]][0] == "input":
            have, resident = sp.states[node[t]][out[node[t]]], False
        elif t in sp.producer:
            p = sp.producer[t]
            k, resident = sp.states[node[p.id]][out[node[p.id]]]
            have = sp.strategies[p.id][k].out_stick
        else:
            have, resident = sp.ctx.input_sticks.get(t), False
        wants: dict = {}
        for op in sp.pg.ops:
            k = sp.states[node[op.id]][out[node[op.id]]][0]
            for i, a in enumerate(op.inputs):
                w = sp.strategies[op.id][k].input_sticks[i]
                if a.tensor == t and w is not None and w != have:
                    wants[w] = wants.get(w, 0) + 1
        w = max(wants, key=wants.get) if wants and not resident else None
        out[n] = st.index((have, w)) if (have, w) in st else st.index((have, None))
    return _feasible_start(sp, out)


def _feasible_start(sp: SpyreStrategyProblem, choice: list[int]) -> list[int]:
    """The start made feasible where its residencies break the problem's rules (the
    heuristic keeps some tensors in LX that `compatible_residency` does not allow, or more
    than the capacity the search counts): such outputs go to device memory."""
    p = sp.problem

    def to_memory(n: int) -> bool:
        if sp.nodes[n][0] != "op":
            return False
        k, r = sp.states[n][choice[n]]
        if r:
            choice[n] = sp.states[n].index((k, False))
        return r
    for (u, v), table in zip(p.edges, p.edge_costs):
        if table[choice[u], choice[v]] >= FORBIDDEN_COST:
            to_memory(u)
    if not evaluate(p, choice).feasible:
        for n in range(p.num_nodes):
            to_memory(n)
    return choice


def decisions_of(sp: SpyreStrategyProblem, choice, hw, pack_s: float = 1.0) -> tuple[PlanDecisions, list[str]]:
    """A choice read back as a plan: op strategies, chosen weight layouts, LX residencies
    packed at LX addresses (`pack`) (module docstring), bundle starts."""
    pg, S = sp.pg, sp.strategies
    d = PlanDecisions(planner="cpsat", input_sticks={t: s for t, s in sp.ctx.input_sticks.items() if t in pg.inputs})
    resident: dict[str, int] = {}
    for (kind, key), st, c in zip(sp.nodes, sp.states, choice):
        if kind == "copy":      # the emitter inserts the restickifies the layouts need
            continue
        if kind == "input":
            d.input_sticks[key] = st[c]
            continue
        k, r = st[c]
        s = S[key][k]
        d.ops[key] = OpPlan(stick=s.stick, core_split=dict(s.core_split), temporal_tiles=dict(s.temporal_tiles),
                            alias=s.alias)
        if r:
            resident[sp.pg.ops[sp.pos[key]].output.tensor] = s.out_lx_bytes
    notes = []
    placed = pack(sp, resident, hw, pack_s)
    if len(placed) < len(resident):
        notes.append(f"LX addresses: {len(resident) - len(placed)} of {len(resident)} residencies did not pack")
    d.resident = placed
    d.bundle_starts = [pg.ops[a].id for a, _ in _groups(sp, set(placed))]
    d.op_order = [op.id for op in pg.ops]
    return d, notes


def _groups(sp: SpyreStrategyProblem, resident: set) -> list[tuple[int, int]]:
    """Spans of the groups of overlapping resident windows (each is one bundle)."""
    out: list[list[int]] = []
    for a, b in sorted(sp.window[t] for t in resident):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def validated(sp: SpyreStrategyProblem, d: PlanDecisions, hw, max_steps: int = 8,
              deadline: Optional[float] = None) -> tuple[PlanDecisions, Optional[object], list[str], float]:
    """Emit and validate `d`; while the only problems are bundles (over the external-tensor
    limit, or an LX residency crossing one), drop in each offending bundle the residency
    with the longest window that meets it, and again (the emitter's bundles are the rule's
    own). Last, without any residency. Returns (plan, program or None, notes,
    seconds of one check)."""
    pg = sp.pg
    dropped = 0
    notes: list[str] = []
    for _ in range(max_steps):
        t_check = time.perf_counter()
        prog, issues = checked_program(pg, hw, d)
        check_s = time.perf_counter() - t_check
        if prog is not None:
            break
        codes = {getattr(i, "code", "") for i in issues}
        if not codes <= BUNDLE_CODES or not d.resident or (deadline is not None and time.perf_counter() > deadline):
            break
        program = emit_program(pg, hw, d)
        bad_ops = {i.op for i in issues if getattr(i, "code", "") == "lx_cross_bundle" and getattr(i, "op", None)}
        drop = set()
        for b in program.bundles:
            if len(b.external_tensors) > hw.bundle_tensor_limit or bad_ops & set(b.ops):
                at = [sp.pos[o] for o in b.ops if o in sp.pos]
                if not at:
                    continue
                lo, hi = min(at), max(at)
                meet = [t for t in d.resident if sp.window[t][0] <= hi and lo <= sp.window[t][1]]
                if meet:
                    drop.add(max(meet, key=lambda t: (sp.window[t][1] - sp.window[t][0], t)))
        if not drop:
            break
        dropped += len(drop)
        resident = {t: r for t, r in d.resident.items() if t not in drop}
        d = replace(d, resident=resident, bundle_starts=[pg.ops[a].id for a, _ in _groups(sp, set(resident))])
    else:
        prog, issues = checked_program(pg, hw, d)
    if dropped:
        notes.append(f"bundle rule: {dropped} residencies dropped")
    if prog is None and d.resident:
        notes.append(f"read back invalid ({issue_text(issues, 2)}): LX residencies dropped")
        d = replace(d, resident={}, bundle_starts=[])
        prog, issues = checked_program(pg, hw, d)
    if prog is None:
        notes.append(f"read back invalid ({issue_text(issues, 2)})")
    return d, prog, notes, check_s


def _first_fit(sp: SpyreStrategyProblem, sizes: dict[str, int], cap: int, order=None) -> dict[str, Residency]:
    """LX addresses first-fit in window order (the single-graph model's canonical packing),
    or in the order `order` gives (a sort key); a tensor that does not fit stays in device
    memory."""
    ordered = sorted(sizes, key=order or (lambda t: (sp.window[t], t)))
    return first_fit_in_windows(ordered, sp.window.__getitem__, sizes, cap)


def pack(sp: SpyreStrategyProblem, sizes: dict[str, int], hw, time_limit_s: float = 1.0) -> dict[str, Residency]:
    """LX addresses for the residencies the search chose: the search keeps the per-core
    sticks live at each op within the capacity, which does not make them pack (the model's
    rule is a 2-D no-overlap of windows x address ranges). First-fit in window order when
    everything fits so; else a small CP-SAT packing with the windows fixed that keeps the
    most single-read saving, hinted with first-fit."""
    cap = hw.lx_capacity_bytes
    score = lambda r: sum(sp.saving.get(t, 0) + 1 for t in r)
    first = _first_fit(sp, sizes, cap)
    if len(first) < len(sizes):
        # other first-fit orders: largest first, longest window first
        for order in (lambda t: (-sizes[t], sp.window[t], t),
                      lambda t: (sp.window[t][0] - sp.window[t][1], -sizes[t], t)):
            other = _first_fit(sp, sizes, cap, order)
            if score(other) > score(first):
                first = other
    if len(first) == len(sizes) or time_limit_s <= 0:
        return first
    unit = hw.stick_bytes
    m = cp_model.CpModel()
    keep, addr, xs, ys = {}, {}, [], []
    cap_u = cap // unit
    for t in sorted(sizes):
        a, b = sp.window[t]
        size = sizes[t] // unit
        keep[t] = m.NewBoolVar(f"keep[{t}]")
        addr[t] = m.NewIntVar(0, max(0, cap_u - size), f"addr[{t}]")
        xs.append(m.NewOptionalFixedSizeIntervalVar(a, b - a + 1, keep[t], f"x[{t}]"))
        ys.append(m.NewOptionalFixedSizeIntervalVar(addr[t], size, keep[t], f"y[{t}]"))
        m.AddHint(keep[t], t in first)
        m.AddHint(addr[t], first[t].lx_address // unit if t in first else 0)
    m.AddNoOverlap2D(xs, ys)
    m.Maximize(sum((sp.saving.get(t, 0) + 1) * v for t, v in keep.items()))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = 2
    if solver.Solve(m) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return first
    got = {t: Residency(solver.Value(addr[t]) * unit, sizes[t]) for t in sorted(sizes) if solver.BooleanValue(keep[t])}
    return got if score(got) >= score(first) else first


def fusion_cuts(sp: SpyreStrategyProblem, resident: set, crossing: list[int], window: int) -> list[int]:
    """Where the post-solve steps' windows end: about every `window` ops, at a position no
    resident window spans (a bundle boundary, so no residency is cut), with the fewest
    tensors crossing within a quarter window of the nominal end."""
    n = len(sp.pg.ops)
    inside = np.zeros(n + 1, dtype=bool)
    for a, b in _groups(sp, resident):
        inside[a + 1:b + 1] = True         # cutting before position a+1..b splits the group
    cuts, start = [], 0
    while n - start > window + window // 4:
        nominal = start + window
        lo, hi = max(start + 1, nominal - window // 4), min(n - 1, nominal + window // 4)
        free = [i for i in range(lo, hi + 1) if not inside[i]]
        if not free:
            free = [i for i in range(lo, n) if not inside[i]][:1]
            if not free:
                break
        cut = min(free, key=lambda i: (crossing[i], abs(i - nominal)))
        cuts.append(cut)
        start = cut
    return cuts


def fuse_pieces(sp: SpyreStrategyProblem, d: PlanDecisions, hw, *, deadline: float,
                window: int) -> tuple[PlanDecisions, list[str]]:
    """The post-solve steps (fused kernels, LX relayouts: `steps.post_solve`) on `d`,
    window by window (`fusion_cuts`: whole bundles each; a window's boundary inputs in the
    layouts `d` writes them), each window's result kept only when it is valid and simulates
    faster (the steps' own rule); one plan from the windows (`segments.merge`)."""
    pg = sp.pg
    n = len(pg.ops)
    readers = reader_index(pg)
    cuts = fusion_cuts(sp, set(d.resident), crossings(pg, list(range(n))), window)
    bounds = [0] + cuts + [n]
    parts, notes, gained = [], [], 0.0
    sticks = {op.output.tensor: out_stick(op, d.ops.get(op.id)) for op in pg.ops}
    sticks.update(d.input_sticks)
    for k in range(len(bounds) - 1):
        idx = list(range(bounds[k], bounds[k + 1]))
        part = keep_part(pg, d, idx, readers)
        left = deadline - time.perf_counter()
        if left <= 0:
            parts.append((part, part.op_order))
            continue
        win_deadline = time.perf_counter() + left * len(idx) / (n - bounds[k])
        sub = subgraph(pg, idx, f"{pg.name}#fusion {k}") if len(bounds) > 2 else pg
        local = replace(part, input_sticks={t: sticks[t] for t in sub.inputs if t in sticks}, op_order=[])
        t_e = time.perf_counter()
        prog, _ = checked_program(sub, hw, local)
        trial_s = time.perf_counter() - t_e
        if prog is None:
            parts.append((part, part.op_order))
            notes.append(f"fusion window {k}: its part does not validate alone, kept as is")
            continue
        after = steps.post_solve(sub, hw, local, deadline=win_deadline,
                                 strategies={op.id: sp.strategies[op.id] for op in sub.ops}, fuse=True,
                                 trial_s=trial_s)
        got = after.decisions
        gained += after.gain_ns()
        got = replace(got, input_sticks=dict(d.input_sticks))
        if not got.op_order:
            got.op_order = part.op_order
        parts.append((got, got.op_order))
    out = merge(parts)
    out.input_sticks = {t: s for t, s in d.input_sticks.items() if t in pg.inputs}
    notes.insert(0, f"post-solve steps in {len(bounds) - 1} windows: simulated gain {gained / 1000:.1f} us")
    return out, notes


def plan_piece(pg: PrimGraph, idx: list[int], hw, *, time_limit_s: float, input_sticks: Optional[dict] = None,
               hint_d: Optional[PlanDecisions] = None, name: str = "piece", seed: int = 1,
               fuse: bool = True) -> tuple[PlanDecisions, Optional[float], str]:
    """The ops `idx` of `pg` planned as one Spyre strategy problem by the core's search
    (module docstring) within `time_limit_s` of wall clock, then read back, validated and
    fused window by window (`fuse_pieces`). `input_sticks`: layouts of the tensors produced
    before `idx` (fixed); `hint_d`: the start (the piece's heuristic plan around those
    layouts when None). Returns the piece's plan (keys are `pg`'s ids; its op order is the
    piece's), its simulated time (None when nothing validated) and a note. Never slower
    (simulated) than the start when the start validates."""
    t0 = time.perf_counter()
    deadline = t0 + time_limit_s
    whole = len(idx) == len(pg.ops) and list(idx) == list(range(len(pg.ops)))
    sub = pg if whole else subgraph(pg, idx, f"{pg.name}#{name}")
    fixed = {t: s for t, s in (input_sticks or {}).items() if t in sub.tensors and t in sub.inputs}
    if hint_d is None:
        hint_d, _ = default_hint(sub, hw, fixed)
    if time_limit_s < MIN_CORE_S + CORE_S_PER_OP * len(idx):
        # no time for a search: the start as the windows path kept it (checked only when
        # boundary layouts are fixed; the whole program is validated once composed)
        if fixed:
            hint_d, _, _ = valid_or_naive(sub, hw, hint_d, fixed)
        return replace(hint_d, planner="cpsat", op_order=[op.id for op in sub.ops]), None, \
            f"{name}: {len(idx)} ops, heuristic plan ({time_limit_s:.2f} s left)"
    hint_d, hint_prog, _ = valid_or_naive(sub, hw, replace(hint_d, op_order=[]), fixed or None)
    hint_us = time_program(hint_prog, hw).total_us if hint_prog is not None else float("inf")
    start = replace(hint_d, planner="cpsat", op_order=[op.id for op in sub.ops])
    ctx = GraphContext.build(sub, hw, {**hint_d.input_sticks, **fixed})
    # aligned strategies (residency chains) cost seconds on hundreds of ops: only when the
    # piece's time leaves the search its share after them
    align = time_limit_s >= ALIGN_S_PER_OP * len(sub.ops)
    S = spyre_strategies(sub, hw, hint_d, ctx, align=align)
    sp = build_problem(sub, hw, ctx, S)
    t_built = time.perf_counter()
    first = choice_of(sp, hint_d)
    search_s = SEARCH_SHARE * (deadline - t_built)
    choice, notes_pre = first, []
    if search_s >= MIN_SEARCH_S:
        res = optimize(sp.problem, time_limit_s=search_s, workers=2, seed=seed, start=first)
        choice = res.choice if res.choice is not None else first
    else:
        notes_pre = [f"no time left to search ({search_s:.2f} s)"]
    t_search = time.perf_counter()
    d, notes = decisions_of(sp, choice, hw, pack_s=min(PACK_MAX_S, PACK_SHARE * max(0.0, deadline - t_search)))
    notes = notes_pre + notes
    d, prog, more, check_s = validated(sp, d, hw, deadline=deadline)
    notes += more
    t_sim = time.perf_counter()
    us = time_program(prog, hw).total_us if prog is not None else float("inf")
    t_read = time.perf_counter()
    check_s += t_read - t_sim
    # the fused plan is checked and simulated whole after the steps: time for that is kept
    fuse_deadline = deadline - FUSION_CHECK_FACTOR * check_s
    if us < float("inf") and fuse and time.perf_counter() < fuse_deadline:
        fused, fnotes = fuse_pieces(sp, d, hw, deadline=fuse_deadline, window=FUSION_WINDOW_OPS)
        fprog, fissues = checked_program(sub, hw, fused)
        fus = time_program(fprog, hw).total_us if fprog is not None else float("inf")
        notes += fnotes
        if fus < us:
            notes.append(f"fused: {us:.1f} -> {fus:.1f} us")
            d, us = fused, fus
        else:
            notes.append(f"fused plan {'invalid: ' + issue_text(fissues, 2) if fprog is None else f'{fus:.1f} us'}"
                         ": not kept")
    src = "core search"
    if us > hint_us:
        notes.append(f"core plan {us:.1f} us > start {hint_us:.1f} us: the start kept")
        d, us, src = start, hint_us, "start"
    ev = evaluate(sp.problem, choice)
    p = sp.problem
    note = (f"{name}: {len(idx)} ops, {src}: {p.num_nodes} nodes{'' if align else ' (strategies not aligned)'}, {sum(len(c) for c in p.node_costs)} states, "
            f"{len(p.edges)} edges; objective {ev.cost if ev.feasible else 'infeasible'} "
            f"(start {evaluate(p, first).cost}); build {t_built - t0:.1f} s, search {t_search - t_built:.1f} s, "
            f"read back {t_read - t_search:.1f} s, fusion {time.perf_counter() - t_read:.1f} s; "
            f"simulated {us:.1f} us (start {hint_us:.1f} us)" + ("; " + "; ".join(notes) if notes else ""))
    d.op_order = d.op_order or [op.id for op in sub.ops]
    return d, (us if us < float("inf") else None), note


def plan_pieces(pg: PrimGraph, idx: list[int], hw, *, deadline: Optional[float], budget_s: float,
                deterministic: bool, input_sticks: Optional[dict] = None, name: str = "piece",
                readers: Optional[dict] = None, **_) -> tuple[list[tuple[PlanDecisions, list[str]]], list[str]]:
    """`plan_piece` with `windows.plan_windows`'s signature (the ops of a repeated stack's
    prologue or epilogue): one part for `idx`, within `budget_s` (never past `deadline`)."""
    readers = readers if readers is not None else reader_index(pg)
    share = budget_s
    if deadline is not None and not deterministic:
        share = min(share, max(0.0, deadline - time.perf_counter()))
    d, _, note = plan_piece(pg, idx, hw, time_limit_s=share, input_sticks=input_sticks, name=name)
    part = keep_part(pg, d, idx, readers)
    return [(part, part.op_order)], [note]


def uses_core_search(deterministic: bool) -> bool:
    """Whether a large graph (or what lies around a repeated block) is planned by the
    core's search: always in wall-clock mode unless `USE_CORE_SEARCH` is off; never in
    deterministic mode (the core's search stops on the wall clock, not on counts)."""
    return USE_CORE_SEARCH and not deterministic
