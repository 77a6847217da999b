"""One scheduler (one per TP rank): admits requests, forms prefill or decode batches, runs the
engine, samples, finishes and frees. Single-threaded and callable in-process (`LLM`, shell, tests);
`scheduler/loop.py` puts it behind the server's sockets.

Overlap scheduling (`SchedulerConfig.overlap`, default on; `--disable-overlap` or
RADIXSERVE_DISABLE_OVERLAP=1 turn it off): `step()` schedules and
launches batch N+1 before it reads batch N's tokens, so the host's work hides behind the device's.
Requests that finish in batch N ride along in N+1 (their extra token is discarded) and their KV and
row are released only once N+1 has completed, since N+1 still writes them.

Grammar-constrained requests (`constrained/manager.py`) wait outside the queue until their grammar
is compiled. The mask of batch N+1 needs batch N's tokens, so when N+1 has constrained rows the
step reads batch N right after launching N+1's forward, advances the matchers, and fills N+1's
mask on the host while the device computes N+1; batches without constrained rows keep the full
overlap.

Mixed batches (`SchedulerConfig.mixed_chunk`, on unless `--disable-mixed-chunk`; SGLang's mixed chunk): a
prefill batch also carries one token of every decoding request, as an extend of length 1, so running
requests keep emitting while a long prompt is prefilled (no CUDA graph for that step).

Priorities (`SamplingParams.priority`, lower first): the waiting queue is kept in priority order,
arrival order among equals; `--schedule-policy` orders each priority's requests for admission
(`policy.py`).

Optimistic admission (`--kv-admission optimistic`, the default; `prefill.py`) allocates a
request's prompt only; each step first gives every decoding request a page for its next token
(`_grow_decode_kv`). When even eviction cannot, the in-flight batch is read first (so every
sampled token, and every draw of a request's seeded generator, belongs to a token it keeps), then
requests are retracted, the one that loses least first (lowest priority, fewest tokens made,
newest), until the rest fit `RETRACT_STEPS` more tokens each; one request alone always fits
(admission refuses one larger than the pool). A retracted request gives its KV to the prefix
cache, goes back to the head of its priority's queue and, re-admitted, prefills its prompt and
the tokens it made (`Req.resume_len`; most of it found in the cache) and goes on with the same
generator: greedy or seeded, it produces the tokens it would have.

A request's life is owned here: `add_request` admits it (`admission.py`: every check, once),
`abort` drops it in any state and in either order with its arrival (`ledger.py`), `step` stops it
on EOS, a stop token id, `max_tokens` or a complete grammar and releases its KV. Stop *strings*
are matched on the text, by the detokenizer (`tokenizer/detokenize.py`), which then aborts it.
`scheduler/lifecycle.py` turns this API into the pipeline's messages for every caller.

LoRA (`--enable-lora`): the adapters served (`load_lora`, `unload_lora`, those of `--lora-paths`
at start) and their device slots are `lora/manager.py`'s; a request names its adapter at
`add_request`, takes a slot at admission and gives it back when released.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from pathlib import Path

import torch

from radixserve.config import EngineConfig, SchedulerConfig, adapter_name_fault, lora_path_pairs
from radixserve.constrained.manager import GrammarManager
from radixserve.core.output import RequestFailure, TokenOutput
from radixserve.core.request import Req
from radixserve.engine.batch_builder import build_batch
from radixserve.engine.device import resolve_device
from radixserve.engine.engine import NO_COMPANION, Engine
from radixserve.engine.sampler import Sampler
from radixserve.kvcache.host_pool import HostTierSize
from radixserve.lora.adapter import LoRAAdapter, read_adapter
from radixserve.lora.manager import LoRAManager
from radixserve.lora.source import AdapterError
from radixserve.models.generation import eos_token_ids
from radixserve.models.source import ModelSource
from radixserve.sampling_params import SamplingParams
from radixserve.scheduler import embed, prompt_logprobs, verify_tree
from radixserve.scheduler.admission import AdmissionError, Limits, check_request
from radixserve.scheduler.cache_manager import CacheManager
from radixserve.scheduler.host_tier import HostTier
from radixserve.scheduler.inflight import ForwardPass, InFlight, copy_to_host
from radixserve.scheduler.ledger import RequestLedger
from radixserve.scheduler.policy import SchedulePolicy
from radixserve.scheduler.prefill import PrefillAdder
from radixserve.scheduler.token_estimate import RETRACT_STEPS, TokenEstimate
from radixserve.scheduler.verify_step import (
    sample_verified,
    token_rows,
    verify_rows,
    write_drafts,
)
from radixserve.scheduler.verify_tree import TreeStep, tree_scratch_rows
from radixserve.speculative.factory import create_speculator
from radixserve.speculative.factory import plan as speculative_plan
from radixserve.speculative.tree import DraftTree
from radixserve.utils.tensor import to_device
from radixserve_kernels import TokenStore

logger = logging.getLogger(__name__)
_IDLE_GRAMMAR_WAIT_S = 0.01  # nothing to run but compilations: wait this long for one per step


class Scheduler:
    def __init__(self, engine: EngineConfig, sched: SchedulerConfig,
                 source: ModelSource | None = None) -> None:
        """`source`: `engine.model` resolved (else the engine resolves it)."""
        self.cfg = sched
        # tokens per prefill batch: what was asked, else the device's default (`config.py`)
        self.prefill_length = sched.prefill_length(resolve_device(engine.device).type)
        # speculative decoding (`speculative/`): what a drafter will hold, before the KV is sized
        spec = speculative_plan(engine, sched) if sched.speculates else None
        if spec is not None and spec.engine is not None:
            engine = spec.engine  # (what the drafter needs of the target: eagle3, no CUDA graphs)
        host = (HostTierSize(sched.hicache_ratio, sched.hicache_size)
                if sched.enable_hierarchical_cache else None)
        trees = spec is not None and sched.speculative_breadth > 1
        if trees and engine.page_size != 1:
            raise ValueError("speculative_eagle_topk or speculative_ngram_max_bfs_breadth > 1 "
                             "verifies a tree of drafts, a KV slot a node: it needs --page-size "
                             f"1, got {engine.page_size}")
        self.engine = Engine(engine, sched.max_running_requests, self.prefill_length, source, host,
                             spec.companion if spec else NO_COMPANION,
                             1 + sched.speculative_num_draft_tokens if spec else 0,
                             tree_scratch_rows(sched) if trees else 0)
        self.device = self.engine.device
        self.table = self.engine.table
        tier = (HostTier(self.engine.kv_pool, self.engine.host_pool, self.device)
                if self.engine.host_pool is not None else None)
        self.cache = CacheManager(self.engine.num_pages, engine.page_size, sched.cache, self.device,
                                  tier, sched.hicache_write_policy == "write_back")
        self.estimate = (TokenEstimate(sched.schedule_conservativeness)
                         if sched.kv_admission == "optimistic" else None)
        pool = self.engine.lora_pool
        self.lora = LoRAManager(pool) if pool is not None else None
        self.adder = PrefillAdder(self.cache, self.table, sched.max_running_requests,
                                  SchedulePolicy(sched.schedule_policy, self.cache), self.estimate,
                                  self.lora)
        self.eos_ids: set[int] = eos_token_ids(self.model_path, self.engine.source.config)
        self.sampler = Sampler(self.device, engine.seed, frozenset(self.eos_ids))
        self.vocab_size = int(self.engine.hf_config.vocab_size)
        self.overlap = sched.overlap
        self.limits = Limits(self.engine.max_seq_len, self.cache.num_pages * engine.page_size,
                             self.vocab_size)
        self.grammars = GrammarManager(self.model_path, self.vocab_size, self.eos_ids)
        self.spec = create_speculator(spec, engine, sched, self.engine) if spec else None
        self.auto_admit_grammars = True  # False under TP: the leader's ready list is broadcast
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.reqs: dict[int, Req] = {}
        self.ledger = RequestLedger()  # uids finished, or aborted before they arrived
        self._inflight: InFlight | None = None
        self._deferred: list[Req] = []  # finished, but the in-flight batch still writes their KV
        self._failures: list[RequestFailure] = []
        self.aborted_waiting = 0  # requests aborted before any of their prompt was computed
        self.retractions = 0  # requests retracted for lack of KV (optimistic admission)
        self._arrivals = 0
        self.prefill_tokens = 0  # prompt tokens computed (not taken from the prefix cache)
        self.decode_kv_tokens = 0  # KV tokens the decode rows attended over (bench --phases)
        self.token_wait_s = 0.0  # time spent waiting for batches' sampled tokens (bench --phases)
        for name, path in lora_path_pairs(engine.lora_paths).items():
            self.load_lora(name, path)

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
        return bool(self.waiting or self.running or self._inflight or self._deferred
                    or len(self.grammars))

    def add_request(self, uid: int, input_ids: list[int], params: SamplingParams, *,
                    auto_max_tokens: bool = False, lora: str | None = None) -> SamplingParams | None:
        """Admit and queue a request (of the LoRA adapter named `lora`, else the base model):
        the parameters it runs with (`max_tokens` filled in when `auto_max_tokens`), None if it
        was aborted before it arrived (it is dropped), or AdmissionError (a ValueError naming
        the field) if refused."""
        if self.ledger.take_tombstone(uid):
            self.ledger.finished(uid)
            return None
        if uid in self.reqs:
            raise AdmissionError(f"uid: request {uid} is already queued", "uid")
        try:
            adapter, namespace = self._adapter(lora) if lora is not None else (None, 0)
            params = check_request(input_ids, params, self.limits, auto_max_tokens)
        except AdmissionError:
            self.ledger.finished(uid)  # a late abort of it is then a no-op, not a tombstone
            raise
        req = Req(uid, list(input_ids), params, lora=adapter, namespace=namespace,
                  arrival=self._arrivals)
        self._arrivals += 1
        if params.seed is not None:
            req.generator = self.sampler.new_request_generator(params.seed)
        self.reqs[uid] = req
        if params.constrained:
            self.grammars.submit(req)  # queued by admit_grammars once compiled
        else:
            self._enqueue(req)
        return params

    def _adapter(self, name: str) -> tuple[LoRAAdapter, int]:
        """The served adapter `name` and its cache namespace, or AdmissionError (404)."""
        if self.lora is None or name not in self.lora.served:
            served = ", ".join(sorted(self.lora.served)) if self.lora is not None else ""
            raise AdmissionError(
                f"model: LoRA adapter {name!r} is not loaded; served: "
                f"{served or 'none'}" + ("" if self.lora else " (LoRA is off: --enable-lora)"),
                "model", "model_not_found", 404)
        return self.lora.served[name]

    def load_lora(self, name: str, path: str) -> None:
        """Serve the PEFT adapter at `path` as `name`: AdapterError (400) before anything is
        loaded if it cannot be (LoRA off, a name in use, a bad adapter)."""
        if self.lora is None:
            raise AdapterError("LoRA adapters are not served: start with --enable-lora")
        if (why := adapter_name_fault(name)) is not None:
            raise AdapterError(why)
        if name in self.lora.served:
            raise AdapterError(f"adapter {name!r} is already loaded (unload it first)")
        pool = self.lora.pool
        adapter = read_adapter(name, path, self.engine.model, pool.max_rank, self.engine.dtype)
        self.lora.add(adapter)
        logger.info("LoRA: serving adapter %r (rank %d, %d projections) from %s", name,
                    adapter.rank, len(adapter.weights), path)

    def unload_lora(self, name: str) -> None:
        """Stop serving adapter `name` (AdapterError 404 if it is not served); requests already
        accepted finish with it."""
        if self.lora is None or name not in self.lora.served:
            raise AdapterError(f"LoRA adapter {name!r} is not loaded", status=404)
        self.lora.remove(name)
        logger.info("LoRA: adapter %r unloaded", name)

    def served_loras(self) -> dict[str, str]:
        """The adapters served, name -> path."""
        return {} if self.lora is None else {n: a.path for n, (a, _) in self.lora.served.items()}

    def _enqueue(self, req: Req) -> None:
        """Into the waiting queue behind every request of its priority or a more urgent one."""
        w, prio = self.waiting, req.params.priority
        i = len(w)
        while i > 0 and w[i - 1].params.priority > prio:  # usually none: all share priority 0
            i -= 1
        w.insert(i, req)

    def _requeue(self, req: Req) -> None:
        """Back into the waiting queue ahead of every request of its priority (retraction)."""
        w, prio = self.waiting, req.params.priority
        i = 0
        while i < len(w) and w[i].params.priority < prio:
            i += 1
        w.insert(i, req)

    def abort(self, uid: int) -> bool:
        """Safe in any state, and before the request arrives: True if a queued or running request
        was dropped (it gets no further output). An unknown uid is remembered, so that its
        request is dropped when it comes; a finished one is a no-op."""
        req = self.reqs.pop(uid, None)
        if req is None:
            if not self.ledger.is_finished(uid):
                self.ledger.tombstone(uid)
            return False
        self.ledger.finished(uid)
        req.aborted = True
        if req.row < 0:
            if not self.grammars.discard(uid):
                self.waiting.remove(req)
            self.aborted_waiting += 1
        else:
            self._retire(req)
        return True

    def _forget(self, uid: int) -> None:
        del self.reqs[uid]
        self.ledger.finished(uid)

    def ready_grammars(self) -> list[int]:
        """Requests whose grammar compilation has ended, for `admit_grammars`."""
        idle = not (self.waiting or self.running or self._inflight or self._deferred)
        return self.grammars.ready(_IDLE_GRAMMAR_WAIT_S if idle else 0.0)

    def admit_grammars(self, uids: list[int]) -> list[int]:
        """Queue those of `uids` whose grammar compiled; fail the others (`take_failures`) and
        return their uids. At TP > 1 rank 0 decides (`scheduler/tp.py`)."""
        if not uids:
            return []
        ready, failed = self.grammars.admit(uids)
        for req in ready:
            self._enqueue(req)
        for f in failed:
            self._forget(f.uid)
        self._failures += failed
        return [f.uid for f in failed]

    def drop_grammars(self, uids: list[int]) -> None:
        """A TP follower: forget the requests whose grammar failed on rank 0 (it reports them)."""
        for uid in uids:
            self.grammars.discard(uid)
            self._forget(uid)

    def take_failures(self) -> list[RequestFailure]:
        """Requests dropped since the last call, before their first token: each gets an error
        (the server's HTTP status, `LLM.generate`'s ValueError) instead of tokens."""
        out, self._failures = self._failures, []
        return out

    def step(self) -> list[TokenOutput]:
        """Launch the next batch (prefill when any prompt work fits, else decode) and return the
        tokens of the batch before it (overlap) or of this one (no overlap)."""
        if self.auto_admit_grammars:
            self.admit_grammars(self.ready_grammars())
        # NOTE: a drafter reads the tokens of the batch before: a step that may draft reads them
        # first (speculation trades the overlap of that step for the tokens it verifies)
        sync = (not self.overlap or any(r.params.has_penalties for r in self.running)
                or (self.spec is not None and self.spec.may_draft(self.running)))
        outputs: list[TokenOutput] = []
        if sync and self._inflight is not None:
            outputs += self._process(self._inflight)
            self._inflight = None
        if not self._grow_decode_kv():
            if self._inflight is not None:  # its tokens first: retraction must know them all
                outputs += self._process(self._inflight)
                self._inflight = None
                self._release_deferred()
            if not self._grow_decode_kv():
                self._retract_for_decode()
        fwd = self._forward_next()
        # a grammar mask needs the in-flight batch's tokens: read them now, while the device runs
        # fwd. NOTE: that batch stays `_inflight` until replaced, so the requests it finishes are
        # released only after fwd, which still writes their KV
        read = fwd is not None and fwd.constrained and self._inflight is not None
        if read:
            outputs += self._process(self._inflight)
        launched = self._sample(fwd) if fwd is not None else None
        if self._inflight is not None and not read:
            outputs += self._process(self._inflight)
        self._inflight = launched
        if sync and launched is not None:
            outputs += self._process(launched)
            self._inflight = None
        if self._inflight is None:
            self._release_deferred()
        return outputs

    def _grow_decode_kv(self) -> bool:
        """Optimistic admission: a page for every decoding request whose next token has no KV
        slot yet; False, allocating nothing, when even eviction cannot give them all."""
        if self.estimate is None:
            return True  # (reserved at admission)
        rows = [r for r in self.running
                if r.prefill_done and not r.params.embed and r.num_slots <= r.kv_len]
        if not rows:
            return True
        ps = self.cache.page_size
        slots = self.cache.allocate(len(rows) * ps)
        if slots is None:
            return False
        cols = [r.num_slots + j for r in rows for j in range(ps)]
        where = to_device([[r.row for r in rows for _ in range(ps)], cols], self.device)
        pt = self.table.page_table
        pt[where[0], where[1]] = slots.to(pt.device, pt.dtype)
        for r in rows:
            r.num_slots += ps
        return True

    def _grow_draft_kv(self, rows: list[Req]) -> None:
        """Optimistic admission: KV slots for the tokens each request may draft, where free or
        evictable pages give them without retracting anyone (a request short of them drafts
        fewer). Under `reserve` every request already holds its worst case."""
        if self.estimate is None:
            return
        ps, pt = self.cache.page_size, self.table.page_table
        for r in rows:
            want = min(r.kv_len + 1 + self.cfg.speculative_num_draft_tokens, r.reserve_len)
            short = -(-(want - r.num_slots) // ps) * ps
            if short <= 0 or not self.spec.lengths.wants(r.uid):
                continue
            if short > self.cache.num_free_pages * ps or (slots := self.cache.allocate(short)) is None:
                return  # (free pages only: the prefix cache is not evicted for a guess)
            pt[r.row, r.num_slots : r.num_slots + short] = slots.to(pt.device, pt.dtype)
            r.num_slots += short

    def _retract_for_decode(self) -> None:
        """Decoding ran out of KV (no batch in flight): retract the requests that lose least
        until the rest fit `RETRACT_STEPS` more tokens each, or one is left (it fits alone)."""
        ps = self.cache.page_size

        def pages_short(reqs: list[Req]) -> int:
            want = sum(max(0, -(-min(r.kv_len + RETRACT_STEPS, r.reserve_len) // ps)
                           - r.num_slots // ps) for r in reqs if r.prefill_done)
            return want - self.cache.available_tokens // ps

        kept = list(self.running)
        for victim in sorted(self.running, key=lambda r: (-r.params.priority, len(r.output_ids),
                                                         -r.arrival)):
            if len(kept) == 1 or pages_short(kept) <= 0:
                break
            kept.remove(victim)
            self._retract(victim)
        self.estimate.retracted(kept)
        grown = self._grow_decode_kv()
        assert grown, "a request alone did not fit the KV pool"

    def _retract(self, req: Req) -> None:
        """Out of the running batch and back to the head of the queue; its KV goes to the prefix
        cache, so that re-admission finds most of it."""
        self.running.remove(req)
        req.retracted_kv = req.kv_len
        self._release(req)
        req.resume_len = len(req.all_ids)
        req.kv_len = req.cached_len = req.num_slots = 0
        req.cache_handle = None
        if not req.output_ids:  # its prompt logprobs are computed again
            req.prompt_lps.clear()
        self._requeue(req)
        self.retractions += 1

    @torch.inference_mode()
    def _forward_next(self) -> ForwardPass | None:
        """Schedule the next batch and launch its forward (the device runs it meanwhile)."""
        if self.estimate is not None and not self.running:
            self.estimate.idle()
        # (an embedding request is done once its prompt is: it never decodes, not even riding
        # along after it finished, so it needs no KV slot past its prompt)
        decoding = [r for r in self.running if r.prefill_done and not r.params.embed]
        budget = self.prefill_length
        if self.cfg.mixed_chunk:  # the decode tokens ride in the prefill batch's token budget
            budget -= len(decoding)
        prefill = self.adder.schedule(self.running, self.waiting, budget) if budget > 0 else []
        self.prefill_tokens += sum(n for _, n in prefill)
        decode = not prefill
        # the decode rows of this batch: all of them, or none when a prefill batch is not mixed
        decode_rows = decoding if decode or self.cfg.mixed_chunk else []
        lp_plan = prompt_logprobs.plan(prefill)  # (prefill items lead the batch)
        embed_reqs, embed_rows = embed.plan(prefill)
        drafts: dict[Req, list[int]] = {}
        planned: dict[Req, DraftTree] = {}  # drafts that branch (their drafts: the nodes)
        if self.spec is not None and lp_plan is None and not embed_reqs:
            self._grow_draft_kv(decode_rows)
            drafts, planned = self.spec.plan(decode_rows)
        items = prefill + [(r, 1 + len(drafts.get(r, ()))) for r in decode_rows]
        if not items:
            return None
        # a verification step: a decode batch of a row a token, or one extend of each request's
        # token and its drafts (`scheduler/verify_step.py`)
        verify = bool(drafts) and decode and self.engine.verifies_as_decode(
            sum(n for _, n in items))
        # a tree's nodes are decode rows (`verify_tree.py`); the extend form, or a tree without
        # free rows or slots, verifies its first candidate as a chain (fewer rows: still decode)
        trees: dict[Req, TreeStep] = {}
        for r, tree in planned.items():
            step = verify_tree.stage(self, r, tree) if verify else None
            if step is None:
                drafts[r] = tree.first_path()
            else:
                trees[r] = step
        if len(trees) < len(planned):
            items = prefill + [(r, 1 + len(drafts.get(r, ()))) for r in decode_rows]
        if drafts:  # verified after the request's last token: the next positions of its row
            write_drafts(self.table.token_pool, {r: d for r, d in drafts.items() if r not in trees})
            decode = verify
        if decode_rows and self.estimate is not None:
            self.estimate.decode_step()
        rows = token_rows(items, trees) if verify else items
        batch = self.engine.stage_decode([r.row for r, _ in rows], [r.kv_len for r, _ in rows],
                                         verify) if decode else None
        if batch is None:
            batch = build_batch(rows, self.table, self.device, decode)
            batch.verify = verify
        batch.uses_lora = any(r.lora is not None for r, _ in items)
        for req, n in items:
            req.kv_len += n
        self.decode_kv_tokens += sum(r.kv_len for r in decode_rows)  # each reads its whole context
        for req, _ in prefill:
            self._share_prompt(req)
        emits = [i for i, (r, _) in enumerate(items) if r.prefill_done]
        # the host tier's loads this batch reads: its attention layers wait for them
        batch.kv_ready = self.cache.before_launch()
        assert batch.kv_ready is None or not decode, "a decode batch reads no loaded pages"
        if verify:  # (a row a token: the logits of every verified position, in order)
            fwd = ForwardPass(items, emits, batch, self.engine.forward(batch), drafts=drafts,
                              trees=trees)
        elif drafts:  # logits at every verified position, one row at every other item's last
            fwd = ForwardPass(items, emits, batch, self.engine.forward_rows(
                batch, to_device(verify_rows(items, drafts), self.device)), drafts=drafts)
        elif lp_plan is None and not embed_reqs:
            fwd = ForwardPass(items, emits, batch, self.engine.forward(batch))
        else:
            # hidden states kept: prompt-logprob rows, then the embedding requests' last tokens
            lp_rows = lp_plan.keep if lp_plan is not None else []
            logits, kept = self.engine.forward_keeping(batch, to_device(lp_rows + embed_rows,
                                                                        self.device))
            fwd = ForwardPass(
                items, emits, batch, logits,
                prompt_logprobs.compute(self.engine.model, kept[: len(lp_rows)], lp_plan)
                if lp_plan else None,
                embed.compute(embed_reqs, kept[len(lp_rows):]) if embed_reqs else None)
        self.cache.after_launch()
        return fwd

    def _share_prompt(self, req: Req) -> None:
        """Put the prompt KV this batch computes in the prefix cache now, not when the request
        ends, so requests sharing the prompt's prefix reuse it while this one still runs."""
        pt = self.table.page_table
        match = self.cache.share_prefix(req.fill_ids[: req.kv_len], pt[req.row, : req.kv_len],
                                        req.cached_len, req.cache_handle, req.namespace)
        if match is not None:
            pt[req.row, req.cached_len : match.cached_len] = match.indices[req.cached_len:].to(
                pt.device, pt.dtype)
            req.cached_len, req.cache_handle = match.cached_len, match.handle

    @torch.inference_mode()
    def _sample(self, fwd: ForwardPass) -> InFlight:
        if fwd.drafts:
            return sample_verified(self, fwd)
        items, emits, batch, logits, prompt_lp, embeds = fwd[:6]
        masked = [(i, r.grammar) for i in emits
                  if (r := items[i][0]).grammar is not None and not (r.finished or r.aborted)]
        if masked:  # (a request finished in the batch just read rides along unmasked: discarded)
            for i in self.grammars.mask(logits, masked):  # its token is discarded: it fails
                items[i][0].grammar.dead_end = True
        # the sampled token is the next step's input: it stays on the device
        cap = self.table.max_seq_len - 1  # a request that rides along past its end (overlap)
        store = (TokenStore(self.table.token_pool, batch.req_rows, batch.seq_lens, cap)
                 if emits and len(emits) == len(items) else None)  # (written by the sampling)
        res = self.sampler.sample(logits, [r for r, _ in items], store)
        if emits and store is None:
            rows = to_device([items[i][0].row for i in emits], self.device)
            cols = to_device([min(items[i][0].kv_len, cap) for i in emits], self.device)
            self.table.token_pool[rows, cols] = res.tokens[to_device(emits, self.device)]
        prompt_lp = prompt_logprobs.to_host(prompt_lp) if prompt_lp is not None else None
        embeds = embed.to_host(embeds) if embeds is not None else None
        host, event = copy_to_host(res)  # (its event also completes the copies above)
        return InFlight(items, emits, host, event, prompt_lp, embeds)

    def _process(self, fl: InFlight) -> list[TokenOutput]:
        t = time.perf_counter()
        res = fl.wait()
        self.token_wait_s += time.perf_counter() - t
        self._release_deferred()  # the batch that still wrote their KV is done now
        if fl.prompt_lp is not None:
            prompt_logprobs.record(fl.prompt_lp)
        vectors = ({} if fl.embeds is None
                   else dict(zip(fl.embeds.reqs, fl.embeds.vectors.tolist())))
        if fl.runs is not None:  # a verification step: each request's run of tokens
            return self._emit_runs(fl)
        tokens = res.tokens.tolist()
        invalid = res.invalid.tolist() if res.invalid is not None else None
        outputs: list[TokenOutput] = []
        for i in fl.emits:
            req = fl.items[i][0]
            if req.finished or req.aborted:
                continue  # rode along after finishing (overlap): its token is discarded
            if req.params.embed:  # its vector is the answer: no token
                outputs.append(TokenOutput(req.uid, -1, True, "stop", prompt_tokens=req.prompt_len,
                                           embedding=vectors[req], cached_tokens=req.prefix_hit))
                self._finish(req)
                continue
            if self._fails_row(req, invalid is not None and bool(invalid[i])):
                continue
            lp = top = None
            if req.params.logprobs is not None and res.chosen_logprob is not None:
                k = req.params.logprobs
                lp = float(res.chosen_logprob[i])
                top = list(zip(res.top_ids[i, :k].tolist(), res.top_logprobs[i, :k].tolist()))
            self._emit(req, tokens[i], lp, top, outputs)
        return outputs

    def _fails_row(self, req: Req, invalid: bool) -> bool:
        """Fail the request alone where its logits held no valid value or its grammar allows no
        token; True when it did."""
        if invalid:
            self._fail(req, "internal error: the model's logits for this request held no valid "
                            "value (NaN or infinity)", None, 500)
            return True
        if req.grammar is not None and req.grammar.dead_end:
            param = req.grammar.param
            self._fail(req, f"{param}: the grammar allows no token after the "
                            f"{len(req.output_ids)} generated: no output can complete it", param)
            return True
        return False

    def _emit(self, req: Req, tok: int, lp: float | None, top: list | None,
              outputs: list[TokenOutput]) -> bool:
        """The request's next token: appended, reported, and the request finished if it ends it;
        False once the request is done (finished, or failed by its grammar)."""
        req.output_ids.append(tok)
        if req.grammar is not None and not req.grammar.accept(tok):
            self._fail_grammar(req, tok)  # the mask forbids it: a bug, this request's alone
            return False
        reason = self._finish_reason(req, tok)
        plp = None
        if req.params.prompt_logprobs is not None and len(req.output_ids) == 1:
            plp = [(req.input_ids[0], None, []), *req.prompt_lps]  # the first has none
        outputs.append(TokenOutput(req.uid, tok, reason is not None, reason, lp, top,
                                   req.prompt_len, plp, cached_tokens=req.prefix_hit,
                                   spec_drafted=req.spec_drafted, spec_accepted=req.spec_accepted,
                                   spec_steps=req.spec_steps))
        if reason is not None:
            req.kv_len = min(req.kv_len, len(req.all_ids))  # (a run may end inside its drafts)
            self._finish(req)
            return False
        return True

    def _emit_runs(self, fl: InFlight) -> list[TokenOutput]:
        outputs: list[TokenOutput] = []
        for i in fl.emits:
            req, run = fl.items[i][0], fl.runs[i]
            if req.finished or req.aborted:
                continue
            if self._fails_row(req, run.invalid):
                continue
            for j, tok in enumerate(run.tokens):
                lp = run.logprobs[j] if run.logprobs is not None else None
                top = run.top[j] if run.top is not None else None
                if not self._emit(req, tok, lp, top, outputs):
                    break
        return outputs

    def _finish(self, req: Req) -> None:
        """It produced its last output: forget it and release its KV (now or after the flight)."""
        req.finished = True
        if self.estimate is not None and req.output_ids:
            self.estimate.finished(req)
        self._forget(req.uid)
        self._retire(req)

    def _fail_grammar(self, req: Req, tok: int) -> None:
        param = req.grammar.param
        logger.error("grammar: request %d sampled token %d, which its %s forbids", req.uid, tok, param)
        self._fail(req, f"{param}: internal error: a sampled token broke the grammar", param, 500)

    def _fail(self, req: Req, message: str, param: str | None, status: int = 400) -> None:
        """The request alone fails after admission (`take_failures`); the others run on."""
        if status >= 500:
            logger.error("request %d failed: %s", req.uid, message)
        self._failures.append(RequestFailure(req.uid, message, param, status))
        self._finish(req)

    def _finish_reason(self, req: Req, tok: int) -> str | None:
        p = req.params
        if req.grammar is not None and req.grammar.terminated:
            return "stop"  # the grammar is complete and the model's EOS accepted
        if (tok in self.eos_ids and not p.ignore_eos) or tok in p.stop_token_ids:
            return "stop"
        if len(req.output_ids) >= p.max_tokens:
            return "length"
        return None

    def _retire(self, req: Req) -> None:
        """Stop scheduling the request; free its KV now, or once the in-flight batch is done."""
        self.running.remove(req)
        if self.spec is not None:
            self.spec.release(req)
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
        self.cache.cache_req(req.all_ids[: req.kv_len], slots, req.cached_len, req.cache_handle,
                             req.namespace)
        self.table.free_row(req.row)
        req.row = -1
        if req.lora_slot >= 0:
            self.lora.release(req.lora_slot)
            req.lora_slot = -1

    def stats(self) -> dict[str, int]:
        size = self.cache.size_info
        host_used, host_total = self.cache.host_tokens
        tier = self.cache.tier
        return {
            "running": len(self.running),
            "waiting": len(self.waiting) + len(self.grammars),
            "kv_pages_used": self.cache.num_used_pages,
            "kv_pages_total": self.cache.num_pages,
            "prefix_hit_tokens": self.adder.prefix_hit_tokens,
            "aborted_waiting": self.aborted_waiting,
            "prefill_tokens": self.prefill_tokens,
            "evictable_tokens": size.evictable,
            "protected_tokens": size.protected,
            # what running requests hold or lock: the pool minus free pages and evictable cache
            "kv_tokens_in_use": self.cache.num_slots - self.cache.available_tokens,
            "kv_tokens_total": self.cache.num_slots,
            # speculative decoding: tokens drafted, drafts kept, verification steps of a request
            "spec_draft_tokens": self.spec.drafted if self.spec else 0,
            "spec_accepted_tokens": self.spec.accepted if self.spec else 0,
            "spec_verify_steps": self.spec.verify_steps if self.spec else 0,
            "lora_slots": 0 if self.lora is None else self.lora.pool.num_slots,
            "retractions": self.retractions,
            "retracted_tokens_recomputed": self.adder.retracted_recomputed,
            "host_hit_tokens": self.cache.host_hit_tokens,
            "host_kv_tokens": host_used,
            "host_kv_tokens_total": host_total,
            "host_loaded_tokens": tier.loaded_tokens if tier is not None else 0,
            "host_written_tokens": tier.written_tokens if tier is not None else 0,
        }

    def lora_requests(self) -> dict[str, list[int]]:
        """[running, waiting] requests of each LoRA adapter that has any."""
        out: dict[str, list[int]] = {}
        for i, reqs in enumerate((self.running, self.waiting)):
            for r in reqs:
                if r.lora is not None:
                    out.setdefault(r.lora.name, [0, 0])[i] += 1
        return out

    def check_integrity(self) -> None:
        self.cache.check_integrity()
        held = self.table.max_reqs - 1 - self.table.num_free  # minus the padding row
        expect = len(self.running) + len(self._deferred)
        assert held == expect, f"{held} rows held, {expect} requests hold rows"

