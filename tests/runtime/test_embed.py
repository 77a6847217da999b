"""Embedding requests in the engine (`SamplingParams(embed=True)`, `LLM.embed`): the last
hidden state after the final norm, L2-normalized, equal to transformers' own, also when chunked
and beside generating requests (which keep their tokens)."""
from __future__ import annotations

import pytest
import torch

from radixserve import LLM, SamplingParams
from tests.runtime.helpers import random_prompts


@torch.inference_mode()
def hf_embedding(model_dir, ids: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    h = model(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0, -1]
    return torch.nn.functional.normalize(h, dim=-1)


@pytest.mark.parametrize("overlap", [True, False])
def test_embeddings_beside_generation(tiny_ckpts, overlap) -> None:
    path = tiny_ckpts["qwen3"]
    prompts = random_prompts(4, [70, 5, 33, 12], 300, seed=61)
    llm = LLM(str(path), dtype="float32", device="cpu", max_prefill_length=24, overlap=overlap)
    gen = SamplingParams(max_tokens=6, ignore_eos=True)
    alone = [r.token_ids for r in llm.generate(prompts[2:], gen)]
    emb = SamplingParams(max_tokens=1, embed=True)
    res = llm.generate(prompts, [emb, emb, gen, gen])
    for p, r in zip(prompts[:2], res[:2]):
        assert r.token_ids == [] and torch.allclose(torch.tensor(r.embedding), hf_embedding(path, p), atol=1e-5)
    assert [r.token_ids for r in res[2:]] == alone and res[2].embedding is None
    assert llm.embed(prompts[:1])[0] == pytest.approx(res[0].embedding, abs=1e-6)
    llm.scheduler.check_integrity()


def test_embed_takes_no_generation_options() -> None:
    with pytest.raises(ValueError, match="^embed"):
        SamplingParams(max_tokens=5, embed=True)
    with pytest.raises(ValueError, match="^embed"):
        SamplingParams(max_tokens=1, embed=True, regex="a")


@pytest.mark.parametrize("page_size", [1, 4])
def test_an_input_of_exactly_the_context_is_embedded(tiny_ckpts, page_size) -> None:
    """An embedding generates no token, so a whole context of input fits (one more does not)."""
    path = tiny_ckpts["qwen3"]
    full, over = random_prompts(2, [64, 65], 300, seed=62)
    llm = LLM(str(path), dtype="float32", device="cpu", context_length=64, page_size=page_size,
              max_prefill_length=24)
    (vector,) = llm.embed([full])
    assert torch.allclose(torch.tensor(vector), hf_embedding(path, full), atol=1e-5)
    with pytest.raises(ValueError, match=r"^prompt 0: This model's maximum context length is 64 tokens, "
                                         r"but the input has 65 tokens"):
        llm.embed([over])
    llm.scheduler.check_integrity()
