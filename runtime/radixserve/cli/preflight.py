"""Errors before work: everything that can be checked from the arguments and the model's config
(flags, the model's presence, `--tp` against its heads, the device, the port) is checked here, in
the parent, before any process is spawned or any weight is loaded. A failure is a `UsageError`:
one line on stderr and exit code 2 (`cli/__init__.py`)."""
from __future__ import annotations

import argparse
import dataclasses
import errno
import glob
import json
import os
import re
import socket
from pathlib import Path
from types import SimpleNamespace

from radixserve.config import (
    CONFIGS,
    EngineConfig,
    SchedulerConfig,
    ServerConfig,
    attn_names,
    configs_from_args,
    lora_path_pairs,
)
from radixserve.options import flag_of, values_from_args
from radixserve.sampling_params import SamplingParams


class UsageError(Exception):
    """A mistake in the command line or its environment that the user can fix; no traceback."""


def as_flag(message: str) -> str:
    """`page_size must be …` -> `--page-size must be …`: name the flag the user typed (the
    declared one, else the field's name spelled as a flag)."""
    first, _, rest = message.partition(" ")
    if not (re.fullmatch(r"[a-z][a-z0-9_]*", first) and rest):
        return message
    return f"{flag_of(CONFIGS, first) or '--' + first.replace('_', '-')} {rest}"


def engine_configs(args: argparse.Namespace) -> tuple[EngineConfig, SchedulerConfig]:
    """The engine's and scheduler's flags checked (their values alone: nothing is read)."""
    try:
        return configs_from_args(args)
    except ValueError as e:
        raise UsageError(as_flag(str(e))) from None


def server_config(args: argparse.Namespace) -> ServerConfig:
    """Every `serve` flag's value checked (nothing is read but a `--chat-template` file)."""
    engine, sched = engine_configs(args)
    try:
        return ServerConfig(engine=engine, scheduler=sched, **values_from_args(ServerConfig, args))
    except ValueError as e:
        raise UsageError(as_flag(str(e))) from None


def sampling_from_args(args: argparse.Namespace) -> SamplingParams:
    """`generate`'s and `shell`'s sampling flags (those the command has) as SamplingParams."""
    names = ("max_tokens", "temperature", "top_p", "top_k")
    try:
        return SamplingParams(**{n: getattr(args, n) for n in names if hasattr(args, n)})
    except ValueError as e:
        raise UsageError(as_flag(str(e))) from None


def check_model(model: str | None) -> None:
    """The model is there (or, for a hub id, can be asked for) — without loading anything."""
    from radixserve.models.default_model import embedded_model_ready, find_embedded_gguf

    if model is None:
        if not embedded_model_ready():
            try:
                find_embedded_gguf()
            except FileNotFoundError as e:
                raise UsageError(str(e)) from None
        return
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UsageError(f"--model {model}: the directory has no config.json (not a Hugging Face model directory)")
        return
    if path.exists() or model.startswith((".", "/", "~")) or model.count("/") > 1:
        raise UsageError(f"--model {model}: no such model directory")


def resolve_model(model: str | None) -> Path:
    """The model's directory: converts the embedded model or downloads a hub id (once, cached)."""
    from radixserve.models.default_model import resolve_model_path

    try:
        return resolve_model_path(model)
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        raise UsageError(str(e)) from None


def _model_shape(path: str | Path | None) -> SimpleNamespace:
    """The config fields the flags are checked against, read as plain JSON: importing torch and
    transformers for this would make a mistake in the command line cost seconds. `path`: the
    model's directory; None: the embedded model not yet converted, read from its GGUF header
    (converting it is work)."""
    if path is None:
        from gguf import GGUFReader

        from radixserve.models.default_model import find_embedded_gguf

        fields = GGUFReader(find_embedded_gguf()).fields

        def value(key: str) -> int:
            f = fields[f"llama.{key}"]
            return int(f.parts[f.data[0]][0])

        return SimpleNamespace(num_attention_heads=value("attention.head_count"),
                               num_key_value_heads=value("attention.head_count_kv"),
                               intermediate_size=value("feed_forward_length"),
                               max_position_embeddings=value("context_length"))
    from radixserve.models.hf_config import text_config

    try:
        data = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"--model {path}: {e}".splitlines()[0]) from None
    if not isinstance(data, dict):
        raise UsageError(f"--model {path}: config.json is not a JSON object")
    text = text_config(data)
    if text is not data and isinstance(text, dict):  # a multimodal checkpoint: its language model,
        outer = {k: data[k] for k in ("architectures", "quantization_config") if k in data}
        data = text | outer  # named as the checkpoint names it, quantized as it is
    if "num_attention_heads" in data:  # transformers' default for a config that leaves it out
        data.setdefault("num_key_value_heads", data["num_attention_heads"])
    return SimpleNamespace(**data)


def check_model_shape(eng: EngineConfig, shape: SimpleNamespace) -> None:
    """`--tp` divides the model's heads and `--context-length` is within the model's: plain
    arithmetic on the config, before anything heavy is imported."""
    from radixserve.ranks.shape import validate_tp

    tp_fields = ("num_attention_heads", "num_key_value_heads", "intermediate_size")
    try:
        # NOTE: a config without these is no architecture this engine runs; check_architecture
        # says so in its own words
        if eng.tp > 1 and all(hasattr(shape, f) for f in tp_fields):
            validate_tp(eng.tp, shape)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if hasattr(shape, "max_position_embeddings"):
        try:
            eng.context_limit(int(shape.max_position_embeddings))
        except ValueError as e:
            raise UsageError(as_flag(str(e))) from None


def check_architecture(shape: SimpleNamespace) -> None:
    """The config names an architecture this engine runs, quantized, if at all, in a format it
    loads (names and fields only: no torch)."""
    from radixserve.models.quantization import read_quantization
    from radixserve.models.registry import supported_architecture

    if hasattr(shape, "architectures"):
        try:
            supported_architecture(shape)
            read_quantization(shape)
        except ValueError as e:
            raise UsageError(str(e)) from None


def check_device(eng: EngineConfig) -> None:
    """`--device`, `--tp` against the visible GPUs, `--attn` against the device, and an FP8 KV
    cache against the GPU's generation."""
    if eng.device.startswith("cuda") and not nvidia_driver_present():  # (before torch's import)
        raise UsageError(f"--device {eng.device}: CUDA is not available on this machine "
                         "(no NVIDIA driver)")
    if not nvidia_driver_present() or eng.device == "cpu":  # CPU: known without torch
        for name in attn_names(eng.attn):
            if name != "torch":
                raise UsageError(f"--attn {eng.attn}: attention backend {name!r} needs a CUDA "
                                 "device; use --attn torch on CPU")
        return
    import torch

    from radixserve.attention.factory import check_backend, resolve_attn_spec

    if eng.device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device {eng.device}: CUDA is not available on this machine")
    device_type = "cuda" if eng.device.startswith("cuda") or (eng.device == "auto" and torch.cuda.is_available()) else "cpu"
    if device_type == "cuda" and eng.tp > torch.cuda.device_count():
        raise UsageError(f"--tp {eng.tp} needs {eng.tp} GPUs, but {torch.cuda.device_count()} are visible")
    try:
        for name in set(resolve_attn_spec(eng.attn, device_type)):
            check_backend(name, device_type)
    except ValueError as e:
        raise UsageError(f"--attn {eng.attn}: {e}") from None
    if device_type == "cuda" and eng.kv_cache_dtype == "fp8_e4m3":
        from radixserve.kvcache.kv_dtype import FP8_KV_DTYPE, check_kv_dtype_on_device

        dev = torch.device(eng.device if eng.device.startswith("cuda:") else "cuda")
        try:
            check_kv_dtype_on_device(FP8_KV_DTYPE, dev)
        except ValueError as e:
            raise UsageError(str(e)) from None


def nvidia_driver_present() -> bool:
    """Whether this machine could have CUDA at all, known without importing torch."""
    return os.path.exists("/proc/driver/nvidia/version") or bool(glob.glob("/dev/nvidia[0-9]*"))


def check_weights(eng: EngineConfig) -> None:
    """A local model directory has the safetensors weights the loader reads, unless none are read."""
    path = Path(eng.model).expanduser() if eng.model else None
    if eng.load_format == "dummy" or path is None or not path.is_dir():
        return
    if not any(path.glob("*.safetensors")):
        raise UsageError(f"--model {eng.model}: no *.safetensors weights in the directory "
                         "(--load-format dummy runs random weights of its shapes)")


def check_engine(args: argparse.Namespace) -> tuple[EngineConfig, SchedulerConfig]:
    """Every engine flag, the device and the model, loading nothing; the engine's `model` is
    the resolved directory."""
    eng, sched = engine_configs(args)
    return dataclasses.replace(eng, model=str(check_setup(eng))), sched


def check_setup(eng: EngineConfig) -> Path:
    """The model (present, its shape against the flags, an architecture this engine runs) and
    the device, loading nothing; the model's directory, resolved once here (a hub id is
    downloaded to read its config; the embedded model is converted only once every check
    passed)."""
    from radixserve.models.default_model import embedded_model_ready

    check_model(eng.model)
    check_weights(eng)
    path = resolve_model(eng.model) if eng.model is not None or embedded_model_ready() else None
    shape = _model_shape(path)
    check_model_shape(eng, shape)  # before torch is imported: these mistakes answer at once
    check_device(eng)
    check_architecture(shape)
    path = path or resolve_model(None)
    check_lora(eng, path)
    return path


def check_lora(eng: EngineConfig, model_dir: Path) -> None:
    """Each `--lora-paths` adapter can be served beside the model: its config, its tensors'
    names and shapes, its rank (nothing loaded: the model is built on the meta device)."""
    if not eng.lora_paths:
        return
    from radixserve.lora.adapter import check_adapters
    from radixserve.lora.source import AdapterError

    try:
        check_adapters(model_dir, lora_path_pairs(eng.lora_paths), eng.max_lora_rank)
    except AdapterError as e:
        raise UsageError(f"--lora-paths {e.message}") from None


def bind_port(host: str, port: int) -> socket.socket:
    """Bind and listen now, so a busy port fails before the model loads and nobody takes the port
    meanwhile (NOTE: with SO_REUSEADDR only a listening socket makes another bind fail). A client
    that connects during startup waits in the backlog until uvicorn accepts."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise UsageError(f"--host {host}: cannot resolve it ({e.strerror})") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: TIME_WAIT is no conflict
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise UsageError(f"--port {port}: {host}:{port} is already in use (another server?); "
                             "stop it or pick another port") from None
        if e.errno == errno.EADDRNOTAVAIL:
            raise UsageError(f"--host {host}: not an address of this machine") from None
        raise UsageError(f"--port {port}: cannot bind {host}:{port} ({e.strerror})") from None
    return sock
