"""Mixed prefill and decode batches on CUDA (`mixed_chunk=True`): each attention backend's extend
path takes decode rows of length 1 beside prompt chunks. In float32 the greedy tokens equal
transformers' for every architecture (CUDA graphs and overlap on for the pure decode steps). In
bfloat16, where FlashInfer runs its own kernels: test_bf16.py, mixed and not."""
from __future__ import annotations

import pytest

from tests.gpu.helpers import BACKENDS, generate
from tests.runtime.helpers import greedy_reference, mixed_batches, spy_batches

pytestmark = pytest.mark.gpu
LENGTHS = [1, 7, 33, 129, 200, 64, 300, 16]
MAX_NEW = 12


@pytest.fixture(scope="module")
def reference(tiny_ckpts) -> dict[str, tuple]:
    return greedy_reference(tiny_ckpts, LENGTHS, MAX_NEW)


@pytest.mark.parametrize("attn", BACKENDS)
def test_fp32_mixed_batches_match_transformers(tiny_ckpts, reference, attn, monkeypatch) -> None:
    for arch, path in tiny_ckpts.items():
        prompts, expected = reference[arch]
        seen = spy_batches(monkeypatch)
        got = generate(path, prompts, MAX_NEW, dtype="float32", device="cuda", attn=attn,
                       page_size=16, max_prefill_length=40, max_running_requests=3,
                       mixed_chunk=True)
        assert got == expected, f"{arch}: mixed batches changed the greedy tokens"
        assert len(mixed_batches(seen)) >= 5, f"{arch}: too few mixed batches to prove anything"
        monkeypatch.undo()
