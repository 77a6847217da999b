"""No dead code and no code used only by tests: vulture reads the three source packages without
the tests, so a function, class, method, property or constant that nothing in them uses is
reported, whether or not a test calls it. What frameworks call by name (route and handler
decorators, pydantic's and kopf's settings, tqdm's interface) and the public API are listed below,
each with why it stays."""
from __future__ import annotations

from pathlib import Path

import pytest

vulture = pytest.importorskip("vulture", reason="vulture is a dev dependency (pip install -e '.[dev]')")

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "runtime", ROOT / "kernels", ROOT / "operator"]
# modules whose job is to serve tests: radixserve.testing builds tiny checkpoints, its kernels twin
# switches Triton's interpreter on
TEST_SUPPORT = ["*/radixserve/testing.py", "*/radixserve_kernels/testing.py"]
# called by a framework through the decorator that registers it
DECORATORS = ["@*.register", "@*.get", "@*.post", "@*.delete", "@*.exception_handler", "@kopf.*",
              "@*.middleware", "@router.*", "@app.*"]
KEPT = {
    "IMAGE_ENTRYPOINT": "the runtime image's ENTRYPOINT the operator's container args rely on; "
                        "the Dockerfile is held to it",
    "progress_storage": "kopf's settings, set by attribute",
    "diffbase_storage": "kopf's settings, set by attribute",
    "__getattr__": "the package's lazy attributes (PEP 562)",
    "set_description_str": "tqdm's interface, called by huggingface_hub's download",
    "set_postfix_str": "tqdm's interface, called by huggingface_hub's download",
    "group_count": "torch.distributed's own counter, reset when a group is left",
    "agenerate": "the offline API (docs/offline.md)",
    "astream": "the offline API (docs/offline.md)",
    "hf_quantizer": "transformers' attribute, cleared so that its model can be saved",
    "prompt_token_ids": "a field of the offline API's result",
    "reader": "keeps the frontend's reader task referenced (asyncio keeps only weak ones)",
    "should_exit": "uvicorn's flag that stops its server",
    "route_class": "FastAPI's router setting: the class of the routes it makes",
    "model_config": "pydantic's model configuration",
    "tp_size": "a field of the server info the SGLang gateway reads",
    "disable_radix_cache": "a field of the server info the SGLang gateway reads",
}


def wire_fields() -> set[str]:
    """The fields of the HTTP API's request and response models: the wire format, read and
    written by pydantic by name (a field the engine does not use is there to be refused)."""
    from pydantic import BaseModel

    from radixserve.server import protocol

    return {name for obj in vars(protocol).values()
            if isinstance(obj, type) and issubclass(obj, BaseModel) for name in obj.model_fields}


def unused(paths: list[Path], exclude: list[str] = TEST_SUPPORT, kept: set[str] = frozenset()) -> list[str]:
    v = vulture.Vulture(ignore_names=[*KEPT, *kept], ignore_decorators=DECORATORS)
    v.scavenge([str(p) for p in paths], exclude=exclude)
    return [f"{Path(i.filename).relative_to(ROOT) if Path(i.filename).is_relative_to(ROOT) else i.filename}"
            f":{i.first_lineno}: unused {i.typ} {i.name!r}" for i in v.get_unused_code(min_confidence=60)]


def test_no_dead_code_in_the_source() -> None:
    found = unused(SOURCES, kept=wire_fields())
    assert not found, "\n".join(found)


def test_code_used_only_by_a_test_is_reported(tmp_path: Path) -> None:
    """Negative control: a helper the package never calls is found even though a test (not read)
    would call it; one the package calls is not."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "a.py").write_text("def used():\n    return 1\n\n\ndef only_tests():\n    return 2\n\n\n"
                              "print(used())\n")
    (tmp_path / "test_a.py").write_text("from pkg.a import only_tests\nonly_tests()\n")
    found = unused([pkg], exclude=[])
    assert len(found) == 1 and "'only_tests'" in found[0], found
