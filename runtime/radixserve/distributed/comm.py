from __future__ import annotations

import torch


class BaseCommunicator:
    """Collectives over the tensor-parallel group. The base class is the TP=1 identity."""

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over all ranks; may work in place and returns the result."""
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Concatenate every rank's `x` along `dim`, in rank order."""
        return x

    def min_int(self, value: int) -> int:
        """The smallest `value` over all ranks (host-side agreement, e.g. KV capacity)."""
        return value

    def broadcast_bytes(self, payload: bytes | None) -> bytes:
        """Rank 0's `payload` on every rank (others pass None). Blocking and lossless: a rank
        that joins late still receives it, since a collective waits for every member."""
        assert payload is not None
        return payload


_COMM: BaseCommunicator = BaseCommunicator()


def set_comm(comm: BaseCommunicator) -> None:
    global _COMM
    _COMM = comm


def get_comm() -> BaseCommunicator:
    return _COMM
