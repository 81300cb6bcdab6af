"""Layout rules and core-split legality of the primitive ops (target/op_rules.py)."""
import pytest

from target.op_rules import (
    ANY, check_split, copy_is_alias, default_choice, legal_core_splits, matching_choice,
    split_granules, stick_options,
)
from target.primitives import Access, Call, CopyBody, In, IterDim, PointwiseBody, PrimOp, StridedMap
from tests.primgraphs import attention_scores, copies, mlp, softmax, colsum

STICK = 128


def _ops(builder):
    pg, _ = builder()
    return pg, {op.id: op for op in pg.ops}


def test_matmul_rule_x_on_k_y_on_n_out_on_n():
    pg, ops = _ops(attention_scores)
    (ch,) = stick_options(ops["qk"])
    # q (b, m, k) sticked on its k dim (2); k read as (b, n, k) must be sticked on its n dim (1)
    assert ch.inputs == (2, 1) and ch.output == 2 and ch.stick_iter == 2


def test_pointwise_broadcast_operand_any_or_its_stick():
    pg, ops = _ops(mlp)
    opts = stick_options(ops["bias"])
    by_iter = {c.stick_iter: c for c in opts}
    assert by_iter[1].inputs == (1, 0) and by_iter[1].output == 1   # stick on n: bias on its n
    assert by_iter[0].inputs == (0, ANY) and by_iter[0].output == 0  # stick on m: bias broadcast
    assert default_choice(ops["bias"]).output == 1


def test_reduce_over_stick_gives_sparse_stick_output():
    pg, ops = _ops(softmax)
    ch = default_choice(ops["amax"])
    assert ch.stick_iter == 1 and ch.inputs == (1,) and ch.output == 1  # the keepdim size-1 dim
    # the row statistic is then a broadcast operand along the stick of `sub`
    assert default_choice(ops["sub"]).inputs == (1, ANY)
    assert matching_choice(ops["sub"], [0, 1], 1) is None  # x sticked on m violates the rule


def test_matching_choice_checks_every_operand():
    pg, ops = _ops(mlp)
    assert matching_choice(ops["mm"], [1, 1], 1) is not None
    assert matching_choice(ops["mm"], [0, 1], 1) is None      # x sticked on m
    assert matching_choice(ops["mm"], [1, 0], 1) is None      # y sticked on k


def test_legal_splits_are_legal_and_complete():
    pg, ops = _ops(mlp)
    op = ops["mm"]
    gran = split_granules(op, [1, 1], 1, ["float16"] * 3, STICK)
    assert gran == {2: 64, 1: 64}
    splits = legal_core_splits(op, gran, 32)
    assert {} in splits
    for s in splits:
        assert check_split(op, s, gran, 32) == []
        prod = 1
        for f in s.values():
            prod *= f
        assert prod <= 32
    # n = 192 elements = 3 sticks: splits of 3 only; k = 128 = 2 sticks
    assert {"n": 3} in splits and {"n": 2} not in splits and {"k": 2} in splits
    assert {"m": 32} in splits and {"m": 64} not in splits


def test_check_split_codes():
    pg, ops = _ops(mlp)
    op = ops["mm"]
    gran = split_granules(op, [1, 1], 1, ["float16"] * 3, STICK)
    assert [c for c, _ in check_split(op, {"n": 2}, gran, 32)] == ["split_uneven"]
    assert [c for c, _ in check_split(op, {"m": 64}, gran, 128)] == []
    assert "cores_over_limit" in [c for c, _ in check_split(op, {"m": 64}, gran, 32)]
    assert [c for c, _ in check_split(op, {"zz": 2}, gran, 32)] == ["split_unknown_dim"]
    two_red = PrimOp("r", (IterDim("a", 128, "reduction"), IterDim("b", 128, "reduction")),
                     (Access("x", (0, 1)),), Access("y", (None, None)), PointwiseBody(In(0)))
    assert "multi_reduction_split" in [c for c, _ in check_split(two_red, {"a": 2, "b": 2}, {}, 32)]


def test_padding_aware_split_in_whole_sticks():
    op = PrimOp("p", (IterDim("m", 4), IterDim("n", 100)), (Access("x", (0, 1)),), Access("y", (0, 1)),
                PointwiseBody(Call("exp", (In(0),))))
    gran = split_granules(op, [1], 1, ["float16", "float16"], STICK)
    splits = legal_core_splits(op, gran, 32)
    assert {"n": 2} in splits and {"n": 4} not in splits   # 100 fp16 = 2 padded sticks
    assert {"m": 4, "n": 2} in splits


def test_at_most_one_reduction_dim_split_enumerated():
    op = PrimOp("r", (IterDim("a", 64, "reduction"), IterDim("b", 64, "reduction"), IterDim("c", 8)),
                (Access("x", (0, 1, 2)),), Access("y", (None, None, 2)), PointwiseBody(In(0)))
    for s in legal_core_splits(op, {}, 32):
        assert sum(1 for n in s if n in ("a", "b")) <= 1


def test_copy_alias_only_when_bytes_coincide():
    pg, ops = _ops(copies)
    sh = {t.id: t.shape for t in pg.tensors.values()}
    rs, tr = ops["reshape"], ops["transpose"]
    assert copy_is_alias(rs, sh["x"], [0, 1, 2], sh["r"], [0, 1], "float16", "float16", 128)
    assert not copy_is_alias(rs, sh["x"], [0, 2, 1], sh["r"], [0, 1], "float16", "float16", 128)  # other stick
    assert not copy_is_alias(rs, sh["x"], [0, 1, 2], sh["r"], [0, 1], "float16", "float32", 128)
    assert not copy_is_alias(tr, sh["r"], [0, 1], sh["tr"], [0, 1], "float16", "float16", 128)   # transpose moves data


def test_reduction_split_on_non_stick_dim_allowed():
    pg, ops = _ops(colsum)
    op = ops["colsum"]
    gran = split_granules(op, [1], 1, ["float16"] * 2, STICK)
    assert {"r": 16, "n": 2} in legal_core_splits(op, gran, 32)


def test_outermost_split_skips_dims_no_core_count_divides():
    from target.op_rules import outermost_split
    op = PrimOp("p", (IterDim("b", 1), IterDim("t", 197), IterDim("h", 768)), (Access("x", (0, 1, 2)),),
                Access("y", (0, 1, 2)), PointwiseBody(Call("exp", (In(0),))))
    gran = split_granules(op, [2], 2, ["float16", "float16"], STICK)
    # b has one unit, 197 is prime: the hidden dim (12 sticks) is split 12 ways
    assert outermost_split(op, gran, 32) == {"h": 12}


def test_merging_unpadded_stick_rows_is_an_alias():
    """[S, H, 128] -> [S, H*128] in fp16 (64 elements a stick): neither last dim is padded,
    so both byte images are the plain row-major elements. With a padded last dim (100) the
    rows of sticks differ and the data must move."""
    def reshape(shape_in, shape_out):
        n = 1
        for s in shape_out:
            n *= s
        op = PrimOp("v", tuple(IterDim(f"d{i}", s) for i, s in enumerate(shape_out)),
                    (Access("x", tuple(None for _ in shape_in)),), Access("y", tuple(range(len(shape_out)))),
                    CopyBody((StridedMap(tuple(shape_out), tuple(_strides(shape_out)), 0),), ((0,) * len(shape_out),)))
        return op
    ok = reshape((512, 32, 128), (512, 4096))
    assert copy_is_alias(ok, (512, 32, 128), [0, 1, 2], (512, 4096), [0, 1], "float16", "float16", 128)
    padded = reshape((512, 32, 100), (512, 3200))
    assert not copy_is_alias(padded, (512, 32, 100), [0, 1, 2], (512, 3200), [0, 1], "float16", "float16", 128)


def _strides(shape):
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return list(reversed(out))
