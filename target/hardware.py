"""The hardware description: one JSON data file per target (target/targets/<name>.json).

This module is the only reader of those files. Every parameter in a target file is an
object {"value": ..., "unit": ..., "source": ...} or {..., "assumption": true,
"reasoning": ...}; the loader checks that each one says where it comes from and flattens
the file into a frozen `Hardware`. The simulator's timing model and the solver's cost
model both derive their rates from this one object, so they cannot drift apart.
`hw.digest` (sha256 of the canonical JSON) goes into every program a planner emits.
Format: docs/hardware.md.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Union

HARDWARE_FORMAT = "sticksat.hardware"
HARDWARE_VERSION = 1
TARGETS_DIR = Path(__file__).resolve().parent / "targets"
_TARGET_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class HardwareError(ValueError):
    """A target file is missing, malformed, or has a number without a source."""


@dataclass(frozen=True)
class ReductionReadCurve:
    """Standalone row-reduction read rate, GB/s = min(cap, base + amp*exp(-rows/rows_scale))."""

    cap_gbps: float
    base_gbps: float
    amp_gbps: float
    rows_scale: float

    def gbps(self, rows: int) -> float:
        return min(self.cap_gbps, self.base_gbps + self.amp_gbps * math.exp(-rows / self.rows_scale))


@dataclass(frozen=True)
class CoreCountCurve:
    """Fraction of the one-way device-memory rate a kernel on `n` active cores reaches,
    linear between the listed core counts (constant past the last)."""

    cores: tuple[float, ...]
    fraction: tuple[float, ...]

    def at(self, n: float) -> float:
        xs, ys = self.cores, self.fraction
        if n <= xs[0]:
            return ys[0]
        for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
            if n <= x1:
                return y0 + (y1 - y0) * (n - x0) / (x1 - x0)
        return ys[-1]


@dataclass(frozen=True)
class UnderfillCurve:
    """Streaming efficiency of a per-core tile of `rows` rows x `cols` columns (elements):
    eff = min(cap, (rows/rows_full)^rows_exp * (cols/cols_ref)^cols_exp). Small tiles
    underfill the load/store pipeline; the cap lets a very large tile run a little faster
    than the nominal rate, as measured."""

    cap: float
    rows_full: float
    rows_exp: float
    cols_ref: float
    cols_exp: float
    eff_floor: float
    floor_exp: float

    def efficiency(self, rows: float, cols: float) -> float:
        if rows <= 0 or cols <= 0:
            return 1.0
        raw = (rows / self.rows_full) ** self.rows_exp * (cols / self.cols_ref) ** self.cols_exp
        if raw >= self.eff_floor:
            return min(self.cap, raw)
        # Below the smallest fitted value the power law is not extrapolated: it continues
        # with a much weaker exponent, so tiny tiles stay ordered but bounded.
        return min(self.cap, self.eff_floor) * (raw / self.eff_floor) ** self.floor_exp


@dataclass(frozen=True, eq=False)
class Hardware:
    name: str
    digest: str
    description: str
    # topology
    cores: int
    corelets_per_core: int
    pt_array: tuple[int, int]
    stick_bytes: int
    lx_bytes_per_core: int
    lx_capacity_bytes: int
    bundle_tensor_limit: int
    bundle_tensor_limit_counts: str
    # which device-memory tensors the limit counts (BUNDLE_RULES); `rule` of its entry
    bundle_tensor_limit_rule: str
    # LX contents survive a bundle boundary (the next kernel launch reads them by address)
    lx_persists_across_bundles: bool
    per_core_span_bytes: int
    device_memory_bytes: int
    device_memory_usable_bytes: int
    # device memory (LPDDR5): one bus shared by all cores
    dram_peak_gbps: float
    dram_oneway_gbps: float
    dram_balanced_gbps: float
    dram_turnaround_ns_per_byte: float
    dram_turnaround_min_cores: int
    # ring
    ring_bytes_per_cycle: int
    clock_ghz: float
    ring_hop_latency_ns: float
    # PT (systolic array)
    pt_peak_mac_per_ns_per_core: float
    pt_sustained_mac_per_ns_per_core: float
    # operand order: a batched matmul operand whose batch dims are not outermost in its
    # device layout stalls the PT feed (ns per MAC per core, at full batch interleave)
    pt_batch_inside_input_ns_per_mac: float
    pt_batch_inside_output_ns_per_mac: float
    # a projection (batched x against a weight all batches share) whose x or output keeps
    # the batch inside: its rows interleave batches that share the weight (a smaller stall)
    pt_projection_batch_inside_ns_per_mac: float
    bmm_layout_saturation_batch: float
    projection_layout_saturation_batch: float
    untiled_overlap_chunks: float
    psum_bytes_per_element: int
    psum_spill_k_per_pass: float
    pt_rows_per_pass: int
    pt_target_passes: int
    pt_dtype_rate_scale: Mapping[str, float]
    # SFP (vector unit)
    sfp_sticks_per_cycle_per_corelet: float
    sfp_transcendental_cycles: float
    # measured access-pattern rates
    restickify_gbps: float
    lx_relayout_gbps_per_core: float
    dram_core_count_curve: "CoreCountCurve"
    # what one core's DMA can issue (reads), and the bus share a kernel on part of the
    # machine reaches (streaming ops; reductions follow dram_core_count_curve)
    dram_core_read_gbps: float
    dram_partial_machine_fraction: float
    # reading what the previous kernel just wrote to device memory: its writes still drain
    dram_raw_turnaround_ns_per_byte: float
    shared_read_free_fanout: float
    # host-side, not device time: what a compiled call costs from Python (calibration only)
    host_call_overhead_us: float
    shared_read_fanout_exponent: float
    reduction_read_curve: ReductionReadCurve
    broadcast_op_gbps: float
    cross_row_reduction_gbps: float
    loop_overhead_us: float
    lx_spill_knee_bytes: int
    lx_spill_exponent: float
    underfill_curve: UnderfillCurve
    power_watts: float
    dtype_bytes: Mapping[str, int]
    # the whole parameter table with units and sources, for reports and docs
    provenance: Mapping[str, Mapping[str, Any]]

    def __hash__(self) -> int:
        return hash(self.digest)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Hardware) and other.digest == self.digest

    # --- element and stick geometry -------------------------------------------------
    def dtype_size(self, dtype: str) -> int:
        try:
            return self.dtype_bytes[dtype]
        except KeyError:
            raise HardwareError(f"target {self.name!r} has no size for dtype {dtype!r}") from None

    def elems_per_stick(self, dtype: str) -> int:
        return max(1, self.stick_bytes // self.dtype_size(dtype))

    def sticks(self, n_elems: int, dtype: str) -> int:
        """Whole sticks needed to hold `n_elems` elements of one stick row."""
        per = self.elems_per_stick(dtype)
        return -(-n_elems // per)

    @property
    def lx_capacity_sticks(self) -> int:
        return self.lx_capacity_bytes // self.stick_bytes

    # --- derived rates (one home for every rate the timing and cost models use) -----
    @property
    def ring_gbps_per_direction(self) -> float:
        return self.ring_bytes_per_cycle * self.clock_ghz

    @property
    def sfp_sticks_per_ns_per_core(self) -> float:
        return self.sfp_sticks_per_cycle_per_corelet * self.corelets_per_core * self.clock_ghz

    def pt_mac_per_ns(self, dtype: str = "float16", layout: str = "sustained") -> float:
        """Per-core PT rate. layout: "sustained" (a matmul whose operands feed the array in
        order; operand-order stalls are added on top, `pt_layout_stall_ns_per_mac`) or
        "peak" (datasheet)."""
        base = {
            "sustained": self.pt_sustained_mac_per_ns_per_core,
            "peak": self.pt_peak_mac_per_ns_per_core,
        }[layout]
        return base * self.pt_dtype_rate_scale.get(dtype, 1.0)

    def batch_interleave(self, batch: float, saturation: float | None = None) -> float:
        """How far a batch-inside operand's rows are interleaved across batches, 0..1: 0 for
        one batch (nothing interleaved), rising linearly to 1 at `saturation` (default
        `bmm_layout_saturation_batch`: the stride past which every row fetch of the PT feed
        is a separate burst)."""
        if batch <= 1:
            return 0.0
        sat = self.bmm_layout_saturation_batch if saturation is None else saturation
        return min(1.0, (batch - 1.0) / max(1e-9, sat - 1.0))

    def pt_layout_stall_ns_per_mac(self, inputs_inside: int, output_inside: bool, batch: float,
                                   shared_weight: bool = False) -> float:
        """Extra PT time per MAC per core of a batched matmul whose operands keep a batch dim
        inside the row dims: each such input stalls the array's feed, and a batch-inside
        output stalls its drain; the drain overlaps the feed stalls (the larger counts). A
        projection (`shared_weight`: one weight for every batch) interleaves rows that share
        the weight: one stall whichever of x and the output is batch-inside."""
        if shared_weight:
            inside = inputs_inside > 0 or output_inside
            return (self.batch_interleave(batch, self.projection_layout_saturation_batch)
                    * (self.pt_projection_batch_inside_ns_per_mac if inside else 0.0))
        feed = inputs_inside * self.pt_batch_inside_input_ns_per_mac
        drain = self.pt_batch_inside_output_ns_per_mac if output_inside else 0.0
        return self.batch_interleave(batch) * max(feed, drain)

    def pt_pass_efficiency(self, rows_per_core: int) -> float:
        """PT efficiency when each core's M slice is short: the array streams M in passes
        of `pt_rows_per_pass` rows; below `pt_target_passes` passes, pipeline fill and drain
        dominate and throughput falls as sqrt(passes / target)."""
        passes = max(1, -(-rows_per_core // self.pt_rows_per_pass))
        return min(1.0, math.sqrt(passes / self.pt_target_passes))

    def dram_ns(self, read_bytes: float, write_bytes: float, gbps: float | None = None,
                cores: int | None = None, access: str = "stream") -> float:
        """Device-memory time of one kernel moving R read and W written bytes: the longer of
        the shared bus, (R+W)/BW + turnaround*min(R, W), and what its cores can issue,
        R / (cores x `dram_core_read_gbps`). BW is capped by the bus share `cores` active
        cores reach (`dram_bus_gbps`, by access kind); the turnaround is paid when `cores`
        (None: many) interleave their streams (at least `dram_turnaround_min_cores`)."""
        bw = self.dram_oneway_gbps if gbps is None else gbps
        if cores is not None:
            bw = min(bw, self.dram_bus_gbps(cores, access))
        t = (read_bytes + write_bytes) / bw
        if cores is None or cores >= self.dram_turnaround_min_cores:
            t += self.dram_turnaround_ns_per_byte * min(read_bytes, write_bytes)
        if cores is not None:
            t = max(t, read_bytes / (max(1, cores) * self.dram_core_read_gbps))
        return t

    def dram_bus_gbps(self, cores: int, access: str = "stream") -> float:
        """Device-memory rate a kernel on `cores` active cores reaches. A streaming kernel
        (pointwise, copy, matmul operands) on part of the machine reaches
        `dram_partial_machine_fraction` of the bus, on all of it the whole bus; a reduction
        ("reduction") follows the device-fitted `dram_core_count_curve` (its fold keeps few
        cores from issuing)."""
        n = max(1, cores)
        if access == "reduction":
            return self.dram_oneway_gbps * self.dram_core_count_curve.at(n)
        return self.dram_oneway_gbps * (1.0 if n >= self.cores else self.dram_partial_machine_fraction)

    def shared_read_delivery_ns(self, unique_bytes: float, fanout: int) -> float:
        """Extra time to deliver a read that `fanout` cores share (a matmul operand the core
        split does not index): it crosses the bus once (counted with the kernel's other
        bytes); up to `shared_read_free_fanout` consumers receive it at no extra cost, more
        cost (f / free)^exponent - 1 further passes of the unique bytes."""
        free = self.shared_read_free_fanout
        if fanout <= free:
            return 0.0
        return unique_bytes * ((fanout / free) ** self.shared_read_fanout_exponent - 1.0) / self.dram_oneway_gbps

    def ring_combine_ns(self, ways: int, part_bytes: float) -> float:
        """Partial results of a reduction dim split `ways` across cores, summed over the ring:
        (ways - 1) hops of one core's partial (`part_bytes`)."""
        if ways <= 1:
            return 0.0
        return (ways - 1) * (part_bytes / self.ring_gbps_per_direction + self.ring_hop_latency_ns)

    def spill_derate(self, working_set_bytes_per_core: float) -> float:
        """Bandwidth multiplier (<= 1) when a per-core working set spills past the knee."""
        if working_set_bytes_per_core <= self.lx_spill_knee_bytes:
            return 1.0
        return (self.lx_spill_knee_bytes / working_set_bytes_per_core) ** self.lx_spill_exponent

    # --- bundles ------------------------------------------------------------------------
    def bundle_slots(self, device_tensors, io_tensors, pool: bool) -> int:
        """How much of `bundle_tensor_limit` a bundle uses that references `device_tensors`
        (alias roots in device memory), by `bundle_tensor_limit_rule`:
        - "device_memory": every one of them;
        - "non_intermediate": the program inputs and outputs among them (`io_tensors`), plus
          one for the pool of device-memory intermediates when the program has one (`pool`):
          torch-spyre's fusion.py before PR #3069 gave each non-intermediate kernel argument
          its own address segment and all pooled intermediates one shared segment;
        - "none": nothing (no limit)."""
        rule = self.bundle_tensor_limit_rule
        if rule == "device_memory":
            return len(set(device_tensors))
        if rule == "non_intermediate":
            return len(set(device_tensors) & set(io_tensors)) + (1 if pool else 0)
        return 0

    def to_summary(self) -> dict:
        """Flat name -> value view (for CLI output and docs)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name == "provenance":
                continue
            v = getattr(self, f.name)
            if dataclasses.is_dataclass(v):
                v = dataclasses.asdict(v)
            elif isinstance(v, Mapping):
                v = dict(v)
            out[f.name] = v
        return out


# Parameters whose JSON value is an object, turned into a typed value here.
_COMPOSITE = {
    "reduction_read_curve": ReductionReadCurve,
    "underfill_curve": UnderfillCurve,
}
_MAPPINGS = {"pt_dtype_rate_scale", "dtype_bytes"}
_NOT_PARAMS = {"name", "digest", "description", "provenance", "bundle_tensor_limit_counts",
               "bundle_tensor_limit_rule"}
# Parameters a target file may leave out, with the value that keeps an older file meaning
# what it meant (LX contents die at a bundle boundary).
_OPTIONAL = {"lx_persists_across_bundles": False}
# What `bundle_tensor_limit` may count (the entry's "rule"; Hardware.bundle_slots).
BUNDLE_RULES = ("device_memory", "non_intermediate", "none")


def _param_names() -> list[str]:
    return [f.name for f in dataclasses.fields(Hardware) if f.name not in _NOT_PARAMS]


def _check_entry(target: str, key: str, entry: Any) -> None:
    if not isinstance(entry, dict) or "value" not in entry:
        raise HardwareError(f"{target}: parameter {key!r} must be an object with a 'value'")
    if "unit" not in entry:
        raise HardwareError(f"{target}: parameter {key!r} has no 'unit'")
    has_source = isinstance(entry.get("source"), str) and entry["source"].strip()
    is_assumption = entry.get("assumption") is True and isinstance(entry.get("reasoning"), str) \
        and entry["reasoning"].strip()
    if not (has_source or is_assumption):
        raise HardwareError(
            f"{target}: parameter {key!r} needs a 'source', or 'assumption': true with 'reasoning'")


def _convert(key: str, value: Any, field_type: str) -> Any:
    if key in _COMPOSITE:
        cls = _COMPOSITE[key]
        names = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(value, dict) or set(value) != names:
            raise HardwareError(f"parameter {key!r} must have exactly the keys {sorted(names)}")
        return cls(**{k: float(v) for k, v in value.items()})
    if key == "dram_core_count_curve":
        if not (isinstance(value, dict) and set(value) == {"cores", "fraction"}
                and isinstance(value["cores"], list) and isinstance(value["fraction"], list)
                and len(value["cores"]) == len(value["fraction"]) >= 1):
            raise HardwareError(f"parameter {key!r} must be {{'cores': [...], 'fraction': [...]}} of equal length")
        xs = tuple(float(x) for x in value["cores"])
        ys = tuple(float(y) for y in value["fraction"])
        if any(b <= a for a, b in zip(xs, xs[1:])) or not all(0 < y <= 1 for y in ys):
            raise HardwareError(f"parameter {key!r}: cores must increase and fractions lie in (0, 1]")
        return CoreCountCurve(xs, ys)
    if key in _MAPPINGS:
        if not isinstance(value, dict):
            raise HardwareError(f"parameter {key!r} must be an object")
        return MappingProxyType({str(k): v for k, v in value.items()})
    if key == "pt_array":
        if not (isinstance(value, list) and len(value) == 2 and all(isinstance(x, int) for x in value)):
            raise HardwareError("parameter 'pt_array' must be [rows, cols]")
        return (value[0], value[1])
    if field_type == "bool":
        if not isinstance(value, bool):
            raise HardwareError(f"parameter {key!r} must be true or false")
        return value
    if field_type == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise HardwareError(f"parameter {key!r} must be an integer")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise HardwareError(f"parameter {key!r} must be a number")
    return float(value)


def canonical_json(doc: dict) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def hardware_from_dict(doc: dict, origin: str = "<dict>") -> Hardware:
    """Build a Hardware from a parsed target document (strict: unknown or missing
    parameters, and numbers without a source, are errors)."""
    if not isinstance(doc, dict):
        raise HardwareError(f"{origin}: a target file is a JSON object")
    if doc.get("format") != HARDWARE_FORMAT or doc.get("version") != HARDWARE_VERSION:
        raise HardwareError(f"{origin}: expected format {HARDWARE_FORMAT!r} version {HARDWARE_VERSION}")
    # `calibration`: the record of the last fit (date, dataset, residuals); informational
    extra_top = set(doc) - {"format", "version", "name", "description", "params", "calibration"}
    if extra_top:
        raise HardwareError(f"{origin}: unknown top-level keys {sorted(extra_top)}")
    name = doc.get("name")
    if not isinstance(name, str) or not _TARGET_NAME.match(name):
        raise HardwareError(f"{origin}: 'name' must match {_TARGET_NAME.pattern}")
    params = doc.get("params")
    if not isinstance(params, dict):
        raise HardwareError(f"{origin}: 'params' must be an object")

    expected = _param_names()
    missing = [k for k in expected if k not in params and k not in _OPTIONAL]
    unknown = [k for k in params if k not in expected]
    if missing:
        raise HardwareError(f"{origin}: missing parameters {missing}")
    if unknown:
        raise HardwareError(f"{origin}: unknown parameters {unknown}")

    types = {f.name: f.type for f in dataclasses.fields(Hardware)}
    values: dict[str, Any] = {}
    for key in expected:
        if key not in params:
            values[key] = _OPTIONAL[key]
            continue
        entry = params[key]
        _check_entry(origin, key, entry)
        values[key] = _convert(key, entry["value"], str(types[key]))

    counts = params["bundle_tensor_limit"].get("counts")
    if not isinstance(counts, str) or not counts.strip():
        raise HardwareError(f"{origin}: 'bundle_tensor_limit' must say what it 'counts'")
    rule = params["bundle_tensor_limit"].get("rule", "device_memory")
    if rule not in BUNDLE_RULES:
        raise HardwareError(f"{origin}: 'bundle_tensor_limit' rule must be one of {list(BUNDLE_RULES)}, "
                            f"got {rule!r}")
    _check_consistency(origin, values)

    provenance = MappingProxyType({
        k: MappingProxyType({kk: vv for kk, vv in v.items() if kk != "value"}) for k, v in params.items()
    })
    digest = hashlib.sha256(canonical_json(doc).encode("ascii")).hexdigest()
    return Hardware(name=name, digest=digest, description=str(doc.get("description", "")),
                    bundle_tensor_limit_counts=counts, bundle_tensor_limit_rule=rule,
                    provenance=provenance, **values)


def _check_consistency(origin: str, v: dict[str, Any]) -> None:
    positive = ["cores", "corelets_per_core", "stick_bytes", "lx_bytes_per_core", "lx_capacity_bytes",
                "bundle_tensor_limit", "per_core_span_bytes", "dram_oneway_gbps", "dram_balanced_gbps",
                "clock_ghz", "pt_sustained_mac_per_ns_per_core", "sfp_sticks_per_cycle_per_corelet",
                "restickify_gbps", "lx_relayout_gbps_per_core", "shared_read_free_fanout"]
    for k in positive:
        if not v[k] > 0:
            raise HardwareError(f"{origin}: parameter {k!r} must be positive")
    if v["lx_capacity_bytes"] > v["lx_bytes_per_core"]:
        raise HardwareError(f"{origin}: lx_capacity_bytes exceeds lx_bytes_per_core")
    if v["lx_capacity_bytes"] % v["stick_bytes"]:
        raise HardwareError(f"{origin}: lx_capacity_bytes must be whole sticks")
    if v["dram_oneway_gbps"] > v["dram_peak_gbps"]:
        raise HardwareError(f"{origin}: dram_oneway_gbps exceeds the datasheet peak")
    if v["pt_sustained_mac_per_ns_per_core"] > v["pt_peak_mac_per_ns_per_core"]:
        raise HardwareError(f"{origin}: sustained PT rate exceeds the peak")


def _resolve(name_or_path: Union[str, Path]) -> Path:
    s = str(name_or_path)
    if _TARGET_NAME.match(s):
        path = TARGETS_DIR / f"{s}.json"
        if not path.is_file():
            known = sorted(p.stem for p in TARGETS_DIR.glob("*.json"))
            raise HardwareError(f"unknown target {s!r}; known targets: {known}")
        return path
    path = Path(s)
    if not path.is_file():
        raise HardwareError(f"no hardware file at {s!r}")
    return path


@functools.lru_cache(maxsize=16)
def _load_cached(path: str, mtime_ns: int) -> Hardware:
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise HardwareError(f"{path}: not valid JSON: {e}") from None
    return hardware_from_dict(doc, origin=path)


def load_target(name_or_path: Union[str, Path] = "spyre") -> Hardware:
    """Load a target by name (target/targets/<name>.json) or by file path."""
    path = _resolve(name_or_path)
    return _load_cached(str(path), path.stat().st_mtime_ns)


def list_targets() -> list[str]:
    return sorted(p.stem for p in TARGETS_DIR.glob("*.json"))
