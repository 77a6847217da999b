"""The embedded SmolLM2-135M-Instruct: greedy tokens equal transformers in every cache / page /
chunking configuration, prefill logits agree within 1e-4, and the CLI answers "Paris"."""
from __future__ import annotations

import itertools
import subprocess
import sys

import pytest
import torch

from radixserve import LLM, SamplingParams
from tests.runtime.helpers import fast_corners, hf_greedy, prefill_logits

TEXT = ("The history of the city begins with a small fishing village on the banks of the river. "
        "Over the centuries merchants, scholars and travellers arrived, bringing new ideas, goods "
        "and languages. ") * 12
MAX_NEW = 10


@pytest.fixture(scope="module")
def embedded():
    from transformers import AutoTokenizer

    from radixserve.models.default_model import resolve_model_path

    path = resolve_model_path(None)
    tok = AutoTokenizer.from_pretrained(path)
    ids = tok.encode(TEXT)
    assert len(ids) >= 300
    prompts = [ids[:n] for n in (1, 5, 17, 40, 64, 129, 250, 300)]
    return path, prompts, hf_greedy(path, prompts, MAX_NEW)


@pytest.mark.parametrize("cache,page_size,max_prefill", fast_corners(
    itertools.product(["radix", "naive"], [1, 16], [16, 8192]), {("radix", 16, 16), ("naive", 1, 8192)}))
def test_embedded_greedy_parity(embedded, cache, page_size, max_prefill) -> None:
    path, prompts, expected = embedded
    llm = LLM(str(path), dtype="float32", device="cpu", cache=cache, page_size=page_size,
              max_prefill_length=max_prefill)
    got = [r.token_ids for r in llm.generate(prompts, SamplingParams(max_tokens=MAX_NEW, ignore_eos=True))]
    assert got == expected


def test_prefill_logits_match_transformers(embedded, tiny_ckpts) -> None:
    from transformers import AutoModelForCausalLM

    path, prompts, _ = embedded
    for model_dir in [path, *tiny_ckpts.values()]:
        llm = LLM(str(model_dir), dtype="float32", device="cpu", page_size=4)
        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        vocab = hf.config.vocab_size
        batch = [[t % vocab for t in p] for p in prompts[2:6]]
        ours = prefill_logits(llm.scheduler.engine, batch)
        with torch.inference_mode():
            for p, got in zip(batch, ours):
                ref = hf(torch.tensor([p])).logits[0].float()
                assert (got - ref).abs().max().item() < 1e-4, model_dir


def test_cli_generate_answers_paris() -> None:
    out = subprocess.run(  # noqa: PLW1510 -- the return code is asserted below
        [sys.executable, "-m", "radixserve", "generate", "What is the capital of France?", "--chat",
         "--max-tokens", "16"], capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Paris" in out.stdout
