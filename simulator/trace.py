"""Chrome / Perfetto trace of a timing report (load the JSON in ui.perfetto.dev).

Layout of the trace:
- pid 0 "program": tid 0 "ops" shows every op as one slice (its barrier-to-barrier span),
  tid 1 "bundles" one slice per bundle.
- pid 1 "device memory": tid 0 the bus, one slice per op that moves device-memory bytes
  (args: bytes read/written).
- pid 2 + c "core c": tid 0 "PT", tid 1 "SFP", tid 2 "DMA" (loads/stores of that core),
  tid 3 "ring". Each op contributes its per-core compute slice on the unit that runs it
  and its per-core data-movement slice on DMA, both starting at the op's start.
Times are microseconds ("ts"/"dur", as the Chrome trace format wants); events are
complete ("ph": "X") events, plus metadata ("ph": "M") naming processes and threads.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Union

from simulator.timing_report import TimingReport

_CORE_TIDS = {"pt": 0, "sfp": 1, "dma": 2, "ring": 3}
_CORE_PID0 = 2


def _meta(pid: int, name: str, tid: int | None = None, tname: str | None = None) -> list[dict]:
    out = []
    if tid is None:
        out.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": name}})
        out.append({"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": pid}})
    else:
        out.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": tname}})
    return out


def trace_events(report: TimingReport) -> list[dict]:
    ev: list[dict] = []
    ev += _meta(0, "program") + _meta(0, "", 0, "ops") + _meta(0, "", 1, "bundles")
    ev += _meta(1, "device memory") + _meta(1, "", 0, "bus")
    cores_seen: set[int] = set()
    bundle_span: dict[int, list[float]] = {}
    for o in report.ops:
        dur = max(0.0, o.end_us - o.start_us)
        ev.append({"ph": "X", "pid": 0, "tid": 0, "name": o.op_id, "cat": o.kind, "ts": o.start_us,
                   "dur": dur, "args": {"opfunc": o.opfunc, "bound_by": o.bound_by, "cores": o.cores,
                                        "compute_us": o.compute_us, "memory_us": o.memory_us,
                                        "effects": o.effects}})
        span = bundle_span.setdefault(o.bundle, [o.start_us, o.end_us])
        span[0] = min(span[0], o.start_us)
        span[1] = max(span[1], o.end_us)
        if o.hbm_read_bytes or o.hbm_write_bytes:
            ev.append({"ph": "X", "pid": 1, "tid": 0, "name": o.op_id, "cat": "dram", "ts": o.start_us,
                       "dur": min(dur, o.memory_us) if o.memory_us else dur,
                       "args": {"read_bytes": o.hbm_read_bytes, "write_bytes": o.hbm_write_bytes}})
        unit = o.ex_unit if o.ex_unit in ("pt", "sfp") else "dma"
        for core, (mem_us, comp_us) in sorted(o.per_core.items()):
            cores_seen.add(core)
            pid = _CORE_PID0 + core
            if comp_us > 0:
                ev.append({"ph": "X", "pid": pid, "tid": _CORE_TIDS[unit], "name": o.op_id,
                           "cat": "compute", "ts": o.start_us, "dur": min(comp_us, dur) if dur else comp_us})
            if mem_us > 0:
                ev.append({"ph": "X", "pid": pid, "tid": _CORE_TIDS["dma"], "name": o.op_id,
                           "cat": "load/store", "ts": o.start_us, "dur": min(mem_us, dur) if dur else mem_us})
            if o.ring_us > 0:
                ev.append({"ph": "X", "pid": pid, "tid": _CORE_TIDS["ring"], "name": o.op_id,
                           "cat": "ring", "ts": max(o.start_us, o.end_us - o.ring_us), "dur": o.ring_us})
    for b, (s, e) in sorted(bundle_span.items()):
        ev.append({"ph": "X", "pid": 0, "tid": 1, "name": f"bundle {b}", "cat": "bundle", "ts": s,
                   "dur": e - s})
    for core in sorted(cores_seen):
        pid = _CORE_PID0 + core
        ev += _meta(pid, f"core {core}")
        for unit, tid in _CORE_TIDS.items():
            ev += _meta(pid, "", tid, unit.upper())
    return ev


def trace_document(report: TimingReport) -> dict:
    return {"traceEvents": trace_events(report), "displayTimeUnit": "ns",
            "otherData": {"hardware": report.hardware, "hardware_digest": report.hardware_digest,
                          "total_us": report.total_us}}


def write_trace(report: TimingReport, path: Union[str, Path]) -> Path:
    """Write the Chrome/Perfetto trace JSON of `report` to `path`."""
    p = Path(path)
    p.write_text(json.dumps(trace_document(report), separators=(",", ":")), encoding="utf-8")
    return p
