"""What the timing model reports (`simulator.timing.time_program`): one `OpTiming` per op
(its span on the timeline, the busy times and bytes behind it, what bounds it) and the
program's `TimingReport`. Their `to_dict` forms are the JSON of `sticksat simulate` and
the service's timing fields (docs/simulator-timing.md "Report")."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class OpTiming:
    op_id: str
    opfunc: str
    ex_unit: str
    kind: str
    bundle: int
    cores: int
    start_us: float = 0.0
    end_us: float = 0.0
    compute_us: float = 0.0          # PT/SFP busy time of the slowest core
    memory_us: float = 0.0           # device-memory (and replicated-load) time of the op
    ring_us: float = 0.0
    overhead_us: float = 0.0         # temporal-tile loop overhead
    bound_by: str = "memory"         # memory | compute | shared_delivery | ring | overhead | none
    hbm_read_bytes: int = 0
    hbm_write_bytes: int = 0
    lx_bytes: int = 0
    ring_bytes: int = 0
    macs: int = 0
    temporal_tiles: int = 1
    double_buffered: bool = True
    fused_group: Optional[int] = None
    effects: list[str] = field(default_factory=list)
    # per core: (memory_us, compute_us) of that core
    per_core: dict[int, tuple[float, float]] = field(default_factory=dict)

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us

    def to_dict(self) -> dict:
        return {
            "op": self.op_id, "opfunc": self.opfunc, "ex_unit": self.ex_unit, "kind": self.kind,
            "bundle": self.bundle, "cores": self.cores, "start_us": self.start_us,
            "end_us": self.end_us, "compute_us": self.compute_us, "memory_us": self.memory_us,
            "ring_us": self.ring_us, "overhead_us": self.overhead_us, "bound_by": self.bound_by,
            "hbm_read_bytes": self.hbm_read_bytes, "hbm_write_bytes": self.hbm_write_bytes,
            "lx_bytes": self.lx_bytes, "ring_bytes": self.ring_bytes, "macs": self.macs,
            "temporal_tiles": self.temporal_tiles, "double_buffered": self.double_buffered,
            "fused_group": self.fused_group, "effects": list(self.effects),
        }


@dataclass
class TimingReport:
    total_us: float
    ops: list[OpTiming]
    core_busy_us: list[float]
    hbm_read_bytes: int
    hbm_write_bytes: int
    lx_bytes: int
    ring_bytes: int
    hardware: str
    hardware_digest: str

    @property
    def hbm_bytes(self) -> int:
        return self.hbm_read_bytes + self.hbm_write_bytes

    def op(self, op_id: str) -> OpTiming:
        for o in self.ops:
            if o.op_id == op_id:
                return o
        raise KeyError(op_id)

    def to_dict(self) -> dict:
        return {
            "total_us": self.total_us, "hardware": self.hardware,
            "hardware_digest": self.hardware_digest, "hbm_read_bytes": self.hbm_read_bytes,
            "hbm_write_bytes": self.hbm_write_bytes, "lx_bytes": self.lx_bytes,
            "ring_bytes": self.ring_bytes, "core_busy_us": list(self.core_busy_us),
            "ops": [o.to_dict() for o in self.ops],
        }
