from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from tests.deploy.support import load_generator


@pytest.fixture(scope="session")
def gen() -> ModuleType:
    return load_generator()


@pytest.fixture(scope="session")
def render(gen: ModuleType):
    """render(values, namespace=...) -> the chart's objects, rendered by real Helm."""

    def _render(
        values: dict[str, Any] | None = None, namespace: str = "radixserve-system"
    ) -> list[dict]:
        return gen.render_chart(values, name="rs", namespace=namespace)

    return _render
