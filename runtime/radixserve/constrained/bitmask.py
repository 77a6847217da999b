"""The grammar mask of one batch: each constrained row's allowed next tokens as a bitmask, filled
on the host (while the device still runs the batch's forward), copied to the device without
waiting, and applied to that row's logits (-inf for every forbidden token). Other rows are not
touched. Sampling then reads the masked logits: penalties, temperature, top-k/p and min-p act
on the allowed tokens only, and logprobs are those of the masked distribution (renormalised over
the allowed tokens; a forbidden token's is -inf).

A row whose grammar allows no token at all (a dead end the grammar walked into) would leave
nothing to sample: `apply` leaves such a row unmasked and names it, so that its request alone
fails and the sampler never sees a row of -inf."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from radixserve.constrained.matcher import GrammarState


class GrammarMasker:
    def __init__(self) -> None:
        self._batch: Any = None  # xgrammar.BatchGrammarMatcher: fills the rows on its threads

    def apply(self, logits: torch.Tensor, rows: list[tuple[int, GrammarState]]) -> list[int]:
        """Mask `logits` [bs, vocab] in place on each (row index, grammar state) of `rows`; the
        row indices left unmasked because their grammar allows no token."""
        import xgrammar as xgr

        if self._batch is None:
            self._batch = xgr.BatchGrammarMatcher()
        bs, vocab = logits.shape
        # NOTE: one row per batch row (the CUDA kernel reads the mask at the logits' row); a fresh
        # pinned buffer each time, so no copy still in flight reads a buffer being refilled
        host = torch.empty(xgr.get_bitmask_shape(bs, vocab), dtype=xgr.bitmask_dtype,
                           pin_memory=logits.is_cuda)
        index = [i for i, _ in rows]
        self._batch.batch_fill_next_token_bitmask([s.matcher for _, s in rows], host, index)
        allows = host[index].any(dim=1).tolist()  # (a host tensor: no device sync)
        dead = [i for i, ok in zip(index, allows) if not ok]
        if dead:
            index = [i for i, ok in zip(index, allows) if ok]
            if not index:
                return dead
        mask = host.to(logits.device, non_blocking=True)
        xgr.apply_token_bitmask_inplace(logits, mask, vocab_size=vocab, indices=index)
        return dead
