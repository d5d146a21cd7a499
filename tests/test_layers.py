"""The package tree shows the layers, and imports respect them (every import counts: module
level, inside a function, under TYPE_CHECKING). Read by parsing the source, not by importing."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "amptool"

#: Layers from the top; a module may import only from its own layer or those below it.
#: ``None`` marks the modules every layer may use (they import nothing of amptool above them).
LAYERS: list[tuple[str, ...]] = [
    ("amptool.cli", "amptool.__main__"),
    ("amptool.api", "amptool"),
    ("amptool.app",),
    ("amptool.frontend", "amptool.passes", "amptool.compiler", "amptool.runtime", "amptool.compare",
     "amptool.colors", "amptool.testing"),
    ("amptool.errors", "amptool.dtypes", "amptool.fileio"),
    ("amptool._tvm", "amptool._without_torch"),
]


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(name: str, path: Path, known: set[str]) -> Iterator[str]:
    """Every amptool module ``name`` imports, resolved to a module that exists."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target.startswith("amptool") and target != name and not name.startswith(target + "."):
                yield target  # (a module's own ancestor packages load with it: not an edge)


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: set(_imports(name, path, known)) for name, path in modules.items()}


def _layer(module: str) -> int:
    best = (-1, len(LAYERS))
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            inside = module == prefix or (prefix != "amptool" and module.startswith(prefix + "."))
            if inside and len(prefix) > best[0]:
                best = (len(prefix), index)
    return best[1]


def test_every_module_has_a_layer():
    assert [m for m in _modules() if _layer(m) == len(LAYERS)] == []


def test_no_import_cycles():
    graph = _graph()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt == "amptool" or node == "amptool":
                continue  # the package's lazy public API names its own submodules
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert cycles == []


def test_imports_go_down_the_layers():
    upward = sorted(
        f"{module} -> {target}"
        for module, targets in _graph().items()
        for target in targets
        if _layer(target) < _layer(module) and target != "amptool"
    )
    assert upward == []


@pytest.mark.parametrize("name", ["build", "dist", "out"])
def test_no_source_package_with_a_name_tools_skip(name):
    assert not (PACKAGE / name).exists()
