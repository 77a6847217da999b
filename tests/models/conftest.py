from __future__ import annotations

from pathlib import Path

import pytest

from radixserve.distributed import set_tp_info


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from radixserve.testing import ARCHS, write_tiny_checkpoint

    root = tmp_path_factory.mktemp("tiny")
    return {arch: write_tiny_checkpoint(arch, root / arch) for arch in ARCHS}


@pytest.fixture
def tp_rank():
    """Pretend to be `rank` of `size` while building layers; always restores TP=1."""

    def use(rank: int, size: int) -> None:
        set_tp_info(rank, size)

    yield use
    set_tp_info(0, 1)
