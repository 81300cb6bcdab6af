"""The architecture the code must obey, checked from the source (docs/architecture.md).

Every module of the project's packages is parsed (nothing is imported) and each import,
at module level or inside a function, is held against four rules:
- an arrow between packages must be one the layering allows (`ALLOWED`);
- no private (underscore) name is imported from another module;
- no import circle among the modules of `solver`, `simulator` and `target`;
- no import inside a function in `solver`, `simulator` or `target` unless a comment on that
  line or the line above says why.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Who may import whom. Data flows backend -> lowering -> solver -> program -> simulator;
# `target` (the device, the program format, the primitive ops) is below all of them;
# `service` wires everything; `calibration` builds plans to fit the simulator's model.
ALLOWED: dict[str, frozenset[str]] = {
    "target": frozenset(),
    "lowering": frozenset({"target"}),
    "simulator": frozenset({"target"}),
    "solver": frozenset({"target", "lowering", "simulator"}),
    "calibration": frozenset({"target", "simulator", "solver"}),
    "backend": frozenset({"target", "lowering", "simulator", "service"}),
    "service": frozenset({"target", "lowering", "solver", "simulator", "calibration"}),
}
PACKAGES = tuple(ALLOWED)
# The torch backend reaches the service package only for the compile driver, which pulls
# in no HTTP framework (tests/test_service_*.py check the driver's imports at run time).
BACKEND_SERVICE_MODULES = frozenset({"service.pipeline"})
# Packages that run where torch is not installed (the service image has no torch).
NO_TORCH = ("target", "lowering", "solver", "simulator", "service", "calibration")
TORCH_TOPS = frozenset({"torch", "transformers", "fms"})
# Where an import inside a function needs a comment saying why.
NO_LOCAL_IMPORTS = ("solver", "simulator", "target")
NO_CIRCLES = ("solver", "simulator", "target")


@dataclass(frozen=True)
class Import:
    importer: str           # dotted module name
    path: Path
    line: int
    target: str             # dotted name imported from (module, or package for `from p import m`)
    names: tuple[str, ...]  # names of `from X import a, b`; () for `import X`
    local: bool             # inside a function
    commented: bool         # a comment on its line or the line above


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports_of(path: Path, module: str | None = None) -> list[Import]:
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    tree = ast.parse(text, str(path))
    module = module or _module_name(path)
    is_package = path.name == "__init__.py"
    local_nodes: set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            local_nodes.update(id(n) for n in ast.walk(fn) if n is not fn)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [(a.name, ()) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [(base, tuple(a.name for a in node.names))]
        else:
            continue
        line = node.lineno
        here = lines[line - 1]
        above = lines[line - 2].strip() if line >= 2 else ""
        commented = "#" in here or above.startswith("#")
        for tgt, names in targets:
            out.append(Import(module, path, line, tgt, names, id(node) in local_nodes, commented))
    return out


def _all_imports() -> list[Import]:
    found = []
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            found.extend(_imports_of(path))
    return found


IMPORTS = _all_imports()
MODULES = {_module_name(p) for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}


def _where(imp: Import) -> str:
    return f"{imp.path.relative_to(REPO)}:{imp.line} {imp.importer} -> {imp.target}"


def _against_layering(imp: Import) -> str:
    src, dst = imp.importer.split(".")[0], imp.target.split(".")[0]
    if dst not in ALLOWED or dst == src:
        return ""
    if dst not in ALLOWED[src]:
        return _where(imp)
    if src == "backend" and dst == "service":
        used = {imp.target} | {f"{imp.target}.{n}" for n in imp.names}
        if not used & BACKEND_SERVICE_MODULES:
            return _where(imp) + " (the backend may use only the compile driver)"
    return ""


def _private_names(imp: Import) -> str:
    if imp.target.split(".")[0] not in ALLOWED or imp.target == imp.importer:
        return ""
    private = [n for n in imp.names if n.startswith("_") and not n.startswith("__")]
    return f"{_where(imp)}: {', '.join(private)}" if private else ""


def _unexplained_local(imp: Import) -> str:
    if imp.local and not imp.commented and imp.importer.split(".")[0] in NO_LOCAL_IMPORTS:
        return _where(imp)
    return ""


def test_packages_import_only_downward():
    bad = [w for i in IMPORTS if (w := _against_layering(i))]
    assert not bad, "imports against the layering (tests/test_layering.py ALLOWED):\n" + "\n".join(bad)


def test_service_side_never_imports_torch():
    bad = [_where(i) for i in IMPORTS
           if i.importer.split(".")[0] in NO_TORCH and i.target.split(".")[0] in TORCH_TOPS]
    assert not bad, "\n".join(bad)


def test_no_private_names_across_modules():
    bad = [w for i in IMPORTS if (w := _private_names(i))]
    assert not bad, "private names imported from another module:\n" + "\n".join(bad)


def test_no_function_local_imports_without_a_reason():
    bad = [w for i in IMPORTS if (w := _unexplained_local(i))]
    assert not bad, ("imports inside functions with no comment saying why (move them to the top, "
                     "or say why on the line or the line above):\n" + "\n".join(bad))


def _module_graph(packages: tuple[str, ...]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES if m.split(".")[0] in packages}
    for imp in IMPORTS:
        if imp.local or imp.importer not in graph:
            continue
        submodules = [f"{imp.target}.{n}" for n in imp.names if f"{imp.target}.{n}" in MODULES]
        # `from package import submodule` is an arrow to the submodule; the package's
        # __init__ only counts when a name is taken from it
        takes_from_package = not imp.names or len(submodules) < len(imp.names)
        for cand in submodules + ([imp.target] if takes_from_package else []):
            if cand in graph and cand != imp.importer:
                graph[imp.importer].add(cand)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    circles = _circles(_module_graph(NO_CIRCLES))
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


@pytest.mark.parametrize("source, expect", [
    ("import os\ndef f():\n    import json\n", ["json"]),
    ("def f():\n    # json is optional here\n    import json\n", []),
])
def test_the_checker_sees_local_imports(tmp_path, source, expect):
    """The rules above are only as good as the parser: a function-local import is seen, and
    a comment above it counts as its reason."""
    path = tmp_path / "probe.py"
    path.write_text(source, encoding="utf-8")
    found = [i.target for i in _imports_of(path, "solver.probe") if i.local and not i.commented]
    assert found == expect


def test_the_checker_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
