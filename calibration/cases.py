"""Every calibration point builds its own plan: the ops, shapes and the work division the
source recorded, through the project's API (PrimGraph -> PlanDecisions -> emitter ->
validator), never a planner's choice.

`build(point, hw) -> Built`: the validated program of the point's case. A case kind
(`matmul`, `bmm`, `pointwise`, `softmax`, `sdpa`) is a small graph builder plus the plan
the source describes; docs/calibration.md lists the vocabulary. A recorded plan that
leaves temporal tiling open (a K-split matmul whose per-core partial sums exceed LX) gets
the fewest M tiles that make it valid, as the compiler would, and says so.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from target.primitives import (Access, Call, Const, In, IterDim, MatmulBody, PointwiseBody, PrimGraph,
                                 PrimOp, PrimTensor, ReduceBody)
from target.geometry import make_layout
from target.superdsc import Program
from simulator.validate import validate_program
from solver.emit import emit_program
from solver.plan import OpPlan, PlanDecisions, Residency


class CaseError(ValueError):
    """The point's case cannot be built into a valid program."""


@dataclass
class Built:
    program: Program
    notes: list[str] = field(default_factory=list)


def _t(tid: str, shape, dtype: str, role: str = "intermediate") -> PrimTensor:
    return PrimTensor(tid, tuple(int(s) for s in shape), dtype, role)


def _valid(pg: PrimGraph, hw, d: PlanDecisions, relayout: Callable[[Program], None] | None = None) -> Program:
    program = emit_program(pg, hw, d)
    if relayout is not None:
        relayout(program)
    issues = validate_program(program, hw)
    if issues:
        raise CaseError("; ".join(f"{i.code}: {i.message}" for i in issues[:3]))
    return program


def _split(case: dict, names: tuple[str, ...]) -> dict[str, int]:
    split = {k: int(v) for k, v in (case.get("split") or {}).items() if int(v) > 1}
    unknown = set(split) - set(names)
    if unknown:
        raise CaseError(f"split names {sorted(unknown)} are not dims of this case ({list(names)})")
    return split


# -- matmul: y[M,N] = x[M,K] @ w[K,N], x a user input, w a weight --------------------------------
def matmul_graph(m: int, k: int, n: int, dtype: str = "float16") -> PrimGraph:
    t = {"x": _t("x", (m, k), dtype, "user_input"), "w": _t("w", (k, n), dtype, "parameter"),
         "y": _t("y", (m, n), dtype)}
    op = PrimOp("mm", (IterDim("m", m), IterDim("n", n), IterDim("k", k, "reduction")),
                (Access("x", (0, 2)), Access("w", (2, 1))), Access("y", (0, 1)), MatmulBody(0, 1, 2))
    return PrimGraph(f"mm{m}x{k}x{n}", t, [op], ["x", "w"], ["y"])


def torch_spyre_core_slices(names: tuple[str, ...], split: dict[str, int], k_fast: bool,
                            reduction: tuple[str, ...] = ("k",)) -> list[tuple[int, dict[str, int]]] | None:
    """coreIdToWkSlice_ as torch-spyre emits it: the reduction (K) slice index slowest, so a
    K split's collaborators sit `cores / k` apart on the ring, unless the source ran the
    "k-fast" emission (`extra.k_fast_emission`: K collaborators adjacent, which is the
    project's natural order, K being a matmul's last iteration dim). None: the natural order."""
    if k_fast or not any(split.get(r, 1) > 1 for r in reduction):
        return None
    order = [n for n in reduction if split.get(n, 1) > 1] + [n for n in names if n not in reduction and
                                                              split.get(n, 1) > 1]
    out, total = [], 1
    for n in order:
        total *= split[n]
    for c in range(total):
        pos, rem = {}, c
        for n in reversed(order):
            pos[n] = rem % split[n]
            rem //= split[n]
        out.append((c, pos))
    return out


def _k_fast(case: dict) -> bool:
    return bool((case.get("extra") or {}).get("k_fast_emission"))


def _matmul(case: dict, hw) -> Built:
    if not all(isinstance(case.get(d), int) for d in ("m", "k", "n")):
        raise CaseError("matmul needs integer m, k, n")
    pg = matmul_graph(case["m"], case["k"], case["n"], case.get("dtype", "float16"))
    split = _split(case, ("m", "n", "k"))
    recorded = {k: int(v) for k, v in (case.get("temporal_tiles") or {}).items() if int(v) > 1}
    if set(recorded) - {"m", "n", "k"}:
        raise CaseError(f"temporal_tiles names {sorted(recorded)} are not dims of a matmul")
    if recorded:
        # the source's coarse tiling, as recorded (a loop over tiles of these dims)
        d = PlanDecisions(planner="calibration")
        d.ops["mm"] = OpPlan(core_split=dict(split), temporal_tiles=recorded,
                             core_slices=torch_spyre_core_slices(("m", "n", "k"), split, _k_fast(case)))
        return Built(_valid(pg, hw, d))
    notes = []
    tiles = 1
    while True:
        d = PlanDecisions(planner="calibration")
        d.ops["mm"] = OpPlan(core_split=dict(split), temporal_tiles={"m": tiles} if tiles > 1 else {},
                             core_slices=torch_spyre_core_slices(("m", "n", "k"), split, _k_fast(case)))
        try:
            program = _valid(pg, hw, d)
            break
        except CaseError as e:
            m_core = case["m"] // split.get("m", 1)
            if "lx" not in str(e).lower() or tiles * 2 > m_core:
                raise
            tiles *= 2
    if tiles > 1:
        notes.append(f"{tiles} temporal tiles over M added: the recorded split alone does not fit LX")
    return Built(program, notes)


# -- bmm: x[B,M,K] @ w[K,N] (shared weight) or x[B,M,K] @ y[B,K,N] ------------------------------------
def _batch_inside(program: Program, tensors: tuple[str, ...], hw) -> None:
    """torch-spyre's default device layout of a batched operand: the batch dim innermost
    of the non-stick dims, inside the stick-group dim too ([B,M,K] sticked on K is
    [M, K/64, B, 64]: PR #4302's baseline SDSC layout ['x','in','mb']), not outermost. (A
    restickified copy `w@...` of a listed tensor takes the same order.)"""
    for td in program.tensors:
        if (td.id in tensors or td.id.split("@")[0] in tensors) and len(td.shape) == 3:
            st = td.layout.stick_dim
            order = [1, 2, 0] if st == 2 else [2, 1, 0]
            td.layout = make_layout(td.shape, td.dtype, st, hw.stick_bytes, order)


def _bmm(case: dict, hw) -> Built:
    if not all(isinstance(case.get(d), int) for d in ("b", "m", "k", "n")):
        raise CaseError("bmm needs integer b, m, k, n")
    b, m, k, n = case["b"], case["m"], case["k"], case["n"]
    dt = case.get("dtype", "float16")
    shared = "2d" in str((case.get("extra") or {}).get("operand_ranks", "3d x 3d")).split("x")[-1]
    t = {"x": _t("x", (b, m, k), dt, "user_input"), "o": _t("o", (b, m, n), dt)}
    dims = (IterDim("b", b), IterDim("m", m), IterDim("n", n), IterDim("k", k, "reduction"))
    if shared:
        t["w"] = _t("w", (k, n), dt, "parameter")
        w_acc = Access("w", (3, 2))
    else:
        t["w"] = _t("w", (b, k, n), dt, "user_input")
        w_acc = Access("w", (0, 3, 2))
    op = PrimOp("bmm", dims, (Access("x", (0, 1, 3)), w_acc), Access("o", (0, 1, 2)), MatmulBody(1, 2, 3))
    pg = PrimGraph("bmm", t, [op], ["x", "w"], ["o"])
    d = PlanDecisions(planner="calibration")
    split = _split(case, ("b", "m", "n", "k"))
    d.ops["bmm"] = OpPlan(core_split=split,
                          core_slices=torch_spyre_core_slices(("b", "m", "n", "k"), split, _k_fast(case)))
    # `layouts`: each operand's order on its own (x, w, o: default | batch_outer); else
    # `layout` for all of them
    per = case.get("layouts") or {}
    whole = case.get("layout", "default")
    unknown = set(per) - {"x", "w", "o"} or {v for v in per.values()} - {"default", "batch_outer"}
    if unknown:
        raise CaseError(f"bmm layouts: unknown {sorted(unknown)}")
    inside = tuple(t for t in ("x", "w", "o") if per.get(t, whole) == "default")
    fix = (lambda p: _batch_inside(p, inside, hw)) if inside else None
    return Built(_valid(pg, hw, d, fix))


# -- pointwise: y = f(x) over [rows, cols] ---------------------------------------------------------
_FN = {"mul": lambda x: Call("mul", (x, Const(2.0))), "add": lambda x: Call("add", (x, Const(1.0))),
       "exp": lambda x: Call("exp", (x,)), "relu": lambda x: Call("relu", (x,)),
       "neg": lambda x: Call("neg", (x,)), "gelu": lambda x: Call("gelu", (x,))}
# two full-size inputs: a (op) b
_FN2 = {"add2": "add", "mul2": "mul"}


def _pointwise(case: dict, hw) -> Built:
    shape = case.get("shape")
    if not (isinstance(shape, list) and len(shape) == 2 and all(isinstance(s, int) for s in shape)):
        raise CaseError("pointwise needs a 2-D integer shape")
    rows, cols = shape
    dt = case.get("dtype", "float16")
    split = {("r" if k in ("0", "r") else "c"): int(v) for k, v in (case.get("split") or {}).items() if int(v) > 1}
    dims = (IterDim("r", rows), IterDim("c", cols))
    t = {"x": _t("x", shape, dt, "user_input"), "y": _t("y", shape, dt)}
    fn = str(case.get("fn", "mul"))
    d = PlanDecisions(planner="calibration")
    if case.get("in_lx"):
        # the source's clone-in: x copied into LX by its own kernel, then the fused kernel
        # (x*2 + x*3) reads it there and writes y
        t["xc"] = _t("xc", shape, dt)
        ops = [PrimOp("clone", dims, (Access("x", (0, 1)),), Access("xc", (0, 1)), PointwiseBody(In(0))),
               PrimOp("kernel", dims, (Access("xc", (0, 1)),), Access("y", (0, 1)),
                      PointwiseBody(Call("add", (Call("mul", (In(0), Const(2.0))),
                                                 Call("mul", (In(0), Const(3.0)))))))]
        d.resident["xc"] = Residency(lx_address=0)
    elif fn in _FN2:
        t["x2"] = _t("x2", shape, dt, "user_input")
        ops = [PrimOp("kernel", dims, (Access("x", (0, 1)), Access("x2", (0, 1))), Access("y", (0, 1)),
                      PointwiseBody(Call(_FN2[fn], (In(0), In(1)))))]
    else:
        if fn not in _FN:
            raise CaseError(f"pointwise fn {fn!r} has no builder")
        ops = [PrimOp("kernel", dims, (Access("x", (0, 1)),), Access("y", (0, 1)), PointwiseBody(_FN[fn](In(0))))]
    for op in ops:
        d.ops[op.id] = OpPlan(core_split=dict(split))
    pg = PrimGraph("pointwise", t, ops, [n for n in ("x", "x2") if n in t], ["y"])
    return Built(_valid(pg, hw, d))


def _rows_split(case: dict) -> dict[str, int]:
    return {("r" if k in ("0", "r") else "c"): int(v) for k, v in (case.get("split") or {}).items() if int(v) > 1}


def _shape2(case: dict) -> tuple[int, int]:
    shape = case.get("shape")
    if not (isinstance(shape, list) and len(shape) == 2 and all(isinstance(s, int) for s in shape)):
        raise CaseError(f"{case.get('kind')} needs a 2-D integer shape")
    return shape[0], shape[1]


# -- broadcast: y = x (op) b, b one row [1,C] ("row") or one column [R,1] ("col") ----------------------
def _broadcast(case: dict, hw) -> Built:
    rows, cols = _shape2(case)
    dt = case.get("dtype", "float16")
    along = case.get("along", "row")
    fn = str(case.get("fn", "add"))
    if fn not in ("add", "mul") or along not in ("row", "col"):
        raise CaseError(f"broadcast fn {fn!r} along {along!r} has no builder")
    bshape, bacc = ((1, cols), (None, 1)) if along == "row" else ((rows, 1), (0, None))
    t = {"x": _t("x", (rows, cols), dt, "user_input"), "b": _t("b", bshape, dt, "user_input"),
         "y": _t("y", (rows, cols), dt)}
    op = PrimOp("kernel", (IterDim("r", rows), IterDim("c", cols)), (Access("x", (0, 1)), Access("b", bacc)),
                Access("y", (0, 1)), PointwiseBody(Call(fn, (In(0), In(1)))))
    d = PlanDecisions(planner="calibration")
    d.ops["kernel"] = OpPlan(core_split=_rows_split(case))
    return Built(_valid(PrimGraph("broadcast", t, [op], ["x", "b"], ["y"]), hw, d))


# -- reduce: sum / max / mean along each row (axis "row") or down each column ("col") -------------------
def _reduce(case: dict, hw) -> Built:
    rows, cols = _shape2(case)
    dt = case.get("dtype", "float16")
    fn, axis = str(case.get("fn", "sum")), case.get("axis", "row")
    if fn not in ("sum", "max", "mean") or axis not in ("row", "col"):
        raise CaseError(f"reduce {fn!r} along {axis!r} has no builder")
    if axis == "row":
        dims = (IterDim("r", rows), IterDim("c", cols, "reduction"))
        oshape, oacc = (rows, 1), (0, None)
    else:
        dims = (IterDim("r", rows, "reduction"), IterDim("c", cols))
        oshape, oacc = (1, cols), (None, 1)
    t = {"x": _t("x", (rows, cols), dt, "user_input"), "y": _t("y", oshape, dt)}
    # mean: the sum of x / n (one fold, one scale per element: what the SFP executes)
    expr = Call("mul", (In(0), Const(1.0 / (cols if axis == "row" else rows)))) if fn == "mean" else In(0)
    op = PrimOp("kernel", dims, (Access("x", (0, 1)),), Access("y", oacc),
                ReduceBody("sum" if fn == "mean" else fn, expr))
    d = PlanDecisions(planner="calibration")
    d.ops["kernel"] = OpPlan(core_split=_rows_split(case))
    return Built(_valid(PrimGraph("reduce", t, [op], ["x"], ["y"]), hw, d))


# -- transpose: y[C,R] = x[R,C] made contiguous (the stick dim becomes a row dim) -----------------------
def _transpose(case: dict, hw) -> Built:
    rows, cols = _shape2(case)
    dt = case.get("dtype", "float16")
    t = {"x": _t("x", (rows, cols), dt, "user_input"), "y": _t("y", (cols, rows), dt)}
    op = PrimOp("kernel", (IterDim("r", rows), IterDim("c", cols)), (Access("x", (0, 1)),), Access("y", (1, 0)),
                PointwiseBody(In(0)))
    d = PlanDecisions(planner="calibration")
    d.ops["kernel"] = OpPlan(core_split=_rows_split(case))
    return Built(_valid(PrimGraph("transpose", t, [op], ["x"], ["y"]), hw, d))


# -- a sum of n tensors as a chain of two-input additions (or independent pairs) -----------------------
def _add_chain(case: dict, hw) -> Built:
    rows, cols = _shape2(case)
    dt = case.get("dtype", "float16")
    n = int(case.get("inputs", 3))
    if n < 2:
        raise CaseError("add_chain needs at least two inputs")
    dims = (IterDim("r", rows), IterDim("c", cols))
    full = (0, 1)
    t = {f"a{i}": _t(f"a{i}", (rows, cols), dt, "user_input") for i in range(n)}
    ops, outs = [], []
    if case.get("independent"):
        # (a0 + a1), (a2 + a3), ...: the same bytes as a chain, no dependency
        for j in range(n // 2):
            t[f"y{j}"] = _t(f"y{j}", (rows, cols), dt)
            ops.append(PrimOp(f"add{j}", dims, (Access(f"a{2 * j}", full), Access(f"a{2 * j + 1}", full)),
                              Access(f"y{j}", full), PointwiseBody(Call("add", (In(0), In(1))))))
            outs.append(f"y{j}")
    else:
        prev = "a0"
        for j in range(1, n):
            out = "y" if j == n - 1 else f"t{j}"
            t[out] = _t(out, (rows, cols), dt)
            ops.append(PrimOp(f"add{j}", dims, (Access(prev, full), Access(f"a{j}", full)), Access(out, full),
                              PointwiseBody(Call("add", (In(0), In(1))))))
            prev = out
        outs.append("y")
    d = PlanDecisions(planner="calibration")
    split = _rows_split(case)
    for op in ops:
        d.ops[op.id] = OpPlan(core_split=dict(split))
    if case.get("intermediates") == "lx":
        cores = 1
        for f in split.values():
            cores *= f
        per_core = -(-rows // cores) * max(cols * hw.dtype_size(dt), hw.stick_bytes)
        # a chain needs two intermediates live at once (the one read and the one written)
        for j in range(1, n - 1):
            d.resident[f"t{j}"] = Residency(lx_address=(j % 2) * per_core)
    return Built(_valid(PrimGraph("add_chain", t, ops, [f"a{i}" for i in range(n)], outs), hw, d))


# -- softmax over rows, decomposed (max, sub+exp, sum, div), one coarse-tiled kernel -----------------
def softmax_graph(rows: int = 512, cols: int = 1024, dtype: str = "float16") -> PrimGraph:
    t = {"x": _t("x", (rows, cols), dtype, "user_input"), "m": _t("m", (rows, 1), dtype),
         "e": _t("e", (rows, cols), dtype), "s": _t("s", (rows, 1), dtype), "y": _t("y", (rows, cols), dtype)}
    red = (IterDim("r", rows), IterDim("c", cols, "reduction"))
    pw = (IterDim("r", rows), IterDim("c", cols))
    ops = [
        PrimOp("max", red, (Access("x", (0, 1)),), Access("m", (0, None)), ReduceBody("max")),
        PrimOp("exp", pw, (Access("x", (0, 1)), Access("m", (0, None))), Access("e", (0, 1)),
               PointwiseBody(Call("exp", (Call("sub", (In(0), In(1))),)))),
        PrimOp("sum", red, (Access("e", (0, 1)),), Access("s", (0, None)), ReduceBody("sum")),
        PrimOp("div", pw, (Access("e", (0, 1)), Access("s", (0, None))), Access("y", (0, 1)),
               PointwiseBody(Call("div", (In(0), In(1))))),
    ]
    return PrimGraph("softmax", t, ops, ["x"], ["y"])


def _softmax(case: dict, hw) -> Built:
    rows, cols = case["shape"]
    cores = int(case.get("cores", 1))
    row_tiles = int((case.get("extra") or {}).get("row_tiles", 1))
    pg = softmax_graph(rows, cols, case.get("dtype", "float16"))
    d = PlanDecisions(planner="calibration")
    for op in pg.ops:
        d.ops[op.id] = OpPlan(core_split={"r": cores} if cores > 1 else {},
                              temporal_tiles={"r": row_tiles} if row_tiles > 1 else {})
    if case.get("intermediates") == "lx":
        addr = 0
        for tid in ("m", "e", "s"):
            d.resident[tid] = Residency(lx_address=addr)
            r, c = pg.tensors[tid].shape
            addr += -(-r // cores) * max(c * hw.dtype_size(pg.tensors[tid].dtype), hw.stick_bytes)
    return Built(_valid(pg, hw, d))


# -- SDPA with materialized scores (torch-spyre's decomposition) -------------------------------------
SDPA_CHAIN = ("mx", "d", "e", "sm")


def sdpa_graph(b: int = 1, h: int = 32, m: int = 512, dh: int = 128, dtype: str = "float16") -> PrimGraph:
    t = {n: _t(n, (b, h, m, dh), dtype, "user_input") for n in ("q", "k", "v")}
    for n, shape in [("qs", (b, h, m, dh)), ("ks", (b, h, m, dh)), ("sc", (b, h, m, m)),
                     ("mx", (b, h, m, 1)), ("d", (b, h, m, m)), ("e", (b, h, m, m)),
                     ("sm", (b, h, m, 1)), ("p", (b, h, m, m)), ("o", (b, h, m, dh))]:
        t[n] = _t(n, shape, dtype)

    def pw(last):
        return (IterDim("b", b), IterDim("h", h), IterDim("m", m), IterDim("j", last))

    red = (IterDim("b", b), IterDim("h", h), IterDim("m", m), IterDim("j", m, "reduction"))
    s = (1.0 / dh ** 0.5) ** 0.5  # q*s and k*s, as torch-spyre's decomposition scales both
    full, row = (0, 1, 2, 3), (0, 1, 2, None)
    ops = [
        PrimOp("qs", pw(dh), (Access("q", full),), Access("qs", full), PointwiseBody(Call("mul", (In(0), Const(s))))),
        PrimOp("ks", pw(dh), (Access("k", full),), Access("ks", full), PointwiseBody(Call("mul", (In(0), Const(s))))),
        PrimOp("qk", (IterDim("b", b), IterDim("h", h), IterDim("m", m), IterDim("n", m), IterDim("k", dh, "reduction")),
               (Access("qs", (0, 1, 2, 4)), Access("ks", (0, 1, 3, 4))), Access("sc", full), MatmulBody(2, 3, 4)),
        PrimOp("max", red, (Access("sc", full),), Access("mx", row), ReduceBody("max")),
        PrimOp("sub", pw(m), (Access("sc", full), Access("mx", row)), Access("d", full), PointwiseBody(Call("sub", (In(0), In(1))))),
        PrimOp("exp", pw(m), (Access("d", full),), Access("e", full), PointwiseBody(Call("exp", (In(0),)))),
        PrimOp("sum", red, (Access("e", full),), Access("sm", row), ReduceBody("sum")),
        PrimOp("div", pw(m), (Access("e", full), Access("sm", row)), Access("p", full), PointwiseBody(Call("div", (In(0), In(1))))),
        PrimOp("pv", (IterDim("b", b), IterDim("h", h), IterDim("m", m), IterDim("n", dh), IterDim("k", m, "reduction")),
               (Access("p", (0, 1, 2, 4)), Access("v", (0, 1, 4, 3))), Access("o", full), MatmulBody(2, 3, 4)),
    ]
    return PrimGraph("sdpa", t, ops, ["q", "k", "v"], ["o"])


def _sdpa_default_tile_order(program: Program, hw) -> None:
    """The bmm operands keep torch-spyre's default device tile order (a batch dim just
    inside the stick), the layout its compiler emitted for the recorded measurement."""
    for td in program.tensors:
        if td.id in ("qs", "p", "v") or td.id.startswith("ks@"):
            st = td.layout.stick_dim
            order = [0, 2, 1, 3] if st == 3 else [0, 3, 1, 2]
            td.layout = make_layout(td.shape, td.dtype, st, hw.stick_bytes, order)


def _sdpa(case: dict, hw) -> Built:
    pg = sdpa_graph(case["b"], case["h"], case["m"], case["d"], case.get("dtype", "float16"))
    split = _split(case, ("b", "h", "m"))
    d = PlanDecisions(planner="calibration")
    for op in pg.ops:
        d.ops[op.id] = OpPlan(core_split=dict(split))
    if case.get("softmax_intermediates") == "lx":
        # the softmax chain's intermediates at one per-core base each, in one bundle
        addr = 0
        cores = 1
        for f in split.values():
            cores *= f
        for tid in SDPA_CHAIN:
            d.resident[tid] = Residency(lx_address=addr)
            shape = pg.tensors[tid].shape
            addr += -(-shape[0] * shape[1] // cores) * shape[2] * max(shape[3] * 2, hw.stick_bytes)
        d.bundle_starts = ["max"]
    return Built(_valid(pg, hw, d, lambda p: _sdpa_default_tile_order(p, hw)))


BUILDERS: dict[str, Callable[[dict, object], Built]] = {
    "matmul": _matmul, "bmm": _bmm, "pointwise": _pointwise, "softmax": _softmax, "sdpa": _sdpa,
    "broadcast": _broadcast, "reduce": _reduce, "transpose": _transpose, "add_chain": _add_chain,
}


def build(case: dict, hw) -> Built:
    kind = case.get("kind")
    if kind not in BUILDERS:
        raise CaseError(f"no builder for case kind {kind!r}")
    try:
        return BUILDERS[kind](case, hw)
    except (KeyError, TypeError) as e:
        raise CaseError(f"case is missing what a plan needs: {e}") from None
