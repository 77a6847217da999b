"""The backend contract on CPU: `forward` stores the new k/v in the pool (unless given None, when
the pool already holds them) and then attends; a hybrid stores once and attends with the backend
the batch's phase picks."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from tests.kernels.kernel_cases import backend_case, run_backend

from radixserve.attention.torch_backend import TorchBackend
from radixserve_kernels.kv_quant import dequantize_kv_ref, quantize_kv_ref

CASES = {"extend": ([9, 0], [6, 11]), "decode": ([0, 4, 15, 33], [1] * 4),
         "mixed": ([9, 0, 30, 7], [6, 11, 1, 1])}  # prompt chunks, then two decode tokens
FP8 = torch.float8_e4m3fn


class RecordingTorch(TorchBackend):
    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self.attended: list[int] = []

    def attend(self, q, layer_id, batch, out=None):
        self.attended.append(layer_id)
        return super().attend(q, layer_id, batch, out)


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.uint8) if x.dtype == FP8 else x


@pytest.mark.parametrize("kv_dtype", [None, FP8], ids=["kv-model", "kv-fp8"])
@pytest.mark.parametrize("case", list(CASES))
def test_forward_without_kv_attends_over_what_the_pool_holds(case: str, kv_dtype) -> None:
    """Also over an FP8 pool: what `forward` stores is k/v quantized with the layer's scales."""
    cfg, batch, q, k, v = backend_case("cpu", torch.float32, 4, *CASES[case], (4, 2), 16,
                                       kv_dtype=kv_dtype)
    pool, fresh = cfg.kv_pool, cfg.kv_pool._kv.clone()
    want = run_backend(TorchBackend(cfg), dataclasses.replace(batch), q, k, v)
    stored_by_forward = pool._kv.clone()
    pool._kv.copy_(fresh)
    got = run_backend(TorchBackend(cfg), dataclasses.replace(batch), q, k, v, kv_stored=True)
    assert torch.equal(_bits(pool._kv), _bits(stored_by_forward))
    k_want = quantize_kv_ref(k, pool.dtype, pool.k_scale(1))
    v_want = quantize_kv_ref(v, pool.dtype, pool.v_scale(1))
    assert torch.equal(_bits(pool.k_cache(1))[batch.out_loc], _bits(k_want))
    assert torch.equal(_bits(pool.v_cache(1))[batch.out_loc], _bits(v_want))
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    # None really means "read the pool": without the new k/v there, the output changes
    pool._kv.copy_(fresh)
    backend = TorchBackend(cfg)
    backend.prepare(batch)
    assert not torch.allclose(backend.forward(q, None, None, 0, batch), want[0])


@pytest.mark.parametrize("case", list(CASES))
def test_hybrid_stores_once_and_attends_with_the_phase_backend(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from radixserve.attention.hybrid import HybridBackend

    cfg, batch, q, k, v = backend_case("cpu", torch.float32, 4, *CASES[case], (4, 2), 16)
    pool, fresh = cfg.kv_pool, cfg.kv_pool._kv.clone()
    want = run_backend(TorchBackend(cfg), dataclasses.replace(batch), q, k, v)
    pool._kv.copy_(fresh)
    stores: list[int] = []
    store = pool.store_kv

    def counted_store(k, v, out_loc, layer_id):
        stores.append(layer_id)
        store(k, v, out_loc, layer_id)

    monkeypatch.setattr(pool, "store_kv", counted_store)
    prefill, decode = RecordingTorch(cfg), RecordingTorch(cfg)
    got = run_backend(HybridBackend(prefill, decode), batch, q, k, v)
    assert stores == [0, 1]
    if case == "mixed":  # each part by its backend (`attention/mixed.py`), the same output
        assert prefill.attended == decode.attended == [0, 1]
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
        return
    picked, other = (decode, prefill) if batch.is_decode else (prefill, decode)
    assert picked.attended == [0, 1] and other.attended == []
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@pytest.mark.parametrize("case", list(CASES))
def test_torch_backend_reads_fp8_as_its_dequantized_values(case: str) -> None:
    """Over an FP8 pool (K and V scales 0.3 and 2.5), exactly what it gives over a float32 pool
    holding fp8 * scale; and within FP8's error of the float32 pool holding the unquantized k/v."""
    cfg8, batch, q, k, v = backend_case("cpu", torch.float32, 4, *CASES[case], (4, 2), 16,
                                        kv_dtype=FP8)
    cfg32, *_ = backend_case("cpu", torch.float32, 4, *CASES[case], (4, 2), 16)
    pool8, pool32 = cfg8.kv_pool, cfg32.kv_pool
    got = run_backend(TorchBackend(cfg8), dataclasses.replace(batch), q, k, v)
    for layer in range(pool8.num_layers):  # the float32 pool: what the FP8 one holds, widened
        pool32.k_cache(layer).copy_(dequantize_kv_ref(pool8.k_cache(layer), pool8.k_scale(layer)))
        pool32.v_cache(layer).copy_(dequantize_kv_ref(pool8.v_cache(layer), pool8.v_scale(layer)))
    backend32 = TorchBackend(dataclasses.replace(cfg32, page_table=cfg8.page_table))
    backend32.prepare(batch)
    for layer, g in enumerate(got):
        want = backend32.forward(q, None, None, layer, batch)  # the pool holds k/v already
        torch.testing.assert_close(g, want, rtol=1e-6, atol=1e-6)


def test_a_backend_refuses_a_kv_dtype_it_cannot_read() -> None:
    """The base contract reads the model's dtype only; a backend claims more by overriding
    `reads_kv_dtype`, so an FP8 pool can never meet a backend that would misread it."""
    from types import SimpleNamespace

    from radixserve.attention.base import BaseAttnBackend
    from radixserve.attention.flashinfer_backend import FlashInferBackend

    class ModelDtypeOnly(BaseAttnBackend):
        def prepare(self, batch) -> None: ...

        def attend(self, q, layer_id, batch):
            return q

    cfg8, *_ = backend_case("cpu", torch.float32, 4, *CASES["decode"], (4, 2), 16, kv_dtype=FP8)
    with pytest.raises(ValueError, match="cannot read a torch.float8_e4m3fn KV cache"):
        ModelDtypeOnly(cfg8)
    ModelDtypeOnly(backend_case("cpu", torch.float32, 4, *CASES["decode"], (4, 2), 16)[0])
    reads = FlashInferBackend.reads_kv_dtype  # FlashInfer: 16-bit q over its own dtype or FP8
    bf16 = SimpleNamespace(cfg=SimpleNamespace(dtype=torch.bfloat16))
    assert reads(bf16, FP8) and reads(bf16, torch.bfloat16)
    assert not reads(bf16, torch.float16)
    assert reads(SimpleNamespace(cfg=SimpleNamespace(dtype=torch.float32)), FP8)  # Triton reads


def test_a_mixed_batch_splits_at_its_trailing_one_token_requests() -> None:
    from radixserve.attention.mixed import split_decode_tail

    _, batch, *_ = backend_case("cpu", torch.float32, 4, [9, 0, 5, 30, 7], [6, 11, 2, 1, 1],
                                (4, 2), 16)
    parts = split_decode_tail(batch)
    assert parts is not None and parts.split == 6 + 11 + 2  # the third request ends the prefill
    assert parts.prefill.extend_lens_cpu == [6, 11, 2] and parts.decode.extend_lens_cpu == [1, 1]
    assert parts.decode.is_decode and not parts.prefill.is_decode
    assert parts.decode.seq_lens.tolist() == [31, 8]
    assert torch.equal(parts.decode.out_loc, batch.out_loc[19:])
    assert torch.equal(parts.prefill.req_rows, batch.req_rows[:3])
    for prefix, ext in (([9, 0], [6, 11]), ([0, 4], [1, 1])):  # prompts only; decode only
        _, other, *_ = backend_case("cpu", torch.float32, 4, prefix, ext, (4, 2), 16)
        assert split_decode_tail(other) is None


def test_flashinfer_graphs_of_one_size_share_its_wrapper() -> None:
    """A size captured twice (LoRA's decode graphs with and without the update) plans the same
    graph wrapper again (its buffers are the ones both graphs read), not a second one."""
    from types import SimpleNamespace

    from radixserve.attention.flashinfer_backend import FlashInferBackend

    made, planned = [], []
    fake = SimpleNamespace(_fallback=None, _graph={}, _graph_indices="indices",
                           _new_decode_wrapper=lambda bs: made.append(bs) or f"wrapper{bs}",
                           _plan=lambda w, batch, indices: planned.append((w, batch.bs)))
    for bs in (4, 4, 8):
        FlashInferBackend.prepare_for_capture(fake, SimpleNamespace(is_decode=True, bs=bs))
    assert made == [4, 8]
    assert planned == [("wrapper4", 4), ("wrapper4", 4), ("wrapper8", 8)]
