from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from radixserve.testing import ARCHS, write_tiny_checkpoint

    root = tmp_path_factory.mktemp("ckpt")
    return {a: write_tiny_checkpoint(a, root / a) for a in ARCHS}
