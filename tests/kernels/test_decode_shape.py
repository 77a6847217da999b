"""The decode launcher's choices (no kernel runs): they must depend only on the batch size's next
power of two, so a CUDA-graph replay padded up to a captured size computes exactly what an eager
run of the same requests does, and every sliced shape must give each slice a whole dot tile."""
from __future__ import annotations

import pytest
import torch

from radixserve_kernels._utils import next_pow2
from radixserve_kernels.decode_attention import decode_block_config, decode_num_splits, fp8_qk_dots

CACHES = [(2, 2), (2, 1), (4, 4), (4, 1)]  # (q bytes, cache bytes): bf16/fp16, FP8, float32


@pytest.mark.parametrize("fp8_qk", [False, True])
@pytest.mark.parametrize("block_d", [32, 64, 128, 256])
@pytest.mark.parametrize("elem_bytes,kv_bytes", CACHES)
def test_launch_depends_only_on_the_next_power_of_two(block_d: int, elem_bytes: int,
                                                     kv_bytes: int, fp8_qk: bool) -> None:
    for bs in range(1, 1100):
        p = next_pow2(bs)
        assert decode_block_config(bs, block_d, elem_bytes, kv_bytes, fp8_qk) == (
            decode_block_config(p, block_d, elem_bytes, kv_bytes, fp8_qk)), bs
        assert decode_num_splits(bs, 8, 132) == decode_num_splits(p, 8, 132), bs


@pytest.mark.parametrize("fp8_qk", [False, True])
@pytest.mark.parametrize("block_d", [32, 64, 128, 256])
@pytest.mark.parametrize("elem_bytes,kv_bytes", CACHES)
def test_sliced_shapes_give_each_slice_a_whole_tile(block_d: int, elem_bytes: int,
                                                    kv_bytes: int, fp8_qk: bool) -> None:
    for bs in range(1, 1100):
        shape = decode_block_config(bs, block_d, elem_bytes, kv_bytes, fp8_qk)
        if shape.sliced:
            assert shape.block_n % shape.warps == 0 and shape.block_n // shape.warps >= 16, shape


def test_sliced_kernel_only_for_a_16_bit_q_over_fp8_at_16_or_more_requests() -> None:
    assert decode_block_config(256, 128, 2, 1).sliced and decode_block_config(16, 128, 2, 1).sliced
    assert not decode_block_config(8, 128, 2, 1).sliced  # few requests: the split kernel
    assert not decode_block_config(256, 128, 2, 2).sliced  # 16-bit cache
    assert not decode_block_config(256, 128, 4, 1).sliced  # float32 q


def test_fp8_keys_read_as_they_are_only_where_allowed_from_128_requests() -> None:
    """The FP8-key dots (sliced kernel) from 128 requests on when the launcher allows them, never
    otherwise; and it allows them only for a bf16 q over an e4m3 cache with head_dim over 32."""
    for bs in range(1, 1100):
        shape = decode_block_config(bs, 128, 2, 1, fp8_qk=True)
        assert shape.fp8_qk == (bs > 64) and (shape.sliced or not shape.fp8_qk), bs
        for args in ((2, 1, False), (2, 2, True), (4, 1, True), (4, 4, True)):
            assert not decode_block_config(bs, 128, *args).fp8_qk, (bs, args)
    fp8 = torch.float8_e4m3fn
    assert fp8_qk_dots(torch.zeros(2, 4, 128, dtype=torch.bfloat16), fp8)
    assert fp8_qk_dots(torch.zeros(2, 4, 64, dtype=torch.bfloat16), fp8)
    assert not fp8_qk_dots(torch.zeros(2, 4, 32, dtype=torch.bfloat16), fp8)  # halves under 32
    assert not fp8_qk_dots(torch.zeros(2, 4, 128, dtype=torch.float16), fp8)  # 11 bits
    assert not fp8_qk_dots(torch.zeros(2, 4, 128, dtype=torch.bfloat16), torch.bfloat16)


def test_decode_order_is_longest_first_from_64_requests() -> None:
    """Under 64 requests the programs start in about one wave, so there is no order to pay a
    sort for; from 64 on, the longest request first, ties in batch order."""
    from radixserve_kernels.decode_attention import ORDER_MIN_BS, decode_order

    assert decode_order(torch.tensor([5, 90, 7], dtype=torch.int32)) is None
    lens = torch.randint(1, 50, (ORDER_MIN_BS,), generator=torch.Generator().manual_seed(0))
    order = decode_order(lens.to(torch.int32))
    assert sorted(order.tolist()) == list(range(ORDER_MIN_BS))
    ranked = lens[order].tolist()
    assert ranked == sorted(ranked, reverse=True)
    ties = [i for i in order.tolist() if lens[i] == ranked[0]]
    assert ties == sorted(ties)


def test_the_host_order_is_the_device_sort() -> None:
    """The runtime sorts the lengths it holds on the host (`decode_order_cpu`) and copies the
    order in: the same permutation as the device's stable sort, ties (many here) included."""
    from radixserve_kernels.decode_attention import ORDER_MIN_BS, decode_order, decode_order_cpu

    gen = torch.Generator().manual_seed(1)
    for n in (ORDER_MIN_BS, 300):
        lens = torch.randint(1, 12, (n,), generator=gen)
        assert decode_order_cpu(lens.tolist()) == decode_order(lens.to(torch.int32)).tolist()
    assert decode_order_cpu([7, 3] * (ORDER_MIN_BS // 2 - 1)) is None


def test_more_requests_than_the_grid_holds_is_a_clear_error() -> None:
    """The requests are the launch grid's third axis (at most 65,535 in CUDA): more is refused
    before any launch, not a CUDA launch failure."""
    from radixserve_kernels import decode_attention

    bs = 65_536
    q = torch.zeros(bs, 2, 16)
    cache = torch.zeros(4, 1, 16)
    ones = torch.ones(bs, dtype=torch.int32)
    with pytest.raises(ValueError, match="at most 65535 requests a call, got 65536"):
        decode_attention(q, cache, cache, torch.zeros(1, 4, dtype=torch.int32),
                         torch.zeros(bs, dtype=torch.int64), ones, 0.25)
