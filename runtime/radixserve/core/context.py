"""The batch being run, visible to attention layers deep inside the model without threading it
through every forward signature."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixserve.attention.base import BaseAttnBackend
    from radixserve.core.batch import Batch


class ForwardContext:
    def __init__(self) -> None:
        self.batch: Batch | None = None
        self.attn_backend: BaseAttnBackend | None = None


_CTX = ForwardContext()


def get_context() -> ForwardContext:
    return _CTX


@contextmanager
def forward_batch(batch: Batch, attn_backend: BaseAttnBackend) -> Iterator[None]:
    assert _CTX.batch is None, "nested forward"
    _CTX.batch, _CTX.attn_backend = batch, attn_backend
    try:
        yield
    finally:
        _CTX.batch, _CTX.attn_backend = None, None
