from __future__ import annotations

import json


def register(sub) -> None:
    p = sub.add_parser("version", help="print the compiler and dependency versions")
    p.set_defaults(func=run)


def run(args) -> int:
    import numpy
    import ortools
    import pydantic

    from lowering.version import COMPILER_VERSION

    print(json.dumps({"sticksat": COMPILER_VERSION, "numpy": numpy.__version__,
                      "ortools": ortools.__version__, "pydantic": pydantic.__version__}))
    return 0
