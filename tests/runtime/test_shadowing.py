"""A user's storage.py or actors.py beside their script is refused at import with one
sentence naming the file to rename (a real script run in a real subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "from runtime import Runtime\nprint('imported', Runtime.__name__)\n"


def _run(directory: Path) -> subprocess.CompletedProcess[str]:
    (directory / "script.py").write_text(SCRIPT, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "script.py"],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("name", ["storage", "actors"])
def test_a_module_beside_the_script_that_shadows_a_corral_package_is_named_to_rename(
    tmp_path: Path, name: str
) -> None:
    shadow = tmp_path / f"{name}.py"
    shadow.write_text("VALUE = 1\n", encoding="utf-8")
    result = _run(tmp_path)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("runtime.shadowing.PackageShadowedError: ")
    assert f"{shadow} is imported in place of corral's {name!r} package" in last
    assert f"rename it, e.g. to my_{name}.py" in last
    assert "is not a package" not in result.stderr


def test_a_package_beside_the_script_that_shadows_storage_is_named_too(tmp_path: Path) -> None:
    package = tmp_path / "storage"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    result = _run(tmp_path)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert f"{package} is imported in place of corral's 'storage' package" in last
    assert "rename it, e.g. to my_storage, " in last


def test_a_script_without_a_shadowing_file_imports_runtime(tmp_path: Path) -> None:
    (tmp_path / "my_storage.py").write_text("VALUE = 1\n", encoding="utf-8")
    result = _run(tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "imported Runtime\n"
