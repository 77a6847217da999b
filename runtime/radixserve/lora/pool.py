"""The adapter slots on the device: every LoRA-capable projection of the model (each decoder
layer's qkv, o, gate-up and down) gets a stack of `num_slots` adapters' weights (`LinearLoRA`),
and each request row the slot of its adapter (`row_slots`, -1: the base model), from which a
batch's tokens are grouped by slot on the device, in a CUDA graph too. Which adapter fills
which slot is the scheduler's decision (`lora/manager.py`); this only holds the weights."""
from __future__ import annotations

import torch
from torch import nn

from radixserve.core.batch import Batch
from radixserve.layers.lora import LinearLoRA, LoRATarget
from radixserve.lora.adapter import LoRAAdapter
from radixserve_kernels import LoRAGroups, lora_groups


class LoRAPool:
    def __init__(self, model: nn.Module, num_slots: int, max_rank: int, dtype: torch.dtype,
                 num_rows: int, device: torch.device) -> None:
        self.num_slots, self.max_rank = num_slots, max_rank
        self.layers: dict[str, LinearLoRA] = {}
        for name, module in model.named_modules():
            if isinstance(module, LoRATarget):
                module.lora = self.layers[name] = LinearLoRA(module, num_slots, max_rank, dtype)
        self.row_slots = torch.full((num_rows,), -1, dtype=torch.int32, device=device)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for lw in self.layers.values() for t in (lw.a, lw.b))

    def fill(self, slot: int, adapter: LoRAAdapter) -> None:
        """Put `adapter` in `slot` (this rank's shard of each matrix), replacing what was there."""
        for lw in self.layers.values():
            lw.clear(slot)
        for (module, part), (a, b) in adapter.weights.items():
            self.layers[module].load(slot, part, a, b)

    def groups(self, batch: Batch) -> LoRAGroups:
        """The batch's tokens grouped by their requests' slots (no host sync: capturable)."""
        slots = self.row_slots[batch.req_rows]
        if not batch.is_decode:
            slots = torch.repeat_interleave(slots, batch.extend_lens, output_size=batch.num_tokens)
        return lora_groups(slots, self.num_slots)
