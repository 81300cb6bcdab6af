"""Layout rules of the primitive ops: where each operand's stick may sit, and which core
splits are legal. They live here, beside the op definitions (target/primitives.py), and
nowhere else: the planners enumerate them, the emitter follows them, the validator checks
programs against them.

Vocabulary
- A *stick* is `stick_bytes` (128) bytes of consecutive elements along one tensor dim, the
  *stick dim* (fp16: 64 elements). A tensor's stick dim is stored last in its device layout
  and padded up to whole sticks.
- A `StickChoice` is one consistent assignment for an op: the tensor dim of every
  operand's stick (or `ANY`, or None for a rank-0 tensor), and the iteration dim the sticks
  run along (`stick_iter`).

The rules, following torch-spyre's `propagate_layouts.py` (how it assigns each operand its stick):
- matmul: x sticked on k, y sticked on n, output sticked on n (x's padded K lanes meet
  y's zero-padded K rows).
- grouped_matmul (mixture-of-experts expert matmul): as matmul — x sticked on k, the
  per-group weights [G, K, N] sticked on n, output sticked on n; the per-row group ids are
  read whole (`ANY`). The group dim g is a reduction-kind dim (a row takes exactly one
  group's product): splitting g gives each core its experts' weights and the rows routed
  to them, combined like a split-K (at most one of g and k is split).
- pointwise: every operand that indexes the stick iteration dim is sticked on it. An
  operand that does not index it (a broadcast along the stick: a bias row seen from a
  column-sticked op, a keepdim row statistic) is read whole and replicated across the stick
  lanes, so any of its layouts is accepted (`ANY`). Rank-0 operands have no stick (None).
- reduce: as pointwise for the inputs. If the stick iteration dim is a parallel dim the
  output is sticked on it; if it is a reduction dim every stick folds to one value, so the
  output has a *sparse stick*: it is sticked on its last broadcast (keepdim, size-1) dim
  when it has one, one value per stick, else on its last dim.
- gather (embedding): the output and the table share the stick (a table row's sticks are
  copied as they are); the gathered table axis is never the stick; the index tensor is read
  whole (`ANY`).
- copy / fill: the output may be sticked on any dim; copy inputs are read whole (`ANY`).
  A copy is a free *alias* (no data moves) when the byte image of its input in the input's
  layout is exactly the output in the output's layout: see `copy_is_alias`.
- restickify (emitted by planners, not lowered): same tensor, any layout in, any out.

Core splits (`legal_core_splits`, `check_split`): factors over iteration dims; the product
is at most the core count; at most one reduction dim is split (partials are summed across
cores) and never a scan (cumsum) dim; a dim that is some operand's stick dim is split in
whole sticks: the factor divides its padded stick count (so a dim of 100 fp16 elements,
2 sticks, splits in 2 as [0,64) and [64,100) — padding-aware), every other dim is split
evenly (the factor divides its size).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import gcd
from typing import Iterable, Optional, Sequence

from target.primitives import (
    DTYPE_BYTES, Access, IterDim, PointwiseBody, PrimOp, In, index_iter_dims,
)

# An operand whose layout the op does not constrain (read whole / broadcast along the stick).
ANY = -1

StickSpec = Optional[int]  # tensor dim, ANY, or None (rank-0 tensor: no stick dim)


@dataclass(frozen=True)
class StickChoice:
    """One consistent stick assignment for an op (see module docstring)."""

    stick_iter: Optional[int]          # iteration-dim index the sticks run along, if any
    inputs: tuple[StickSpec, ...]      # per input operand
    output: StickSpec                  # output operand (never ANY)

    def to_json(self) -> dict:
        return {"stick_iter": self.stick_iter, "inputs": list(self.inputs), "output": self.output}

    @classmethod
    def from_json(cls, d: dict) -> "StickChoice":
        return cls(d["stick_iter"], tuple(d["inputs"]), d["output"])


def stick_elems(dtype: str, stick_bytes: int) -> int:
    """Elements of `dtype` in one stick (128 B: 64 fp16, 32 fp32, 128 int8)."""
    return max(1, stick_bytes // DTYPE_BYTES[dtype])


def _tensor_dim_of(access: Access, iter_index: int) -> Optional[int]:
    """The tensor dim of `access` indexed by iteration dim `iter_index` (last one if several)."""
    found = None
    for j, d in enumerate(access.dims):
        if d == iter_index:
            found = j
    return found


def _operand_spec(access: Access, iter_index: Optional[int]) -> StickSpec:
    if len(access.dims) == 0:
        return None
    if iter_index is None:
        return ANY
    j = _tensor_dim_of(access, iter_index)
    return ANY if j is None else j


def _sparse_output_dim(access: Access) -> StickSpec:
    """Output stick when the stick dim was reduced away: the last broadcast (keepdim) dim,
    else the last dim."""
    if len(access.dims) == 0:
        return None
    nones = [j for j, d in enumerate(access.dims) if d is None]
    return nones[-1] if nones else len(access.dims) - 1


def _out_iter_candidates(op: PrimOp) -> list[int]:
    """Iteration dims the output indexes, ordered with the output's last dim first (the
    default choice) then the other dims from the innermost outwards."""
    dims = [d for d in op.output.dims if d is not None]
    seen: list[int] = []
    for d in reversed(dims):
        if d not in seen:
            seen.append(d)
    return seen


def stick_options(op: PrimOp) -> list[StickChoice]:
    """Every legal stick assignment of `op`, the default one (output sticked on its last
    dim, what a compiler without an optimizer does) first. Memoized per op object
    (`PrimOp.derived`): the emitter and the validator ask for every op of every trial."""
    return list(op.derived("stick_options", lambda: tuple(_stick_options(op))))


def _stick_options(op: PrimOp) -> list[StickChoice]:
    body = op.body
    kind = body.kind
    out_rank = len(op.output.dims)
    if kind == "matmul":
        x, y = op.inputs[0], op.inputs[1]
        return [StickChoice(body.n, (_operand_spec(x, body.k), _operand_spec(y, body.n)),
                            _operand_spec(op.output, body.n))]
    if kind == "grouped_matmul":
        # as a matmul: sticks along n (x along k, each group's weight along n); the
        # per-row group ids are read whole (their layout is not constrained)
        x, w, gid = op.inputs[0], op.inputs[1], op.inputs[2]
        return [StickChoice(body.n, (_operand_spec(x, body.k), _operand_spec(w, body.n), _operand_spec(gid, None)),
                            _operand_spec(op.output, body.n))]
    if kind in ("pointwise", "reduce"):
        cands = _out_iter_candidates(op)
        if kind == "reduce":
            # a stick along a reduction dim (the common "reduce the last dim" case)
            red = [i for i, d in enumerate(op.iter_dims) if d.kind == "reduction"]
            in_dims = [d for a in op.inputs for d in a.dims if d is not None]
            for r in red:
                if r in in_dims and r not in cands:
                    # default: input 0's last dim, if it is this reduction dim
                    first = op.inputs[0].dims[-1] if op.inputs and op.inputs[0].dims else None
                    if first == r:
                        cands.insert(0, r)
                    else:
                        cands.append(r)
        out: list[StickChoice] = []
        for s in cands:
            ins = tuple(_operand_spec(a, s) for a in op.inputs)
            if s in op.output.dims:
                o = _operand_spec(op.output, s)
            else:
                o = _sparse_output_dim(op.output)
            out.append(StickChoice(s, ins, o))
        if not out:  # rank-0 output and inputs
            out.append(StickChoice(None, tuple(_operand_spec(a, None) for a in op.inputs),
                                   None if out_rank == 0 else out_rank - 1))
        return out
    if kind == "gather":
        table, indices = op.inputs[0], op.inputs[1:]
        gathered = set(getattr(body, "table_axes", (body.axis,)))
        idx_specs = tuple(_operand_spec(a, None) for a in indices)
        out = []
        for s in _out_iter_candidates(op):
            j = _tensor_dim_of(table, s)
            tspec = ANY if (j is None or j in gathered) else j
            out.append(StickChoice(s, (tspec,) + idx_specs, _operand_spec(op.output, s)))
        if not out:
            out.append(StickChoice(None, (_operand_spec(table, None),) + idx_specs,
                                   None if out_rank == 0 else out_rank - 1))
        return out
    if kind == "scatter":
        # in place: the output is the table's bytes, so both take one stick (never a
        # scattered axis) and the values row is sticked along the same iteration dim
        table, values, indices = op.inputs[0], op.inputs[1], op.inputs[2:]
        idx_specs = tuple(_operand_spec(a, None) for a in indices)
        out = []
        for s in _out_iter_candidates(op):
            j = _tensor_dim_of(table, s)
            out.append(StickChoice(s, (j, _operand_spec(values, s)) + idx_specs, j))
        if not out:
            out.append(StickChoice(None, (_operand_spec(table, None), _operand_spec(values, None)) + idx_specs,
                                   None if out_rank == 0 else out_rank - 1))
        return out
    # copy, fill: any output dim, inputs read whole
    ins = tuple(_operand_spec(a, None) for a in op.inputs)
    if out_rank == 0:
        return [StickChoice(None, ins, None)]
    out = []
    for j in reversed(range(out_rank)):
        d = op.output.dims[j]
        out.append(StickChoice(d, ins, j))
    return out


def default_choice(op: PrimOp) -> StickChoice:
    return stick_options(op)[0]


def spec_accepts(spec: StickSpec, actual_stick_dim: Optional[int]) -> bool:
    """Does a tensor whose layout has stick dim `actual_stick_dim` satisfy `spec`?"""
    if spec == ANY:
        return True
    return spec == actual_stick_dim


def matching_choice(op: PrimOp, input_sticks: Sequence[Optional[int]],
                    output_stick: Optional[int]) -> Optional[StickChoice]:
    """The stick option of `op` that the given operand stick dims satisfy, or None."""
    for ch in stick_options(op):
        if ch.output != output_stick:
            continue
        if all(spec_accepts(s, a) for s, a in zip(ch.inputs, input_sticks)):
            return ch
    return None


# -- core splits ---------------------------------------------------------------------------
def split_granules(op: PrimOp, input_sticks: Sequence[Optional[int]], output_stick: Optional[int],
                   dtypes: Sequence[str], stick_bytes: int) -> dict[int, int]:
    """Per iteration dim, the split granule in elements: the lcm of stick_elems over the
    operands whose stick dim is indexed by that iteration dim (1 when none is).
    `dtypes` lists the inputs' dtypes then the output's."""
    gran: dict[int, int] = {}
    accesses = list(op.inputs) + [op.output]
    sticks = list(input_sticks) + [output_stick]
    for n, (acc, st, dt) in enumerate(zip(accesses, sticks, dtypes)):
        if st is None or st == ANY or st >= len(acc.dims):
            continue
        if n < len(op.inputs) and op.body.kind == "copy":
            continue  # copy inputs are read whole through their strided maps
        if (n == 0 or n == len(accesses) - 1) and op.body.kind in ("gather", "scatter") \
                and st in getattr(op.body, "table_axes", (op.body.axis,)) and acc.dims[st] is None:
            continue
        it = acc.dims[st]
        if it is None:
            continue
        e = stick_elems(dt, stick_bytes)
        g = gran.get(it, 1)
        gran[it] = g * e // gcd(g, e)
    return gran


def split_units(size: int, granule: int) -> int:
    """How many indivisible units a dim of `size` elements has (sticks for a stick dim)."""
    return -(-size // granule) if granule > 1 else size


def _is_scan(op: PrimOp) -> bool:
    return op.body.kind == "reduce" and op.body.fn == "cumsum"


def _unsplittable(op: PrimOp) -> frozenset[int]:
    """Iteration dims no core split may cut: a scan's reduction dims (each step needs the
    last), a scatter's row dims (which of two rows naming one position lands last is their
    order, which only one core keeps)."""
    if _is_scan(op):
        return frozenset(i for i, d in enumerate(op.iter_dims) if d.kind == "reduction")
    return index_iter_dims(op)


def check_split(op: PrimOp, core_split: dict[str, int], granules: dict[int, int],
                cores: int) -> list[tuple[str, str]]:
    """Problems with `core_split` for `op` as (code, message) pairs; [] when legal.
    Codes: split_unknown_dim, split_uneven, cores_over_limit, multi_reduction_split."""
    issues: list[tuple[str, str]] = []
    by_name = {d.name: (i, d) for i, d in enumerate(op.iter_dims)}
    product = 1
    red_split = []
    for name, f in core_split.items():
        if name not in by_name:
            issues.append(("split_unknown_dim", f"{op.id}: split dim {name!r} is not an iteration dim"))
            continue
        i, d = by_name[name]
        if not isinstance(f, int) or f < 1:
            issues.append(("split_uneven", f"{op.id}: split factor {f!r} of {name} is not a positive integer"))
            continue
        product *= f
        if f == 1:
            continue
        units = split_units(d.size, granules.get(i, 1))
        if units % f:
            what = "whole sticks" if granules.get(i, 1) > 1 else "elements"
            issues.append(("split_uneven", f"{op.id}: {name} ({d.size} elements, {units} {what}) "
                                           f"does not split evenly in {f}"))
        if d.kind == "reduction":
            red_split.append(name)
            if _is_scan(op):
                issues.append(("split_uneven", f"{op.id}: scan dim {name} cannot be split across cores"))
        elif i in _unsplittable(op):
            issues.append(("split_uneven", f"{op.id}: {name} orders the rows of a scatter: it cannot be split "
                                           f"across cores"))
    if product > cores:
        issues.append(("cores_over_limit", f"{op.id}: split uses {product} cores, hardware has {cores}"))
    if len(red_split) > 1:
        issues.append(("multi_reduction_split", f"{op.id}: more than one reduction dim split: {red_split}"))
    return issues


def _divisors(n: int, limit: int) -> list[int]:
    return [f for f in range(1, min(n, limit) + 1) if n % f == 0]


def legal_core_splits(op: PrimOp, granules: dict[int, int], cores: int,
                      max_split_dims: Optional[int] = None) -> list[dict[str, int]]:
    """Every legal core split of `op` (iteration-dim name -> factor, factors of 1 omitted),
    the unsplit {} first. `granules` from `split_granules` for the chosen sticks."""
    fixed = _unsplittable(op)
    dims = [(i, d) for i, d in enumerate(op.iter_dims) if i not in fixed]
    results: list[dict[str, int]] = []

    def rec(pos: int, cur: dict[str, int], product: int, n_red: int):
        if pos == len(dims):
            results.append(dict(cur))
            return
        i, d = dims[pos]
        units = split_units(d.size, granules.get(i, 1))
        for f in _divisors(units, cores // product):
            if f > 1:
                if d.kind == "reduction" and n_red >= 1:
                    continue
                if max_split_dims is not None and len(cur) >= max_split_dims:
                    continue
                cur[d.name] = f
            rec(pos + 1, cur, product * f, n_red + (1 if (f > 1 and d.kind == "reduction") else 0))
            if f > 1:
                del cur[d.name]

    rec(0, {}, 1, 0)
    return results


# -- copies: free alias or data movement -------------------------------------------------------
def _row_major_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides = []
    acc = 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return tuple(reversed(strides))


def copy_is_reshape(op: PrimOp, in_shape: Sequence[int], out_shape: Sequence[int]) -> bool:
    """A single-piece copy that reads the input's row-major elements in order: a reshape."""
    b = op.body
    if b.kind != "copy" or len(op.inputs) != 1 or len(b.maps) != 1:
        return False
    m = b.maps[0]
    n_in = 1
    for s in in_shape:
        n_in *= s
    n_out = 1
    for s in out_shape:
        n_out *= s
    if m.offset != 0 or tuple(m.shape) != tuple(out_shape) or n_in != n_out:
        return False
    if any(o != 0 for o in b.out_offsets[0]):
        return False
    want = _row_major_strides(out_shape)
    return all(st == w or sz == 1 for st, w, sz in zip(m.strides, want, out_shape))


def copy_is_alias(op: PrimOp, in_shape: Sequence[int], in_dim_order: Sequence[int],
                  out_shape: Sequence[int], out_dim_order: Sequence[int],
                  in_dtype: str, out_dtype: str, stick_bytes: int) -> bool:
    """A copy is a free alias when the input's bytes in its layout are exactly the output in
    its layout: a reshape (row-major order kept) between two layouts that keep the natural
    dim order (stick on the last dim), so bytes are row-major over the shape with the last
    dim padded to whole sticks. Either the last-dim size is the same (every row of sticks,
    padding included, is the same bytes; only the outer dims are regrouped) or neither last
    dim is padded (the bytes are the plain row-major elements, e.g. [S, H, 128] -> [S, H*128]
    with 64-element sticks)."""
    if in_dtype != out_dtype or not copy_is_reshape(op, in_shape, out_shape):
        return False
    if list(in_dim_order) != list(range(len(in_shape))):
        return False
    if list(out_dim_order) != list(range(len(out_shape))):
        return False
    in_last = in_shape[-1] if len(in_shape) else 1
    out_last = out_shape[-1] if len(out_shape) else 1
    per_stick = stick_elems(in_dtype, stick_bytes)
    return in_last == out_last or (in_last % per_stick == 0 and out_last % per_stick == 0)


# -- restickify ----------------------------------------------------------------------------
def restickify_prim(op_id: str, src: str, dst: str, shape: Sequence[int]) -> PrimOp:
    """The loop nest of a restickify/relayout: an identity over the tensor's dims (d0, d1,
    ...), reading `src` in its layout and writing `dst` in another. Gives restickify ops the
    same iteration-space, split and slice machinery as compute ops."""
    dims = tuple(IterDim(f"d{j}", int(s), "parallel") for j, s in enumerate(shape))
    idx = tuple(range(len(shape)))
    return PrimOp(op_id, dims, (Access(src, idx),), Access(dst, idx), PointwiseBody(In(0)),
                  source="restickify")


def ex_unit(op: PrimOp) -> str:
    """Execution unit: matmuls (plain and grouped) on the PT systolic array, everything else
    on the SFP."""
    return "pt" if op.body.kind in ("matmul", "grouped_matmul") else "sfp"


def opfunc(op: PrimOp) -> str:
    b = op.body
    if b.kind == "pointwise":
        e = b.expr
        return getattr(e, "fn", "identity" if isinstance(e, In) else "const")
    if b.kind == "reduce":
        return b.fn
    return b.kind


def iter_index(op: PrimOp) -> dict[str, int]:
    return {d.name: i for i, d in enumerate(op.iter_dims)}


def operand_iter_dims(access: Access) -> Iterable[int]:
    return (d for d in access.dims if d is not None)


def outermost_split(op: PrimOp, granules: dict[int, int], cores: int) -> dict[str, int]:
    """What a compiler without an optimizer does: split the outermost parallel dim that can
    be split (more than one unit, some factor > 1 up to the core count divides it) across as
    many cores as divide it evenly (whole sticks on a stick dim); {} when none can."""
    for i, d in enumerate(op.iter_dims):
        if d.kind != "parallel":
            continue
        units = split_units(d.size, granules.get(i, 1))
        if units <= 1:
            continue
        f = max(_divisors(units, cores))
        if f > 1:
            return {d.name: f}
    return {}
