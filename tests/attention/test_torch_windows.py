"""Sliding windows in the torch backend: a layer with window W equals dense attention in which
query position p sees keys p-W+1..p (transformers' mask), over cached prefixes, prompt chunks
longer than a query tile and decode rows; a layer without a window in the same batch still sees
every key."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from tests.kernels.kernel_cases import WINDOW_CASES, backend_case, run_backend, windowed_reference

from radixserve.attention.torch_backend import TorchBackend


@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("case", list(WINDOW_CASES))
def test_windowed_layer_equals_dense_windowed_attention(case: str, page: int) -> None:
    cfg, batch, q, k, v = backend_case("cpu", torch.float32, page, *WINDOW_CASES[case], (8, 2), 16,
                                       seed=len(case) + page)
    windows = (24, None)
    cfg = dataclasses.replace(cfg, windows=windows)
    got = run_backend(TorchBackend(cfg), batch, q, k, v)
    for layer, g in enumerate(got):
        want = windowed_reference(cfg, batch, q, layer, windows[layer])
        torch.testing.assert_close(g.double(), want, rtol=1e-5, atol=1e-5)
    unwindowed = windowed_reference(cfg, batch, q, 0, None)
    assert (got[0].double() - unwindowed).abs().max() > 1e-2  # the window did cut keys
