"""Tensor-parallel rank information and collective communication.

Layers call `get_tp_info()` to size their shards and `get_comm()` for collectives. With a TP size
of 1 every collective is the identity, so single-GPU and CPU runs pay nothing.
"""
from __future__ import annotations

from .comm import BaseCommunicator, get_comm, set_comm
from .info import TPInfo, get_tp_info, set_tp_info

__all__ = ["BaseCommunicator", "TPInfo", "get_comm", "get_tp_info", "set_comm", "set_tp_info"]
