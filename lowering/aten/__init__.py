"""aten -> primitive lowerings, one module per op family. Importing this package fills
`HANDLERS` (target name -> lowering function)."""
from lowering.aten import attention, conv, indexing, matmul, moe, paged, pointwise, reductions, views  # noqa: F401
from lowering.aten.context import HANDLERS

__all__ = ["HANDLERS"]
