"""`SamplingParams.prompt_logprobs` and the completion's `logprobs` through `LLM`: equal to
transformers' log-softmax over the same tokens, whatever the chunking, page size or batch; a prompt
already in the radix cache is computed again (its logprobs need its logits)."""
from __future__ import annotations

import pytest
import torch

from radixserve import LLM, SamplingParams
from tests.runtime.helpers import random_prompts


@torch.inference_mode()
def hf_logprobs(model_dir, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(ids[i+1] | ids[:i+1]) for every i, and the log-softmax rows themselves."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    return logp[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0], logp


@pytest.mark.parametrize("page_size,max_prefill", [(1, 8192), (16, 24)])
def test_prompt_and_output_logprobs_match_transformers(tiny_ckpts, page_size, max_prefill) -> None:
    path = tiny_ckpts["qwen3"]
    prompts = random_prompts(3, [70, 5, 33], 300, seed=51)
    llm = LLM(str(path), dtype="float32", device="cpu", page_size=page_size,
              max_prefill_length=max_prefill)
    llm.generate(prompts, SamplingParams(max_tokens=2))  # the prompts are now in the radix cache
    sp = SamplingParams(max_tokens=4, ignore_eos=True, prompt_logprobs=3, logprobs=2)
    for prompt, res in zip(prompts, llm.generate(prompts, sp)):
        assert len(res.prompt_logprobs) == len(prompt) and res.prompt_logprobs[0].logprob is None
        want, rows = hf_logprobs(path, prompt + res.token_ids)
        got = torch.tensor([x.logprob for x in res.prompt_logprobs[1:]])
        assert torch.allclose(got, want[: len(prompt) - 1], atol=1e-4)
        for i, x in enumerate(res.prompt_logprobs[1:]):  # the 3 best at each position, in order
            best = torch.topk(rows[i], 3)
            assert [t for t, _ in x.top] == [llm.tokenizer.decode([j]) for j in best.indices.tolist()]
            assert torch.allclose(torch.tensor([v for _, v in x.top]), best.values, atol=1e-4)
        out = torch.tensor([x.logprob for x in res.logprobs])
        assert len(res.logprobs) == 4
        assert torch.allclose(out, want[len(prompt) - 1:], atol=1e-4)


def test_without_prompt_logprobs_there_are_none(tiny_ckpts) -> None:
    llm = LLM(str(tiny_ckpts["llama"]), dtype="float32", device="cpu")
    res = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2))[0]
    assert res.prompt_logprobs is None and res.logprobs is None
    with pytest.raises(ValueError, match="^prompt_logprobs"):
        SamplingParams(prompt_logprobs=21)
