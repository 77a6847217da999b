"""Token selection: greedy, temperature, top-k, top-p, min-p, penalties, logit bias, min_tokens,
per-request seeds."""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

from radixserve.config import EngineConfig
from radixserve.utils import kernel_path
from radixserve.utils.tensor import to_device
from radixserve_kernels import TokenStore, argmax_rows, argmax_rows_ref, store_tokens_ref

if TYPE_CHECKING:
    from radixserve.core.request import Req
    from radixserve.sampling_params import SamplingParams

_MIN_TEMPERATURE = 1e-6  # below this, sampling is greedy in float32 anyway


class SampleResult(NamedTuple):
    tokens: torch.Tensor  # [bs] int64, on the logits' device
    chosen_logprob: torch.Tensor | None = None  # [bs] float32, when any request asked for logprobs
    top_ids: torch.Tensor | None = None  # [bs, K] best tokens, K = the largest count asked for
    top_logprobs: torch.Tensor | None = None  # [bs, K]
    # [bs] bool, rows that had nothing to sample from (NaN, +inf, or -inf throughout): their
    # tokens are meaningless; None where no row was checked (the greedy fast path cannot fail)
    invalid: torch.Tensor | None = None


def apply_penalties(logits: torch.Tensor, req: Req) -> torch.Tensor:
    """OpenAI presence/frequency penalties over generated tokens; HF repetition penalty over
    prompt and generated tokens."""
    p = req.params
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(req.all_ids)), device=logits.device)
        vals = logits[seen]
        logits[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    if (p.presence_penalty or p.frequency_penalty) and req.output_ids:
        out = torch.tensor(req.output_ids, device=logits.device)
        counts = torch.bincount(out, minlength=logits.shape[-1])[: logits.shape[-1]].to(logits.dtype)
        logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)
    # an extreme penalty (repetition_penalty 1e-40) overflows to inf: keep the row finite
    return torch.nan_to_num(logits, nan=float("-inf"), posinf=torch.finfo(logits.dtype).max,
                            neginf=float("-inf"))


def apply_bias_and_min_tokens(logits: torch.Tensor, req: Req, eos_ids: frozenset[int],
                              before: int | None = None) -> None:
    """In place on a float32 row: OpenAI's `logit_bias`, then, while fewer than `min_tokens` tokens
    came before this one, the ending tokens (`stop_token_ids`, and EOS unless `ignore_eos`) at
    -inf, as vLLM's min_tokens. The token being sampled follows `before` others; by default
    `kv_len - prompt_len` (the scheduler's count, so overlap cannot make it stale)."""
    p = req.params
    if p.logit_bias:
        ids = to_device(list(p.logit_bias), logits.device)
        logits[ids] += to_device(list(p.logit_bias.values()), logits.device, torch.float32)
    if before is None:
        before = req.kv_len - req.prompt_len
    if p.min_tokens and before < p.min_tokens:
        ban = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_ids))
        ban = sorted(t for t in ban if t < logits.shape[-1])
        if ban:
            logits[to_device(ban, logits.device)] = float("-inf")


def scale(row: torch.Tensor, temperature: float) -> torch.Tensor:
    """`row / temperature` in a stable form: shifted so its maximum is 0 first, so a tiny
    temperature sends the others to -inf (never inf - inf = nan), and floored so it never
    rounds to 0 in float32. The softmax of the result is the same distribution."""
    return (row - row.max()) / max(temperature, _MIN_TEMPERATURE)


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """Mask (to -inf) tokens outside top-k, the top-p nucleus and the min-p floor. [V] float32."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if min_p > 0.0:
        probs = torch.softmax(logits, -1)
        logits = logits.masked_fill(probs < min_p * probs.max(), float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cum = torch.softmax(sorted_logits, -1).cumsum(-1)
        drop = cum - torch.softmax(sorted_logits, -1) >= top_p  # keep the token that crosses top_p
        drop[0] = False  # NOTE: a top_p that rounds to 0 in float32 must still leave the best token
        logits = logits.clone()
        logits[order[drop]] = float("-inf")
    return logits


def plain_probs(row: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The distribution a request samples from at one row of float32 logits [V]: scaled by its
    temperature, filtered by its top-k, top-p and min-p (what drafts are verified against)."""
    return torch.softmax(filter_logits(scale(row, p.temperature), p.top_k, p.top_p, p.min_p), -1)


class Sampler:
    def __init__(self, device: torch.device, seed: int = EngineConfig.seed,
                 eos_ids: frozenset[int] = frozenset()) -> None:
        self.device = device
        self.eos_ids = eos_ids  # what min_tokens holds back, with each request's stop_token_ids
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    def new_request_generator(self, seed: int) -> torch.Generator:
        g = torch.Generator(device=self.device)
        g.manual_seed(seed)
        return g

    def sample(self, logits: torch.Tensor, reqs: list[Req],
               store: TokenStore | None = None) -> SampleResult:
        """logits [bs, V] in the model's dtype, one row per request (float32 rows may be modified
        in place). `store`: where the tokens also go (the next step's inputs). Stays on the
        device: nothing here waits for the GPU."""
        if all(r.params.is_greedy and not r.params.adjusts_logits and r.params.logprobs is None
               for r in reqs):
            # the common case, read as is: widening to float32 is exact, so argmax picks the same
            # token, without writing and re-reading a float32 copy (bs x 152K at Qwen's vocab)
            pick = argmax_rows if kernel_path.use_triton(logits) else argmax_rows_ref
            return SampleResult(pick(logits, store))
        logits = logits.float()  # penalties, temperature and logprobs work in float32, as HF's do
        for i, req in enumerate(reqs):
            if req.params.has_penalties:
                logits[i] = apply_penalties(logits[i], req)
            if req.params.logit_bias or req.params.min_tokens:
                apply_bias_and_min_tokens(logits[i], req, self.eos_ids)
        # a row with no valid value would make multinomial fail (on CUDA, a device assert that
        # ends the process): it is sampled as uniform instead, and its request fails alone
        invalid = (torch.isnan(logits).any(-1) | torch.isposinf(logits).any(-1)
                   | torch.isneginf(logits).all(-1))
        logits.masked_fill_(invalid[:, None], 0.0)
        want_lp = [r.params.logprobs for r in reqs if r.params.logprobs is not None]
        logp = torch.log_softmax(logits, -1) if want_lp else None
        tokens = logits.argmax(-1)
        for i, req in enumerate(reqs):
            p = req.params
            if p.is_greedy:
                continue
            row = filter_logits(scale(logits[i], p.temperature), p.top_k, p.top_p, p.min_p)
            gen = req.generator or self.generator
            tokens[i] = torch.multinomial(torch.softmax(row, -1), 1, generator=gen)[0]
        if store is not None:
            store_tokens_ref(tokens, store)
        if logp is None:
            return SampleResult(tokens, invalid=invalid)
        top = torch.topk(logp, max(want_lp), dim=-1)
        chosen = logp.gather(1, tokens[:, None])[:, 0]
        return SampleResult(tokens, chosen, top.indices, top.values, invalid)
