"""No import cycle among corral's source modules (``storage``, ``actors``, ``runtime``).

Every import counts, ``if TYPE_CHECKING:`` ones too: a cycle that only the type checker
follows still ties two modules into one concept. ``from package import name`` counts as
an import of the submodule ``name`` where there is one, else of the package.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("storage", "actors", "runtime")


def module_names(root: Path) -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            targets = [
                f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                for alias in node.names
            ]
        else:
            continue
        found.update(t for t in targets if t in modules and t != name)
    return found


def cycles(root: Path) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    modules = module_names(root)
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:  # recursion depth: the longest import chain (small)
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return groups


def test_no_import_cycle_among_source_modules() -> None:
    assert cycles(ROOT) == []


def test_the_cycle_check_sees_a_cycle(tmp_path: Path) -> None:
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "runtime" / "a.py").write_text("from . import b\n", encoding="utf-8")
    (tmp_path / "runtime" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from runtime.a import x\n",
        encoding="utf-8",
    )
    (tmp_path / "runtime" / "c.py").write_text("from .a import y\n", encoding="utf-8")
    assert cycles(tmp_path) == [["runtime.a", "runtime.b"]]
