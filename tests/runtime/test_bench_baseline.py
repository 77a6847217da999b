"""The transformers baseline of `radixserve bench` loads what the checkpoint is, a multimodal one
too (transformers' image-text-to-text class), and its greedy tokens are the engine's."""
from __future__ import annotations

import pytest
import torch

from radixserve import LLM, SamplingParams
from radixserve.bench.baseline import load_hf_model
from radixserve.testing import write_tiny_multimodal_checkpoint
from tests.runtime.helpers import random_prompts

MAX_NEW = 8


@pytest.mark.parametrize("arch", ["mistral3", "gemma3_vision"])
def test_baseline_of_a_multimodal_checkpoint_generates_the_engines_tokens(tmp_path, arch) -> None:
    path = write_tiny_multimodal_checkpoint(arch, tmp_path / arch)
    model = load_hf_model(path, torch.float32, torch.device("cpu"), dummy=False)
    assert type(model).__name__.endswith("ForConditionalGeneration")
    prompt = random_prompts(1, [30], 200, seed=3)[0]
    with torch.inference_mode():
        out = model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=MAX_NEW,
                             do_sample=False, eos_token_id=None)
    theirs = out[0, len(prompt):].tolist()
    ours = LLM(str(path), dtype="float32", device="cpu").generate(
        [prompt], SamplingParams(max_tokens=MAX_NEW, ignore_eos=True))[0].token_ids
    assert theirs == ours and len(ours) == MAX_NEW
