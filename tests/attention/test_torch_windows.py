"""Sliding windows in the torch backend: a layer with window W equals dense attention in which
query position p sees keys p-W+1..p (transformers' mask), over cached prefixes, prompt chunks
longer than a query tile and decode rows; a layer without a window in the same batch still sees
every key."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from tests.kernels.kernel_cases import backend_case, run_backend

from radixserve.attention.torch_backend import TorchBackend
from radixserve_kernels.kv_quant import dequantize_kv_ref, gather_kv

CASES = {  # (cached prefix lengths, new tokens)
    "prefix-hits-and-decode": ([700, 0, 40, 33, 5, 2], [40, 300, 1, 2, 1, 1]),
    "long-prompt": ([0, 130], [1100, 1]),
    "decode-only": ([0, 4, 1500, 33], [1, 1, 1, 1]),
}


def windowed_reference(cfg, batch, q: torch.Tensor, layer: int, window: int | None) -> torch.Tensor:
    """float64 attention of each request's queries over its page-table row's keys, query i at
    position prefix + i seeing keys j with prefix + i - window < j <= prefix + i."""
    pool, table = cfg.kv_pool, cfg.page_table
    rep = q.shape[1] // cfg.num_kv_heads
    outs, start = [], 0
    for row, n, e in zip(batch.req_rows.tolist(), batch.seq_lens_cpu, batch.extend_lens_cpu):
        slots = table[row, :n].long()
        k = dequantize_kv_ref(gather_kv(pool.k_cache(layer), slots), pool.k_scale(layer)).double()
        v = dequantize_kv_ref(gather_kv(pool.v_cache(layer), slots), pool.v_scale(layer)).double()
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        scores = torch.einsum("qhd,khd->hqk", q[start:start + e].double(), k) * cfg.scale
        pos, key = (n - e + torch.arange(e))[:, None], torch.arange(n)[None, :]
        allowed = (key <= pos) & (key > pos - (window if window is not None else n + 1))
        probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        outs.append(torch.einsum("hqk,khd->qhd", probs, v))
        start += e
    return torch.cat(outs)


@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("case", list(CASES))
def test_windowed_layer_equals_dense_windowed_attention(case: str, page: int) -> None:
    cfg, batch, q, k, v = backend_case("cpu", torch.float32, page, *CASES[case], (8, 2), 16,
                                       seed=len(case) + page)
    windows = (24, None)
    cfg = dataclasses.replace(cfg, windows=windows)
    got = run_backend(TorchBackend(cfg), batch, q, k, v)
    for layer, g in enumerate(got):
        want = windowed_reference(cfg, batch, q, layer, windows[layer])
        torch.testing.assert_close(g.double(), want, rtol=1e-5, atol=1e-5)
    unwindowed = windowed_reference(cfg, batch, q, 0, None)
    assert (got[0].double() - unwindowed).abs().max() > 1e-2  # the window did cut keys
