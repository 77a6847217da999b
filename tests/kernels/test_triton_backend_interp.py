"""The Triton attention backend end to end on CPU (kernels in Triton's interpreter) against the
torch reference backend: prefill, extend over a cached prefix, decode, sliding-window layers, and
the CUDA-graph hooks' static buffers."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from tests.kernels.kernel_cases import (
    WINDOW_CASES,
    backend_case,
    interpreter_only,
    run_backend,
    windowed_reference,
)

pytestmark = interpreter_only
CASES = {
    "prefill": ([0, 0], [5, 40]),
    "extend": ([9, 33, 0], [1, 20, 7]),
    "decode": ([0, 4, 15, 16, 80], [1] * 5),
    "mixed": ([0, 9, 40, 16, 3], [30, 12, 1, 1, 1]),  # prompt chunks, then decode tokens
}


# prefill and extend twice, decode and mixed (seconds a case: the decode kernel) once, each page
# size, stored and unstored new k/v, and cache dtype among them
@pytest.mark.fast_cases("prefill-1-False-kv-model", "prefill-16-True-kv-fp8",
                        "extend-16-False-kv-fp8", "extend-16-True-kv-model",
                        "decode-16-True-kv-fp8", "mixed-1-False-kv-model")
@pytest.mark.parametrize("kv_dtype", [None, torch.float8_e4m3fn], ids=["kv-model", "kv-fp8"])
@pytest.mark.parametrize("page,kv_stored", [(1, False), (16, False), (16, True)])
@pytest.mark.parametrize("case", list(CASES))
def test_triton_backend_matches_torch(case: str, page: int, kv_stored: bool, kv_dtype) -> None:
    """`kv_stored`: the new k/v are in the pool already (the fused rotary kernel's way). An FP8
    pool (with scales) is read alike: the kernels fold the scales where the reference multiplies."""
    from radixserve.attention.torch_backend import TorchBackend
    from radixserve.attention.triton_backend import TritonBackend

    cfg, batch, q, k, v = backend_case("cpu", torch.float32, page, *CASES[case], (4, 2), 16,
                                       seed=page, kv_dtype=kv_dtype)
    want = run_backend(TorchBackend(cfg), dataclasses.replace(batch), q, k, v)
    got = run_backend(TritonBackend(cfg), batch, q, k, v, kv_stored=kv_stored)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # (left out of `make test-fast`; `make test` runs it)
@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("case", [*WINDOW_CASES, "mixed"])
def test_windowed_layers_match_torch(case: str, page: int) -> None:
    """A model with windows (24, None): layer 0 masks keys outside its window, layer 1 sees all,
    as the torch backend does; a mixed batch's prompt chunks and decode tail alike, also with
    torch prefilling and Triton decoding."""
    from radixserve.attention.hybrid import HybridBackend
    from radixserve.attention.torch_backend import TorchBackend
    from radixserve.attention.triton_backend import TritonBackend

    lens = WINDOW_CASES[case] if case in WINDOW_CASES else CASES[case]
    cfg, batch, q, k, v = backend_case("cpu", torch.float32, page, *lens, (8, 2), 16, seed=page)
    cfg = dataclasses.replace(cfg, windows=(24, None))
    want = run_backend(TorchBackend(cfg), dataclasses.replace(batch), q, k, v)
    backends = [TritonBackend(cfg)]
    if case == "mixed":
        backends.append(HybridBackend(TorchBackend(cfg), TritonBackend(cfg)))
    for backend in backends:
        got = run_backend(backend, dataclasses.replace(batch), q, k, v)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    assert (got[0].double() - windowed_reference(cfg, batch, q, 0, None)).abs().max() > 1e-2


def _refilled(captured, batch):
    """What `CudaGraphRunner` hands a replay: the captured batch's tensors refilled in place with
    `batch`'s rows and lengths, and `batch`'s host-side lengths."""
    captured.req_rows.copy_(batch.req_rows)
    captured.seq_lens.copy_(batch.seq_lens)
    return dataclasses.replace(captured, seq_lens_cpu=batch.seq_lens_cpu)


def test_graph_hooks_reuse_static_buffers_and_follow_the_new_batch() -> None:
    from radixserve.attention.torch_backend import TorchBackend
    from radixserve.attention.triton_backend import TritonBackend

    cfg, batch, q, k, v = backend_case("cpu", torch.float32, 4, [3, 30, 0, 12], [1] * 4, (4, 2), 16)
    backend = TritonBackend(cfg)
    backend.init_cuda_graph(8)
    captured = dataclasses.replace(batch, req_rows=torch.zeros_like(batch.req_rows),
                                   seq_lens=torch.ones_like(batch.seq_lens), seq_lens_cpu=[1] * 4)
    backend.prepare_for_capture(captured)
    cap_md = captured.attn_metadata
    replay = _refilled(captured, batch)
    backend.prepare_for_replay(replay)
    md = replay.attn_metadata
    # a replayed graph reads the buffers it was captured with: same storage, new contents
    assert md.seq_lens.data_ptr() == cap_md.seq_lens.data_ptr()
    assert md.req_rows.data_ptr() == cap_md.req_rows.data_ptr()
    assert md.num_splits == cap_md.num_splits
    assert md.seq_lens.tolist() == batch.seq_lens_cpu
    got = backend.forward(q, k, v, 0, dataclasses.replace(batch, attn_metadata=cap_md))
    want = run_backend(TorchBackend(cfg), dataclasses.replace(batch), q, k, v, layers=1)[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_decode_kernel_rotates_the_new_token_only_in_small_decode_batches() -> None:
    """Up to `ROPE_IN_DECODE_MAX_BS` decode requests the decode kernel takes q/k unrotated (one
    launch fewer); larger decode batches (where it measured slower on the H200), prefill and
    mixed batches, and heads the kernel cannot rotate keep the rotary kernel; so does a
    verification step's decode rows at any size (a row reads the keys the rows before it store
    in the same launch: a fused store would race them)."""
    from radixserve.attention.triton_backend import TritonBackend

    most = TritonBackend.ROPE_IN_DECODE_MAX_BS
    for lens, dim, verify, fused in (([5] * most, 32, False, True),
                                     ([5] * (most + 1), 32, False, False),
                                     ([5, 9], 24, False, False), ([5, 6, 7], 32, True, False)):
        cfg, batch, *_ = backend_case("cpu", torch.float32, 4, lens, [1] * len(lens), (4, 2), dim)
        batch.verify = verify
        backend = TritonBackend(cfg)
        backend.prepare(batch)
        assert backend.fuses_rope(batch) is fused
        assert backend.fuses_rope_at(len(lens)) is (fused or verify)
    for case in ("prefill", "mixed"):
        cfg, batch, *_ = backend_case("cpu", torch.float32, 4, *CASES[case], (4, 2), 32)
        backend = TritonBackend(cfg)
        backend.prepare(batch)
        assert not backend.fuses_rope(batch)


@pytest.mark.slow  # (left out of `make test-fast`; `make test` runs it)
def test_graph_replay_reads_the_longest_first_order_the_host_copied_in() -> None:
    """From ORDER_MIN_BS decode requests the host sorts the lengths and copies the launch order
    into the graph's buffer: a replay reads the new batch's longest-first order (ties in batch
    order) from the storage it was captured with, and attends as the torch backend does."""
    from radixserve.attention.torch_backend import TorchBackend
    from radixserve.attention.triton_backend import TritonBackend
    from radixserve_kernels.decode_attention import ORDER_MIN_BS

    n = ORDER_MIN_BS
    cfg, batch, q, k, v = backend_case("cpu", torch.float32, 4, [(7 * i) % 23 for i in range(n)],
                                       [1] * n, (4, 2), 16)
    backend = TritonBackend(cfg)
    backend.init_cuda_graph(n)
    captured = dataclasses.replace(batch, req_rows=torch.zeros_like(batch.req_rows),
                                   seq_lens=torch.ones_like(batch.seq_lens), seq_lens_cpu=[1] * n)
    backend.prepare_for_capture(captured)
    cap_md = captured.attn_metadata
    replay = _refilled(captured, batch)
    backend.prepare_for_replay(replay)
    order = replay.attn_metadata.order
    assert order.data_ptr() == cap_md.order.data_ptr()
    assert sorted(order.tolist()) == list(range(n))
    ranked = [(-batch.seq_lens_cpu[i], i) for i in order.tolist()]
    assert ranked == sorted(ranked) and len({r[0] for r in ranked}) < n  # longest first, with ties
    got = backend.forward(q, k, v, 0, dataclasses.replace(batch, attn_metadata=cap_md))
    want = run_backend(TorchBackend(cfg), dataclasses.replace(batch), q, k, v, layers=1)[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_warm_up_launches_every_unrotated_unordered_decode_kernel_a_mixed_tail_can_take(
        monkeypatch) -> None:
    """A mixed batch's decode tail takes the unrotated kernel, without a launch order under
    ORDER_MIN_BS requests: kinds the graphs' warm-up never launches (they rotate up to
    ROPE_IN_DECODE_MAX_BS and order from ORDER_MIN_BS). The warm-up launches one batch of every
    split count a tail of 1 .. ORDER_MIN_BS - 1 requests can take, none rotating or ordered."""
    import radixserve_kernels
    from radixserve.attention.triton_backend import TritonBackend
    from radixserve_kernels import decode_num_splits
    from radixserve_kernels.decode_attention import ORDER_MIN_BS

    cfg = backend_case("cpu", torch.float32, 4, [3, 5], [1, 1], (4, 2), 16)[0]
    backend = TritonBackend(cfg)
    calls = []

    def spy(q, *args, **kw):  # records the launch (the kernel itself: 34 s in the interpreter)
        calls.append((q.shape[0], kw["num_splits"], kw.get("new_kv"), kw.get("order")))
        return torch.zeros_like(q)

    monkeypatch.setattr(radixserve_kernels, "decode_attention", spy)
    backend.warm_up_eager_decode([1, 2, 4, 8, 16, 32, 64, 128])
    assert all(new is None and order is None for _, _, new, order in calls)
    assert max(c[0] for c in calls) == ORDER_MIN_BS - 1
    assert {c[1] for c in calls} == {decode_num_splits(b, 2, backend._sms)
                                      for b in range(1, ORDER_MIN_BS)}
    calls.clear()
    backend.warm_up_eager_decode([1, 2, 4])  # graphs to 4 requests: tails to 4
    assert [c[0] for c in calls] == [1, 2, 4]
