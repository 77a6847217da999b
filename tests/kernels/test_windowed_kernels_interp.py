"""Sliding windows in the Triton attention kernels (Triton's interpreter on CPU): extend and
decode with a window W equal their references with W, and the references equal float64 dense
attention in which the query at position p sees keys p-W+1..p (`windowed_reference`). Windows
under and over a key block, a cached prefix longer than the window, decode splits the window
leaves empty, the fused new-token path, an FP8 cache; and the kernels never read the keys
before a window's first key block (NaN there changes nothing)."""
from __future__ import annotations

import pytest
import torch
from tests.kernels.kernel_cases import (
    FP8_SCALES,
    backend_case,
    close,
    interpreter_only,
    windowed_reference,
)

pytestmark = interpreter_only
FP8 = torch.float8_e4m3fn
# (cached prefix lengths, new tokens): a prefix far longer than the window, a prompt of several
# query blocks without one, a short extend whose window starts inside its prefix
EXTEND = ([700, 0, 37], [90, 130, 5])
DECODE = [0, 23, 24, 69, 299]  # cached keys before each request's new token
SLICED = (32, 2, 2, True)  # a `DecodeShape`: 32-key blocks, a slice a warp (the sliced kernel)


def _args(cfg, batch, q: torch.Tensor) -> tuple:
    pool = cfg.kv_pool
    return (q, pool.k_cache(0), pool.v_cache(0), cfg.page_table, batch.req_rows, batch.seq_lens)


def _scales(cfg) -> dict[str, float]:
    return {"k_scale": cfg.kv_pool.k_scale(0), "v_scale": cfg.kv_pool.v_scale(0)}


def _extend(cfg, batch, q: torch.Tensor, window: int | None, ref: bool = False) -> torch.Tensor:
    from radixserve_kernels import extend_attention, extend_attention_ref

    args = (*_args(cfg, batch, q), batch.extend_lens, cfg.scale)
    if ref:
        return extend_attention_ref(*args, window=window, **_scales(cfg))
    ext = batch.extend_lens
    qo_start = torch.cumsum(ext, 0, dtype=torch.int32) - ext
    return extend_attention(*args, qo_start, max(batch.extend_lens_cpu), window=window,
                            **_scales(cfg))


def _poison_keys_before(cfg, batch, first: list[int]) -> None:
    """NaN into layer 0's K and V of each request's keys before `first[i]`."""
    pool = cfg.kv_pool
    for row, n in zip(batch.req_rows.tolist(), first):
        slots = cfg.page_table[row, :n].long()
        pool.k_cache(0)[slots] = float("nan")
        pool.v_cache(0)[slots] = float("nan")


def _check_reference(cfg, batch, q: torch.Tensor, window: int, ref: torch.Tensor) -> None:
    """The reference is dense windowed attention, and the window did cut keys."""
    torch.testing.assert_close(ref.double(), windowed_reference(cfg, batch, q, 0, window),
                               rtol=1e-5, atol=1e-5)
    assert (ref.double() - windowed_reference(cfg, batch, q, 0, None)).abs().max() > 1e-2


@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("window", [24, 100], ids=["under-a-block", "over-a-block"])
def test_windowed_extend_equals_its_reference(window: int, page: int) -> None:
    cfg, batch, q, *_ = backend_case("cpu", torch.float32, page, *EXTEND, (4, 2), 16, seed=page)
    ref = _extend(cfg, batch, q, window, ref=True)
    _check_reference(cfg, batch, q, window, ref)
    got = _extend(cfg, batch, q, window)
    close(got, ref, torch.float32)
    # the loop starts at the key block holding the first query block's first key (blocks of 32
    # or 64 keys, so a multiple of 128 below it is never read): the long prefix is skipped
    first = [max(s - e - window + 1, 0) // 128 * 128
             for s, e in zip(batch.seq_lens_cpu, batch.extend_lens_cpu)]
    assert first[0] >= 512
    _poison_keys_before(cfg, batch, first)
    assert torch.equal(_extend(cfg, batch, q, window), got)


def test_windowed_extend_over_an_fp8_cache() -> None:
    cfg, batch, q, *_ = backend_case("cpu", torch.float32, 16, *EXTEND, (4, 2), 16, seed=3,
                                     kv_dtype=FP8)
    ref = _extend(cfg, batch, q, 24, ref=True)
    _check_reference(cfg, batch, q, 24, ref)
    close(_extend(cfg, batch, q, 24), ref, torch.float32, scale=FP8_SCALES["v_scale"])


@pytest.mark.parametrize("shape", [None, SLICED], ids=["split", "sliced"])
@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("window", [24, 100], ids=["under-a-block", "over-a-block"])
def test_windowed_decode_equals_its_reference(window: int, page: int, shape) -> None:
    """Split counts 1, 3 and 8 divide the window's keys in whole key blocks: at 3 and 8 some
    splits get none (lse -inf, weight 0 in the merge)."""
    from radixserve_kernels import decode_attention, decode_attention_ref
    from radixserve_kernels.decode_attention import DecodeShape

    shape = shape and DecodeShape(*shape)
    cfg, batch, q, *_ = backend_case("cpu", torch.float32, page, DECODE, [1] * len(DECODE),
                                     (4, 2), 16, seed=page + window)
    ref = decode_attention_ref(*_args(cfg, batch, q), cfg.scale, window=window)
    _check_reference(cfg, batch, q, window, ref)
    for splits in (1, 3, 8):
        got = decode_attention(*_args(cfg, batch, q), cfg.scale, num_splits=splits, shape=shape,
                               window=window)
        close(got, ref, torch.float32)
    # each split starts inside the window: no key before it is ever read
    _poison_keys_before(cfg, batch, [max(n - window, 0) for n in batch.seq_lens_cpu])
    assert torch.equal(decode_attention(*_args(cfg, batch, q), cfg.scale, num_splits=8,
                                        shape=shape, window=window), got)


def test_windowed_decode_over_an_fp8_cache() -> None:
    from radixserve_kernels import decode_attention, decode_attention_ref

    cfg, batch, q, *_ = backend_case("cpu", torch.float32, 16, DECODE, [1] * len(DECODE), (4, 2),
                                     16, seed=5, kv_dtype=FP8)
    ref = decode_attention_ref(*_args(cfg, batch, q), cfg.scale, window=24, **_scales(cfg))
    _check_reference(cfg, batch, q, 24, ref)
    got = decode_attention(*_args(cfg, batch, q), cfg.scale, num_splits=3, window=24,
                           **_scales(cfg))
    close(got, ref, torch.float32, scale=FP8_SCALES["v_scale"])


@pytest.mark.parametrize("shape", [None, SLICED], ids=["split", "sliced"])
def test_windowed_decode_rotating_the_new_token(shape) -> None:
    """`NewTokenKV`: the kernel rotates q and the new key and stores k/v itself; the new token
    is the window's last key, in the last split that has keys."""
    from radixserve_kernels import (
        NewTokenKV,
        RopeParams,
        build_cos_sin_cache,
        decode_attention,
        decode_attention_ref,
    )
    from radixserve_kernels.decode_attention import DecodeShape, rotate_new_token_ref

    shape = shape and DecodeShape(*shape)
    dim, window = 32, 24
    cfg, batch, q, k, v = backend_case("cpu", torch.float32, 4, DECODE, [1] * len(DECODE),
                                       (4, 2), dim, seed=7)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    new = NewTokenKV(k, v, batch.out_loc, RopeParams(build_cos_sin_cache(inv_freq, 512)))
    pool, rest = cfg.kv_pool, (cfg.page_table, batch.req_rows, batch.seq_lens, cfg.scale)
    got_kv = [pool.k_cache(0).clone(), pool.v_cache(0).clone()]
    got = decode_attention(q, *got_kv, *rest, num_splits=3, shape=shape, new_kv=new,
                           window=window)
    ref_kv = [pool.k_cache(0).clone(), pool.v_cache(0).clone()]
    ref = decode_attention_ref(q, *ref_kv, *rest, new_kv=new, window=window)
    # the truth over the pool with the rotated new k/v stored
    rotated = rotate_new_token_ref(q, pool.k_cache(0), pool.v_cache(0), batch.seq_lens, new)
    _check_reference(cfg, batch, rotated, window, ref)
    close(got, ref, torch.float32, scale=4)
    for g, r in zip(got_kv, ref_kv):
        close(g[batch.out_loc], r[batch.out_loc], torch.float32, scale=4)


def test_a_window_under_one_token_is_refused() -> None:
    from radixserve_kernels import decode_attention

    cfg, batch, q, *_ = backend_case("cpu", torch.float32, 1, [3], [1], (4, 2), 16)
    with pytest.raises(ValueError, match="at least one token"):
        decode_attention(*_args(cfg, batch, q), cfg.scale, window=0)
