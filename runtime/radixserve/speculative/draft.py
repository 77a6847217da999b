"""A draft model: a smaller model of the target's vocabulary (or the target's own weights, the
machinery's ceiling), run by this engine beside the target with a KV pool of its own.

For each drafting request it keeps a row of that pool and the tokens whose KV the row holds. A
round of drafting first catches every request up: one extend of the tokens it has not seen (a new
request's whole prompt; afterwards the target's token and the drafts it kept), whose last logits
give the first draft; then greedy decode steps give the others (with --speculative-eagle-topk k,
each step's k likeliest tokens: the others branch off the chain, `tree.branch_paths`). A row's
KV is valid as far as the tokens it was fed agree with the request's own, so after a
verification it is cut back to the kept drafts by comparison, with no word from the verifier. A
request the pool cannot hold (its prompt and `max_tokens` reserved at its first draft) is not
drafted for."""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from radixserve.engine.batch_builder import build_batch
from radixserve.engine.engine import Companion, Engine
from radixserve.kvcache.allocator import PageAllocator
from radixserve.models.source import ModelSource
from radixserve.speculative.drafter import DRAFTERS, StepDrafter, free_row
from radixserve.speculative.tree import Step, top_tokens
from radixserve.utils.tensor import to_device

if TYPE_CHECKING:
    from radixserve.config import EngineConfig, SchedulerConfig
    from radixserve.core.request import Req

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class _Row:
    """A request's row of the draft pool: `fed` are the tokens whose KV it holds."""

    row: int
    slots: torch.Tensor
    fed: list[int] = field(default_factory=list)

    @property
    def kv_len(self) -> int:
        return len(self.fed)


def _agreeing(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@DRAFTERS.register("draft")
class DraftModelDrafter(StepDrafter):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.table = engine.table
        self.allocator = PageAllocator(engine.num_pages, 1, engine.device)
        self._rows: dict[int, _Row] = {}

    @classmethod
    def plan(cls, engine_cfg: EngineConfig, cfg: SchedulerConfig) -> tuple[Companion, ModelSource]:
        """The draft model resolved, and its weights and KV bytes a token on this rank, so that the
        target leaves room for them and a pool of as many tokens as its own."""
        from radixserve.distributed import get_tp_info
        from radixserve.engine.device import resolve_device
        from radixserve.kvcache.kv_dtype import resolve_kv_dtype
        from radixserve.kvcache.sizing import kv_bytes_per_token
        from radixserve.models.hf_config import head_dim, text_config
        from radixserve.models.loader import resolve_dtype, weight_bytes

        source = ModelSource.resolve(cfg.speculative_draft_model_path)
        dtype = resolve_dtype(engine_cfg.dtype, source.config, resolve_device(engine_cfg.device))
        hc = text_config(source.config)
        kv_heads = max(1, hc.num_key_value_heads // get_tp_info().size)
        per_token = kv_bytes_per_token(hc.num_hidden_layers, kv_heads, head_dim(hc),
                                       resolve_kv_dtype(engine_cfg.kv_cache_dtype, dtype))
        return Companion(weight_bytes(source.config, dtype), per_token), source

    @classmethod
    def create(cls, engine_cfg: EngineConfig, cfg: SchedulerConfig, target: Engine,
               context: ModelSource) -> DraftModelDrafter:
        draft_cfg = dataclasses.replace(
            engine_cfg, model=str(context.path), page_size=1,
            max_kv_tokens=target.num_pages * target.page_size, context_length=None)
        engine = Engine(draft_cfg, cfg.max_running_requests, cfg.prefill_length(target.device.type),
                        context)
        vocab = int(engine.hf_config.vocab_size)
        if vocab > int(target.hf_config.vocab_size):
            raise ValueError(f"speculative_draft_model_path: the draft model's vocabulary ({vocab}) "
                             f"is larger than the target's ({int(target.hf_config.vocab_size)})")
        logger.info("speculative decoding: draft model %s, %d KV tokens", engine.model_path.name,
                    engine.num_pages)
        return cls(engine)

    def _row(self, req: Req) -> _Row | None:
        rec = self._rows.get(req.uid)
        if rec is not None:
            return rec
        need = req.prompt_len + req.params.max_tokens
        if need > self.table.max_seq_len or self.table.num_free <= 1:
            return None
        pages = self.allocator.alloc(need)
        if pages is None:
            return None  # the draft pool is full: this request decodes without drafts
        rec = self._rows[req.uid] = _Row(self.table.alloc_row(), self.allocator.pages_to_slots(pages))
        self.table.page_table[rec.row, :need] = rec.slots.to(self.table.page_table.dtype)
        return rec

    @torch.inference_mode()
    def draft_steps(self, reqs: list[Req], lengths: list[int], k: int) -> list[list[Step]]:
        out: list[list[Step]] = [[] for _ in reqs]
        todo = [(i, r, rec) for i, r in enumerate(reqs)
                if lengths[i] > 0 and (rec := self._row(r)) is not None]
        if not todo:
            return out
        pool, dev = self.table.token_pool, self.engine.device
        items, news = [], []
        for _, r, rec in todo:  # catch up: what the row has not seen, through the last token
            ids = r.all_ids
            del rec.fed[_agreeing(rec.fed, ids):]
            if len(rec.fed) == len(ids):  # (seen in full: run its last token again)
                rec.fed.pop()
            new = ids[len(rec.fed):]
            pool[rec.row, rec.kv_len: len(ids)] = to_device(new, dev)
            items.append((rec, len(new)))
            news.append(new)
        logits = self.engine.forward(build_batch(items, self.table, dev, decode=False))
        for (rec, _), new in zip(items, news):
            rec.fed += new
        drafts = [[step] for step in top_tokens(logits, k)]
        live = [j for j, (i, _, _) in enumerate(todo) if lengths[i] > 1]
        for step in range(1, max(lengths[i] for i, _, _ in todo)):
            live = [j for j in live if lengths[todo[j][0]] > step]
            if not live:
                break
            recs = [todo[j][2] for j in live]
            rows = to_device([rec.row for rec in recs], dev)
            cols = to_device([rec.kv_len for rec in recs], dev)
            pool[rows, cols] = to_device([drafts[j][-1][0][0] for j in live], dev)
            batch = self.engine.stage_decode([rec.row for rec in recs], [rec.kv_len for rec in recs])
            if batch is None:
                batch = build_batch([(rec, 1) for rec in recs], self.table, dev, decode=True)
            for j, top in zip(live, top_tokens(self.engine.forward(batch), k)):
                todo[j][2].fed.append(drafts[j][-1][0][0])
                drafts[j].append(top)
        for j, (i, _, _) in enumerate(todo):
            out[i] = drafts[j]
        return out

    def release(self, req: Req) -> None:
        free_row(self._rows, req.uid, self.allocator, self.table)
