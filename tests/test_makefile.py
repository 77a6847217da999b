"""The newcomer path, read from `make -n` (nothing is run): outside a virtualenv make installs
into a project `.venv` (Debian's own python3 refuses pip), inside one into that, and without CUDA
it asks torch's CPU index before PyPI; `make test-fast` leaves the slow tiers out."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def _dry_run(target: str, **env: str) -> str:
    base = {k: v for k, v in os.environ.items()
            if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "PY", "MAKEFLAGS", "MFLAGS")}
    r = subprocess.run(["make", "-n", "-s", "-C", str(ROOT), "VENV=/nonexistent/venv", target],
                       env=base | env, capture_output=True, text=True, check=False, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_outside_a_virtualenv_make_installs_into_the_project_venv() -> None:
    out = _dry_run("install")
    assert "python3 -m venv /nonexistent/venv" in out
    assert "/nonexistent/venv/bin/python -m pip install -e ." in out
    assert "python3 -m pip" not in out


@pytest.mark.parametrize("env", [{"VIRTUAL_ENV": "/some/env"}, {"CONDA_PREFIX": "/some/conda"},
                                 {"PY": "python3.11"}])
def test_an_active_environment_or_a_given_python_is_used_as_it_is(env: dict[str, str]) -> None:
    out = _dry_run("install", **env)
    assert "-m venv" not in out and "/nonexistent/venv" not in out
    assert f"{env.get('PY', 'python3')} -m pip install -e ." in out


def test_without_cuda_the_cpu_index_comes_before_pypi() -> None:
    out = _dry_run("install")
    cpu = out.index("--index-url https://download.pytorch.org/whl/cpu")
    assert "nvidia-smi" in out[:cpu]  # asked only where there is no CUDA
    assert out.index("unreachable: torch from PyPI") > cpu


def test_fast_loop_leaves_the_slow_tiers_out() -> None:
    out = _dry_run("test-fast", VIRTUAL_ENV="/some/env")
    line = next(x for x in out.splitlines() if "-m pytest" in x)
    marks = line.split(' -m "', 1)[1].split('"', 1)[0]
    for tier in ("slow", "server", "gpu", "cluster", "node", "e2e"):
        assert f"not {tier}" in marks, marks
    # on every core, one torch thread a worker
    assert line.startswith("OMP_NUM_THREADS=1 ") and " -n auto " in line, line


def test_lint_installs_ruff_where_missing() -> None:
    out = _dry_run("lint", VIRTUAL_ENV="/some/env")
    assert "python3 -m ruff --version" in out and "python3 -m pip install ruff" in out
