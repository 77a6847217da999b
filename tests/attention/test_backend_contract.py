"""The backend contract on CPU: `forward` stores the new k/v in the pool (unless given None, when
the pool already holds them) and then attends; a hybrid stores once and attends with the backend
the batch's phase picks."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from tests.kernels.kernel_cases import backend_case, run_backend

from radixserve.attention.torch_backend import TorchBackend

CASES = {"extend": ([9, 0], [6, 11]), "decode": ([0, 4, 15, 33], [1] * 4)}


class RecordingTorch(TorchBackend):
    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self.attended: list[int] = []

    def attend(self, q, layer_id, batch):
        self.attended.append(layer_id)
        return super().attend(q, layer_id, batch)


@pytest.mark.parametrize("case", list(CASES))
def test_forward_without_kv_attends_over_what_the_pool_holds(case: str) -> None:
    cfg, batch, q, k, v = backend_case("cpu", torch.float32, 4, *CASES[case], (4, 2), 16)
    pool, fresh = cfg.kv_pool, cfg.kv_pool._kv.clone()
    want = run_backend(TorchBackend(cfg), dataclasses.replace(batch), q, k, v)
    stored_by_forward = pool._kv.clone()
    pool._kv.copy_(fresh)
    got = run_backend(TorchBackend(cfg), dataclasses.replace(batch), q, k, v, kv_stored=True)
    assert torch.equal(pool._kv, stored_by_forward)
    assert torch.equal(pool.k_cache(1)[batch.out_loc], k)
    assert torch.equal(pool.v_cache(1)[batch.out_loc], v)
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
    picked, other = (decode, prefill) if batch.is_decode else (prefill, decode)
    assert picked.attended == [0, 1] and other.attended == []
    assert stores == [0, 1]
    for g, w in zip(got, want):
        assert torch.equal(g, w)
