from __future__ import annotations

from typing import NamedTuple


class TPInfo(NamedTuple):
    rank: int
    size: int


_TP_INFO = TPInfo(rank=0, size=1)


def set_tp_info(rank: int, size: int) -> None:
    global _TP_INFO
    if not 0 <= rank < size:
        raise ValueError(f"tp rank {rank} out of range for size {size}")
    _TP_INFO = TPInfo(rank, size)


def get_tp_info() -> TPInfo:
    return _TP_INFO
