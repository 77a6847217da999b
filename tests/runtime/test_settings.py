"""`radixserve.settings`: every RADIXSERVE_* variable typed and read in one place, documented in
docs/configuration.md, and read nowhere else."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from radixserve import settings

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [p for d in ("runtime", "kernels") for p in (ROOT / d).rglob("*.py")]


def test_docs_table_is_the_modules_table() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    assert settings.markdown_table() in doc, "regenerate with: python -m radixserve.settings"


def test_every_variable_read_in_the_code_is_a_setting() -> None:
    """Any RADIXSERVE_* name written anywhere in the runtime is declared in settings.py."""
    known = {s.name for s in settings.ALL}
    seen: set[str] = set()
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and node.value.startswith("RADIXSERVE_") and node.value.isupper()):
                seen.add(node.value)
    assert seen - known == set(), f"undeclared variables: {sorted(seen - known)}"


def _reads_environ(node: ast.AST) -> bool:
    """`os.environ.get(...)`, `os.getenv(...)` or `os.environ[...]` as a value."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        f = node.func
        if f.attr == "get" and isinstance(f.value, ast.Attribute) and f.value.attr == "environ":
            return True
        if f.attr == "getenv":
            return True
    return (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)
            and isinstance(node.value, ast.Attribute) and node.value.attr == "environ")


def test_no_radixserve_variable_is_read_outside_settings_and_nothing_at_import() -> None:
    offenders = []
    for path in SOURCES:
        if path.name == "settings.py" and path.parent.name == "radixserve":
            continue
        tree = ast.parse(path.read_text())
        consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                  and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                  for t in n.targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if not _reads_environ(node):
                continue
            key = node.args[0] if isinstance(node, ast.Call) and node.args else getattr(node, "slice", None)
            name = key.value if isinstance(key, ast.Constant) else consts.get(getattr(key, "id", ""), "")
            if isinstance(name, str) and name.startswith("RADIXSERVE_"):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} reads {name}")
        for stmt in tree.body:  # module level: runs at import
            if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and any(
                    _reads_environ(n) for n in ast.walk(stmt)) and "__main__" not in ast.unparse(stmt):
                offenders.append(f"{path.relative_to(ROOT)}:{stmt.lineno} reads the environment at import")
    assert offenders == []


def test_defaults_parsing_and_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for s in settings.ALL:
        monkeypatch.delenv(s.name, raising=False)
    assert settings.STARTUP_TIMEOUT.get() == 900.0
    assert settings.ALLREDUCE.get() == "auto"
    assert settings.DISABLE_OVERLAP.get() is False
    assert settings.CACHE_DIR.get() == Path.home() / ".cache" / "radixserve"  # computed on use
    assert settings.STACK_DUMP_S.get() is None and settings.API_KEY.get() is None
    monkeypatch.setenv("RADIXSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("RADIXSERVE_DISABLE_OVERLAP", "TRUE")
    monkeypatch.setenv("RADIXSERVE_LOG_LEVEL", "warning")
    monkeypatch.setenv("RADIXSERVE_ALLREDUCE", " ")  # blank is unset
    assert settings.CACHE_DIR.get() == tmp_path
    assert settings.DISABLE_OVERLAP.get() is True
    assert settings.LOG_LEVEL.get() == "WARNING"
    assert settings.ALLREDUCE.get() == "auto"
    for name, bad, why in [("RADIXSERVE_STARTUP_TIMEOUT", "-5", "positive number of seconds"),
                           ("RADIXSERVE_HEARTBEAT_TIMEOUT_S", "soon", "number of seconds"),
                           ("RADIXSERVE_DISABLE_OVERLAP", "maybe", "must be 1/true"),
                           ("RADIXSERVE_LOG_FORMAT", "xml", "must be one of plain, json"),
                           ("RADIXSERVE_CPU_KV_GIB", "-1", "non-negative")]:
        monkeypatch.setenv(name, bad)
        setting = next(s for s in settings.ALL if s.name == name)
        with pytest.raises(ValueError, match=rf"^{name} .*{why}.*, got '{bad}'$"):
            setting.get()


def test_a_value_set_after_import_is_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's health check reads its limits on use, so a test or parent can set them late."""
    from radixserve.kvcache.sizing import kv_token_capacity

    monkeypatch.setenv("RADIXSERVE_CPU_KV_GIB", "1")
    one = kv_token_capacity(__import__("torch").device("cpu"), 1024, 0.9, 10**9)
    monkeypatch.setenv("RADIXSERVE_CPU_KV_GIB", "2")
    two = kv_token_capacity(__import__("torch").device("cpu"), 1024, 0.9, 10**9)
    assert (one, two) == (2**20, 2**21)


def test_pdl_setting_reaches_the_kernels(monkeypatch: pytest.MonkeyPatch, tiny_ckpts) -> None:
    """RADIXSERVE_PDL is read by the engine in each rank's process and handed to the kernels'
    launchers (which must not read the environment themselves); a bad value stops the engine."""
    from radixserve.config import EngineConfig
    from radixserve.engine.engine import Engine
    from radixserve_kernels import _utils

    def engine() -> Engine:
        return Engine(EngineConfig(model=str(tiny_ckpts["llama"]), dtype="float32", device="cpu"),
                      max_running_requests=2)

    monkeypatch.setitem(_utils._pdl, "enabled", True)
    monkeypatch.setenv("RADIXSERVE_PDL", "0")
    engine()
    assert _utils._pdl["enabled"] is False
    monkeypatch.setenv("RADIXSERVE_PDL", "on")
    engine()
    assert _utils._pdl["enabled"] is True
    monkeypatch.setenv("RADIXSERVE_PDL", "maybe")
    with pytest.raises(ValueError, match="RADIXSERVE_PDL"):
        engine()
