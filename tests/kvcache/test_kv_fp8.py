"""The FP8 KV cache's pieces on CPU: the dtype flag, the pool's per-layer scales and quantized
writes, the sizing, and the scales read from a checkpoint under vLLM's and SGLang's names."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radixserve.config import KV_CACHE_DTYPE_CHOICES, EngineConfig
from radixserve.kvcache import MHAKVPool, kv_bytes_per_token
from radixserve.kvcache.kv_dtype import (
    KV_CACHE_DTYPES,
    check_kv_dtype_on_device,
    kv_dtype_name,
    resolve_kv_dtype,
)
from radixserve.kvcache.kv_scales import checkpoint_kv_scales, match_scale_name
from radixserve_kernels.kv_quant import FP8_MAX, dequantize_kv_ref, quantize_kv_ref

FP8 = torch.float8_e4m3fn


def test_flag_choices_and_resolution() -> None:
    assert tuple(KV_CACHE_DTYPES) == KV_CACHE_DTYPE_CHOICES
    assert resolve_kv_dtype("auto", torch.bfloat16) == torch.bfloat16
    assert resolve_kv_dtype("auto", torch.float32) == torch.float32
    assert resolve_kv_dtype("fp8_e4m3", torch.bfloat16) == FP8
    assert resolve_kv_dtype("float16", torch.bfloat16) == torch.float16
    assert kv_dtype_name(FP8) == "fp8_e4m3" and kv_dtype_name(torch.bfloat16) == "bfloat16"
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, bfloat16, float16, fp8_e4m3"):
        EngineConfig(kv_cache_dtype="int8")
    assert EngineConfig(kv_cache_dtype="fp8_e4m3").kv_cache_dtype == "fp8_e4m3"
    check_kv_dtype_on_device(FP8, torch.device("cpu"))  # CPU reads FP8 through torch


def test_quantize_round_trip_clamps_instead_of_nan() -> None:
    x = torch.tensor([0.0, 1.0, -3.3, 500.0, -1e6, 0.001])
    q = quantize_kv_ref(x, FP8, 1.0)
    assert q.dtype == FP8 and not q.float().isnan().any()
    assert q.float()[3] == FP8_MAX and q.float()[4] == -FP8_MAX
    back = dequantize_kv_ref(quantize_kv_ref(x, FP8, 0.25), 0.25)
    assert back[2] == pytest.approx(-3.25) and back[3] == pytest.approx(FP8_MAX * 0.25)
    # other dtypes: a plain cast, the scale unused
    assert torch.equal(quantize_kv_ref(x, torch.float32, 1.0), x)
    assert torch.equal(dequantize_kv_ref(x.bfloat16(), 1.0), x.bfloat16().float())


def test_sizing_counts_one_byte_per_fp8_element() -> None:
    bf16 = kv_bytes_per_token(28, 8, 128, torch.bfloat16)
    assert kv_bytes_per_token(28, 8, 128, FP8) * 2 == bf16 == 2 * 28 * 8 * 128 * 2


def test_fp8_pool_stores_each_layer_with_its_scales() -> None:
    pool = MHAKVPool(2, 4, 4, 2, 8, FP8, "cpu", k_scales=[0.5, 0.01], v_scales=[2.0, 1.0])
    assert pool.is_fp8 and pool.dtype == FP8
    assert (pool.k_scale(1), pool.v_scale(0)) == (0.01, 2.0)
    gen = torch.Generator().manual_seed(0)
    k, v = torch.randn(3, 2, 8, generator=gen), torch.randn(3, 2, 8, generator=gen)
    loc = torch.tensor([5, 0, 16])  # 16: the scratch slot
    pool.store_kv(k, v, loc, layer_id=1)
    assert torch.equal(pool.k_cache(1)[loc].view(torch.uint8),
                       quantize_kv_ref(k, FP8, 0.01).view(torch.uint8))
    torch.testing.assert_close(dequantize_kv_ref(pool.v_cache(1)[loc], 1.0), v, rtol=0.07, atol=2**-9)
    assert not pool.k_cache(0).view(torch.uint8).any()  # layer 0 untouched


def test_pool_rejects_bad_scales() -> None:
    with pytest.raises(ValueError, match="FP8 KV pool only"):
        MHAKVPool(2, 4, 4, 2, 8, torch.bfloat16, "cpu", k_scales=[0.5, 1.0])
    with pytest.raises(ValueError, match="3 given for 2 layers"):
        MHAKVPool(2, 4, 4, 2, 8, FP8, "cpu", v_scales=[1.0] * 3)
    with pytest.raises(ValueError, match="positive"):
        MHAKVPool(2, 4, 4, 2, 8, FP8, "cpu", k_scales=[0.0, 1.0])


@pytest.mark.parametrize("name,want", [
    ("model.layers.3.self_attn.k_scale", (3, "k")),
    ("model.layers.3.self_attn.attn.v_scale", (3, "v")),
    ("model.layers.12.self_attn.k_proj.k_scale", (12, "k")),
    ("model.layers.12.self_attn.v_proj.v_scale", (12, "v")),
    ("model.layers.0.self_attn.k_proj.output_scale", (0, "k")),
    ("model.layers.0.self_attn.v_proj.output_scale", (0, "v")),
    ("model.layers.7.self_attn.kv_scale", (7, "kv")),
    ("model.layers.0.self_attn.q_proj.output_scale", None),
    ("model.layers.0.self_attn.k_proj.weight_scale", None),
    ("model.layers.0.self_attn.k_proj.input_scale", None),
    ("model.layers.0.self_attn.k_proj.weight", None),
])
def test_scale_names_of_vllm_and_sglang(name: str, want) -> None:
    assert match_scale_name(name) == want


def _write(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"))
    return path


def test_checkpoint_scales_each_convention_and_default(tmp_path: Path, caplog) -> None:
    w = {"model.layers.0.self_attn.q_proj.weight": torch.zeros(2, 2)}
    none = checkpoint_kv_scales(_write(tmp_path / "none", w), 3)
    assert none.k == none.v == (1.0, 1.0, 1.0) and "no k_scale/v_scale" in none.source
    mixed = checkpoint_kv_scales(_write(tmp_path / "mixed", {
        **w,
        "model.layers.0.self_attn.k_scale": torch.tensor(0.5),
        "model.layers.0.self_attn.v_scale": torch.tensor([0.25]),
        "model.layers.1.self_attn.k_proj.output_scale": torch.tensor(0.125, dtype=torch.bfloat16),
        "model.layers.1.self_attn.v_proj.v_scale": torch.tensor(2.0),
        "model.layers.2.self_attn.kv_scale": torch.tensor(3.0),
    }), 3)
    assert mixed.k == (0.5, 0.125, 3.0) and mixed.v == (0.25, 2.0, 3.0)
    assert "from the checkpoint" in mixed.source and "k 0.125..3" in mixed.describe()
    with caplog.at_level("WARNING"):
        partial = checkpoint_kv_scales(_write(tmp_path / "partial", {
            "model.layers.1.self_attn.k_scale": torch.tensor(0.5)}), 2)
    assert partial.k == (1.0, 0.5) and partial.v == (1.0, 1.0)
    assert "no scale for 3 of 4" in caplog.text


def test_a_multimodal_checkpoint_s_scales_are_its_language_model_s(tmp_path: Path) -> None:
    from radixserve.models.multimodal import language_model_name

    path = _write(tmp_path / "mm", {
        "language_model.model.layers.0.self_attn.k_scale": torch.tensor(0.25),
        "language_model.model.layers.0.self_attn.v_scale": torch.tensor(0.5),
        # a quantized vision tower's layer 0: not the language model's
        "vision_tower.vision_model.encoder.layers.0.self_attn.k_scale": torch.tensor(4.0),
    })
    scales = checkpoint_kv_scales(path, 1, language_model_name)
    assert scales.k == (0.25,) and scales.v == (0.5,)
    assert checkpoint_kv_scales(path, 1).k != (0.25,)  # without the renaming the vision one counts


def test_checkpoint_scales_must_be_per_tensor_and_positive(tmp_path: Path) -> None:
    per_head = _write(tmp_path / "per_head", {"model.layers.0.self_attn.k_scale": torch.ones(8)})
    with pytest.raises(ValueError, match="per-tensor"):
        checkpoint_kv_scales(per_head, 1)
    zero = _write(tmp_path / "zero", {"model.layers.0.self_attn.v_scale": torch.tensor(0.0)})
    with pytest.raises(ValueError, match="finite and positive"):
        checkpoint_kv_scales(zero, 1)


def test_fp8_on_a_gpu_before_ada_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA A100")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (8, 0))
    with pytest.raises(ValueError, match="compute capability 8.9 or newer.*A100 is 8.0"):
        check_kv_dtype_on_device(FP8, torch.device("cuda", 0))
    check_kv_dtype_on_device(torch.bfloat16, torch.device("cuda", 0))  # other dtypes: any GPU
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    check_kv_dtype_on_device(FP8, torch.device("cuda", 0))
