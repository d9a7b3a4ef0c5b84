"""The layer rule: imports only point down (storage <- actors <- runtime)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {
    "storage": {"actors", "runtime", "benchmarks", "tests"},
    "actors": {"runtime", "benchmarks", "tests"},
    "runtime": {"benchmarks", "tests"},
}


def imported_top_levels(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_package_imports_nothing_from_the_layers_above_it(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"package {package} has no modules"
    violations = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in files
        for name in sorted(imported_top_levels(path) & FORBIDDEN[package])
    ]
    assert violations == []


def test_the_layer_check_sees_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import actors.bus\nfrom runtime import Runtime\n", encoding="utf-8")
    assert imported_top_levels(bad) >= {"actors", "runtime"}
