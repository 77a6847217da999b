"""How many KV tokens fit: from free GPU memory, or a fixed budget on CPU."""
from __future__ import annotations

import torch

from radixserve import settings


def kv_token_capacity(
    device: torch.device, bytes_per_token: int, memory_ratio: float, want_tokens: int
) -> int:
    """KV tokens to allocate: never more than `want_tokens` (what max requests × context could
    use); on CUDA, what keeps the process under `memory_ratio` of the card after the weights."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        budget = int(total * memory_ratio) - (total - free)
    else:
        budget = int(settings.CPU_KV_GIB.get() * 2**30)
    if budget <= bytes_per_token:
        raise RuntimeError(
            f"no memory left for the KV cache (budget {budget / 2**30:.2f} GiB); "
            "raise --memory-ratio or use a smaller model"
        )
    return max(1, min(want_tokens, budget // bytes_per_token))
