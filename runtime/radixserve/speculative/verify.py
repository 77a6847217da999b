"""Which drafted tokens a request keeps. The target's logits at each drafted position say what it
would have produced there; the drafts it agrees with are kept, up to the first it does not, and
the target's own token follows (at the first disagreement, or after the last draft).

Greedy: a draft is kept where it is the target's argmax, so the output is the plain decode's,
token for token. Sampled: drafts are deterministic (a point mass on the drafted token), so the
standard rejection rule keeps draft `d` with probability p(d), and a rejection samples from p with
`d` removed (renormalized): each token's distribution is exactly the target's p, as in plain
decoding. p is the request's own: logit bias, min_tokens (counted at each position), temperature,
top-k, top-p and min-p, as `engine/sampler.py` applies them. Logprobs are the target's at each
kept position."""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

from radixserve.engine.sampler import apply_bias_and_min_tokens, plain_probs

if TYPE_CHECKING:
    from radixserve.core.request import Req


class Verified(NamedTuple):
    tokens: list[int]  # the kept drafts, then the target's own token
    logprobs: list[float] | None = None  # each token's, where the request asked for them
    top: list[list[tuple[int, float]]] | None = None  # each position's k best
    invalid: bool = False  # a row had nothing to sample from (NaN, +inf, -inf throughout)


def plain_greedy(req: Req) -> bool:
    """Whether the request's tokens are its logits' argmax, nothing else asked (the common case:
    its drafts are checked against argmaxes read for the whole step at once)."""
    p = req.params
    return p.is_greedy and not p.adjusts_logits and p.logprobs is None


def verify(logits: torch.Tensor, drafts: list[int], req: Req, eos_ids: frozenset[int],
           generator: torch.Generator, best: list[int] | None = None) -> Verified:
    """`logits` [len(drafts) + 1, V]: the target's at the request's last token and at each draft;
    `best`: their argmaxes, where read already (a `plain_greedy` request)."""
    p = req.params
    if plain_greedy(req):
        if best is None:
            best = logits.argmax(-1).tolist()
        n = 0
        while n < len(drafts) and drafts[n] == best[n]:
            n += 1
        return Verified(drafts[:n] + [best[n]])
    rows = logits.float()
    done = len(req.output_ids)
    tokens: list[int] = []
    for j in range(len(drafts) + 1):
        if p.logit_bias or p.min_tokens:
            apply_bias_and_min_tokens(rows[j], req, eos_ids, before=done + j)
        row = rows[j]
        if bool(torch.isnan(row).any() | torch.isposinf(row).any() | torch.isneginf(row).all()):
            return Verified([], invalid=True)  # its request fails alone, as the sampler's would
        if p.is_greedy:
            tok = int(rows[j].argmax())
            tokens.append(drafts[j] if j < len(drafts) and drafts[j] == tok else tok)
        else:
            probs = plain_probs(rows[j], p)
            gen = req.generator or generator
            if j < len(drafts):
                d = drafts[j]
                if float(torch.rand((), generator=gen, device=probs.device)) < float(probs[d]):
                    tokens.append(d)
                    continue
                probs[d] = 0.0  # rejected: the rest of p, renormalized by multinomial
            tokens.append(int(torch.multinomial(probs, 1, generator=gen)[0]))
        if j == len(drafts) or tokens[-1] != drafts[j]:
            break
    if p.logprobs is None:
        return Verified(tokens)
    logp = torch.log_softmax(rows[: len(tokens)], -1)
    chosen = logp.gather(1, torch.tensor(tokens, device=logp.device)[:, None])[:, 0].tolist()
    top = torch.topk(logp, p.logprobs, dim=-1) if p.logprobs else None
    best = ([list(zip(i, v)) for i, v in zip(top.indices.tolist(), top.values.tolist())]
            if top is not None else [[] for _ in tokens])
    return Verified(tokens, chosen, best)
