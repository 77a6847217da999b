"""The `operator/` source folder must never shadow Python's own `operator` module."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_stdlib_operator_not_shadowed_from_repo_root() -> None:
    code = "import operator, sys; print(operator.__file__); assert hasattr(operator, 'itemgetter')"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert not out.startswith(str(ROOT)), f"repo folder shadows stdlib operator: {out}"


def test_source_roots_are_not_packages() -> None:
    for folder in ("runtime", "kernels", "operator"):
        assert not (ROOT / folder / "__init__.py").exists(), folder
