"""A request's life inside one scheduler: prompt, KV it holds, tokens it produced."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from radixserve.sampling_params import SamplingParams

if TYPE_CHECKING:
    from radixserve.constrained.matcher import GrammarState
    from radixserve.lora.adapter import LoRAAdapter


@dataclass(eq=False)
class Req:
    uid: int
    input_ids: list[int]
    params: SamplingParams
    row: int = -1  # page-table / token-pool row while admitted
    cached_len: int = 0  # prefix tokens matched in the prefix cache at admission
    # NOTE: cached_len grows as the request's own prompt is shared; this stays the admission hit
    prefix_hit: int = 0  # prompt tokens the prefix cache served (usage's cached_tokens)
    cache_handle: Any = None
    num_slots: int = 0  # slots of the row that the request holds (cached + allocated)
    kv_len: int = 0  # tokens whose KV has been computed
    output_ids: list[int] = field(default_factory=list)
    generator: torch.Generator | None = None  # per-request RNG when a seed is given
    grammar: GrammarState | None = None  # a constrained request's matcher, once compiled
    # prompt logprobs so far: (token id, logprob, [(id, logprob), …]) of prompt tokens 1, 2, …
    prompt_lps: list[tuple[int, float, list[tuple[int, float]]]] = field(default_factory=list)
    aborted: bool = False
    finished: bool = False
    # speculative decoding: tokens drafted for it, drafts kept, steps that verified drafts
    spec_drafted: int = 0
    spec_accepted: int = 0
    spec_steps: int = 0
    lora: LoRAAdapter | None = None  # the LoRA adapter it runs with (None: the base model)
    namespace: int = 0  # its prefix-cache namespace (the adapter's load, `lora/manager.py`)
    lora_slot: int = -1  # the device slot holding its adapter while admitted
    arrival: int = 0  # the scheduler's arrival count: ties in the queue and in retraction
    # retraction: tokens of `all_ids` to prefill again when re-admitted (0: the prompt), and the
    # KV it had computed when retracted (what re-admission may have to compute again)
    resume_len: int = 0
    retracted_kv: int = 0
    overtaken: int = 0  # later arrivals of its priority admitted before it (scheduling policies)

    @property
    def prompt_len(self) -> int:
        return len(self.input_ids)

    @property
    def all_ids(self) -> list[int]:
        return self.input_ids + self.output_ids

    @property
    def prefill_len(self) -> int:
        """Tokens computed before the request samples: its prompt, or after a retraction the
        prompt and the tokens it had generated."""
        return self.resume_len or self.prompt_len

    @property
    def fill_ids(self) -> list[int]:
        """The `prefill_len` tokens prefilled."""
        return self.all_ids[: self.prefill_len] if self.resume_len else self.input_ids

    @property
    def prefill_done(self) -> bool:
        return self.kv_len >= self.prefill_len

    @property
    def remaining_prefill(self) -> int:
        return self.prefill_len - self.kv_len

    @property
    def reserve_len(self) -> int:
        """Slots the request can ever need: prompt + every token it may generate (an embedding
        generates none)."""
        return self.prompt_len + (0 if self.params.embed else self.params.max_tokens)

    @property
    def tokens_left(self) -> int:
        """Tokens it may still generate."""
        return 0 if self.params.embed else self.params.max_tokens - len(self.output_ids)
