"""`--attn auto` on CUDA, decided on CPU with the probes monkeypatched: FlashInfer prefills only
where its kernels are prebuilt (flashinfer-jit-cache) or buildable (an nvcc FlashInfer would
find); otherwise Triton prefills, with one INFO line saying why. Explicit names are untouched."""
from __future__ import annotations

import dataclasses
import logging
import sys
import types
from pathlib import Path

import pytest
import torch

from radixserve.attention import factory
from radixserve.attention.hybrid import HybridBackend


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """A CUDA machine with flashinfer and triton installed, no jit-cache, no nvcc anywhere, and
    a flashinfer package folder (for the AOT probe) in tmp_path. Tests turn pieces on."""
    installed = {"flashinfer", "triton"}
    fi_root = tmp_path / "site" / "flashinfer"
    fi_root.mkdir(parents=True)

    def find_spec(name: str):
        if name not in installed:
            return None
        spec = types.SimpleNamespace(name=name, submodule_search_locations=None)
        if name == "flashinfer":
            spec.submodule_search_locations = [str(fi_root)]
        return spec

    monkeypatch.setattr(factory, "_spec", find_spec)
    for var in ("CUDA_HOME", "CUDA_PATH", "FLASHINFER_DISABLE_JIT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.setattr(factory, "_DEFAULT_NVCC", tmp_path / "no-cuda" / "bin" / "nvcc")
    ns = types.SimpleNamespace(installed=installed, fi_root=fi_root, tmp=tmp_path)
    ns.nvcc = lambda where: _exe(where / "bin" / "nvcc")
    return ns


def _exe(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_no_prebuilt_kernels_and_no_nvcc_falls_back_to_triton(machine) -> None:
    why = factory.flashinfer_blocker()
    assert why and "flashinfer-jit-cache" in why and "no nvcc" in why
    assert factory.resolve_attn_spec("auto", "cuda") == ("triton", "triton")


def test_jit_cache_installed_keeps_flashinfer_prefill(machine) -> None:
    machine.installed.add("flashinfer_jit_cache")
    assert factory.flashinfer_blocker() is None
    assert factory.resolve_attn_spec("auto", "cuda") == ("flashinfer", "triton")


def test_cubin_alone_is_not_prebuilt(machine) -> None:
    """flashinfer-cubin carries TensorRT-LLM cubins; the FA2 modules still need nvcc."""
    machine.installed.add("flashinfer_cubin")
    assert not factory.flashinfer_prebuilt()
    assert factory.resolve_attn_spec("auto", "cuda") == ("triton", "triton")


def test_aot_build_of_flashinfer_counts_as_prebuilt(machine) -> None:
    aot = machine.fi_root / "data" / "aot"
    aot.mkdir(parents=True)
    assert not factory.flashinfer_prebuilt(), "an empty AOT folder holds no kernels"
    _exe(aot / "batch_prefill_x" / "batch_prefill_x.so")
    assert factory.flashinfer_prebuilt()
    assert factory.resolve_attn_spec("auto", "cuda") == ("flashinfer", "triton")


@pytest.mark.parametrize("where", ["path", "cuda_home", "cuda_path", "default"])
def test_nvcc_flashinfer_would_find_keeps_flashinfer(machine, monkeypatch, where: str) -> None:
    home = machine.tmp / "cuda"
    nvcc = machine.nvcc(home)
    if where == "path":
        monkeypatch.setenv("PATH", str(nvcc.parent))
    elif where == "cuda_home":
        monkeypatch.setenv("CUDA_HOME", str(home))
    elif where == "cuda_path":
        monkeypatch.setenv("CUDA_PATH", str(home))
    else:
        monkeypatch.setattr(factory, "_DEFAULT_NVCC", nvcc)
    assert factory.find_nvcc() == str(nvcc)
    assert factory.resolve_attn_spec("auto", "cuda") == ("flashinfer", "triton")


def test_cuda_home_without_nvcc_wins_over_path(machine, monkeypatch) -> None:
    """FlashInfer builds with CUDA_HOME's nvcc when CUDA_HOME is set (a runtime image's
    /usr/local/cuda has none), whatever PATH holds."""
    monkeypatch.setenv("PATH", str(machine.nvcc(machine.tmp / "toolkit").parent))
    monkeypatch.setenv("CUDA_HOME", str(machine.tmp / "runtime-only"))
    assert factory.find_nvcc() is None
    assert factory.resolve_attn_spec("auto", "cuda") == ("triton", "triton")


def test_jit_disabled_counts_as_unbuildable(machine, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(machine.nvcc(machine.tmp / "cuda").parent))
    monkeypatch.setenv("FLASHINFER_DISABLE_JIT", "1")
    assert "FLASHINFER_DISABLE_JIT" in factory.flashinfer_blocker()
    assert factory.resolve_attn_spec("auto", "cuda") == ("triton", "triton")


def test_without_triton_the_fallback_is_torch(machine) -> None:
    machine.installed.discard("triton")
    assert factory.resolve_attn_spec("auto", "cuda") == ("torch", "torch")


@pytest.mark.parametrize("spec", ["flashinfer", "flashinfer,triton"])
def test_explicit_names_are_not_second_guessed(machine, spec: str) -> None:
    prefill, decode = factory.resolve_attn_spec(spec, "cuda")
    assert prefill == "flashinfer" and decode == spec.split(",")[-1]


def test_cpu_is_torch_whatever_is_installed(machine) -> None:
    machine.installed.add("flashinfer_jit_cache")
    assert factory.resolve_attn_spec("auto", "cpu") == ("torch", "torch")


# ------------------------------------------------------------------ create_attn_backend


class _Fake:
    def __init__(self, name: str, cfg) -> None:
        self.name, self.cfg = name, cfg

    def reads_kv_dtype(self, kv_dtype) -> bool:
        return True


def _cfg(head_dim: int = 128, dtype=torch.bfloat16, kv_dtype=None):
    pool = types.SimpleNamespace(dtype=kv_dtype or dtype)
    return factory.AttnConfig(
        num_qo_heads=4, num_kv_heads=2, head_dim=head_dim, page_size=1, kv_pool=pool,
        page_table=torch.zeros(1, 1, dtype=torch.int32), device=torch.device("cuda"), dtype=dtype,
    )


@pytest.fixture
def built(monkeypatch):
    made: list[str] = []

    def create_one(name, cfg):
        made.append(name)
        return _Fake(name, cfg)

    monkeypatch.setattr(factory, "_create_one", create_one)
    return made


def _names(backend) -> tuple[str, str]:
    if isinstance(backend, HybridBackend):
        return backend.prefill.name, backend.decode.name
    return backend.name, backend.name


def test_create_logs_one_line_when_flashinfer_is_passed_over(machine, built, caplog) -> None:
    with caplog.at_level(logging.INFO, logger=factory.__name__):
        backend = factory.create_attn_backend("auto", _cfg())
    assert _names(backend) == ("triton", "triton") and built == ["triton"]
    (line,) = [r for r in caplog.records if r.name == factory.__name__]
    assert line.levelno == logging.INFO
    assert "triton prefill, not FlashInfer" in line.getMessage()
    assert "flashinfer-jit-cache" in line.getMessage() and "nvcc" in line.getMessage()


def test_create_is_silent_when_flashinfer_runs(machine, built, caplog) -> None:
    machine.installed.add("flashinfer_jit_cache")
    with caplog.at_level(logging.INFO, logger=factory.__name__):
        backend = factory.create_attn_backend("auto", _cfg())
    assert _names(backend) == ("flashinfer", "triton")
    assert not [r for r in caplog.records if r.name == factory.__name__]


def test_fp8_kv_cache_prefills_with_triton(machine, built, caplog) -> None:
    """FlashInfer usable, but over an FP8 cache Triton's prefill is the faster one (H200)."""
    machine.installed.add("flashinfer_jit_cache")
    fp8 = torch.float8_e4m3fn
    with caplog.at_level(logging.INFO, logger=factory.__name__):
        backend = factory.create_attn_backend("auto", _cfg(kv_dtype=fp8))
    assert _names(backend) == ("triton", "triton") and built == ["triton"]
    (line,) = [r for r in caplog.records if r.name == factory.__name__]
    assert "triton prefill, not FlashInfer" in line.getMessage() and "FP8" in line.getMessage()
    assert factory.resolve_attn_spec("auto", "cuda", kv_dtype=fp8) == ("triton", "triton")
    assert factory.resolve_attn_spec("auto", "cuda", kv_dtype=torch.bfloat16) == ("flashinfer", "triton")
    assert factory.resolve_attn_spec("flashinfer", "cuda", kv_dtype=fp8) == ("flashinfer", "flashinfer")
    machine.installed.discard("triton")  # FlashInfer is then still the fastest there is
    assert factory.resolve_attn_spec("auto", "cuda", kv_dtype=fp8) == ("flashinfer", "flashinfer")


def test_windowed_model_runs_on_triton_never_flashinfer(machine, built, caplog) -> None:
    """FlashInfer usable but without sliding windows: Triton prefills and decodes a windowed
    model, with one line saying why; without Triton, torch does both."""
    machine.installed.add("flashinfer_jit_cache")
    cfg = dataclasses.replace(_cfg(), windows=(24, None))
    with caplog.at_level(logging.INFO, logger=factory.__name__):
        backend = factory.create_attn_backend("auto", cfg)
    assert _names(backend) == ("triton", "triton") and built == ["triton"]
    (line,) = [r for r in caplog.records if r.name == factory.__name__]
    assert "triton prefill, not FlashInfer" in line.getMessage()
    assert "sliding-window" in line.getMessage()
    machine.installed.discard("triton")
    prefill, decode, why = factory._auto("cuda", cfg)
    assert (prefill, decode) == ("torch", "torch") and "sliding-window" in why
    machine.installed.discard("flashinfer")
    assert factory._auto("cuda", cfg) == ("torch", "torch", None)
    assert factory._auto("cpu", cfg)[:2] == ("torch", "torch")


@pytest.mark.parametrize("head_dim", [16, 32, 72])
def test_head_dims_flashinfer_cannot_tile_prefill_with_triton(machine, built, caplog, head_dim) -> None:
    """FlashInfer usable, but its FA2 kernels fail at their first prefill for a head under 64
    (seen on the H200 with head_dim 16), so `auto` passes it over, saying why; 64/128/256 keep it."""
    machine.installed.add("flashinfer_jit_cache")
    with caplog.at_level(logging.INFO, logger=factory.__name__):
        backend = factory.create_attn_backend("auto", _cfg(head_dim=head_dim))
    assert _names(backend) == ("triton", "triton") and built == ["triton"]
    (line,) = [r for r in caplog.records if r.name == factory.__name__]
    assert f"not {head_dim}" in line.getMessage()
    for ok in (64, 96, 128, 256):
        assert _names(factory.create_attn_backend("auto", _cfg(head_dim=ok)))[0] == "flashinfer"


def test_explicit_flashinfer_refuses_a_head_it_cannot_serve(monkeypatch) -> None:
    """`--attn flashinfer` with a bf16 model of head_dim 16 is a clear error at start, not a
    FlashInfer internal error at the first prefill; float32 runs Triton's kernels, so passes."""
    from radixserve.attention import flashinfer_backend

    monkeypatch.setattr(flashinfer_backend, "_import_flashinfer", lambda: None)
    with pytest.raises(ValueError, match="at least 64, not 16; use --attn triton"):
        flashinfer_backend.FlashInferBackend(_cfg(head_dim=16))


def _fake_flashinfer(monkeypatch, aot_dir: Path) -> list[tuple]:
    """flashinfer.jit.env / flashinfer.jit.attention.modules as FlashInfer 0.5.x lays them out."""
    calls: list[tuple] = []

    def get_batch_prefill_uri(backend, dq, dkv, do, didx, hqk, hvo, pos, swa, cap, f16qk):
        calls.append((backend, dq, dkv, do, didx, hqk, hvo, pos, swa, cap, f16qk))
        return f"batch_prefill_{str(dq).split('.')[-1]}_{str(dkv).split('.')[-1]}_hd{hqk}"

    mods = {
        "flashinfer": types.ModuleType("flashinfer"),
        "flashinfer.jit": types.ModuleType("flashinfer.jit"),
        "flashinfer.jit.env": types.ModuleType("flashinfer.jit.env"),
        "flashinfer.jit.attention": types.ModuleType("flashinfer.jit.attention"),
        "flashinfer.jit.attention.modules": types.ModuleType("flashinfer.jit.attention.modules"),
    }
    mods["flashinfer.jit.env"].FLASHINFER_AOT_DIR = aot_dir
    mods["flashinfer.jit.attention.modules"].get_batch_prefill_uri = get_batch_prefill_uri
    mods["flashinfer"].jit = mods["flashinfer.jit"]
    mods["flashinfer.jit"].env = mods["flashinfer.jit.env"]
    mods["flashinfer.jit"].attention = mods["flashinfer.jit.attention"]
    mods["flashinfer.jit.attention"].modules = mods["flashinfer.jit.attention.modules"]
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    return calls


def test_prebuilt_cache_without_this_head_dim_falls_back(machine, built, monkeypatch, caplog) -> None:
    """The jit-cache holds FA2 prefill for head dims 64/128/256 only: with no nvcc, a model of
    head_dim 96 must not reach FlashInfer's JIT."""
    machine.installed.add("flashinfer_jit_cache")
    aot = machine.tmp / "jit-cache"
    _exe(aot / "batch_prefill_bfloat16_bfloat16_hd128" / "batch_prefill_bfloat16_bfloat16_hd128.so")
    calls = _fake_flashinfer(monkeypatch, aot)
    assert _names(factory.create_attn_backend("auto", _cfg(128))) == ("flashinfer", "triton")
    assert calls[-1] == ("fa2", torch.bfloat16, torch.bfloat16, torch.bfloat16, torch.int32,
                         128, 128, 0, False, False, False)
    with caplog.at_level(logging.INFO, logger=factory.__name__):
        assert _names(factory.create_attn_backend("auto", _cfg(96))) == ("triton", "triton")
    (line,) = [r for r in caplog.records if r.name == factory.__name__]
    assert "head_dim 96" in line.getMessage()


def test_prebuilt_cache_with_nvcc_never_asks_flashinfer(machine, built, monkeypatch) -> None:
    machine.installed.add("flashinfer_jit_cache")
    monkeypatch.setenv("PATH", str(machine.nvcc(machine.tmp / "cuda").parent))
    calls = _fake_flashinfer(monkeypatch, machine.tmp / "jit-cache")
    assert _names(factory.create_attn_backend("auto", _cfg(96))) == ("flashinfer", "triton")
    assert calls == []


def test_an_unknown_flashinfer_layout_trusts_the_package(machine, built, monkeypatch) -> None:
    machine.installed.add("flashinfer_jit_cache")
    monkeypatch.setitem(sys.modules, "flashinfer", types.ModuleType("flashinfer"))
    monkeypatch.setitem(sys.modules, "flashinfer.jit", None)  # import fails
    assert _names(factory.create_attn_backend("auto", _cfg(96))) == ("flashinfer", "triton")
