"""The tiny checkpoints: deterministic, a real tokenizer with a chat template, two EOS ids, and
weights that make greedy decoding in transformers produce varied tokens."""

from __future__ import annotations

import json

import pytest
import torch

from radixserve.testing import ARCHS, EOS_IDS, write_tiny_checkpoint


def test_same_seed_same_files_other_seed_other_weights(tmp_path):
    a = write_tiny_checkpoint("qwen3", tmp_path / "a", seed=3)
    b = write_tiny_checkpoint("qwen3", tmp_path / "b", seed=3)
    c = write_tiny_checkpoint("qwen3", tmp_path / "c", seed=4)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()


def test_config_overrides_apply(tmp_path):
    path = write_tiny_checkpoint(
        "llama", tmp_path / "x", num_hidden_layers=3, max_position_embeddings=4096
    )
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 3 and cfg["max_position_embeddings"] == 4096
    assert "head_dim" not in cfg  # llama exercises the hidden_size // heads default


def test_unknown_arch_is_refused(tmp_path):
    with pytest.raises(ValueError, match="qwen3_moe"):
        write_tiny_checkpoint("gpt2", tmp_path)


def test_tokenizer_round_trips_and_renders_chat(tiny):
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    path = tiny["qwen2"]
    tok = AutoTokenizer.from_pretrained(path)
    assert len(tok) == AutoConfig.from_pretrained(path).vocab_size
    text = "Héllo wörld: radix trees, 42 tokens! 🙂"
    assert tok.decode(tok.encode(text)) == text
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.convert_tokens_to_ids(["<|pad|>", "<|bos|>", "<|endoftext|>", "<|im_end|>"]) == [
        0,
        1,
        2,
        4,
    ]
    assert sorted(GenerationConfig.from_pretrained(path).eos_token_id) == list(EOS_IDS)
    assert AutoConfig.from_pretrained(path).max_position_embeddings >= 1024


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_decoding_is_not_degenerate(tiny, arch):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny[arch], dtype=torch.float32)
    ids = torch.tensor([[10, 200, 37, 99, 150]])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=24,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )[0, 5:].tolist()
    assert len(set(out)) >= 8, out
