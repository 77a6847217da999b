"""The model on its device with its KV pool and attention backend: batch in, last-token logits out."""
from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from radixserve.attention import AttnConfig, create_attn_backend
from radixserve.config import EngineConfig
from radixserve.distributed import get_comm, get_tp_info
from radixserve.engine.batch import Batch
from radixserve.engine.context import forward_batch
from radixserve.engine.cuda_graph import CudaGraphRunner
from radixserve.engine.device import resolve_device
from radixserve.engine.kv_sizing import kv_token_capacity
from radixserve.kvcache.pool import MHAKVPool
from radixserve.kvcache.sizing import kv_bytes_per_token
from radixserve.models.default_model import resolve_model_path
from radixserve.models.loader import load_model, resolve_dtype
from radixserve.scheduler.table import TableManager

logger = logging.getLogger(__name__)


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


class Engine:
    def __init__(self, cfg: EngineConfig, max_running_requests: int) -> None:
        from transformers import AutoConfig

        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        torch.manual_seed(cfg.seed)
        t0 = time.perf_counter()
        self.model_path: Path = resolve_model_path(cfg.model)
        self.dtype = resolve_dtype(cfg.dtype, AutoConfig.from_pretrained(self.model_path), self.device)
        self.model, self.hf_config = load_model(
            self.model_path, self.dtype, self.device, load_format=cfg.load_format
        )
        self.max_seq_len = int(self.hf_config.max_position_embeddings)
        logger.info("load: %s weights on %s (%s) in %.1fs", self.model_path.name, self.device, self.dtype,
                    time.perf_counter() - t0)
        t1 = time.perf_counter()
        self.page_size = cfg.page_size

        hc, tp = self.hf_config, get_tp_info()
        head_dim = getattr(hc, "head_dim", None) or hc.hidden_size // hc.num_attention_heads
        kv_heads = max(1, hc.num_key_value_heads // tp.size)
        per_token = kv_bytes_per_token(hc.num_hidden_layers, kv_heads, head_dim, self.dtype)
        want = max_running_requests * _round_up(self.max_seq_len, cfg.page_size)
        tokens = cfg.max_kv_tokens or kv_token_capacity(self.device, per_token, cfg.memory_ratio, want)
        tokens = get_comm().min_int(tokens)  # every rank schedules alike: size for the tightest
        self.num_pages = max(1, tokens // cfg.page_size)
        self.kv_pool = MHAKVPool(
            hc.num_hidden_layers, self.num_pages, cfg.page_size, kv_heads, head_dim,
            self.dtype, self.device,
        )
        logger.info("KV sizing: %d tokens (%.2f GiB) in %.1fs", self.num_pages * cfg.page_size,
                    self.num_pages * cfg.page_size * per_token / 2**30, time.perf_counter() - t1)
        # one spare row, so a CUDA-graph padding request never aliases a live one
        self.table = TableManager(
            max_running_requests + 1, _round_up(self.max_seq_len, cfg.page_size), self.device
        )
        self.padding_row = self.table.alloc_row()
        self.table.page_table[self.padding_row].fill_(self.kv_pool.dummy_slot)
        self.attn_cfg = AttnConfig(
            num_qo_heads=hc.num_attention_heads // tp.size, num_kv_heads=kv_heads,
            head_dim=head_dim, page_size=cfg.page_size, kv_pool=self.kv_pool,
            page_table=self.table.page_table, device=self.device, dtype=self.dtype,
        )
        self.attn_backend = create_attn_backend(cfg.attn, self.attn_cfg)
        t2 = time.perf_counter()
        self.graph_runner = self._make_graph_runner(cfg.cuda_graph_max_bs, max_running_requests)
        if self.graph_runner is not None:
            logger.info("graph capture: decode CUDA graphs in %.1fs", time.perf_counter() - t2)
        logger.info(
            "engine ready in %.1fs: %s on %s (%s), KV %d pages x %d tokens, attention %s",
            time.perf_counter() - t0, self.model_path, self.device, self.dtype, self.num_pages,
            cfg.page_size, type(self.attn_backend).__name__,
        )

    def _make_graph_runner(self, max_bs: int | None, max_running: int) -> CudaGraphRunner | None:
        supports = self.attn_backend.supports_cuda_graph
        if self.device.type != "cuda" or max_bs == 0:
            return None
        if not supports:
            if max_bs:
                raise ValueError(f"--cuda-graph-max-bs {max_bs}: attention backend "
                                 f"{type(self.attn_backend).__name__} has no CUDA-graph support")
            return None
        return CudaGraphRunner(self, min(max_bs or 256, max_running))

    @torch.inference_mode()
    def forward_hidden(self, batch: Batch) -> torch.Tensor:
        """Hidden states of every token of the batch [T, H] (writes their KV)."""
        self.attn_backend.prepare(batch)
        with forward_batch(batch, self.attn_backend):
            return self.model(batch.input_ids, batch.positions)

    @torch.inference_mode()
    def forward(self, batch: Batch) -> torch.Tensor:
        """Logits [bs, vocab] (model dtype) of each request's last token in the batch."""
        if self.graph_runner is not None and self.graph_runner.can_run(batch):
            return self.graph_runner.run(batch)
        hidden = self.forward_hidden(batch)
        if not batch.is_decode:
            hidden = hidden[torch.cumsum(batch.extend_lens, 0) - 1]
        return self.model.compute_logits(hidden)
