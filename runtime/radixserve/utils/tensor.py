from __future__ import annotations

import math

import torch


def to_device(values: list, device: torch.device, dtype: torch.dtype = torch.int64,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """Host list -> device tensor without a host sync (pinned staging, async copy); with `out`,
    into its first len(values) entries (one copy, e.g. into a CUDA graph's static buffer)."""
    host = torch.tensor(values, dtype=dtype, pin_memory=device.type == "cuda")
    if out is not None:
        return out[: len(values)].copy_(host, non_blocking=True)
    return host if device.type != "cuda" else host.to(device, non_blocking=True)


def pinned_copy(t: torch.Tensor | None) -> torch.Tensor | None:
    """An asynchronous copy of a CUDA tensor into pinned host memory (read it after an event
    recorded later has fired); a CPU tensor as it is."""
    if t is None or t.device.type != "cuda":
        return t
    out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    return out.copy_(t, non_blocking=True)


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """`torch.zeros`, except that on CPU the memory is the kernel's zero pages until written
    (calloc, through numpy: torch's own zeros writes every byte), so a large, mostly idle
    buffer such as the KV pool costs no resident memory until used."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    import numpy as np

    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    return torch.from_numpy(np.zeros(nbytes, dtype=np.uint8)).view(dtype).view(shape)
