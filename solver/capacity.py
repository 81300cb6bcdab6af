"""Tensors the device cannot hold, found before any planner runs.

A planner given such a graph spends its budget and returns a program the validator
rejects (`device_memory`, `span_exceeded`): a planner failure, although no plan exists.
`check_fits(pg, hw)` proves the impossibility from sizes alone and raises `DoesNotFit`
(a GraphError with code `does_not_fit`: the client's graph is too big for the target,
answered 422, never `planner_failed`). It refuses only what no plan can hold:

- a tensor's smallest device-memory image (`min_device_bytes`: its sticks padded, on the
  best stick dim a plan may choose) exceeds the usable device memory. A user input's
  layout is not the planner's to choose: it arrives sticked on its last dim
  (solver/plan.py), so it is padded there;
- a tensor an op writes whole (every op writes its whole output) whose smallest image
  exceeds cores x `per_core_span_bytes`: however the op is split, some core's slice spans
  at least 1/cores of the bytes, past what one core may address;
- the graph's inputs and outputs, live together for the whole program, exceed the usable
  device memory.
"""
from __future__ import annotations

from typing import Optional

from lowering.errors import GraphError
from target.primitives import PrimGraph, PrimTensor


class DoesNotFit(GraphError):
    """A tensor (or the program's inputs and outputs together) needs more device memory,
    or more than the cores can address, than the target has."""

    def __init__(self, message: str, node: Optional[str], tensor: str, nbytes: int, limit: int):
        super().__init__("does_not_fit", message, node)
        self.tensor = tensor
        self.nbytes = nbytes
        self.limit = limit

    def to_dict(self) -> dict:
        return {**super().to_dict(), "tensor": self.tensor, "bytes": self.nbytes, "limit_bytes": self.limit}


def min_device_bytes(t: PrimTensor, hw, stick_dim: Optional[int] = None) -> int:
    """Bytes of `t`'s smallest stick layout in device memory (sticked on `stick_dim`, or
    on the best dim when None): the stick dim rounded up to whole sticks."""
    size = hw.dtype_size(t.dtype)
    per_stick = hw.elems_per_stick(t.dtype)
    if not t.shape:
        return per_stick * size  # a rank-0 tensor occupies one stick
    dims = range(len(t.shape)) if stick_dim is None else (stick_dim,)
    best = None
    for d in dims:
        n = -(-t.shape[d] // per_stick) * per_stick
        for j, s in enumerate(t.shape):
            if j != d:
                n *= s
        best = n if best is None else min(best, n)
    return best * size


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def check_fits(pg: PrimGraph, hw) -> None:
    """Raise DoesNotFit for the first tensor no plan can hold (module docstring)."""
    usable = hw.device_memory_usable_bytes
    reach = hw.cores * hw.per_core_span_bytes
    producers = pg.producer()
    io = set(pg.inputs) | set(pg.outputs)
    io_bytes = 0
    for t in pg.tensors.values():
        fixed = len(t.shape) - 1 if t.role == "user_input" and t.shape else None
        need = min_device_bytes(t, hw, fixed)
        op = producers.get(t.id)
        node = (op.source or op.id) if op is not None else t.id
        what = f"tensor {t.id} ({list(t.shape)} {t.dtype})" + (f" of op {op.id}" if op is not None else "")
        how = ("sticked on its last dim, as a user input arrives" if fixed is not None
               else "in its smallest stick layout")
        if need > usable:
            raise DoesNotFit(f"{what} does not fit the device: it needs {need} bytes ({_gib(need)}) {how}; "
                             f"{hw.name} has {usable} bytes ({_gib(usable)}) of usable device memory",
                             node, t.id, need, usable)
        if op is not None and need > reach:
            raise DoesNotFit(f"{what} does not fit the device: it needs {need} bytes ({_gib(need)}) {how}, and "
                             f"however {op.id} is split over the {hw.cores} cores one core's part spans more than "
                             f"the {hw.per_core_span_bytes} bytes a core can address ({_gib(reach)} in all)",
                             node, t.id, need, reach)
        if t.id in io:
            io_bytes += need
    if io_bytes > usable:
        biggest = max(io, key=lambda tid: min_device_bytes(pg.tensors[tid], hw))
        raise DoesNotFit(f"the graph's inputs and outputs together need {io_bytes} bytes ({_gib(io_bytes)}) of "
                         f"device memory; {hw.name} has {usable} bytes ({_gib(usable)}) usable",
                         None, biggest, io_bytes, usable)
