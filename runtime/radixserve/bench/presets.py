"""Model shapes for `--model-preset NAME --dummy-weights`: exact configs of public models, written as
a config-only directory so the engine and transformers can both build them with random weights."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from radixserve import settings

# A Hugging Face FP8 checkpoint's config (Qwen3-8B-FP8 and the DeepSeek-V3 family): e4m3 weights
# with one scale per 128x128 block, activations scaled at run time
FP8_BLOCK_QUANTIZATION = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                          "weight_block_size": [128, 128]}
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")

_QWEN3_COMMON = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
    "head_dim": 128, "num_key_value_heads": 8, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "max_position_embeddings": 40960, "hidden_act": "silu", "attention_bias": False,
    "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "bfloat16",
}
PRESETS: dict[str, dict] = {
    "qwen3-0.6b": {**_QWEN3_COMMON, "hidden_size": 1024, "intermediate_size": 3072,
                   "num_hidden_layers": 28, "num_attention_heads": 16, "tie_word_embeddings": True},
    "qwen3-4b": {**_QWEN3_COMMON, "hidden_size": 2560, "intermediate_size": 9728,
                 "num_hidden_layers": 36, "num_attention_heads": 32, "tie_word_embeddings": True},
    "qwen3-8b": {**_QWEN3_COMMON, "hidden_size": 4096, "intermediate_size": 12288,
                 "num_hidden_layers": 36, "num_attention_heads": 32, "tie_word_embeddings": False},
    "qwen3-14b": {**_QWEN3_COMMON, "hidden_size": 5120, "intermediate_size": 17408,
                  "num_hidden_layers": 40, "num_attention_heads": 40, "tie_word_embeddings": False},
}


def preset_dir(name: str) -> Path:
    """A directory holding only `config.json` for the preset (weights come from --dummy-weights)."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; choose one of: {', '.join(PRESETS)}")
    path = settings.CACHE_DIR.get() / "presets" / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(PRESETS[name], indent=2))
    return path


def fp8_block_dir(model_dir: str | Path) -> Path:
    """A copy of `model_dir` without its weights whose config declares block-FP8 weights
    (`FP8_BLOCK_QUANTIZATION`): with dummy weights, the model's linear layers are then FP8 with
    random block scales where the loader keeps FP8 weights (a 16-bit model on CUDA)."""
    src = Path(model_dir).resolve()
    key = hashlib.sha1(str(src).encode()).hexdigest()[:12]  # one copy per source directory
    path = settings.CACHE_DIR.get() / "presets" / "fp8-block" / f"{src.name}-{key}"
    path.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and not f.name.endswith(_WEIGHT_SUFFIXES) and f.name != "config.json":
            shutil.copy2(f, path / f.name)
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = FP8_BLOCK_QUANTIZATION
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path
