"""What a compiler user reads about a program: the compile summary, the per-op report, the
roofline view, the restickifies and the diff of two programs of one graph (docs/report.md).

Only reads a `Program` and its `TimingReport` (`simulator.timing`); no planner, no torch.
Numbers are formatted for people: units, 3-4 significant figures (`fmt_us`, `fmt_bytes`).
"""
from __future__ import annotations

import math
from typing import Optional

from simulator.timing_report import TimingReport
from target.hardware import load_target
from target.superdsc import LxMemory, Program, lx_live_spans


# -- formatting ---------------------------------------------------------------------------------
def sig_digits(v: float, digits: int = 4) -> str:
    """`v` with `digits` significant figures, never in exponent form for |v| < 1e6."""
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 10 ** digits:
        return f"{v:,.0f}"
    decimals = max(0, digits - 1 - int(_floor_log10(a)))
    return f"{v:.{decimals}f}"


def _floor_log10(a: float) -> int:
    return math.floor(math.log10(a))


def fmt_us(us: Optional[float]) -> str:
    """A duration given in microseconds, in ns / µs / ms / s."""
    if us is None:
        return "-"
    a = abs(us)
    if a == 0:
        return "0 µs"
    if a < 1:
        return f"{sig_digits(us * 1e3)} ns"
    if a < 1e3:
        return f"{sig_digits(us)} µs"
    if a < 1e6:
        return f"{sig_digits(us / 1e3)} ms"
    return f"{sig_digits(us / 1e6)} s"


def fmt_s(s: Optional[float]) -> str:
    return "-" if s is None else fmt_us(s * 1e6)


def fmt_bytes(n: Optional[float]) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{sig_digits(n / scale, 3)} {unit}"
    return f"{int(n)} B"


def fmt_pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{sig_digits(100 * x, 3)}%"


# -- compile summary ----------------------------------------------------------------------------
def program_counts(program: Program) -> dict:
    """Op, bundle, LX residency and restickify counts of a program."""
    kinds: dict[str, int] = {}
    for o in program.ops:
        kinds[o.kind] = kinds.get(o.kind, 0) + 1
    lx = [t for t in program.tensors if isinstance(t.memory, LxMemory)]
    return {
        "ops": len(program.ops), "compute_ops": kinds.get("compute", 0),
        "restickifies": kinds.get("restickify", 0), "relayouts": kinds.get("relayout", 0),
        "bundles": len(program.bundles), "lx_residencies": len(lx),
        "lx_tile_buffers": sum(1 for t in lx if t.memory.per_tile),
    }


def summary(program: Program, timing: Optional[TimingReport]) -> dict:
    """The numbers `sticksat compile` prints when it finishes (JSON-able)."""
    s = program.stats
    sim = timing.total_us if timing is not None else None
    lb = s.lower_bound_us
    out = {
        "graph": program.graph_name, "planner": s.planner, "requested_planner": s.fallback_from or s.planner,
        "fallback_reason": s.fallback_reason, "status": s.solver_status, "predicted_us": s.predicted_us,
        "simulated_us": sim, "lower_bound_us": lb,
        "gap_to_lower_bound": (sim / lb - 1.0) if (sim is not None and lb) else None,
        "solver_objective_us": s.objective, "solver_bound_us": s.bound, "solver_gap": s.gap,
        "solve_seconds": s.solve_seconds, "notes": list(s.notes),
    }
    out.update(program_counts(program))
    if timing is not None:
        out["fused_kernels"] = len({o.fused_group for o in timing.ops if o.fused_group is not None})
    return out


def summary_lines(program: Program, timing: Optional[TimingReport]) -> list[str]:
    """The compile summary as lines for a terminal."""
    m = summary(program, timing)
    planner = m["planner"]
    if m["fallback_reason"]:
        planner += f" (fallback from {m['requested_planner']}: {m['fallback_reason']})"
    lines = [f"compiled {m['graph'] or 'graph'} with {planner}"
             + (f", status {m['status']}" if m["status"] else "")]
    lines.append(f"  simulated   {fmt_us(m['simulated_us'])}   predicted {fmt_us(m['predicted_us'])}")
    lb = f"  lower bound {fmt_us(m['lower_bound_us'])}"
    if m["gap_to_lower_bound"] is not None:
        lb += f"   simulated is {sig_digits(1 + m['gap_to_lower_bound'], 3)}x the bound"
    if m["solver_gap"] is not None:
        lb += f"   solver gap {fmt_pct(m['solver_gap'])} (objective {fmt_us(m['solver_objective_us'])}, " \
              f"bound {fmt_us(m['solver_bound_us'])})"
    lines.append(lb)
    lines.append(f"  solved in   {fmt_s(m['solve_seconds'])}")
    lines.append(f"  {m['ops']} ops ({m['compute_ops']} compute, {m['restickifies']} restickify, "
                 f"{m['relayouts']} LX relayout), {m['bundles']} bundles, {m['lx_residencies']} LX residencies"
                 + (f" ({m['lx_tile_buffers']} tile buffers)" if m["lx_tile_buffers"] else "")
                 + (f", {m['fused_kernels']} fused kernels" if m.get("fused_kernels") else ""))
    if m["notes"]:
        lines.append("  notes:")
        lines.extend(f"    {n}" for n in m["notes"])
    return lines


# -- the per-op report --------------------------------------------------------------------------
import re as _re
from dataclasses import asdict, dataclass, field

from target.superdsc import OpDecl, TensorDecl

_LAYER_RE = _re.compile(r"(?:layers?|blocks?|h)[._](\d+)")


@dataclass
class OperandRow:
    role: str          # in0, in1, ..., out
    tensor: str
    stick_dim: Optional[int]
    memory: str        # LX | LX tile | device


@dataclass
class OpRow:
    index: int
    op: str
    source: str
    layer: Optional[str]
    kind: str
    opfunc: str
    ex_unit: str
    cores: int
    core_split: str
    temporal_tiles: str
    operands: list[OperandRow]
    bound_by: str
    start_us: float
    simulated_us: float
    share: float
    compute_us: float
    memory_us: float
    hbm_bytes: int
    macs: int
    fused_group: Optional[int]
    effects: list[str]
    # roofline: achieved vs peak (None where the op does not use that resource)
    achieved_mac_per_ns: Optional[float] = None
    compute_fraction: Optional[float] = None
    achieved_gbps: Optional[float] = None
    bandwidth_fraction: Optional[float] = None
    intensity_mac_per_byte: Optional[float] = None


@dataclass
class RestickRow:
    op: str
    kind: str            # restickify | relayout
    tensor: str          # the source tensor
    dst: str
    from_stick: Optional[int]
    to_stick: Optional[int]
    consumers: list[str]   # ops reading the restickified tensor (the ones needing that stick)
    simulated_us: float
    memory: str


@dataclass
class Report:
    graph: str
    planner: str
    hardware: str
    total_us: float
    summary: dict
    ops: list[OpRow]
    restickifies: list[RestickRow]
    peak_mac_per_ns: float
    peak_gbps: float
    lx_bytes_per_core: int
    lx_occupancy: list[tuple[float, int]] = field(default_factory=list)   # (time us, bytes per core) steps
    per_core: list[list[tuple[str, float, float]]] = field(default_factory=list)  # core -> (op, start, end)

    def to_dict(self) -> dict:
        return asdict(self)


def _split_text(split: dict) -> str:
    parts = [f"{k}:{v}" for k, v in split.items() if int(v) > 1]
    return "×".join(parts) if parts else "-"


def _memory(td: Optional[TensorDecl]) -> str:
    if td is None:
        return "?"
    m = td.memory
    if isinstance(m, LxMemory):
        return "LX tile" if m.per_tile else "LX"
    return "device"


def _operand_ids(op: OpDecl) -> list[tuple[str, str]]:
    if op.prim is not None and op.kind == "compute":
        ins = [(f"in{i}", a["tensor"]) for i, a in enumerate(op.prim.get("inputs", []))]
        return ins + [("out", op.prim["output"]["tensor"])]
    out = []
    if op.src:
        out.append(("in0", op.src))
    if op.dst:
        out.append(("out", op.dst))
    return out


def build_report(program: Program, timing: TimingReport, hw=None) -> Report:
    """The report model of `program` timed as `timing` (on `hw`, default the program's target)."""
    if hw is None:
        hw = load_target(program.hardware)
    tmap = program.tensor_map()
    total = timing.total_us
    peak_mac = hw.pt_sustained_mac_per_ns_per_core * hw.cores
    peak_gbps = hw.dram_oneway_gbps
    readers: dict[str, list[str]] = {}
    for op in program.ops:
        for role, t in _operand_ids(op):
            if role != "out":
                readers.setdefault(t, []).append(op.id)
    rows: list[OpRow] = []
    resticks: list[RestickRow] = []
    for k, (op, ot) in enumerate(zip(program.ops, timing.ops)):
        dur = ot.end_us - ot.start_us
        source = (op.prim or {}).get("source", "") if op.kind == "compute" else (op.src or "")
        m = _LAYER_RE.search(source or op.id)
        hbm = ot.hbm_read_bytes + ot.hbm_write_bytes
        row = OpRow(
            index=k, op=op.id, source=source, layer=m.group(1) if m else None, kind=op.kind,
            opfunc=op.opfunc, ex_unit=op.ex_unit, cores=op.num_cores_used, core_split=_split_text(op.core_split),
            temporal_tiles=_split_text(op.temporal_tiles),
            operands=[OperandRow(r, t, tmap[t].layout.stick_dim if t in tmap else None, _memory(tmap.get(t)))
                      for r, t in _operand_ids(op)],
            bound_by=ot.bound_by, start_us=ot.start_us, simulated_us=dur, share=(dur / total) if total else 0.0,
            compute_us=ot.compute_us, memory_us=ot.memory_us, hbm_bytes=hbm, macs=ot.macs,
            fused_group=ot.fused_group, effects=list(ot.effects))
        if dur > 0:
            if ot.macs:
                row.achieved_mac_per_ns = ot.macs / (dur * 1e3)
                row.compute_fraction = row.achieved_mac_per_ns / peak_mac
            if hbm:
                row.achieved_gbps = hbm / (dur * 1e3)
                row.bandwidth_fraction = row.achieved_gbps / peak_gbps
        if ot.macs and hbm:
            row.intensity_mac_per_byte = ot.macs / hbm
        rows.append(row)
        if op.kind in ("restickify", "relayout") and op.src and op.dst:
            s, d = tmap.get(op.src), tmap.get(op.dst)
            resticks.append(RestickRow(
                op=op.id, kind=op.kind, tensor=op.src, dst=op.dst,
                from_stick=s.layout.stick_dim if s else None, to_stick=d.layout.stick_dim if d else None,
                consumers=readers.get(op.dst, []), simulated_us=dur, memory=f"{_memory(s)} -> {_memory(d)}"))
    rep = Report(graph=program.graph_name, planner=program.stats.planner, hardware=timing.hardware,
                 total_us=total, summary=summary(program, timing), ops=rows, restickifies=resticks,
                 peak_mac_per_ns=peak_mac, peak_gbps=peak_gbps, lx_bytes_per_core=hw.lx_bytes_per_core)
    rep.lx_occupancy = _lx_occupancy(program, timing)
    per_core: list[list] = [[] for _ in range(hw.cores)]
    for ot in timing.ops:
        for c, (mu, cu) in sorted(ot.per_core.items()):
            if 0 <= c < hw.cores and max(mu, cu) > 0:
                per_core[c].append((ot.op_id, ot.start_us, ot.start_us + min(max(mu, cu), ot.end_us - ot.start_us)))
    rep.per_core = per_core
    return rep


def _lx_occupancy(program: Program, timing: TimingReport) -> list[tuple[float, int]]:
    """LX bytes reserved per core over time (every core reserves the same `size_per_core`
    at the same address): steps (time us, bytes) at each op start, and the end."""
    spans = lx_live_spans(program)
    sizes = {t.id: t.memory.size_per_core for t in program.tensors if isinstance(t.memory, LxMemory)}
    steps = []
    for k, ot in enumerate(timing.ops):
        used = sum(sizes[t] for t, (a, b) in spans.items() if a <= k <= b)
        steps.append((ot.start_us, used))
    steps.append((timing.total_us, 0))
    return steps


def sorted_rows(report: Report, top: Optional[int] = None) -> list[OpRow]:
    rows = sorted(report.ops, key=lambda r: (-r.simulated_us, r.index))
    return rows[:top] if top else rows


def operands_text(r: OpRow) -> str:
    return " ".join(f"{o.role}:{'s' + str(o.stick_dim) if o.stick_dim is not None else '-'}"
                    f"@{ {'LX': 'LX', 'LX tile': 'LXt', 'device': 'dev'}.get(o.memory, o.memory)}"
                    for o in r.operands)


def _table(headers: list[str], rows: list[list[str]], right: set[int] = frozenset()) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    fmt = lambda cells: "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return [fmt(headers), fmt(["-" * w for w in widths])] + [fmt(r).rstrip() for r in rows]


def render_text(report: Report, top: Optional[int] = None) -> str:
    out = summary_lines_from(report)
    rows = sorted_rows(report, top)
    out.append("")
    out.append(f"ops by simulated time ({len(rows)} of {len(report.ops)}; operands: role:stick dim@memory)")
    out += _table(["op", "source", "layer", "kind", "cores", "split", "tiles", "operands", "bound by", "time", "share"],
                  [[r.op, r.source or "-", r.layer or "-", r.opfunc, str(r.cores), r.core_split, r.temporal_tiles,
                    operands_text(r), r.bound_by, fmt_us(r.simulated_us), fmt_pct(r.share)] for r in rows],
                  right={4, 9, 10})
    layers = {}
    for r in report.ops:
        if r.layer is not None:
            layers[r.layer] = layers.get(r.layer, 0.0) + r.simulated_us
    if len(layers) > 1:
        out.append("")
        out.append("by layer")
        out += _table(["layer", "time", "share"],
                      [[k, fmt_us(v), fmt_pct(v / report.total_us if report.total_us else 0)]
                       for k, v in sorted(layers.items(), key=lambda kv: -kv[1])], right={1, 2})
    out.append("")
    out.append(f"roofline (peak {sig_digits(report.peak_mac_per_ns)} MAC/ns, {sig_digits(report.peak_gbps)} GB/s device memory)")
    out += _table(["op", "MACs", "device bytes", "MAC/byte", "MAC/ns", "% peak compute", "GB/s", "% peak bw", "bound by"],
                  [[r.op, sig_digits(r.macs) if r.macs else "-", fmt_bytes(r.hbm_bytes) if r.hbm_bytes else "-",
                    sig_digits(r.intensity_mac_per_byte, 3) if r.intensity_mac_per_byte else "-",
                    sig_digits(r.achieved_mac_per_ns, 3) if r.achieved_mac_per_ns else "-", fmt_pct(r.compute_fraction),
                    sig_digits(r.achieved_gbps, 3) if r.achieved_gbps else "-", fmt_pct(r.bandwidth_fraction), r.bound_by]
                   for r in rows], right={1, 2, 3, 4, 5, 6, 7})
    out.append("")
    if report.restickifies:
        out.append(f"restickifies ({len(report.restickifies)}; the consumers are the ops that need the new stick)")
        out += _table(["op", "tensor", "stick", "memory", "time", "needed by"],
                      [[x.op, x.tensor, f"{x.from_stick} -> {x.to_stick}", x.memory, fmt_us(x.simulated_us),
                        ", ".join(x.consumers) or "-"] for x in report.restickifies], right={4})
    else:
        out.append("restickifies: none")
    return "\n".join(out) + "\n"


def summary_lines_from(report: Report) -> list[str]:
    m = report.summary
    lines = [f"{report.graph or 'program'}: {report.planner} on {report.hardware}, simulated {fmt_us(report.total_us)}"
             + (f", lower bound {fmt_us(m['lower_bound_us'])}" if m.get("lower_bound_us") else "")
             + (f", solver gap {fmt_pct(m['solver_gap'])}" if m.get("solver_gap") is not None else "")]
    lines.append(f"{m['ops']} ops ({m['compute_ops']} compute, {m['restickifies']} restickify, {m['relayouts']} LX relayout), "
                 f"{m['bundles']} bundles, {m['lx_residencies']} LX residencies")
    return lines


# -- the diff of two programs of one graph ------------------------------------------------------
@dataclass
class DiffRow:
    op: str
    what: str         # the decisions that differ
    this: str
    other: str
    delta_us: float   # other's time of the op minus this one's (positive: other is slower)


def diff_programs(a: Program, ta: TimingReport, b: Program, tb: TimingReport) -> dict:
    """Which decisions differ between programs `a` and `b` of the same graph and what each
    costs (per op: b's simulated time minus a's). Empty `ops` when they decide the same."""
    if a.graph_hash and b.graph_hash and a.graph_hash != b.graph_hash:
        raise ValueError(f"programs of different graphs ({a.graph_hash[:12]} vs {b.graph_hash[:12]})")
    amap, bmap = a.tensor_map(), b.tensor_map()
    atime = {o.op_id: o.end_us - o.start_us for o in ta.ops}
    btime = {o.op_id: o.end_us - o.start_us for o in tb.ops}
    aops, bops = {o.id: o for o in a.ops}, {o.id: o for o in b.ops}
    rows: list[DiffRow] = []

    def tensor_desc(td: Optional[TensorDecl]) -> str:
        if td is None:
            return "-"
        return f"stick {td.layout.stick_dim} in {_memory(td)}"

    for oid in [o.id for o in a.ops] + [o.id for o in b.ops if o.id not in aops]:
        x, y = aops.get(oid), bops.get(oid)
        if x is None or y is None:
            rows.append(DiffRow(oid, f"{(x or y).kind} only in {'this' if y is None else 'other'}",
                                "present" if x else "-", "present" if y else "-",
                                btime.get(oid, 0.0) - atime.get(oid, 0.0)))
            continue
        what, this, other = [], [], []
        if {k: v for k, v in x.core_split.items() if v > 1} != {k: v for k, v in y.core_split.items() if v > 1}:
            what.append("core split")
            this.append(_split_text(x.core_split))
            other.append(_split_text(y.core_split))
        if {k: v for k, v in x.temporal_tiles.items() if v > 1} != {k: v for k, v in y.temporal_tiles.items() if v > 1}:
            what.append("temporal tiles")
            this.append(_split_text(x.temporal_tiles))
            other.append(_split_text(y.temporal_tiles))
        for role, t in _operand_ids(x):
            da, db = tensor_desc(amap.get(t)), tensor_desc(bmap.get(t))
            if da != db and role == "out":
                what.append(f"{role} {t}")
                this.append(da)
                other.append(db)
        if [t for _, t in _operand_ids(x)] != [t for _, t in _operand_ids(y)]:
            what.append("operands")
            this.append(",".join(t for _, t in _operand_ids(x)))
            other.append(",".join(t for _, t in _operand_ids(y)))
        if what:
            rows.append(DiffRow(oid, "; ".join(what), "; ".join(this), "; ".join(other),
                                btime.get(oid, 0.0) - atime.get(oid, 0.0)))
    # graph-input tensors (no producer op in the program) can differ in layout too
    produced = {t for o in a.ops for r, t in _operand_ids(o) if r == "out"}
    for tid, td in amap.items():
        if tid in produced or tid not in bmap:
            continue
        if tensor_desc(td) != tensor_desc(bmap[tid]):
            rows.append(DiffRow(tid, "input tensor", tensor_desc(td), tensor_desc(bmap[tid]), 0.0))
    rows.sort(key=lambda r: -abs(r.delta_us))
    delta = tb.total_us - ta.total_us
    return {"this_us": ta.total_us, "other_us": tb.total_us, "delta_us": delta,
            # the part of the difference no differing op accounts for (ops whose own
            # decisions are equal but whose neighbours' differ, e.g. an operand now in LX)
            "unattributed_us": delta - sum(r.delta_us for r in rows) if rows else 0.0,
            "ops": [asdict(r) for r in rows]}


def render_diff_text(d: dict, top: Optional[int] = None) -> str:
    out = [f"this {fmt_us(d['this_us'])}, other {fmt_us(d['other_us'])} "
           f"(other {'+' if d['delta_us'] >= 0 else ''}{fmt_us(d['delta_us'])})"]
    rows = d["ops"][:top] if top else d["ops"]
    if not rows:
        out.append("no differing decisions")
    else:
        out.append(f"{len(d['ops'])} differing decisions (cost: the op's time in other minus in this; "
                   f"{fmt_us(d['unattributed_us'])} of the difference is in ops whose own decisions are equal)")
        out += _table(["op", "differs in", "this", "other", "cost"],
                      [[r["op"], r["what"], r["this"], r["other"],
                        ("+" if r["delta_us"] >= 0 else "") + fmt_us(r["delta_us"])] for r in rows], right={4})
    return "\n".join(out) + "\n"
