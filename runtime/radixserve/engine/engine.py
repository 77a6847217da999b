"""The model on its device with its KV pool and attention backend: batch in, last-token logits out."""
from __future__ import annotations

import functools
import logging
import time
from pathlib import Path
from typing import NamedTuple

import torch

from radixserve import settings
from radixserve.attention import AttnConfig, BaseAttnBackend, create_attn_backend
from radixserve.config import GPU_PREFILL_LENGTH, EngineConfig, SchedulerConfig, lora_path_pairs
from radixserve.core.batch import Batch
from radixserve.core.context import forward_batch
from radixserve.core.table import TableManager
from radixserve.distributed import get_comm, get_tp_info
from radixserve.engine.cuda_graph import CudaGraphRunner, GraphCaptureBuffer
from radixserve.engine.device import resolve_device
from radixserve.engine.prefill_graph import PrefillGraphRunner
from radixserve.kvcache.host_pool import (
    HostKVPool,
    HostTierSize,
    check_host_memory,
    host_tier_tokens,
)
from radixserve.kvcache.kv_dtype import check_kv_dtype_on_device, kv_dtype_name, resolve_kv_dtype
from radixserve.kvcache.kv_scales import KVScales, checkpoint_kv_scales
from radixserve.kvcache.pool import MHAKVPool
from radixserve.kvcache.sizing import kv_bytes_per_token, kv_token_capacity
from radixserve.lora.adapter import config_rank
from radixserve.lora.pool import LoRAPool
from radixserve.models.decoder import DecoderModel
from radixserve.models.hf_config import text_config
from radixserve.models.loader import load_model, resolve_dtype
from radixserve.models.multimodal import checkpoint_names
from radixserve.models.source import ModelSource
from radixserve.utils import kernel_path
from radixserve_kernels import set_pdl

logger = logging.getLogger(__name__)


# Measured on the H200 (docs/benchmarks.md): graphs make a 300-token prefill step 2.2x faster and
# a 400-token one 3.1x, where the launches dwarf the GPU work; and in the offline workload's mixed
# 8k-token steps the GPU sat idle half the time behind a slow host, which graphs to 8,192 tokens
# take from 35-38 to 20-24 ms a step. So the default covers the default
# prefill chunk; larger batches stay eager unless asked for.
DEFAULT_PREFILL_GRAPH_TOKENS = GPU_PREFILL_LENGTH


def prefill_graph_tokens(asked: int | None, max_prefill_length: int) -> int:
    """The largest prefill batch captured (0: none): what was asked, else the default, never
    more than the scheduler's largest prefill batch (larger counts would never replay)."""
    return min(DEFAULT_PREFILL_GRAPH_TOKENS if asked is None else asked, max_prefill_length)


class Companion(NamedTuple):
    """What another engine of this process will hold: its weights, and KV bytes per token."""

    weight_bytes: int
    bytes_per_token: int


NO_COMPANION = Companion(0, 0)


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def decode_logits(model: torch.nn.Module, attn_backend: BaseAttnBackend,
                  lora: LoRAPool | None, batch: Batch) -> torch.Tensor:
    """Logits [bs, vocab] of a decode batch (one token per request): what a CUDA graph captures.
    A module function, given to the graph runner with its arguments bound, so that the runner
    holds the model and the backend, never the engine. With LoRA on, the graph groups the
    batch's tokens by adapter slot itself, from its requests' rows."""
    if lora is not None:
        batch.lora = lora.groups(batch)
    with forward_batch(batch, attn_backend):
        return model.compute_logits(model(batch.input_ids, batch.positions))


class Engine:
    def __init__(self, cfg: EngineConfig, max_running_requests: int,
                 max_prefill_length: int | None = None, source: ModelSource | None = None,
                 host_tier: HostTierSize | None = None,
                 companion: Companion = NO_COMPANION, verify_tokens: int = 0,
                 scratch_rows: int = 0) -> None:
        """`max_prefill_length`: the scheduler's largest prefill batch, in tokens (what the
        prefill graphs cover unless `cfg.prefill_graph_max_tokens` says otherwise); None: the
        device's default (`SchedulerConfig.prefill_length`). `source`: `cfg.model` resolved
        (else resolved here). `host_tier`: also allocate a host KV tier of that size
        (`host_pool`; on CPU the device pool leaves it room in the same budget). `companion`:
        another engine this process starts after this one (a draft model), whose weights and KV
        pool of as many tokens this one's sizing leaves room for. `verify_tokens` (speculative
        decoding): the most tokens a verification step carries for one request (its last and
        its drafts), which the decode graphs cover as rows of their own (`verifies_as_decode`).
        `scratch_rows`: table rows beyond the requests' (a tree of drafts' nodes, each a decode
        row of its own path: `scheduler/verify_tree.py`).
        """
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        if max_prefill_length is None:
            max_prefill_length = SchedulerConfig().prefill_length(self.device.type)
        set_pdl(settings.PDL.get())  # RADIXSERVE_PDL, read in every rank's process
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        torch.manual_seed(cfg.seed)
        t0 = time.perf_counter()
        self.source = source or ModelSource.resolve(cfg.model)
        self.model_path: Path = self.source.path
        shape = self.source.config
        self._checkpoint_names = checkpoint_names(shape)
        self.dtype = resolve_dtype(cfg.dtype, shape, self.device)
        self.max_seq_len = cfg.context_limit(int(text_config(shape).max_position_embeddings))  # before any load
        self.model, self.hf_config = load_model(
            self.model_path, self.dtype, self.device, load_format=cfg.load_format,
            hf_config=shape)
        logger.info("load: %s weights on %s (%s) in %.1fs", self.model_path.name, self.device, self.dtype,
                    time.perf_counter() - t0)
        # adapter slots before the KV cache, which takes what memory is left
        self.lora_pool = self._make_lora_pool(max_running_requests + 1)
        t1 = time.perf_counter()
        self.page_size = cfg.page_size

        hc, tp = self.hf_config, get_tp_info()
        head_dim = getattr(hc, "head_dim", None) or hc.hidden_size // hc.num_attention_heads
        kv_heads = max(1, hc.num_key_value_heads // tp.size)
        self.kv_dtype = resolve_kv_dtype(cfg.kv_cache_dtype, self.dtype)
        check_kv_dtype_on_device(self.kv_dtype, self.device)
        scales = self._kv_scales(hc.num_hidden_layers)
        # this rank's KV bytes a token, all layers (also read by bench --phases)
        self.kv_bytes_per_token = per_token = kv_bytes_per_token(
            hc.num_hidden_layers, kv_heads, head_dim, self.kv_dtype)
        want = max_running_requests * _round_up(self.max_seq_len, cfg.page_size)
        # on CPU the host tier shares the budget: a token there costs its host copies too
        shared = (1 + host_tier.ratio if host_tier is not None and host_tier.size_gib is None
                  and self.device.type != "cuda" else 1)
        tokens = cfg.max_kv_tokens or kv_token_capacity(
            self.device, int(per_token * shared) + companion.bytes_per_token, cfg.memory_ratio,
            want, companion.weight_bytes)
        tokens = get_comm().min_int(tokens)  # every rank schedules alike: size for the tightest
        self.num_pages = max(1, tokens // cfg.page_size)
        self.kv_pool = MHAKVPool(
            hc.num_hidden_layers, self.num_pages, cfg.page_size, kv_heads, head_dim,
            self.kv_dtype, self.device, scales.k, scales.v,
        )
        vs_model = ""
        if self.kv_dtype != self.dtype:
            model_per_token = kv_bytes_per_token(hc.num_hidden_layers, kv_heads, head_dim, self.dtype)
            vs_model = (f", {model_per_token / per_token:.1f}x the tokens of a "
                        f"{kv_dtype_name(self.dtype)} cache")
        logger.info("KV sizing: %d tokens (KV cache %s, %d bytes/token%s, %.2f GiB) in %.1fs",
                    self.num_pages * cfg.page_size, kv_dtype_name(self.kv_dtype), per_token,
                    vs_model, self.num_pages * cfg.page_size * per_token / 2**30,
                    time.perf_counter() - t1)
        if self.kv_pool.is_fp8:
            logger.info("KV cache fp8_e4m3 scales (per layer and tensor): %s", scales.describe())
        self.host_pool: HostKVPool | None = None
        if host_tier is not None:
            host = get_comm().min_int(host_tier_tokens(
                host_tier, self.num_pages * cfg.page_size, per_token))
            check_host_memory(host * per_token * tp.size, self.device)  # every rank's, here
            self.host_pool = HostKVPool(hc.num_hidden_layers, max(1, host // cfg.page_size),
                                        cfg.page_size, kv_heads, head_dim, self.kv_dtype,
                                        pinned=self.device.type == "cuda")
        # one spare row, so a CUDA-graph padding request never aliases a live one
        self.table = TableManager(
            max_running_requests + 1 + scratch_rows, _round_up(self.max_seq_len, cfg.page_size),
            self.device
        )
        self.padding_row = self.table.alloc_row()
        self.table.page_table[self.padding_row].fill_(self.kv_pool.dummy_slot)
        self.attn_cfg = AttnConfig(
            num_qo_heads=hc.num_attention_heads // tp.size, num_kv_heads=kv_heads,
            head_dim=head_dim, page_size=cfg.page_size, kv_pool=self.kv_pool,
            page_table=self.table.page_table, device=self.device, dtype=self.dtype,
            windows=self._sliding_windows(),
        )
        self.attn_backend = create_attn_backend(cfg.attn, self.attn_cfg)
        t2 = time.perf_counter()
        self.graph_runner = self._make_graph_runner(cfg.cuda_graph_max_bs, max_running_requests,
                                                    verify_tokens)
        if self.graph_runner is not None:
            logger.info("graph capture: decode CUDA graphs in %.1fs", time.perf_counter() - t2)
        t3 = time.perf_counter()
        self.prefill_graphs = self._make_prefill_graphs(max_prefill_length)
        if self.prefill_graphs is not None:
            sizes = self.prefill_graphs.sizes
            logger.info("graph capture: prefill CUDA graphs, %d pieces for each of %d token "
                        "counts (%d-%d) in %.1fs", self.model.model.num_pieces, len(sizes),
                        sizes[0], sizes[-1], time.perf_counter() - t3)
        if self.device.type == "cuda":  # a step's logits have one row per request it carries
            t4 = time.perf_counter()
            self.model.warm_up_logits(max_running_requests)
            logger.info("warm-up: the LM head's GEMM for 1-%d rows in %.1fs", max_running_requests,
                        time.perf_counter() - t4)
        logger.info(
            "engine ready in %.1fs: %s on %s (%s), KV %d pages x %d tokens, attention %s",
            time.perf_counter() - t0, self.model_path, self.device, self.dtype, self.num_pages,
            cfg.page_size, type(self.attn_backend).__name__,
        )

    def _make_lora_pool(self, num_rows: int) -> LoRAPool | None:
        cfg = self.cfg
        if not cfg.lora:
            return None
        rank = cfg.max_lora_rank or max([16, *(config_rank(p) for p in
                                              lora_path_pairs(cfg.lora_paths).values())])
        pool = LoRAPool(self.model, cfg.max_loras_per_batch, rank, self.dtype, num_rows,
                        self.device)
        logger.info("LoRA: %d adapter slots of rank %d over %d projections (%.2f GiB)",
                    pool.num_slots, rank, len(pool.layers), pool.nbytes / 2**30)
        return pool

    def _sliding_windows(self) -> tuple[int | None, ...]:
        """The model's sliding windows; a window as long as the context is full attention."""
        windows = tuple(None if w is None or w >= self.max_seq_len else w
                        for w in self.model.sliding_windows())
        return windows if any(w is not None for w in windows) else ()

    def _kv_scales(self, num_layers: int) -> KVScales:
        """An FP8 cache's scales: the checkpoint's when it has them (random weights have none)."""
        if self.kv_dtype != torch.float8_e4m3fn:
            return KVScales.default(num_layers, "not an FP8 cache")
        if self.cfg.load_format == "dummy":
            return KVScales.default(num_layers, "random weights have no k_scale/v_scale")
        return checkpoint_kv_scales(self.model_path, num_layers, self._checkpoint_names)

    def _make_graph_runner(self, max_bs: int | None, max_running: int,
                           verify_tokens: int) -> CudaGraphRunner | None:
        supports = self.attn_backend.supports_cuda_graph
        if self.device.type != "cuda" or max_bs == 0:
            return None
        if not supports:
            if max_bs:
                raise ValueError(f"--cuda-graph-max-bs {max_bs}: attention backend "
                                 f"{type(self.attn_backend).__name__} has no CUDA-graph support")
            return None
        rows = max_running * max(1, verify_tokens)  # a verification step: a row a token
        buffer = GraphCaptureBuffer.create(min(max_bs or 256, rows), self.table.token_pool,
                                           self.table.page_table, self.padding_row)
        forward = functools.partial(decode_logits, self.model, self.attn_backend, None)
        lora = (None if self.lora_pool is None else
                functools.partial(decode_logits, self.model, self.attn_backend, self.lora_pool))
        return CudaGraphRunner(forward, self.attn_backend, buffer, lora, verify=verify_tokens > 0)

    def _make_prefill_graphs(self, max_prefill_length: int) -> PrefillGraphRunner | None:
        n = prefill_graph_tokens(self.cfg.prefill_graph_max_tokens, max_prefill_length)
        if self.device.type != "cuda" or n == 0 or not isinstance(
                getattr(self.model, "model", None), DecoderModel):
            return None
        if not kernel_path.use_triton(torch.empty(0, device=self.device)):
            # the layers' torch twins are not all capturable (the MoE reference reads expert
            # ids on the host), so without the Triton kernels prefill stays eager
            logger.info("prefill CUDA graphs: off without the Triton kernels (eager prefill)")
            return None
        if get_tp_info().size > 1:  # NOTE: not yet run on GPUs with TP: prefill stays eager
            logger.info("prefill CUDA graphs: off at tp %d (eager prefill)", get_tp_info().size)
            return None
        return PrefillGraphRunner(self.model.model, self.attn_backend, n, self.kv_pool.dummy_slot,
                                  lora=self.lora_pool)

    def release_cuda_graphs(self) -> None:
        """Destroy the captured graphs; the engine runs eager afterwards (it is being torn down).
        NOTE: a captured NCCL collective keeps a reference on its communicator until its graph
        is destroyed, and NCCL's finalize (inside destroy_process_group) waits for those
        references: with the decode graphs alive, leaving a TP group hung on every rank (seen
        on two H200s)."""
        runners = [r for r in (self.graph_runner, self.prefill_graphs) if r is not None]
        if not runners:
            return
        torch.cuda.synchronize(self.device)
        for r in runners:
            r.destroy()
        self.graph_runner = self.prefill_graphs = None

    @torch.inference_mode()
    def forward_hidden(self, batch: Batch) -> torch.Tensor:
        """Hidden states of every token of the batch [T, H] (writes their KV)."""
        if self.prefill_graphs is not None and self.prefill_graphs.can_run(batch):
            return self.prefill_graphs.run(batch)
        if batch.uses_lora and self.lora_pool is not None:
            batch.lora = self.lora_pool.groups(batch)
        self.attn_backend.prepare(batch)
        with forward_batch(batch, self.attn_backend):
            return self.model(batch.input_ids, batch.positions)

    @torch.inference_mode()
    def forward_keeping(self, batch: Batch, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A prefill batch's last-token logits, and the hidden states of its tokens at `keep`
        (prompt logprobs). Never a decode graph replay."""
        assert not batch.is_decode
        hidden = self.forward_hidden(batch)
        last = hidden[torch.cumsum(batch.extend_lens, 0) - 1]
        return self.model.compute_logits(last), hidden[keep]

    @torch.inference_mode()
    def forward_rows(self, batch: Batch, rows: torch.Tensor) -> torch.Tensor:
        """Logits [len(rows), vocab] at the batch's tokens `rows` (a verification step run as an
        extend: each drafted position; `verifies_as_decode`). Never a decode graph replay."""
        return self.model.compute_logits(self.forward_hidden(batch)[rows])

    def stage_decode(self, rows: list[int], starts: list[int], verify: bool = False) -> Batch | None:
        """A decode batch staged for a CUDA-graph replay (`CudaGraphRunner.stage`), or None where
        no graph runs it: build it on the device then (`engine/batch_builder.py`). `verify`: a
        verification step's rows (`Batch.verify`)."""
        if self.graph_runner is None:
            return None
        return self.graph_runner.stage(rows, starts, verify)

    def verifies_as_decode(self, rows: int) -> bool:
        """Whether a verification step of `rows` tokens runs as a decode batch, a row a token
        (`scheduler/verify_step.py`): where a decode graph takes that many rows (on CUDA an
        eager decode batch would re-read each request's KV for every row and gain nothing over
        the extend), and on CPU, which runs the same path without graphs. Otherwise it runs as
        an extend of each request's tokens."""
        if self.graph_runner is not None:
            return self.graph_runner.can_run_verify(rows)
        return self.device.type != "cuda"

    @torch.inference_mode()
    def forward(self, batch: Batch) -> torch.Tensor:
        """Logits [bs, vocab] (model dtype) of each request's last token in the batch."""
        if self.graph_runner is not None and self.graph_runner.can_run(batch):
            return self.graph_runner.run(batch)
        hidden = self.forward_hidden(batch)
        if not batch.is_decode:
            hidden = hidden[torch.cumsum(batch.extend_lens, 0) - 1]
        return self.model.compute_logits(hidden)
