"""The torch backend attends each request over its own length: its output equals plain dense causal
attention for batches of very different lengths (prefix-cache hits, GQA, one-token requests in
and after the prompts, prompts longer than a query tile), and no SDPA call it makes is sized by
the batch's longest request times the batch."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tests.kernels.kernel_cases import backend_case, run_backend, windowed_reference

from radixserve.attention.torch_backend import Q_TILE, TorchBackend

STREAMS = [150, 171, 160, 163, 158, 149, 166, 155]  # eight running requests' cached lengths

CASES = {
    # one long prompt (three query tiles) first, eight streams decoding behind it
    "long-prompt-and-streams": ([0] + STREAMS, [1100] + [1] * 8),
    # a long prompt's later chunk over its cached prefix, beside the streams
    "chunk-over-prefix": ([1600] + STREAMS, [300] + [1] * 8),
    # prefix hits (queries fewer than keys), a fresh prompt, a one-token chunk mid-batch
    "prefix-hits": ([700, 0, 2000, 33, 900, 2], [40, 300, 1, 2, 1, 1]),
    "decode-only": ([0, 4, 1500, 33], [1, 1, 1, 1]),
    "prompts-only": ([9, 0, 600], [6, 700, 1]),
}


def dense_reference(cfg, batch, q: torch.Tensor, layer: int) -> torch.Tensor:
    """Each request's queries over the keys its page-table row holds, query i at position
    prefix + i seeing keys 0..prefix + i; float64, GQA by repeating KV heads."""
    return windowed_reference(cfg, batch, q, layer, None)


# the two longest cases (a second each) at two corners of page size x head layout, the others whole
@pytest.mark.fast_cases("long-prompt-and-streams-1-gqa", "long-prompt-and-streams-16-mha",
                        "chunk-over-prefix-1-gqa", "chunk-over-prefix-16-mha",
                        *[f"{case}-{page}-{heads}" for case in list(CASES)[2:] for page in (1, 16)
                          for heads in ("gqa", "mha")])
@pytest.mark.parametrize("heads", [(8, 2), (4, 4)], ids=["gqa", "mha"])
@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("case", list(CASES))
def test_torch_backend_equals_dense_attention(case: str, page: int, heads) -> None:
    cfg, batch, q, k, v = backend_case("cpu", torch.float32, page, *CASES[case], heads, 16,
                                       seed=len(case) + page)
    got = run_backend(TorchBackend(cfg), batch, q, k, v)
    for layer, g in enumerate(got):
        want = dense_reference(cfg, batch, q, layer)
        torch.testing.assert_close(g.double(), want, rtol=1e-5, atol=1e-5)


def test_torch_backend_bf16_close_to_dense_attention() -> None:
    cfg, batch, q, k, v = backend_case("cpu", torch.bfloat16, 4, *CASES["chunk-over-prefix"],
                                       (8, 2), 16)
    got = run_backend(TorchBackend(cfg), batch, q, k, v, layers=1)[0]
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), dense_reference(cfg, batch, q, 0),
                               rtol=1.6e-2, atol=1.6e-2)


def test_output_goes_to_the_given_buffer() -> None:
    cfg, batch, q, k, v = backend_case("cpu", torch.float32, 4, *CASES["prefix-hits"], (8, 2), 16)
    backend = TorchBackend(cfg)
    backend.prepare(batch)
    buf = torch.full_like(q, 7.0)
    got = backend.forward(q, k, v, 0, batch, out=buf)
    assert got.data_ptr() == buf.data_ptr()
    torch.testing.assert_close(buf.double(), dense_reference(cfg, batch, q, 0), rtol=1e-5, atol=1e-5)


def score_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record, for every SDPA call from now on, the number of attention scores it computes:
    batch x query heads x queries x keys (what the math path holds at once)."""
    sizes: list[int] = []
    real = F.scaled_dot_product_attention

    def spy(query, key, value, *args, **kwargs):
        sizes.append(query.shape[:-1].numel() * key.shape[-2])
        return real(query, key, value, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    return sizes


def test_scores_are_bounded_by_the_chunk_not_the_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 512-token chunk over a 2,560-token cached prefix beside eight streams: no call holds
    more scores than that chunk over its own keys, and all calls together hold less than the
    chunk's share plus one query per stream over its own keys. Padded to the longest request,
    a single call held nine times the chunk's scores."""
    hq, chunk, prefix = 8, 512, 2560
    cfg, batch, q, k, v = backend_case("cpu", torch.float32, 16, [prefix] + STREAMS,
                                       [chunk] + [1] * 8, (hq, 2), 16)
    sizes = score_sizes(monkeypatch)
    run_backend(TorchBackend(cfg), batch, q, k, v, layers=1)
    chunk_scores = hq * chunk * (prefix + chunk)
    assert max(sizes) <= chunk_scores
    assert sum(sizes) <= chunk_scores + hq * 8 * (max(STREAMS) + 1)


def test_a_long_prompt_is_attended_in_query_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Queries beyond `Q_TILE` go in further calls, each over the keys its tile can see: a
    1,300-token prompt's scores are three tiles' worth, about half its full square."""
    n, hq = 1300, 4
    cfg, batch, q, k, v = backend_case("cpu", torch.float32, 4, [0], [n], (hq, 2), 16)
    sizes = score_sizes(monkeypatch)
    run_backend(TorchBackend(cfg), batch, q, k, v, layers=1)
    bounds = [min(t + Q_TILE, n) for t in range(0, n, Q_TILE)]
    assert sizes == [hq * (b - t) * b for t, b in zip(range(0, n, Q_TILE), bounds)]
    assert max(sizes) <= hq * Q_TILE * n
