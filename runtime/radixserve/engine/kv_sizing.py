"""How many KV tokens fit: from free GPU memory, or a fixed budget on CPU (never more than a share
of what the container's memory limit leaves)."""
from __future__ import annotations

import logging

import torch

from radixserve import settings
from radixserve.utils.cgroup_memory import headroom_bytes

logger = logging.getLogger(__name__)
# The KV cache takes at most this share of what the container's limit leaves once the weights are
# loaded: the rest is for activations, the other processes and the allocator's slack.
CPU_HEADROOM_SHARE = 0.5


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
        left = headroom_bytes()
        if left is not None and int(left * CPU_HEADROOM_SHARE) < budget:
            logger.info("KV cache: %.2f GiB, half of the %.2f GiB the container's memory limit "
                        "leaves (%s asks %.2f GiB)", left * CPU_HEADROOM_SHARE / 2**30,
                        left / 2**30, settings.CPU_KV_GIB.name, budget / 2**30)
            budget = int(left * CPU_HEADROOM_SHARE)
    if budget <= bytes_per_token:
        raise RuntimeError(
            f"no memory left for the KV cache (budget {budget / 2**30:.2f} GiB); "
            "raise --memory-ratio (GPU) or the container's memory limit (CPU), or use a smaller "
            "model"
        )
    return max(1, min(want_tokens, budget // bytes_per_token))
