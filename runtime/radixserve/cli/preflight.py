"""Errors before work: everything that can be checked from the arguments and the model's config
(flags, the model's presence, `--tp` against its heads, the device, the port) is checked here, in
the parent, before any process is spawned or any weight is loaded. A failure is a `UsageError`:
one line on stderr and exit code 2 (`cli/__init__.py`)."""
from __future__ import annotations

import argparse
import errno
import json
import re
import socket
from pathlib import Path
from types import SimpleNamespace

from radixserve.config import EngineConfig, SchedulerConfig, configs_from_args


class UsageError(Exception):
    """A mistake in the command line or its environment that the user can fix; no traceback."""


def as_flag(message: str) -> str:
    """`page_size must be …` -> `--page-size must be …`: name the flag the user typed."""
    first, _, rest = message.partition(" ")
    return f"--{first.replace('_', '-')} {rest}" if re.fullmatch(r"[a-z][a-z0-9_]*", first) and rest else message


def engine_configs(args: argparse.Namespace) -> tuple[EngineConfig, SchedulerConfig]:
    try:
        return configs_from_args(args)
    except ValueError as e:
        raise UsageError(as_flag(str(e))) from None


def check_model(model: str | None) -> None:
    """The model is there (or, for a hub id, can be asked for) — without loading anything."""
    from radixserve.models.default_model import cache_dir, find_embedded_gguf

    if model is None:
        if not (cache_dir() / "SmolLM2-135M-Instruct" / "config.json").exists():
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


def _model_shape(model: str | None) -> SimpleNamespace:
    """The config fields the flags are checked against, read as plain JSON: importing torch and
    transformers for this would make a mistake in the command line cost seconds. For the embedded
    model not yet converted, read from its GGUF header (converting it is work)."""
    from radixserve.models.default_model import cache_dir, find_embedded_gguf

    if model is None and not (cache_dir() / "SmolLM2-135M-Instruct" / "config.json").exists():
        from gguf import GGUFReader

        fields = GGUFReader(find_embedded_gguf()).fields

        def value(key: str) -> int:
            f = fields[f"llama.{key}"]
            return int(f.parts[f.data[0]][0])

        return SimpleNamespace(num_attention_heads=value("attention.head_count"),
                               num_key_value_heads=value("attention.head_count_kv"),
                               intermediate_size=value("feed_forward_length"),
                               max_position_embeddings=value("context_length"))
    from radixserve.models.default_model import resolve_model_path
    from radixserve.models.hf_config import text_config

    try:
        path = Path(resolve_model_path(model)) / "config.json"
        data = json.loads(path.read_text())
    except (OSError, ValueError, RuntimeError) as e:
        raise UsageError(f"--model {model}: {e}".splitlines()[0]) from None
    if not isinstance(data, dict):
        raise UsageError(f"--model {model}: config.json is not a JSON object")
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
    from radixserve.scheduler.tp_launch import validate_tp

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
    """The config names an architecture this engine runs (imports the model classes, so torch),
    quantized, if at all, in a format it loads."""
    from radixserve.models.architectures import get_model_class
    from radixserve.models.quantization import read_quantization

    if hasattr(shape, "architectures"):
        try:
            get_model_class(shape)
            read_quantization(shape)
        except ValueError as e:
            raise UsageError(str(e)) from None


def check_device(eng: EngineConfig) -> None:
    """`--device`, `--tp` against the visible GPUs, `--attn` against the device, and an FP8 KV
    cache against the GPU's generation."""
    import torch

    from radixserve.attention.factory import check_backend, resolve_attn_spec

    if eng.device != "auto" and not re.fullmatch(r"cpu|cuda(:\d+)?", eng.device):
        raise UsageError(f"--device must be auto, cpu, cuda or cuda:N, got {eng.device!r}")
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


def check_weights(eng: EngineConfig) -> None:
    """A local model directory has the safetensors weights the loader reads, unless none are read."""
    path = Path(eng.model).expanduser() if eng.model else None
    if eng.load_format == "dummy" or path is None or not path.is_dir():
        return
    if not any(path.glob("*.safetensors")):
        raise UsageError(f"--model {eng.model}: no *.safetensors weights in the directory "
                         "(--load-format dummy runs random weights of its shapes)")


def check_engine(args: argparse.Namespace) -> tuple[EngineConfig, SchedulerConfig]:
    """Every engine flag, the device and the model, without loading anything."""
    eng, sched = engine_configs(args)
    check_model(eng.model)
    check_weights(eng)
    shape = _model_shape(eng.model)
    check_model_shape(eng, shape)  # before torch is imported: these mistakes answer at once
    check_device(eng)
    check_architecture(shape)
    return eng, sched


def chat_template_from_args(args: argparse.Namespace) -> str | None:
    """`--chat-template` read and parsed (its text), or None where not given."""
    if args.chat_template is None:
        return None
    from radixserve.tokenizer.load import read_chat_template

    try:
        return read_chat_template(args.chat_template)
    except (ValueError, OSError) as e:
        raise UsageError(f"--chat-template: {e}") from None


def bind_port(host: str, port: int) -> socket.socket:
    """Bind and listen now, so a busy port fails before the model loads and nobody takes the port
    meanwhile (NOTE: with SO_REUSEADDR only a listening socket makes another bind fail). A client
    that connects during startup waits in the backlog until uvicorn accepts."""
    if not 0 < port < 65536:
        raise UsageError(f"--port must be between 1 and 65535, got {port}")
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
