"""`RADIXSERVE_TEST_TIMES=FILE`: one line per test as it ends, with a failure's message, written
once per test also under pytest-xdist (whose controller and workers both see each report)."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
ROOT_CONFTEST = Path(__file__).with_name("conftest.py")


@pytest.mark.slow  # (left out of `make test-fast`; `make test` runs it)
@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_each_test_is_one_line_with_why_it_failed(pytester: pytest.Pytester, monkeypatch,
                                                 workers: list[str]) -> None:
    pytester.makeconftest(ROOT_CONFTEST.read_text())
    pytester.makepyfile(test_cases='''
def test_fails():
    assert 1 == 2, "one is not two"

def test_passes():
    pass
''')
    times = pytester.path / "times.txt"
    monkeypatch.setenv("RADIXSERVE_TEST_TIMES", str(times))
    pytester.runpytest_subprocess("-p", "no:cacheprovider", *workers).assert_outcomes(passed=1, failed=1)
    lines = times.read_text().splitlines()
    assert len(lines) == 2, lines
    by_test = {line.split()[3]: line for line in lines}
    assert by_test["test_cases.py::test_fails"].split()[1] == "failed"
    assert by_test["test_cases.py::test_fails"].endswith("| AssertionError: one is not two")
    assert by_test["test_cases.py::test_passes"].split()[1:3] == ["passed", "call"]
