"""Attention through FlashInfer's paged prefill and decode wrappers (`pip install
'radixserve[gpu]'`; 0.5.3 tested). FlashInfer has no float32 kernels, so a float32 model runs
this backend's batches through the Triton kernels instead. An FP8 KV cache is planned with
`kv_data_type` float8_e4m3fn and run with the layer's `k_scale`/`v_scale` (FlashInfer folds the
K scale into the softmax scale and multiplies the output by the V scale)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from radixserve.attention.base import ATTN_BACKENDS, AttnConfig, BaseAttnBackend
from radixserve.attention.flashinfer_limits import flashinfer_head_dim_blocker
from radixserve.attention.triton_backend import TritonBackend
from radixserve_kernels.kv_quant import is_fp8

if TYPE_CHECKING:
    from radixserve.core.batch import Batch

_WORKSPACE_BYTES = 128 * 1024 * 1024
_INT_WORKSPACE_BYTES = 8 * 1024 * 1024


class FlashInferMetadata(NamedTuple):
    wrapper: Any  # the planned prefill or decode wrapper


def _import_flashinfer():
    try:
        import flashinfer
    except ImportError as e:
        raise ValueError(
            "attention backend 'flashinfer' needs the flashinfer package "
            "(pip install 'radixserve[gpu]'); or choose --attn triton"
        ) from e
    return flashinfer


@ATTN_BACKENDS.register("flashinfer")
class FlashInferBackend(BaseAttnBackend):
    def __init__(self, cfg: AttnConfig) -> None:
        super().__init__(cfg)
        fi = _import_flashinfer()
        self._fallback = TritonBackend(cfg) if cfg.dtype == torch.float32 else None
        if self._fallback is None and (why := flashinfer_head_dim_blocker(cfg.head_dim)):
            raise ValueError(f"--attn flashinfer: {why}; use --attn triton")
        group = cfg.num_qo_heads // cfg.num_kv_heads
        self._tensor_cores = group >= 4  # FlashInfer's own advice: prefill kernels win at big GQA
        self._float_ws = torch.zeros(_WORKSPACE_BYTES, dtype=torch.uint8, device=cfg.device)
        self._int_ws = torch.empty(_INT_WORKSPACE_BYTES, dtype=torch.uint8, device=cfg.device)
        # fa2: FlashInfer's fa3 path is slower here, as mini-sglang measured too
        self._prefill = fi.BatchPrefillWithPagedKVCacheWrapper(self._float_ws, "NHD", backend="fa2")
        self._prefill.reset_workspace_buffer(self._float_ws, self._int_ws)
        self._decode = self._new_decode_wrapper()
        self._pages_per_row = -(-cfg.page_table.shape[1] // cfg.page_size)
        self._graph: dict[int, Any] = {}
        self._graph_indptr = self._graph_indices = self._graph_last = None
        # NOTE: plan() stages its schedule in a pinned host buffer copied asynchronously; the
        # next plan() must not overwrite it before that copy ran (overlap scheduling plans
        # batch N+1 while the GPU still runs batch N).
        self._planned = torch.cuda.Event() if cfg.device.type == "cuda" else None
        self._planned_once = False

    def reads_kv_dtype(self, kv_dtype: torch.dtype) -> bool:
        if self.cfg.dtype == torch.float32:
            return True  # the Triton fallback reads
        # NOTE: FlashInfer compiles q and KV of one 16-bit dtype, or 16-bit q over FP8 KV
        return kv_dtype == self.cfg.dtype or is_fp8(kv_dtype)

    def _new_decode_wrapper(self, bs: int | None = None) -> Any:
        fi = _import_flashinfer()
        kwargs: dict[str, Any] = {}
        if bs is not None:
            assert self._graph_indptr is not None, "init_cuda_graph first"
            kwargs = {
                "use_cuda_graph": True,
                "paged_kv_indptr_buffer": self._graph_indptr[: bs + 1],
                "paged_kv_indices_buffer": self._graph_indices,
                "paged_kv_last_page_len_buffer": self._graph_last[:bs],
            }
        wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(
            self._float_ws, "NHD", use_tensor_cores=self._tensor_cores, backend="fa2", **kwargs
        )
        wrapper.reset_workspace_buffer(self._float_ws, self._int_ws)  # one int workspace for all
        return wrapper

    def _plan(self, wrapper: Any, batch: Batch, indices_out: torch.Tensor | None) -> None:
        from radixserve_kernels import page_indices

        cfg, p = self.cfg, self.cfg.page_size
        seq = batch.seq_lens_cpu
        n_pages = torch.tensor([-(-s // p) for s in seq], dtype=torch.int32)
        indptr = torch.zeros(len(seq) + 1, dtype=torch.int32)
        torch.cumsum(n_pages, 0, out=indptr[1:])
        last_len = torch.tensor([(s - 1) % p + 1 for s in seq], dtype=torch.int32)
        total = int(indptr[-1])
        if indices_out is None:
            indices_out = torch.empty(max(total, 1), dtype=torch.int32, device=cfg.device)
        indptr_dev = indptr.to(cfg.device, non_blocking=True)
        page_indices(cfg.page_table, batch.req_rows, batch.seq_lens, p, indptr_dev, indices_out)
        common = {
            "num_qo_heads": cfg.num_qo_heads, "num_kv_heads": cfg.num_kv_heads, "page_size": p,
            "sm_scale": cfg.scale, "q_data_type": cfg.dtype, "kv_data_type": cfg.kv_pool.dtype,
            "non_blocking": True,
        }
        if self._planned is not None and self._planned_once:
            self._planned.synchronize()
        if batch.is_decode:
            wrapper.plan(indptr, indices_out[:total], last_len, head_dim=cfg.head_dim, **common)
        else:
            qo_indptr = torch.zeros(len(seq) + 1, dtype=torch.int32)
            torch.cumsum(torch.tensor(batch.extend_lens_cpu, dtype=torch.int32), 0, out=qo_indptr[1:])
            wrapper.plan(
                qo_indptr, indptr, indices_out[:total], last_len, head_dim_qk=cfg.head_dim,
                causal=True, **common,
            )
        if self._planned is not None:
            self._planned.record()
            self._planned_once = True
        batch.attn_metadata = FlashInferMetadata(wrapper)

    def prepare(self, batch: Batch) -> None:
        if self._fallback is not None:
            return self._fallback.prepare(batch)
        self._plan(self._decode if batch.is_decode else self._prefill, batch, None)

    def attend(self, q: torch.Tensor, layer_id: int, batch: Batch,
               out: torch.Tensor | None = None) -> torch.Tensor:
        if self._fallback is not None:
            return self._fallback.attend(q, layer_id, batch, out)
        md: FlashInferMetadata = batch.attn_metadata  # type: ignore[assignment]
        pool, p = self.cfg.kv_pool, self.cfg.page_size
        k_cache, v_cache = pool.k_cache(layer_id), pool.v_cache(layer_id)
        paged = (k_cache.view(-1, p, *k_cache.shape[1:]), v_cache.view(-1, p, *v_cache.shape[1:]))
        # NOTE: q as it comes, a strided view of the qkv projection: FlashInfer's FA2 kernels
        # take q's row and head strides, and a copy cost 1.2 ms per 8k-token prefill on the H200
        if not pool.is_fp8:
            return md.wrapper.run(q, paged, out=out)
        # floats, so a CUDA graph captures them as constants; a V scale of 1.0 is left out, as
        # FlashInfer multiplies the output by it in a separate launch
        v_scale = pool.v_scale(layer_id)
        return md.wrapper.run(q, paged, k_scale=pool.k_scale(layer_id),
                              v_scale=None if v_scale == 1.0 else v_scale, out=out)

    # CUDA graphs: one decode wrapper per captured batch size over shared static buffers;
    # replay re-plans into them (plan() runs outside the graph, as FlashInfer requires).
    def init_cuda_graph(self, max_bs: int) -> None:
        if self._fallback is not None:
            return self._fallback.init_cuda_graph(max_bs)
        dev = self.cfg.device
        self._graph_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self._graph_indices = torch.zeros(max_bs * self._pages_per_row, dtype=torch.int32, device=dev)
        self._graph_last = torch.ones(max_bs, dtype=torch.int32, device=dev)

    def prepare_for_capture(self, batch: Batch) -> None:
        if self._fallback is not None:
            return self._fallback.prepare_for_capture(batch)
        assert batch.is_decode, "decode batches are captured"
        # one wrapper a size: a size's graphs (with and without LoRA's update) replay it in turn,
        # each planned again before its replay
        if batch.bs not in self._graph:
            self._graph[batch.bs] = self._new_decode_wrapper(batch.bs)
        self._plan(self._graph[batch.bs], batch, self._graph_indices)

    def prepare_for_replay(self, batch: Batch) -> None:
        if self._fallback is not None:
            return self._fallback.prepare_for_replay(batch)
        self._plan(self._graph[batch.bs], batch, self._graph_indices)
