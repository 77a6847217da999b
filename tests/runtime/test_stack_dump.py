"""`RADIXSERVE_STACK_DUMP_S`: a process prints where each thread is, periodically; unset, nothing."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from radixserve.utils.stack_dump import ENV, enable_stack_dumps

PROBE = """
import time
from radixserve.utils.stack_dump import enable_stack_dumps
enable_stack_dumps("probe")
def stuck_in_here():
    time.sleep(1.2)
stuck_in_here()
"""


def run_probe(value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    if value is not None:
        env[ENV] = value
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                          timeout=60, check=True)
    return done.stderr


def test_stacks_name_the_function_a_process_waits_in() -> None:
    err = run_probe("0.3")
    assert "[probe] pid" in err
    assert err.count("stuck_in_here") >= 2  # repeated, not once


def test_unset_prints_nothing() -> None:
    assert run_probe(None) == ""


@pytest.mark.parametrize("bad", ["soon", "0", "-1"])
def test_bad_value_names_the_variable(monkeypatch, bad) -> None:
    monkeypatch.setenv(ENV, bad)
    with pytest.raises(ValueError, match=ENV):
        enable_stack_dumps("x")
