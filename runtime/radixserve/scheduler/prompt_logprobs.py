"""Prompt logprobs (`SamplingParams.prompt_logprobs`, completions' `echo`): in a prefill batch,
the hidden state at prompt position p gives the logprob of prompt token p + 1, so the batch keeps
those rows' hidden states, and their log-softmax is reduced on the device to the chosen token's
logprob and the k best, a few hundred rows of logits at a time (a 2,000-token prompt's full
logits would be gigabytes at a 150K vocabulary)."""
from __future__ import annotations

from typing import NamedTuple

import torch

from radixserve.core.request import Req
from radixserve.utils.tensor import pinned_copy, to_device

_ROWS_PER_CHUNK = 512


class PromptLogprobPlan(NamedTuple):
    """Which batch tokens to keep, and whose they are."""

    keep: list[int]  # token positions in the batch
    targets: list[int]  # the prompt token each kept position predicts
    owners: list[tuple[Req, int]]  # (request, how many of the kept rows are its), in order
    k: int  # top logprobs to return per row (the largest any owner asked for)


class PromptLogprobs(NamedTuple):
    owners: list[tuple[Req, int]]
    targets: list[int]
    chosen: torch.Tensor  # [rows] float32
    top_ids: torch.Tensor  # [rows, k]
    top_logprobs: torch.Tensor  # [rows, k]


def plan(items: list[tuple[Req, int]]) -> PromptLogprobPlan | None:
    """For the prefill `items` (request, new tokens), before their `kv_len` advances: the rows of
    the requests that asked for prompt logprobs, each predicting a prompt token (the last prompt
    position predicts the first output token: the sampler's business, not a prompt logprob)."""
    keep: list[int] = []
    targets: list[int] = []
    owners: list[tuple[Req, int]] = []
    k, offset = 0, 0
    for req, n in items:
        # (a request retracted after its first token has sent its prompt logprobs already)
        if req.params.prompt_logprobs is not None and not req.output_ids:
            start = req.kv_len
            stop = min(start + n, req.prompt_len - 1)
            if stop > start:
                keep += range(offset, offset + stop - start)
                targets += req.input_ids[start + 1 : stop + 1]
                owners.append((req, stop - start))
                k = max(k, req.params.prompt_logprobs)
        offset += n
    return PromptLogprobPlan(keep, targets, owners, k) if owners else None


def compute(model: torch.nn.Module, hidden: torch.Tensor, p: PromptLogprobPlan) -> PromptLogprobs:
    """Reduce the kept hidden states [rows, H] to logprobs, on their device, without a sync."""
    targets = to_device(p.targets, hidden.device)
    chosen, top_ids, top_lps = [], [], []
    for lo in range(0, hidden.shape[0], _ROWS_PER_CHUNK):
        logp = torch.log_softmax(model.compute_logits(hidden[lo : lo + _ROWS_PER_CHUNK]).float(), -1)
        chosen.append(logp.gather(1, targets[lo : lo + _ROWS_PER_CHUNK, None])[:, 0])
        top = torch.topk(logp, p.k, dim=-1)
        top_ids.append(top.indices)
        top_lps.append(top.values)
    return PromptLogprobs(p.owners, p.targets, torch.cat(chosen), torch.cat(top_ids),
                          torch.cat(top_lps))


def to_host(r: PromptLogprobs) -> PromptLogprobs:
    """Started now, complete once the batch's host copy event has fired (`inflight.py`)."""
    return r._replace(chosen=pinned_copy(r.chosen), top_ids=pinned_copy(r.top_ids),
                      top_logprobs=pinned_copy(r.top_logprobs))


def record(r: PromptLogprobs) -> None:
    """Append each owner's rows to its `prompt_lps` (host values)."""
    chosen, ids, lps = r.chosen.tolist(), r.top_ids.tolist(), r.top_logprobs.tolist()
    row = 0
    for req, n in r.owners:
        k = req.params.prompt_logprobs or 0
        for i in range(row, row + n):
            req.prompt_lps.append((r.targets[i], chosen[i], list(zip(ids[i][:k], lps[i][:k]))))
        row += n
