"""How many KV tokens to allocate, and what one costs.

On a GPU, what keeps the process under `--memory-ratio` of the card once the weights are loaded.
On CPU, what the server can use (`--max-running-requests` × the context, or `--max-kv-tokens`),
at most half the memory left to this process (its container's limit, else what the machine has
available): the rest is for activations, the other processes and the allocator's slack. The CPU
pool's pages are zero pages of the kernel until written (`utils.tensor.lazy_zeros`), so an idle
server holds little of it resident."""
from __future__ import annotations

import logging

import torch

from radixserve import settings
from radixserve.utils.cgroup_memory import headroom_bytes

logger = logging.getLogger(__name__)
CPU_HEADROOM_SHARE = 0.5


def kv_bytes_per_token(
    num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> int:
    """Bytes of K plus V one token occupies across all layers (on one TP rank)."""
    dims = {"num_layers": num_layers, "num_kv_heads": num_kv_heads, "head_dim": head_dim}
    for name, value in dims.items():
        if value < 1:
            raise ValueError(f"{name} must be positive, got {value}")
    return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def _available_bytes() -> int | None:
    """The machine's available memory (/proc/meminfo's MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def available_bytes() -> int | None:
    """Memory this process may still take: its container's headroom, else the machine's
    available memory; None where neither is known."""
    limit = headroom_bytes()
    return limit if limit is not None else _available_bytes()


def _cpu_budget(bytes_per_token: int, want_tokens: int) -> int:
    want = want_tokens * bytes_per_token
    asked = settings.CPU_KV_GIB.get()
    budget, why = (int(asked * 2**30), f"{settings.CPU_KV_GIB.name}") if asked is not None else (
        want, "what the running requests and the context can use")
    limit = headroom_bytes()
    where = "the container's memory limit" if limit is not None else "this machine"
    left = available_bytes()
    if left is not None and int(left * CPU_HEADROOM_SHARE) < budget:
        why = (f"half of the {left / 2**30:.2f} GiB {where} leaves ({why}: "
               f"{budget / 2**30:.2f} GiB)")
        budget = int(left * CPU_HEADROOM_SHARE)
    logger.info("KV budget on CPU: %.2f GiB, %s", min(budget, want) / 2**30, why)
    return budget


def kv_token_capacity(
    device: torch.device, bytes_per_token: int, memory_ratio: float, want_tokens: int,
    reserve_bytes: int = 0,
) -> int:
    """KV tokens to allocate: never more than `want_tokens` (what max requests × context could
    use); on CUDA, what keeps the process under `memory_ratio` of the card after the weights.
    `reserve_bytes`: memory left aside from the budget (a draft model's weights, loaded after)."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        budget = int(total * memory_ratio) - (total - free) - reserve_bytes
    else:
        budget = _cpu_budget(bytes_per_token, want_tokens) - reserve_bytes
    if budget <= bytes_per_token:
        raise RuntimeError(
            f"no memory left for the KV cache (budget {budget / 2**30:.2f} GiB); "
            "raise --memory-ratio (GPU) or the container's memory limit (CPU), or use a smaller "
            "model"
        )
    return max(1, min(want_tokens, budget // bytes_per_token))
