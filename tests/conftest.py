from __future__ import annotations

import shutil

import pytest


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001 -- any failure to probe CUDA means no GPU tier
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_gpu = pytest.mark.skip(reason="needs a CUDA device (run `pytest -m gpu` on the GPU machine)")
    no_kind = pytest.mark.skip(reason="needs `docker` and `kind` on PATH (run `make e2e`)")
    has_cuda = _has_cuda()
    has_kind = shutil.which("docker") is not None and shutil.which("kind") is not None
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(no_gpu)
        if "e2e" in item.keywords and not has_kind:
            item.add_marker(no_kind)
