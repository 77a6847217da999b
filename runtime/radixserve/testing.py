"""Tiny random checkpoints in the Hugging Face layout (config, safetensors, a real byte-level BPE
tokenizer with a chat template, generation config) so tests never download anything."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from radixserve.models.gemma3 import FULL, SLIDING

ARCHS = ("llama", "llama3", "qwen2", "qwen3", "qwen3_moe")
# sliding-window architectures, tested on their own (their windows need the torch or Triton backend)
WINDOWED_ARCHS = ("mistral", "gemma3")
SLIDING_WINDOW = 24  # tokens: test prompts run past it
# multimodal checkpoints served text-only: arch -> (its text arch above, transformers' config and
# model classes, a tiny vision tower)
MULTIMODAL: dict[str, tuple[str, str, str, dict[str, Any]]] = {
    "gemma3_vision": ("gemma3", "Gemma3Config", "Gemma3ForConditionalGeneration", {
        "model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 28, "patch_size": 14}),
    "mistral3": ("mistral", "Mistral3Config", "Mistral3ForConditionalGeneration", {
        "model_type": "pixtral", "hidden_size": 32, "intermediate_size": 64, "head_dim": 16,
        "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 28, "patch_size": 14}),
}
# the checkpoint layouts of a multimodal model: transformers 5's names and the Hub's (transformers 4.5x)
MULTIMODAL_LAYOUTS = ("transformers5", "hub")
MULTIMODAL_CASES = tuple((arch, layout) for arch in MULTIMODAL for layout in MULTIMODAL_LAYOUTS)
_HUB_TO_TRANSFORMERS5 = (("language_model.model.", "model.language_model."),
                         ("language_model.lm_head.", "lm_head."),
                         ("vision_tower.", "model.vision_tower."),
                         ("multi_modal_projector.", "model.multi_modal_projector."))

SPECIAL_TOKENS = ("<|pad|>", "<|bos|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0..4
EOS_IDS = (2, 4)  # <|endoftext|> and <|im_end|>
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_TOKENIZER_VOCAB = 384
_LOGIT_GAIN = 3.0  # logits of std ~3: greedy picks are clear-cut, not near-ties
# Blocks write larger updates than the embedding, so the residual stream is not dominated by the
# input token (with tied embeddings that favours repeating it).
_BLOCK_OUT_GAIN = 4.0
_TIED_SHRINK = (
    8.0  # a tied embedding also enters the residual stream: keep its self-logit bias small
)

_CORPUS = """\
A radix tree stores the prompts that were already processed, so a new request that shares a prefix
with an old one reuses its key and value cache instead of computing it again. The scheduler admits
requests while memory lasts, splits long prompts into chunks, and batches decoding steps together.
Every token is written into a page of the cache; pages are freed when no request refers to them.
Tensor parallelism splits each weight matrix across devices: column parallel layers split outputs,
row parallel layers split inputs and sum the partial results with an all-reduce.
The quick brown fox jumps over the lazy dog. 0123456789 + - * / = ( ) [ ] { } < > ! ? , . ; :
Hello, world! How are you today? I am fine, thank you. What is the capital of France? Paris.
Large language models predict the next token given the previous ones. Sampling with a temperature
spreads probability mass; greedy decoding always takes the most likely token. Rotary position
embeddings rotate query and key vectors by an angle that grows with the position of the token.
Mixture of experts layers route every token to a few experts chosen by a small router network.
"""

_COMMON: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "hidden_act": "silu",
}
_ARCH_CONFIG: dict[str, dict[str, Any]] = {
    "llama": {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "tie_word_embeddings": True,
        "rope_theta": 10000.0,
    },
    "llama3": {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "tie_word_embeddings": False,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256,
        },
    },
    "qwen2": {
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "tie_word_embeddings": True,
        "rope_theta": 1000000.0,
    },
    "qwen3": {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "tie_word_embeddings": False,
        "rope_theta": 1000000.0,
    },
    "mistral": {
        "model_type": "mistral",
        "architectures": ["MistralForCausalLM"],
        "tie_word_embeddings": False,
        "rope_theta": 1000000.0,
        "sliding_window": SLIDING_WINDOW,
    },
    "gemma3": {
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        "tie_word_embeddings": True,
        "num_hidden_layers": 3,
        "layer_types": [SLIDING, FULL, SLIDING],
        "sliding_window": SLIDING_WINDOW,
        "query_pre_attn_scalar": 24,  # not head_dim: the attention scale differs from 1/sqrt(16)
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh",
        "final_logit_softcapping": 30.0,
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    },
    "qwen3_moe": {
        "model_type": "qwen3_moe",
        "architectures": ["Qwen3MoeForCausalLM"],
        "tie_word_embeddings": False,
        "rope_theta": 1000000.0,
        "num_hidden_layers": 3,
        "mlp_only_layers": [1],
        "decoder_sparse_step": 1,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "norm_topk_prob": True,
    },
}


def write_tiny_checkpoint(
    arch: str, path: str | Path, *, seed: int = 0, **config_overrides: Any
) -> Path:
    """Write a tiny random `arch` model to `path` (created) and return it. Deterministic in `seed`."""
    from transformers import AutoConfig, GenerationConfig

    if arch not in _ARCH_CONFIG:
        raise ValueError(
            f"unknown tiny arch {arch!r}; choose one of: {', '.join(ARCHS + WINDOWED_ARCHS)}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(path, save_jinja_files=False)  # template inside tokenizer_config.json
    kwargs = {**_COMMON, **_ARCH_CONFIG[arch], "vocab_size": len(tokenizer), **config_overrides}
    model_type = kwargs.pop("model_type")
    AutoConfig.for_model(model_type, **kwargs).save_pretrained(path)
    if arch == "llama" and "head_dim" not in config_overrides:
        _drop_config_key(path, "head_dim")  # exercise the hidden_size // num_heads default
    cfg = AutoConfig.from_pretrained(path)
    _save_safetensors(random_hf_weights(cfg, seed), path / "model.safetensors")
    GenerationConfig(bos_token_id=1, eos_token_id=list(EOS_IDS), pad_token_id=0).save_pretrained(
        path
    )
    return path


def write_tiny_multimodal_checkpoint(
    arch: str, path: str | Path, *, layout: str = "transformers5", seed: int = 0
) -> Path:
    """Write a tiny `arch` of `MULTIMODAL` (transformers' own class: a tiny vision tower and
    projector, its language model the text arch's tiny random weights, float32) under the tensor
    names of `layout` (`MULTIMODAL_LAYOUTS`), and return `path`."""
    import transformers
    from safetensors.torch import load_file
    from transformers import GenerationConfig

    text_arch, config_cls, model_cls, vision = MULTIMODAL[arch]
    if layout not in MULTIMODAL_LAYOUTS:
        raise ValueError(f"layout must be one of {MULTIMODAL_LAYOUTS}, got {layout!r}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(path, save_jinja_files=False)
    text = {**_COMMON, **_ARCH_CONFIG[text_arch], "vocab_size": len(tokenizer)}
    text.pop("architectures")
    if text_arch == "gemma3":
        text.pop("model_type")  # Gemma3Config builds its own Gemma3TextConfig
        # NOTE: null in the released checkpoints; transformers' multimodal class never applies it
        text["final_logit_softcapping"] = None
    cfg = getattr(transformers, config_cls)(
        text_config=text, vision_config=vision, image_token_index=len(tokenizer) - 1,
        tie_word_embeddings=text["tie_word_embeddings"], dtype="float32", mm_tokens_per_image=4)
    torch.manual_seed(seed)  # the vision tower's initialisation
    model = getattr(transformers, model_cls)(cfg)
    state = model.state_dict()
    lm = random_hf_weights(cfg.text_config, seed)
    for name, t in lm.items():
        state["model.language_model." + name.removeprefix("model.") if name.startswith("model.")
              else name] = t
    if cfg.text_config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.language_model.embed_tokens.weight"]
    model.load_state_dict(state)
    model.save_pretrained(path)
    tensors = {}
    for file in path.glob("*.safetensors"):
        tensors.update(load_file(str(file)))
        file.unlink()
    for index in path.glob("*.safetensors.index.json"):
        index.unlink()
    tensors = {_multimodal_name(k, layout): t for k, t in tensors.items()}
    _save_safetensors(tensors, path / "model.safetensors")
    GenerationConfig(bos_token_id=1, eos_token_id=list(EOS_IDS), pad_token_id=0).save_pretrained(
        path
    )
    return path


def _multimodal_name(name: str, layout: str) -> str:
    for hub, new in _HUB_TO_TRANSFORMERS5:  # to transformers 5's names, whichever were saved
        if name.startswith(hub):
            name = new + name[len(hub):]
            break
    if layout == "hub":
        for hub, new in _HUB_TO_TRANSFORMERS5:
            if name.startswith(new):
                return hub + name[len(new):]
    return name


def build_tokenizer() -> Any:
    """A byte-level BPE trained in-process on a fixed text (deterministic), wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_TOKENIZER_VOCAB,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS.splitlines(), trainer)
    fast = PreTrainedTokenizerFast(
        # NOTE: unk named too: transformers 5 rebuilds Qwen2's tokenizer class and would otherwise
        # append its default "<|endoftext|>" past the end of the vocabulary.
        tokenizer_object=tok,
        pad_token="<|pad|>",
        bos_token="<|bos|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def random_hf_weights(cfg: Any, seed: int) -> dict[str, torch.Tensor]:
    """Random float32 tensors under transformers' names, scaled to keep activations near unit size."""
    gen = torch.Generator().manual_seed(seed)

    def mat(*shape: int, gain: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * gain / shape[-1] ** 0.5

    def norm(n: int) -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(n, generator=gen)

    def bias(n: int) -> torch.Tensor:
        return 0.1 * torch.randn(n, generator=gen)

    h, v = cfg.hidden_size, cfg.vocab_size
    hd = getattr(cfg, "head_dim", None) or h // cfg.num_attention_heads
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    qkv_bias = cfg.model_type == "qwen2" or getattr(cfg, "attention_bias", False)
    w: dict[str, torch.Tensor] = {"model.embed_tokens.weight": torch.randn(v, h, generator=gen)}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(h)
        w[p + "post_attention_layernorm.weight"] = norm(h)
        for name, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            w[p + f"self_attn.{name}.weight"] = mat(rows, h)
            if qkv_bias:
                w[p + f"self_attn.{name}.bias"] = bias(rows)
        w[p + "self_attn.o_proj.weight"] = mat(h, q, gain=_BLOCK_OUT_GAIN)
        if cfg.model_type.startswith(("qwen3", "gemma3")):
            w[p + "self_attn.q_norm.weight"] = norm(hd)
            w[p + "self_attn.k_norm.weight"] = norm(hd)
        if cfg.model_type == "gemma3_text":
            w[p + "pre_feedforward_layernorm.weight"] = norm(h)
            w[p + "post_feedforward_layernorm.weight"] = norm(h)
        w.update(_mlp_weights(cfg, i, p + "mlp.", mat))
    w["model.norm.weight"] = norm(h)
    if not cfg.tie_word_embeddings:
        w["lm_head.weight"] = mat(v, h, gain=_LOGIT_GAIN)
    else:  # one matrix embeds and makes the logits: shrink it, and scale the final norm up to match
        w["model.embed_tokens.weight"] *= _LOGIT_GAIN / h**0.5 / _TIED_SHRINK
        w["model.norm.weight"] *= _TIED_SHRINK
    if cfg.model_type == "gemma3_text":  # Gemma's norms scale by (1 + weight)
        # its blocks' outputs pass a norm: give those the gain o_proj and down_proj have elsewhere
        post = ("post_attention_layernorm", "post_feedforward_layernorm")
        w = {k: t * (_BLOCK_OUT_GAIN if any(p in k for p in post) else 1.0) for k, t in w.items()}
        w = {k: t - 1.0 if "norm" in k else t for k, t in w.items()}
    return w


def _mlp_weights(cfg: Any, layer: int, p: str, mat: Any) -> dict[str, torch.Tensor]:
    from radixserve.models.qwen3_moe import is_sparse_layer

    h = cfg.hidden_size
    if cfg.model_type == "qwen3_moe" and is_sparse_layer(cfg, layer):
        out = {p + "gate.weight": mat(cfg.num_experts, h, gain=2.0)}
        n = cfg.moe_intermediate_size
        for e in range(cfg.num_experts):
            out[p + f"experts.{e}.gate_proj.weight"] = mat(n, h)
            out[p + f"experts.{e}.up_proj.weight"] = mat(n, h)
            out[p + f"experts.{e}.down_proj.weight"] = mat(h, n, gain=_BLOCK_OUT_GAIN)
        return out
    n = cfg.intermediate_size
    return {
        p + "gate_proj.weight": mat(n, h),
        p + "up_proj.weight": mat(n, h),
        p + "down_proj.weight": mat(h, n, gain=_BLOCK_OUT_GAIN),
    }


def _save_safetensors(tensors: dict[str, torch.Tensor], file: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: t.contiguous() for k, t in tensors.items()}, str(file), metadata={"format": "pt"})


def _drop_config_key(path: Path, key: str) -> None:
    file = path / "config.json"
    data = json.loads(file.read_text())
    data.pop(key, None)
    file.write_text(json.dumps(data, indent=2))
