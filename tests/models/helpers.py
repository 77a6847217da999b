"""A dense causal attention backend for one prefill sequence, so model tests need no KV pool."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from radixserve.attention.base import BaseAttnBackend
from radixserve.core.batch import Batch
from radixserve.core.context import forward_batch
from radixserve.models.base import BaseCausalLM


class DenseCausalBackend(BaseAttnBackend):
    def __init__(self) -> None:  # no AttnConfig: nothing is cached
        pass

    def prepare(self, batch: Batch) -> None:
        assert batch.bs == 1 and batch.seq_lens_cpu == batch.extend_lens_cpu  # no cached prefix

    def forward(
        self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, layer_id: int,
        batch: Batch, out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attends over the k/v handed in: there is no pool to store them in or read them from."""
        assert k is not None and v is not None, "DenseCausalBackend has no KV pool"
        assert out is None, "the model runs eagerly here: no static output buffer"
        groups = q.shape[1] // k.shape[1]
        k, v = (x.repeat_interleave(groups, dim=1) for x in (k, v))
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True
        )
        return out.transpose(0, 1)

    def attend(self, q: torch.Tensor, layer_id: int, batch: Batch) -> torch.Tensor:
        raise NotImplementedError("DenseCausalBackend has no KV pool: pass k/v to forward")


def one_request_batch(ids: list[int]) -> Batch:
    n = len(ids)
    return Batch(
        phase="prefill",
        input_ids=torch.tensor(ids),
        positions=torch.arange(n),
        out_loc=torch.zeros(n, dtype=torch.int64),
        req_rows=torch.zeros(1, dtype=torch.int64),
        seq_lens=torch.tensor([n], dtype=torch.int32),
        extend_lens=torch.tensor([n], dtype=torch.int32),
        seq_lens_cpu=[n],
        extend_lens_cpu=[n],
    )


@torch.inference_mode()
def our_logits(model: BaseCausalLM, ids: list[int]) -> torch.Tensor:
    """float32 logits [len(ids), vocab] of every position."""
    batch, backend = one_request_batch(ids), DenseCausalBackend()
    backend.prepare(batch)
    with forward_batch(batch, backend):
        hidden = model(batch.input_ids, batch.positions)
    return model.compute_logits(hidden).float()


@torch.inference_mode()
def hf_logits(model_dir: Path, ids: list[int],
              model_class: str = "AutoModelForCausalLM") -> torch.Tensor:
    """transformers' float32 logits (of `model_class`, a transformers class name)."""
    import transformers

    model = getattr(transformers, model_class).from_pretrained(model_dir, dtype=torch.float32).eval()
    return model(torch.tensor([ids])).logits[0].float()
