"""Write lowering/op_schemas.json: the argument schema of every target in
`lowering.SUPPORTED_TARGETS`, read from the pinned torch's operator registry.

The service never imports torch, so the validator checks a node's arguments against this
file (`lowering.validate`, codes `unexpected_argument` / `missing_argument`). Per target:
`args` (the positional parameter names, in order), `required` (how many of them have no
default), `kwargs` (keyword-only parameter names).

    python scripts/gen_op_schemas.py            # rewrite lowering/op_schemas.json
    python scripts/gen_op_schemas.py --check    # exit 1 if it is stale

tests/test_op_schemas.py runs the check. Needs torch (the `torch` extra) and, for
`transformers.grouped_mm_fallback`, transformers; for FMS's `moe.*` and `spyre.*` ops, ibm-fms.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "lowering" / "op_schemas.json"
FORMAT = "sticksat.op-schemas"
VERSION = 1


def _register_lazy_ops() -> None:
    """Operators torch or transformers register only when a module is imported."""
    import torch._inductor.inductor_prims  # noqa: F401 - prims._low_memory_max_pool_with_offsets
    try:
        import transformers.integrations.moe  # noqa: F401 - transformers.grouped_mm_fallback
    except ImportError:
        pass
    try:   # Foundation Model Stack (ibm-fms, a test dependency): its custom ops
        import fms.triton.pytorch_ops  # noqa: F401 - moe.moe_mm
        import fms.utils.spyre.paged  # noqa: F401 - spyre.paged_attn_store / _compute / _compute_with_sinks
    except ImportError:
        pass


def schema_of(target: str) -> dict | None:
    import torch

    namespace, name, overload = target.split(".")
    try:
        op = getattr(getattr(getattr(torch.ops, namespace), name), overload)
    except (AttributeError, RuntimeError):
        return None
    args, kwargs, required = [], [], 0
    for a in op._schema.arguments:
        if a.kwarg_only:
            kwargs.append(a.name)
        else:
            args.append(a.name)
            if not a.has_default_value():
                required = len(args)
    return {"args": args, "required": required, "kwargs": kwargs}


def build() -> dict:
    import torch

    from lowering import SUPPORTED_TARGETS

    _register_lazy_ops()
    ops = {}
    missing = []
    for target in sorted(SUPPORTED_TARGETS):
        schema = schema_of(target)
        if schema is None:
            missing.append(target)
        else:
            ops[target] = schema
    return {"format": FORMAT, "version": VERSION, "torch": torch.__version__.split("+")[0],
            "without_schema": missing, "ops": ops}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if lowering/op_schemas.json is stale")
    args = parser.parse_args(argv)
    text = json.dumps(build(), indent=1, sort_keys=True) + "\n"
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT.relative_to(REPO)} is stale: run python scripts/gen_op_schemas.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
