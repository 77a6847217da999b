"""EAGLE-3: a one-layer draft head (`eagle3_head.py`) fed the target's own hidden states.

The target leaves the hidden states entering three of its layers at each token's KV slot
(`models/decoder.py`, `HiddenCapture`), in a store beside its KV pool: every token it computes
(prompt, decode, verified drafts) writes them, and a cached prefix's slots hold them already. So
the head reads them through the request's page-table row, whatever computed them.

The head's position p reads (the target's hidden state at p, token p + 1) and predicts token
p + 2. Its KV lives in a pool of its own (one layer, page size 1, as many tokens as the
target's), a row a request, as a draft model's does (`draft.py`). `fed` counts the positions
whose KV came from the target's hidden states: those stay valid (the tokens and hidden states
they read are committed). A round of drafting catches each request up on the positions the
target computed since (one extend; its last position's logits give the first draft), then feeds
the head its own output hidden state and its last draft for each further draft (greedy decode
steps, a chain; with --speculative-eagle-topk k each step's k likeliest tokens, the others
branching off the chain: `tree.branch_paths`). Those steps' KV is written over by the next
round's catch-up. Drafts are scored over the draft vocabulary and mapped to target ids by `d2t`.

NOTE: the target runs without CUDA graphs (its capture is eager), and at tensor parallel size 1
only. On a GPU its verification steps are therefore extends, which verify a tree's first
candidate alone (`Engine.verifies_as_decode`)."""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import torch

from radixserve.attention import AttnConfig, create_attn_backend
from radixserve.core.context import forward_batch
from radixserve.core.table import TableManager
from radixserve.engine.batch_builder import build_batch
from radixserve.engine.engine import Companion
from radixserve.kvcache.allocator import PageAllocator
from radixserve.kvcache.pool import MHAKVPool
from radixserve.models import hf_config as hc
from radixserve.models.decoder import DecoderModel, HiddenCapture
from radixserve.models.source import ModelSource
from radixserve.speculative.drafter import DRAFTERS, StepDrafter, free_row
from radixserve.speculative.eagle3_head import (
    EMBED,
    FIELD,
    Eagle3Head,
    HeadShape,
    aux_layers,
    checkpoint_shapes,
)
from radixserve.speculative.tree import Step, top_tokens
from radixserve.utils.tensor import lazy_zeros, to_device

if TYPE_CHECKING:
    from radixserve.config import EngineConfig, SchedulerConfig
    from radixserve.core.batch import Batch
    from radixserve.core.request import Req
    from radixserve.engine.engine import Engine

logger = logging.getLogger(__name__)
_GRAPH_FIELDS = ("cuda_graph_max_bs", "prefill_graph_max_tokens")


class Eagle3Plan(NamedTuple):
    """The head's checkpoint checked against the target, before the target loads."""

    path: Path
    config: object
    shape: HeadShape
    layers: tuple[int, ...]  # the target layers whose input hidden states the head reads
    own_embed: bool


@dataclass(eq=False)
class _Row:
    """A request's row of the head's pool: `fed` positions hold KV from the target's hidden
    states; `kv_len` is where the next batch's tokens start (`build_batch`)."""

    row: int
    slots: torch.Tensor
    fed: int = 0
    kv_len: int = 0


@DRAFTERS.register("eagle3")
class Eagle3Drafter(StepDrafter):
    def __init__(self, head: Eagle3Head, to_target: torch.Tensor | None, target: Engine,
                 store: torch.Tensor, head_cfg: object, max_reqs: int) -> None:
        self.head, self.to_target, self.target, self.store = head, to_target, target, store
        self.embed = head.embed_tokens or target.model.model.embed_tokens
        dev, kv_heads, head_dim = target.device, hc.num_kv_heads(head_cfg), hc.head_dim(head_cfg)
        tokens = target.num_pages * target.page_size
        self.table = TableManager(max_reqs, target.table.max_seq_len, dev)
        self.allocator = PageAllocator(tokens, 1, dev)
        pool = MHAKVPool(1, tokens, 1, kv_heads, head_dim, target.kv_dtype, dev)
        self.attn = create_attn_backend(target.cfg.attn, AttnConfig(
            num_qo_heads=head_cfg.num_attention_heads, num_kv_heads=kv_heads, head_dim=head_dim,
            page_size=1, kv_pool=pool, page_table=self.table.page_table, device=dev,
            dtype=target.dtype))
        self._rows: dict[int, _Row] = {}

    @classmethod
    def target_config(cls, engine_cfg: EngineConfig) -> EngineConfig:
        """No CUDA graphs: the target's hidden states are captured in eager forwards."""
        for name in _GRAPH_FIELDS:
            if getattr(engine_cfg, name):
                raise ValueError(f"{name}: --speculative-algorithm eagle3 runs the target without "
                                 "CUDA graphs (it captures hidden states eagerly); leave it unset "
                                 "or 0")
        return dataclasses.replace(engine_cfg, **dict.fromkeys(_GRAPH_FIELDS, 0))

    @classmethod
    def plan(cls, engine_cfg: EngineConfig, cfg: SchedulerConfig) -> tuple[Companion, Eagle3Plan]:
        """The head's checkpoint checked (shapes from its headers), and its weights, KV and the
        target's captured hidden states a token, so that the target leaves room for them."""
        from radixserve.distributed import get_tp_info
        from radixserve.engine.device import resolve_device
        from radixserve.kvcache.kv_dtype import resolve_kv_dtype
        from radixserve.kvcache.sizing import kv_bytes_per_token
        from radixserve.models.loader import resolve_dtype

        if get_tp_info().size > 1:
            raise ValueError("--speculative-algorithm eagle3 is not supported with tensor "
                             "parallelism (--tp > 1) yet")
        target = ModelSource.resolve(engine_cfg.model)
        tcfg = hc.text_config(target.config)
        source = ModelSource.resolve(cfg.speculative_draft_model_path)
        shape = HeadShape.of(source.config, tcfg)
        found = checkpoint_shapes(source.path)
        shape.check(found, source.path)
        layers = aux_layers(source.config, int(tcfg.num_hidden_layers))
        dtype = resolve_dtype(engine_cfg.dtype, target.config, resolve_device(engine_cfg.device))
        kv = kv_bytes_per_token(1, hc.num_kv_heads(source.config), hc.head_dim(source.config),
                                resolve_kv_dtype(engine_cfg.kv_cache_dtype, dtype))
        captured = len(layers) * shape.target_hidden * dtype.itemsize
        return (Companion(shape.weight_bytes(dtype, found), kv + captured),
                Eagle3Plan(source.path, source.config, shape, layers, EMBED in found))

    @classmethod
    def create(cls, engine_cfg: EngineConfig, cfg: SchedulerConfig, target: Engine,
               context: Eagle3Plan) -> Eagle3Drafter:
        from radixserve.models.loader import default_dtype

        model = getattr(target.model, "model", None)
        if not isinstance(model, DecoderModel):
            raise TypeError(f"--speculative-algorithm eagle3: {type(target.model).__name__} "
                             "does not expose its hidden states")
        assert target.graph_runner is None and target.prefill_graphs is None, "graphs with eagle3"
        dev, dtype, shape = target.device, target.dtype, context.shape
        with torch.device("meta"), default_dtype(dtype):
            head = Eagle3Head(context.config, shape, target.table.max_seq_len, context.own_embed)
        head.to_empty(device=dev)
        head.midlayer.self_attn.rotary_emb.on_materialized()
        head.eval().requires_grad_(False)
        d2t = head.load(context.path)
        to_target = None if d2t is None else (torch.arange(len(d2t)) + d2t).to(dev)
        if to_target is not None and not bool(
                ((to_target >= 0) & (to_target < shape.target_vocab)).all()):
            raise ValueError(f"{FIELD}: the EAGLE-3 checkpoint's d2t maps draft ids outside the "
                             f"target's vocabulary ({shape.target_vocab})")
        slots = (target.num_pages + 1) * target.page_size  # (as the KV pool: its scratch page too)
        store = lazy_zeros((slots, len(context.layers), shape.target_hidden), dtype, dev)
        model.capture = HiddenCapture(context.layers, store)
        logger.info("speculative decoding: EAGLE-3 head %s over %d draft tokens, reading the "
                    "inputs of target layers %s", context.path.name, shape.draft_vocab,
                    list(context.layers))
        return cls(head, to_target, target, store, context.config, cfg.max_running_requests + 1)

    def _row(self, req: Req) -> _Row | None:
        rec = self._rows.get(req.uid)
        if rec is not None:
            return rec
        need = req.prompt_len + req.params.max_tokens
        if need > self.table.max_seq_len or self.table.num_free == 0:
            return None
        pages = self.allocator.alloc(need)
        if pages is None:
            return None  # the head's pool is full: this request decodes without drafts
        rec = self._rows[req.uid] = _Row(self.table.alloc_row(), self.allocator.pages_to_slots(pages))
        self.table.page_table[rec.row, :need] = rec.slots.to(self.table.page_table.dtype)
        return rec

    def _forward(self, batch: Batch, hidden: torch.Tensor,
                 k: int) -> tuple[list[Step], torch.Tensor]:
        """(each row's `k` likeliest drafts, as target ids; the head's output hidden states
        [T, H])."""
        embeds = self.embed(batch.input_ids)
        self.attn.prepare(batch)
        with forward_batch(batch, self.attn):
            normed, out = self.head(batch.positions, embeds, hidden)
        if not batch.is_decode:  # (an extend: the last position of each request drafts)
            last = torch.cumsum(batch.extend_lens, 0) - 1
            normed, out = normed[last], out[last]
        return top_tokens(self.head.lm_head(normed), k, self.to_target), out

    @torch.inference_mode()
    def draft_steps(self, reqs: list[Req], lengths: list[int], k: int) -> list[list[Step]]:
        out: list[list[Step]] = [[] for _ in reqs]
        todo = []
        for i, r in enumerate(reqs):
            # the positions whose hidden states the target has computed: those before its last token
            end = min(len(r.all_ids) - 1, r.kv_len)
            if lengths[i] > 0 and end > 0 and (rec := self._row(r)) is not None:
                rec.fed = min(rec.fed, end - 1)  # (its last position runs again: it drafts)
                todo.append((i, r, rec, end))
        if not todo:
            return out
        dev, pool = self.target.device, self.table.token_pool
        items, rows, cols = [], [], []
        for _, r, rec, end in todo:  # catch up: position p reads token p + 1
            pool[rec.row, rec.fed: end] = to_device(r.all_ids[rec.fed + 1: end + 1], dev)
            rec.kv_len = rec.fed
            items.append((rec, end - rec.fed))
            rows += [r.row] * (end - rec.fed)
            cols += range(rec.fed, end)
        where = to_device([rows, cols], dev)
        slots = self.target.table.page_table[where[0], where[1]].long()
        hidden = self.head.fc(self.store[slots].flatten(1))
        tops, hidden = self._forward(build_batch(items, self.table, dev, decode=False), hidden, k)
        for _, _, rec, end in todo:
            rec.fed = rec.kv_len = end
        drafts = [[top] for top in tops]
        live = list(range(len(todo)))
        for step in range(1, max(lengths[i] for i, _, _, _ in todo)):
            live = [j for j in live if lengths[todo[j][0]] > step]
            if not live:
                break
            recs = [todo[j][2] for j in live]
            at = to_device([[rec.row for rec in recs], [rec.kv_len for rec in recs],
                            [drafts[j][-1][0][0] for j in live]], dev)
            pool[at[0], at[1]] = at[2]
            sel = to_device(live, dev)
            tops, new = self._forward(build_batch([(rec, 1) for rec in recs], self.table, dev,
                                                  decode=True), hidden[sel], k)
            hidden[sel] = new
            for j, rec, top in zip(live, recs, tops):
                rec.kv_len += 1
                drafts[j].append(top)
        for j, (i, _, _, _) in enumerate(todo):
            out[i] = drafts[j]
        return out

    def release(self, req: Req) -> None:
        free_row(self._rows, req.uid, self.allocator, self.table)
