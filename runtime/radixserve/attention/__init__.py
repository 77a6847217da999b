from __future__ import annotations

from radixserve.attention.base import ATTN_BACKENDS, AttnConfig, BaseAttnBackend
from radixserve.attention.factory import create_attn_backend

__all__ = ["ATTN_BACKENDS", "AttnConfig", "BaseAttnBackend", "create_attn_backend"]
