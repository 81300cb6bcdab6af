"""torch's type promotion, as far as the lowering needs it to check declared dtypes."""
from __future__ import annotations

from typing import Iterable, Optional, Union

from lowering.aten.context import FLOAT_DTYPES, INT_DTYPES, Scalar, View

_FLOAT_RANK = {"float16": 1, "bfloat16": 1, "float32": 2, "float64": 3}
_INT_BITS = {"uint8": 8, "int8": 8, "int16": 16, "int32": 32, "int64": 64}


def category(dtype: str) -> int:
    if dtype == "bool":
        return 0
    if dtype in INT_DTYPES:
        return 1
    return 2


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


def promote_pair(a: str, b: str) -> str:
    if a == b:
        return a
    ca, cb = category(a), category(b)
    if ca != cb:
        return a if ca > cb else b
    if ca == 2:
        if _FLOAT_RANK[a] == _FLOAT_RANK[b]:  # float16 with bfloat16
            return "float32"
        return a if _FLOAT_RANK[a] > _FLOAT_RANK[b] else b
    if {a, b} == {"uint8", "int8"}:
        return "int16"
    if "uint8" in (a, b):
        other = b if a == "uint8" else a
        return other
    return a if _INT_BITS[a] > _INT_BITS[b] else b


def _promote_all(dtypes: Iterable[str]) -> Optional[str]:
    out = None
    for d in dtypes:
        out = d if out is None else promote_pair(out, d)
    return out


_SCALAR_DEFAULT = {"bool": "bool", "int": "int64", "float": "float32"}
_SCALAR_CAT = {"bool": 0, "int": 1, "float": 2}


def result_type(operands: Iterable[Union[View, Scalar]]) -> str:
    """torch.result_type: dimensioned tensors, then zero-dim tensors, then Python scalars;
    a lower-priority group only matters when it is of a higher category."""
    operands = list(operands)
    dim = _promote_all(o.dtype for o in operands if isinstance(o, View) and o.rank > 0)
    zero = _promote_all(o.dtype for o in operands if isinstance(o, View) and o.rank == 0)
    scalars = [o.kind for o in operands if isinstance(o, Scalar)]
    result = dim
    if zero is not None and (result is None or category(zero) > category(result)):
        result = zero
    if scalars:
        top = max(scalars, key=lambda k: _SCALAR_CAT[k])
        if result is None or _SCALAR_CAT[top] > category(result):
            result = _SCALAR_DEFAULT[top]
    if result is None:
        raise ValueError("result_type of no operands")
    return result


def float_result(dtype: str) -> str:
    """Dtype of a float function (exp, div, ...) applied to `dtype`."""
    return dtype if is_float(dtype) else "float32"
