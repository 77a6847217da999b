"""`pytest -m gpu` keeps one case of each GPU attention kernel's grid and `pytest -m kernel_sweep`
runs the rest: together the whole grid, with no case in both and none in neither."""
from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from tests.kernels.conftest import SWEPT

ROOT = Path(__file__).resolve().parents[2]
FILE = "tests/kernels/test_kernels_gpu.py"


def _collected(*args: str) -> set[str]:
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p",
                        "no:cacheprovider", *args, FILE], cwd=ROOT, capture_output=True,
                       text=True, check=False, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return {line for line in r.stdout.splitlines() if line.startswith(FILE + "::")}


@pytest.mark.slow  # three collections in subprocesses
def test_gpu_tier_keeps_one_case_of_each_grid_and_the_sweep_the_rest() -> None:
    every, gpu, sweep = _collected("-m", "gpu or kernel_sweep"), _collected("-m", "gpu"), \
        _collected("-m", "kernel_sweep")
    assert gpu | sweep == every and not gpu & sweep

    def per_test(ids: set[str]) -> Counter:
        return Counter(i.split("::")[1].split("[")[0] for i in ids)

    assert {name: per_test(gpu)[name] for name in SWEPT} == dict.fromkeys(SWEPT, 1)
    assert set(per_test(sweep)) == SWEPT  # nothing outside the attention grids is swept
    assert all(per_test(sweep)[name] >= 3 for name in SWEPT)
