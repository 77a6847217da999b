"""Build a model on the meta device, materialise it on the target device and fill it from the
checkpoint's safetensors, one tensor at a time."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from radixserve.config import EngineConfig
from radixserve.layers.lazy_weight import LazyWeight
from radixserve.models.architectures import get_model_class
from radixserve.models.base import BaseCausalLM
from radixserve.models.fp8_weights import (
    compact_fp8_scales,
    dummy_fp8_layers,
    fp8_weights,
    keep_fp8_layers,
    read_scales,
)
from radixserve.models.hf_config import text_config, tie_word_embeddings
from radixserve.models.multimodal import checkpoint_names
from radixserve.models.quantization import read_quantization
from radixserve.models.weights import WeightNameMap
from radixserve.options import declared as declaration
from radixserve.options import value_fault
from radixserve.utils.checkpoint_files import safetensors_files

logger = logging.getLogger(__name__)
LM_HEAD = "lm_head.weight"


def resolve_dtype(spec: str, hf_config: Any, device: torch.device | str) -> torch.dtype:
    """`auto`: the checkpoint's float16/bfloat16; for float32 or no dtype, float32 on CPU and
    bfloat16 on CUDA. Otherwise the named dtype."""
    if spec != "auto":  # a `--dtype` choice: refused here as `EngineConfig` refuses it
        if (why := value_fault(declaration(EngineConfig, "dtype"), spec)) is not None:
            raise ValueError(f"dtype {why}")
        return getattr(torch, spec)
    declared = _declared_dtype(hf_config) or _declared_dtype(text_config(hf_config))
    if isinstance(declared, str):
        declared = getattr(torch, declared.removeprefix("torch."), None)
    if declared in (torch.float16, torch.bfloat16):
        return declared
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def _declared_dtype(cfg: Any) -> Any:
    declared = getattr(cfg, "dtype", None)
    if declared is None and "dtype" not in dir(type(cfg)):  # NOTE: transformers < 4.56 only;
        declared = getattr(cfg, "torch_dtype", None)  # newer ones warn when asked for it
    return declared


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def _tie_as_transformers(hf_config: Any, model_dir: Path,
                         rename: Callable[[str], str | None] | None) -> None:
    """Set the language model's `tie_word_embeddings` as transformers 5 ties when it loads: the
    LM head is the embedding where a config says so (a multimodal checkpoint's outer one or its
    `text_config`) and the checkpoint has no `lm_head.weight` of its own; one it has is used."""
    text = text_config(hf_config)
    if not (tie_word_embeddings(hf_config) or tie_word_embeddings(text)):
        return
    own = any(name == LM_HEAD for name, _ in iter_safetensors(model_dir, rename))  # headers only
    if own:
        logger.info("the checkpoint has its own %s: the LM head is not tied to the embedding", LM_HEAD)
    text.tie_word_embeddings = not own


def iter_safetensors(
    model_dir: Path, rename: Callable[[str], str | None] | None = None
) -> Iterator[tuple[str, LazyWeight]]:
    """(name, lazy tensor) for every tensor of the checkpoint: a layer's weight loader reads only
    the block it keeps (its tensor-parallel shard) when it copies it. `rename` gives the model's
    name of a checkpoint name, None for a tensor not to touch at all."""
    from safetensors import safe_open

    for path in safetensors_files(model_dir):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 -- safe_open is not a dict
                ours = name if rename is None else rename(name)
                if ours is None:
                    continue
                sl = f.get_slice(name)
                yield ours, LazyWeight(sl, tuple(sl.get_shape()))


def weight_bytes(hf_config: Any, dtype: torch.dtype) -> int:
    """The bytes of the model's parameters on this rank (built on the meta device: nothing is
    allocated), in `dtype`."""
    cls = get_model_class(hf_config)
    with torch.device("meta"), default_dtype(dtype):
        model = cls(text_config(hf_config))
    return sum(p.numel() * p.element_size() for p in model.parameters())


def build_model(hf_config: Any, dtype: torch.dtype, device: torch.device | str) -> BaseCausalLM:
    """The model's modules with uninitialised parameters on `device` (built on the meta device so
    no memory is touched twice), buffers such as rotary caches computed."""
    cls = get_model_class(hf_config)
    with torch.device("meta"), default_dtype(dtype):
        model = cls(text_config(hf_config))  # a multimodal checkpoint: its language model
    model.to_empty(device=torch.device(device))
    for module in model.modules():
        if hasattr(module, "on_materialized"):
            module.on_materialized()
    return model.eval().requires_grad_(False)


def meta_model(model_dir: Path) -> BaseCausalLM:
    """The model of `model_dir` on the meta device: its modules and shapes, no memory and no
    weight read (LoRA adapters are checked against it before anything loads)."""
    from transformers import AutoConfig

    return build_model(AutoConfig.from_pretrained(model_dir), torch.float32, "meta")


def load_model(
    model_dir: str | Path,
    dtype: torch.dtype,
    device: torch.device | str,
    *,
    load_format: str = EngineConfig.load_format,
    hf_config: Any = None,
) -> tuple[BaseCausalLM, Any]:
    """(model, the language model's transformers config: `text_config` of a multimodal one).
    `load_format="dummy"` fills random weights of the right shapes instead of reading the
    checkpoint (benchmarks, memory sizing). `hf_config`: the checkpoint's transformers config where the
    caller has it (else read here)."""
    from transformers import AutoConfig

    model_dir = Path(model_dir)
    if hf_config is None:
        hf_config = AutoConfig.from_pretrained(model_dir)
    fp8 = read_quantization(hf_config)  # an unsupported method fails here, before any weight
    rename = checkpoint_names(hf_config)
    if load_format != "dummy":
        _tie_as_transformers(hf_config, model_dir, rename)
    model = build_model(hf_config, dtype, device)
    if rename is not None:
        logger.info("%s: vision tower not loaded (text-only)", type(hf_config).__name__)

    def checkpoint() -> Iterator[tuple[str, LazyWeight]]:
        return iter_safetensors(model_dir, rename)

    if load_format == "dummy":
        _fill_dummy(model)
        if fp8 is not None and use_fp8_gemm(device, dtype):
            n = dummy_fp8_layers(model, fp8)
            logger.info("dummy FP8 weights (%s scales): %d linear layers", fp8.granularity, n)
    elif fp8 is None:
        model.load_weights(checkpoint())
    else:
        scales = read_scales(checkpoint())
        names = getattr(model, "weight_names", WeightNameMap())
        kept = keep_fp8_layers(model, names, scales, fp8) if use_fp8_gemm(device, dtype) else set()
        model.load_weights(fp8_weights(checkpoint(), scales, fp8, kept))
        logger.info("FP8 weights (%s, %s scales): %d linear weights stay FP8, the rest dequantized "
                    "to %s", fp8.method, fp8.granularity, len(kept), dtype)
    if fp8 is not None and fp8.block is not None:
        logger.info("FP8 block scales shared by aligned rows: %d layers", compact_fp8_scales(model))
    if fp8 is not None and torch.device(device).type == "cuda":
        # NOTE: the 16-bit weights FP8 layers replaced are free but cached by the allocator; the
        # KV cache is sized from the driver's free memory, so hand them back first
        torch.cuda.empty_cache()
    logger.info("loaded %s (%s) on %s as %s", model_dir, type(model).__name__, device, dtype)
    return model, text_config(hf_config)


def use_fp8_gemm(device: torch.device | str, dtype: torch.dtype) -> bool:
    """Whether an FP8 checkpoint's linear weights stay FP8 (`layers/fp8_linear.py`): a bfloat16
    or float16 model on a GPU with FP8 support (compute capability 8.9+: Ada, Hopper). float32
    models (the parity reference) and CPUs dequantize at load."""
    device = torch.device(device)
    if device.type != "cuda" or dtype not in (torch.bfloat16, torch.float16):
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


@torch.no_grad()
def _fill_dummy(model: BaseCausalLM) -> None:
    for param in model.parameters():
        if param.dim() > 1:
            param.normal_(0.0, param.shape[-1] ** -0.5)
        else:
            param.normal_(1.0, 0.1)
