"""A core split carried through a tensor: the split of one op's iteration dims under which
each of its cores touches the box of a result that the same core wrote in another op (or,
for a producer, writes the box its reader's core reads). Pure functions of the ops and
splits; the split variants, the merges and the LX holds all map splits with these.

- `split_through`: a producer's split as its reader's (the reader follows);
- `from_producer`: the same for a run member reading an earlier member's result;
- `head_split`: a reader's split as the heading matmul's (the producer follows);
- `from_head`: the heading matmul's split of its result as each member's;
- `result_split`: one op's split as another's writing a result of the same shape;
- `factored_split`: the split writing a result in given slice counts along its non-unit dims;
- `nearby_factors`: slice counts a few moves of a factor of 2 between dims away, nearest first.
"""
from __future__ import annotations

from typing import Optional

from target.primitives import PrimOp
from solver.plan import OpPlan


def split_through(producer: PrimOp, producer_split: dict[str, int], reader: PrimOp,
                  tensor: str) -> Optional[dict[str, int]]:
    """The split of `reader`'s iteration dims under which each of its cores reads the box of
    `tensor` (the producer's result) that the same core wrote: the producer's split of the
    tensor's dims, mapped to the reader's dims along which it reads them. None when a split
    tensor dim has no image in the reader, or nothing is split."""
    split = {k: v for k, v in producer_split.items() if v > 1}
    acc = next((a for a in reader.inputs if a.tensor == tensor), None)
    if acc is None or not split:
        return None
    names = [d.name for d in producer.iter_dims]
    out: dict[str, int] = {}
    for j, i in enumerate(producer.output.dims):
        if i is None or names[i] not in split:
            continue
        r = acc.dims[j] if j < len(acc.dims) else None
        if r is None:
            return None
        out[reader.iter_dims[r].name] = split[names[i]]
    return out if len(out) == len(split) else None


def from_producer(prim: PrimOp, made: dict[str, str], prims: dict[str, PrimOp],
                  ops: dict[str, OpPlan]) -> Optional[dict[str, int]]:
    """The split of `prim`'s iteration dims (reduction dims included) under which each core
    reads the box of an earlier run member's result that the same core wrote: the
    producer's split of its result's tensor dims, mapped to the dims `prim` reads them
    along. None when `prim` reads no earlier member's result or a split tensor dim has no
    image in it."""
    for a in prim.inputs:
        p = made.get(a.tensor)
        if p is None or p == prim.id:
            continue
        return split_through(prims[p], ops.get(p, OpPlan()).core_split, prim, a.tensor)
    return None


def head_split(head, members: list, want: dict[str, int]) -> Optional[dict[str, int]]:
    """`want` (a split of the first member reading `head`'s result) as a split of `head`'s
    iteration dims: each split dim mapped to the result's tensor dim it indexes, then to the
    head's iteration dim writing that tensor dim. None when a split dim has no such image."""
    out_t = head.output.tensor
    reader = next((m for m in members if any(a.tensor == out_t for a in m.inputs)), None)
    if reader is None or not want:
        return None
    acc = next(a for a in reader.inputs if a.tensor == out_t)
    tensor_dim = {reader.iter_dims[d].name: j for j, d in enumerate(acc.dims) if d is not None}
    head_dim = {j: head.iter_dims[d].name for j, d in enumerate(head.output.dims) if d is not None}
    split: dict[str, int] = {}
    for name, f in want.items():
        j = tensor_dim.get(name)
        if j is None or j not in head_dim:
            return None
        split[head_dim[j]] = f
    return split


def from_head(head: PrimOp, of_head: dict[str, int], shapes: dict[str, tuple]):
    """The reverse of `head_split`: a function giving a run member the heading matmul's
    split of its result (as a split of the member's iteration dims writing the same tensor
    dims), for members whose result has the head's result shape; None when the head is no
    matmul or splits a dim its result does not have (a split reduction)."""
    if head.body.kind != "matmul":
        return None
    split = {k: v for k, v in of_head.items() if v > 1}
    names = [d.name for d in head.iter_dims]
    by_tensor_dim = {j: split[names[i]] for j, i in enumerate(head.output.dims)
                     if i is not None and names[i] in split}
    if not split or len(by_tensor_dim) != len(split):
        return None
    out_shape = shapes[head.output.tensor]

    def want(member: PrimOp) -> Optional[dict[str, int]]:
        if shapes[member.output.tensor] != out_shape:
            return None
        out: dict[str, int] = {}
        for j, f in by_tensor_dim.items():
            i = member.output.dims[j]
            if i is None:
                return None
            out[member.iter_dims[i].name] = f
        return out
    return want


def result_split(src: PrimOp, split: dict[str, int], dst: PrimOp, shapes: dict) -> Optional[dict[str, int]]:
    """`src`'s split as a split of `dst`'s iteration dims that writes the same slices of a
    result of the same shape (unit dims aside: a [1, 512, 4096] result matches a [512, 4096]
    one): each split dim mapped to the result dim it writes, then to `dst`'s dim writing
    that one. None when the shapes differ or a split dim writes no result dim."""
    s_shape, d_shape = shapes[src.output.tensor], shapes[dst.output.tensor]
    if [x for x in s_shape if x != 1] != [x for x in d_shape if x != 1]:
        return None
    s_dims = [i for j, i in enumerate(src.output.dims) if s_shape[j] != 1]
    d_dims = [i for j, i in enumerate(dst.output.dims) if d_shape[j] != 1]
    want = {k: v for k, v in split.items() if v > 1}
    names = [x.name for x in src.iter_dims]
    out: dict[str, int] = {}
    for si, di in zip(s_dims, d_dims):
        if si is not None and names[si] in want:
            if di is None:
                return None
            out[dst.iter_dims[di].name] = want[names[si]]
    return out if len(out) == len(want) else None


def factored_split(producer: PrimOp, shape, factors) -> Optional[dict[str, int]]:
    """`producer`'s split that writes its result (of `shape`) in `factors` slices along the
    result's non-unit dims, in order; None when one of those dims is written by no
    iteration dim."""
    out: dict[str, int] = {}
    for j, f in zip([j for j, n in enumerate(shape) if n != 1], factors):
        i = producer.output.dims[j]
        if i is None:
            return None
        if f > 1:
            out[producer.iter_dims[i].name] = f
    return out


def nearby_factors(current, moves: int) -> list[list[int]]:
    """`current` (slice counts per dim) first, then every count vector at most `moves` moves
    of a factor of 2 from one dim to another away, nearest first (the product stays)."""
    opts = [list(current)]
    frontier = [list(current)]
    for _ in range(moves):
        nxt = []
        for cur in frontier:
            for a in range(len(cur)):
                for b in range(len(cur)):
                    if a != b and cur[b] % 2 == 0:
                        f = list(cur)
                        f[a] *= 2
                        f[b] //= 2
                        if f not in opts:
                            opts.append(f)
                            nxt.append(f)
        frontier = nxt
    return opts
