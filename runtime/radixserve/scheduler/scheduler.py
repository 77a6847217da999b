"""One scheduler (one per TP rank): admits requests, forms prefill or decode batches, runs the
engine, samples, finishes and frees. Single-threaded and callable in-process (`LLM`, shell, tests);
`scheduler/process.py` wraps it in a ZMQ loop.

Overlap scheduling (default; off with RADIXSERVE_DISABLE_OVERLAP=1): `step()` schedules and
launches batch N+1 before it reads batch N's tokens, so the host's work hides behind the device's.
Requests that finish in batch N ride along in N+1 (their extra token is discarded) and their KV and
row are released only once N+1 has completed, since N+1 still writes them.
"""
from __future__ import annotations

import logging
import os
from collections import deque
from pathlib import Path

import torch

from radixserve.config import EngineConfig, SchedulerConfig
from radixserve.engine.engine import Engine
from radixserve.engine.sampler import Sampler
from radixserve.models.generation import eos_token_ids
from radixserve.sampling_params import SamplingParams
from radixserve.scheduler.batch_builder import build_batch
from radixserve.scheduler.cache_manager import CacheManager
from radixserve.scheduler.inflight import InFlight, copy_to_host
from radixserve.scheduler.output import TokenOutput
from radixserve.scheduler.prefill import PrefillAdder
from radixserve.scheduler.req import Req
from radixserve.utils.tensor import to_device

logger = logging.getLogger(__name__)


def overlap_enabled() -> bool:
    return os.environ.get("RADIXSERVE_DISABLE_OVERLAP", "0") in ("", "0", "false")


class Scheduler:
    def __init__(self, engine: EngineConfig, sched: SchedulerConfig, overlap: bool | None = None) -> None:
        self.cfg = sched
        self.engine = Engine(engine, sched.max_running_requests)
        self.device = self.engine.device
        self.table = self.engine.table
        self.cache = CacheManager(self.engine.num_pages, engine.page_size, sched.cache, self.device)
        self.adder = PrefillAdder(self.cache, self.table, sched.max_running_requests)
        self.sampler = Sampler(self.device, engine.seed)
        self.eos_ids: set[int] = eos_token_ids(self.engine.model_path)
        self.vocab_size = int(self.engine.hf_config.vocab_size)
        self.overlap = overlap_enabled() if overlap is None else overlap
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.reqs: dict[int, Req] = {}
        self._inflight: InFlight | None = None
        self._deferred: list[Req] = []  # finished, but the in-flight batch still writes their KV
        self.aborted_waiting = 0  # requests aborted before any of their prompt was computed
        self.prefill_tokens = 0  # prompt tokens computed (not taken from the prefix cache)

    @property
    def model_path(self) -> Path:
        return self.engine.model_path

    @property
    def hf_config(self):
        return self.engine.hf_config

    @property
    def max_seq_len(self) -> int:
        return self.engine.max_seq_len

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self._inflight or self._deferred)

    def add_request(self, uid: int, input_ids: list[int], params: SamplingParams) -> None:
        if uid in self.reqs:
            raise ValueError(f"uid: request {uid} is already queued")
        if len(input_ids) == 0:
            raise ValueError("input_ids: the prompt is empty")
        if any(not 0 <= t < self.vocab_size for t in input_ids):
            raise ValueError(f"input_ids: token ids must be in [0, {self.vocab_size})")
        params.validate()
        total = len(input_ids) + params.max_tokens
        if total > self.max_seq_len:
            raise ValueError(
                f"max_tokens: prompt ({len(input_ids)} tokens) + max_tokens ({params.max_tokens})"
                f" = {total} exceeds the model's context length {self.max_seq_len}"
            )
        capacity = self.cache.num_pages * self.engine.page_size
        if total > capacity:
            raise ValueError(
                f"max_tokens: prompt + max_tokens = {total} exceeds the KV cache capacity "
                f"{capacity} tokens"
            )
        req = Req(uid, list(input_ids), params)
        if params.seed is not None:
            req.generator = self.sampler.new_request_generator(params.seed)
        self.reqs[uid] = req
        self.waiting.append(req)

    def abort(self, uid: int) -> None:
        """Safe in any state: the request is dropped at once and gets no further output."""
        req = self.reqs.pop(uid, None)
        if req is None:
            return
        req.aborted = True
        if req.row < 0:
            self.waiting.remove(req)
            self.aborted_waiting += 1
        else:
            self._retire(req)

    def step(self) -> list[TokenOutput]:
        """Launch the next batch (prefill when any prompt work fits, else decode) and return the
        tokens of the batch before it (overlap) or of this one (no overlap)."""
        sync = not self.overlap or any(r.params.has_penalties for r in self.running)
        outputs: list[TokenOutput] = []
        if sync and self._inflight is not None:
            outputs += self._process(self._inflight)
            self._inflight = None
        launched = self._launch_next()
        if self._inflight is not None:
            outputs += self._process(self._inflight)
        self._inflight = launched
        if sync and launched is not None:
            outputs += self._process(launched)
            self._inflight = None
        if self._inflight is None:
            self._release_deferred()
        return outputs

    @torch.inference_mode()
    def _launch_next(self) -> InFlight | None:
        items = self.adder.schedule(self.running, self.waiting, self.cfg.max_prefill_length)
        decode = not items
        if decode:
            items = [(r, 1) for r in self.running if r.prefill_done]
        if not items:
            return None
        batch = build_batch(items, self.table, self.device, decode)
        if not decode:
            self.prefill_tokens += sum(n for _, n in items)
        for req, n in items:
            req.kv_len += n
        emits = [i for i, (r, _) in enumerate(items) if r.prefill_done]
        logits = self.engine.forward(batch)
        res = self.sampler.sample(logits, [r for r, _ in items])
        if emits:  # the sampled token is the next step's input: it stays on the device
            cap = self.table.max_seq_len - 1  # a request that rides along past its end (overlap)
            if len(emits) == len(items):
                rows, cols, toks = batch.req_rows, batch.seq_lens.long().clamp(max=cap), res.tokens
            else:
                rows = to_device([items[i][0].row for i in emits], self.device)
                cols = to_device([min(items[i][0].kv_len, cap) for i in emits], self.device)
                toks = res.tokens[to_device(emits, self.device)]
            self.table.token_pool[rows, cols] = toks
        host, event = copy_to_host(res)
        return InFlight(items, emits, host, event)

    def _process(self, fl: InFlight) -> list[TokenOutput]:
        res = fl.wait()
        self._release_deferred()  # the batch that still wrote their KV is done now
        tokens = res.tokens.tolist()
        outputs: list[TokenOutput] = []
        for i in fl.emits:
            req = fl.items[i][0]
            if req.finished or req.aborted:
                continue  # rode along after finishing (overlap): its token is discarded
            tok = tokens[i]
            req.output_ids.append(tok)
            reason = self._finish_reason(req, tok)
            lp = top = None
            if req.params.logprobs is not None and res.chosen_logprob is not None:
                k = req.params.logprobs
                lp = float(res.chosen_logprob[i])
                top = list(zip(res.top_ids[i, :k].tolist(), res.top_logprobs[i, :k].tolist()))
            outputs.append(TokenOutput(req.uid, tok, reason is not None, reason, lp, top))
            if reason is not None:
                req.finished = True
                del self.reqs[req.uid]
                self._retire(req)
        return outputs

    def _finish_reason(self, req: Req, tok: int) -> str | None:
        p = req.params
        if (tok in self.eos_ids and not p.ignore_eos) or tok in p.stop_token_ids:
            return "stop"
        if len(req.output_ids) >= p.max_tokens:
            return "length"
        return None

    def _retire(self, req: Req) -> None:
        """Stop scheduling the request; free its KV now, or once the in-flight batch is done."""
        self.running.remove(req)
        if self._inflight is not None:
            self._deferred.append(req)
        else:
            self._release(req)

    def _release_deferred(self) -> None:
        for req in self._deferred:
            self._release(req)
        self._deferred.clear()

    def _release(self, req: Req) -> None:
        """Hand the request's KV to the prefix cache (it frees what it does not keep)."""
        slots = self.table.page_table[req.row, : req.num_slots].long()
        self.cache.cache_req(req.all_ids[: req.kv_len], slots, req.cached_len, req.cache_handle)
        self.table.free_row(req.row)
        req.row = -1

    def stats(self) -> dict[str, int]:
        size = self.cache.size_info
        return {
            "running": len(self.running),
            "waiting": len(self.waiting),
            "kv_pages_used": self.cache.num_used_pages,
            "kv_pages_total": self.cache.num_pages,
            "prefix_hit_tokens": self.adder.prefix_hit_tokens,
            "aborted_waiting": self.aborted_waiting,
            "prefill_tokens": self.prefill_tokens,
            "evictable_tokens": size.evictable,
            "protected_tokens": size.protected,
        }

    def check_integrity(self) -> None:
        self.cache.check_integrity()
        held = self.table.max_reqs - 1 - self.table.num_free  # minus the padding row
        expect = len(self.running) + len(self._deferred)
        assert held == expect, f"{held} rows held, {expect} requests hold rows"

