"""Sliding windows in the Triton attention kernels (Triton's interpreter on CPU): extend and
decode with a window W equal their references with W, and the references equal float64 dense
attention in which the query at position p sees keys p-W+1..p (`windowed_reference`). Windows
under and over a key block, a cached prefix longer than the window, decode splits the window
leaves empty, the fused new-token path, an FP8 cache, page sizes 1 and 16; and the kernels never
read the keys before a window's first key block (NaN there changes nothing). The checks live in
`kernel_cases` (the gpu tier runs them at real shapes)."""
from __future__ import annotations

import pytest
import torch
from tests.kernels import kernel_cases as kc

pytestmark = kc.interpreter_only
FP8 = torch.float8_e4m3fn
SLICED = (32, 2, 2, True)  # a `DecodeShape`: 32-key blocks, a slice a warp (the sliced kernel)
WINDOWS = pytest.mark.parametrize("window", [24, 100], ids=["under-a-block", "over-a-block"])


def _shape(fields: tuple | None):
    from radixserve_kernels.decode_attention import DecodeShape

    return fields and DecodeShape(*fields)


@pytest.mark.fast_cases("under-a-block-1", "over-a-block-16")
@pytest.mark.parametrize("page", [1, 16])
@WINDOWS
def test_windowed_extend_equals_its_reference(window: int, page: int) -> None:
    kc.check_windowed_extend("cpu", page, window, (4, 2), 16)


def test_windowed_extend_over_an_fp8_cache() -> None:
    kc.check_windowed_extend("cpu", 16, 24, (4, 2), 16, kv_dtype=FP8)


# (the split kernel under a window: the FP8 and rotating cases below)
@pytest.mark.fast_cases("over-a-block-16-sliced")
@pytest.mark.parametrize("shape", [None, SLICED], ids=["split", "sliced"])
@pytest.mark.parametrize("page", [1, 16])
@WINDOWS
def test_windowed_decode_equals_its_reference(window: int, page: int, shape) -> None:
    kc.check_windowed_decode("cpu", page, window, (4, 2), 16, [1, 3, 8], _shape(shape))


def test_windowed_decode_over_an_fp8_cache() -> None:
    kc.check_windowed_decode("cpu", 16, 24, (4, 2), 16, [3], kv_dtype=FP8)


@pytest.mark.parametrize("shape", [None, SLICED], ids=["split", "sliced"])
def test_windowed_decode_rotating_the_new_token(shape) -> None:
    kc.check_windowed_decode_rope("cpu", 24, (4, 2), 32, _shape(shape))


def test_a_window_under_one_token_is_refused() -> None:
    from radixserve_kernels import decode_attention, extend_attention

    cfg, batch, q, *_ = kc.backend_case("cpu", torch.float32, 1, [3], [1], (4, 2), 16)
    args = kc.layer0_args(cfg, batch, q)
    with pytest.raises(ValueError, match="at least one token"):
        decode_attention(*args, cfg.scale, window=0)
    with pytest.raises(ValueError, match="at least one token"):
        extend_attention(*args, batch.extend_lens, cfg.scale, batch.seq_lens * 0, 1, window=-1)
