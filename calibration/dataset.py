"""The calibration dataset: one entry per public Spyre device measurement (format in
docs/calibration.md). Versioned JSON in calibration/data/; this module is its only reader.

Format version 2 adds `source.build` (the compiler build or commit a measurement was taken
on, where the source states it) and `point.reserved` (a point held out for validation:
evaluated and reported apart, never fitted). Version 3 adds `point.holdout` (a point of a
source the model was neither built nor fitted on, kept as an out-of-sample check: evaluated
and summarized per source, never fitted, not held to the bounds; unused by the v3 file, which
fits every public measurement an issue does not reserve). Older files load unchanged."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

DATA_DIR = Path(__file__).resolve().parent / "data"
DEFAULT_DATASET = DATA_DIR / "spyre_v4.json"
FORMAT = "sticksat.calibration"
VERSION = 3
VERSIONS = (1, 2, 3)

Family = Literal["matmul", "bmm", "pointwise", "broadcast", "reduction", "softmax", "restickify", "relayout", "chain",
                 "tiling"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Source(_Model):
    ref: str
    url: Optional[str] = None
    date: Optional[str] = None
    quote: str = ""
    # the compiler build / commit the measurement was taken on, where the source says (v2)
    build: Optional[str] = None


class Point(_Model):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$")
    source: Source
    family: Family
    case: dict[str, Any]
    measured_us: Optional[float] = Field(None, gt=0)
    # only a ratio is known: this point's time / the `ratio_to` point's time
    ratio_to: Optional[str] = None
    measured_ratio: Optional[float] = Field(None, gt=0)
    # "kernel": device time of the kernels; "wall": host wall clock of one compiled call
    timing: Literal["kernel", "wall"] = "kernel"
    notes: str = ""
    # why no plan can be built from what the source states (kept: better recorded than lost)
    unbuildable: Optional[str] = None
    # why this point is shown but neither fitted nor held to the error bound
    disputed: Optional[str] = None
    # why this point is held out: evaluated and reported on its own, never fitted (v2)
    reserved: Optional[str] = None
    # why this point is an out-of-sample check: evaluated and summarized per source, never
    # fitted, not held to the bounds (v3)
    holdout: Optional[str] = None

    @property
    def usable(self) -> bool:
        """Fitted and held to the bounds: neither unbuildable, disputed, reserved nor held out."""
        return self.unbuildable is None and self.disputed is None and self.reserved is None and self.holdout is None

    @property
    def source_key(self) -> str:
        """One source = one issue, PR, document or commit (the ref without its detail)."""
        return self.source.ref.split(" (")[0]


class Dataset(_Model):
    format: Literal["sticksat.calibration"]
    version: Literal[1, 2, 3]
    target: str
    collected: str
    changes: str = ""
    points: list[Point]
    # the file it was read from: the dataset's edition (spyre_v4.json) is the file's, not the
    # format version's (a v4 dataset is written in format version 3)
    _file: Optional[str] = PrivateAttr(default=None)

    @property
    def label(self) -> str:
        name = self._file or self.target
        return f"{name} (format v{self.version}, {self.collected}, {len(self.points)} points)"

    def by_id(self) -> dict[str, Point]:
        return {p.id: p for p in self.points}


def load_dataset(path: Optional[str | Path] = None) -> Dataset:
    path = Path(path or DEFAULT_DATASET)
    ds = Dataset.model_validate_json(path.read_text(encoding="utf-8"))
    ds._file = path.name
    ids = ds.by_id()
    if len(ids) != len(ds.points):
        raise ValueError("calibration dataset: duplicate point ids")
    referenced = {p.ratio_to for p in ds.points if p.ratio_to}
    for p in ds.points:
        if (p.measured_us is None and (p.ratio_to is None or p.measured_ratio is None) and p.id not in referenced
                and p.unbuildable is None):
            raise ValueError(f"calibration point {p.id}: needs measured_us, ratio_to + measured_ratio, "
                             f"or to be another point's ratio_to")
        if p.ratio_to is not None and p.ratio_to not in ids:
            raise ValueError(f"calibration point {p.id}: ratio_to {p.ratio_to!r} is not a point")
        if ds.version < 2 and (p.reserved is not None or p.source.build is not None):
            raise ValueError(f"calibration point {p.id}: 'reserved' and 'source.build' need format version 2")
        if ds.version < 3 and p.holdout is not None:
            raise ValueError(f"calibration point {p.id}: 'holdout' needs format version 3")
        if p.ratio_to is not None and ((p.reserved is None) != (ids[p.ratio_to].reserved is None)
                                       or (p.holdout is None) != (ids[p.ratio_to].holdout is None)):
            raise ValueError(f"calibration point {p.id}: a ratio cannot mix a reserved or held-out and a fitted point")
    return ds
