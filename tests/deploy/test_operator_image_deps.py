"""The operator image installs only the `operator` extra (no torch, no transformers), so every
module the operator imports, at the top or inside a function, must come from that extra."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys

import tomllib

from tests.deploy.support import REPO

PACKAGE = REPO / "operator" / "radixserve_operator"


def _imported_top_level_modules() -> dict[str, str]:
    found: dict[str, str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], path.name)
    return found


def _norm(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def test_operator_imports_only_stdlib_and_the_operator_extra() -> None:
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    allowed = {_norm(re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0]) for req in extra["operator"]}
    dists = importlib.metadata.packages_distributions()
    missing = {}
    for module, where in _imported_top_level_modules().items():
        if module in sys.stdlib_module_names or module in ("__future__", "radixserve_operator"):
            continue
        assert module != "radixserve", f"{where} imports the engine, which the operator image lacks"
        provided_by = {_norm(d) for d in dists.get(module, [module])}
        if not provided_by & allowed:
            missing[module] = (where, sorted(provided_by))
    assert not missing, f"add to the `operator` extra in pyproject.toml: {missing}"
