"""A launched batch whose sampled tokens are still on their way to the host."""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

from radixserve.core.batch import Batch
from radixserve.core.request import Req
from radixserve.engine.sampler import SampleResult
from radixserve.utils.tensor import pinned_copy

if TYPE_CHECKING:
    from radixserve.scheduler.embed import Embeddings
    from radixserve.scheduler.prompt_logprobs import PromptLogprobs
    from radixserve.scheduler.verify_tree import TreeStep
    from radixserve.speculative.verify import Verified


class ForwardPass(NamedTuple):
    """A batch whose forward is launched, not yet sampled."""

    items: list[tuple[Req, int]]
    emits: list[int]  # indices of items that finished their prompt: they sample a token
    batch: Batch
    logits: torch.Tensor  # [bs, vocab], one row per item (a verification step: `verify_rows`)
    prompt_lp: PromptLogprobs | None = None  # of the requests that asked for them
    embeds: Embeddings | None = None  # of the embedding requests whose prompt ends here
    drafts: dict[Req, list[int]] | None = None  # a verification step: each request's drafts
    trees: dict[Req, TreeStep] | None = None  # those of its drafts that branch (node by node)

    @property
    def constrained(self) -> bool:
        return any(self.items[i][0].grammar is not None for i in self.emits)


class InFlight(NamedTuple):
    items: list[tuple[Req, int]]
    emits: list[int]  # indices of items that finished their prompt: they produce a token
    host: SampleResult  # the sample copied into host memory (pinned on CUDA, filled async)
    event: torch.cuda.Event | None  # recorded after the copy; None on CPU
    prompt_lp: PromptLogprobs | None = None  # host copy, complete with `host`
    embeds: Embeddings | None = None  # host copy, complete with `host`
    runs: dict[int, Verified] | None = None  # a verification step's tokens, by item (on the host)

    def wait(self) -> SampleResult:
        if self.event is not None:
            self.event.synchronize()
        return self.host


def copy_to_host(res: SampleResult) -> tuple[SampleResult, torch.cuda.Event | None]:
    """The sample's host copy and the event after which it (and any copy started before) is
    complete; None on CPU."""
    if res.tokens.device.type != "cuda":
        return res, None
    host = SampleResult(*(pinned_copy(t) for t in res))
    event = torch.cuda.Event()
    event.record()
    return host, event
