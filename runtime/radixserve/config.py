"""Configuration by composition: a server holds an engine and a scheduler config; nothing overrides
a parent's field. `add_engine_args` gives every entry point (serve, generate, bench, shell, LLM)
the same flags, named as in mini-sglang/SGLang."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields

from radixserve import settings

# NOTE: spelled out here (as in `radixserve.kvcache.kv_dtype`) so importing the config needs no torch
KV_CACHE_DTYPE_CHOICES = ("auto", "bfloat16", "float16", "fp8_e4m3")

# Tokens per prefill batch (the prefill chunk) unless `--max-prefill-length` says otherwise. On a
# GPU 8,192 (measured on the H200, docs/benchmarks.md). On CPU a step's cost grows with its tokens
# and every running stream waits for the whole step, so a long prompt goes in chunks of 512 and
# the streams beside it get a token every step.
GPU_PREFILL_LENGTH = 8192
CPU_PREFILL_LENGTH = 512


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None  # None: the embedded SmolLM2-135M-Instruct
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"  # auto (the model's dtype) | bfloat16 | float16 | fp8_e4m3
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    tp: int = 1
    page_size: int = 1
    attn: str = "auto"  # auto | NAME | PREFILL,DECODE
    memory_ratio: float = 0.9  # share of free device memory for weights + KV (GPU)
    max_kv_tokens: int | None = None  # explicit KV capacity; default from memory (GPU) or a budget (CPU)
    cuda_graph_max_bs: int | None = None  # None: chosen from memory; 0 disables
    # prefill batches of up to this many tokens (at most the prefill chunk, max_prefill_length)
    # run as piecewise CUDA graphs; None: 8,192; 0 disables
    prefill_graph_max_tokens: int | None = None
    seed: int = 0
    load_format: str = "auto"  # auto: the checkpoint's weights | dummy: random, same shapes
    context_length: int | None = None  # None: the model's max_position_embeddings; else at most it

    def __post_init__(self) -> None:
        if self.load_format not in ("auto", "dummy"):
            raise ValueError(f"load_format must be auto|dummy, got {self.load_format!r}")
        ps = self.page_size
        if ps < 1 or ps & (ps - 1):
            raise ValueError(f"page_size must be a power of two, got {ps}")
        if self.dtype not in ("auto", "bfloat16", "float16", "float32"):
            raise ValueError(f"dtype must be auto|bfloat16|float16|float32, got {self.dtype!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPE_CHOICES:
            raise ValueError(f"kv_cache_dtype must be {'|'.join(KV_CACHE_DTYPE_CHOICES)}, "
                             f"got {self.kv_cache_dtype!r}")
        if self.tp < 1:
            raise ValueError(f"tp must be at least 1, got {self.tp}")
        if not 0.0 < self.memory_ratio <= 1.0:
            raise ValueError(f"memory_ratio must be in (0, 1], got {self.memory_ratio}")
        if self.max_kv_tokens is not None and self.max_kv_tokens < 1:
            raise ValueError(f"max_kv_tokens must be positive, got {self.max_kv_tokens}")
        if self.prefill_graph_max_tokens is not None and self.prefill_graph_max_tokens < 0:
            raise ValueError(f"prefill_graph_max_tokens must be 0 (off) or positive, "
                             f"got {self.prefill_graph_max_tokens}")
        if self.context_length is not None and self.context_length < 2:
            raise ValueError(f"context_length must be at least 2, got {self.context_length}")

    def context_limit(self, max_position_embeddings: int) -> int:
        """The longest sequence (prompt and reply) served: the model's context length, or the
        shorter `context_length` asked for (vLLM's --max-model-len, SGLang's --context-length),
        which also shrinks the page table; ValueError for a longer one."""
        if self.context_length is None:
            return max_position_embeddings
        if self.context_length > max_position_embeddings:
            raise ValueError(f"context_length {self.context_length} is longer than the model's "
                             f"{max_position_embeddings} (max_position_embeddings)")
        return self.context_length


@dataclass(frozen=True)
class SchedulerConfig:
    cache: str = "radix"  # radix | naive
    # tokens per prefill batch (chunked prefill bound); None: by device (`prefill_length`)
    max_prefill_length: int | None = None
    max_running_requests: int = 256
    # NOTE: a factory, so the environment is read when a config is made (a test, the CLI or a
    # parent may set it after import); `--disable-overlap` sets it False explicitly
    overlap: bool = field(default_factory=lambda: not settings.DISABLE_OVERLAP.get())
    # prefill batches also carry the running requests' decode tokens (on: ITL p99 under long
    # prompts, measured on the H200, docs/benchmarks.md)
    mixed_chunk: bool = True

    def __post_init__(self) -> None:
        if self.max_prefill_length is not None and self.max_prefill_length < 1:
            raise ValueError(f"max_prefill_length must be positive, got {self.max_prefill_length}")
        if self.max_running_requests < 1:
            raise ValueError(
                f"max_running_requests must be positive, got {self.max_running_requests}"
            )

    def prefill_length(self, device_type: str) -> int:
        """Tokens per prefill batch on a `device_type` device: `max_prefill_length` when given,
        else that device's default."""
        if self.max_prefill_length is not None:
            return self.max_prefill_length
        return GPU_PREFILL_LENGTH if device_type == "cuda" else CPU_PREFILL_LENGTH


@dataclass(frozen=True)
class ServerConfig:
    engine: EngineConfig = field(default_factory=EngineConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    num_tokenizer: int = 0
    api_key: str | None = None
    shutdown_timeout: float = 30.0
    default_max_tokens: int = 2048  # a chat request without max_tokens: bounds its KV reservation
    metrics_without_key: bool = False
    tool_call_parser: str = "auto"  # tool_choice auto: auto (from the chat template) | hermes | llama3 | none
    reasoning_parser: str | None = None  # qwen3 | deepseek_r1: thinking as `reasoning_content`
    chat_template: str | None = None  # a template's text, in place of the checkpoint's
    sampling_defaults: str = "model"  # model: generation_config.json's for unset fields | openai
    # transport limits (docs/api.md): a connection's header block, the idle time between requests,
    # a request's body (bytes, and seconds without a byte of it), connections at once
    header_timeout: float = 5.0
    keep_alive_timeout: float = 5.0
    max_request_body_bytes: int = 32 << 20
    body_timeout: float = 30.0
    max_connections: int = 1024


def add_chat_template_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chat-template", default=None, metavar="FILE_OR_TEMPLATE",
                   help="a Jinja chat template (a file, or the template itself) used in place of "
                        "the checkpoint's, e.g. for a base model that has none")


def add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="HF model dir or hub id (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"])
    p.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPE_CHOICES,
                   help="KV cache dtype (auto: the model's); fp8_e4m3 holds twice the tokens, "
                        "scaled by the checkpoint's k_scale/v_scale or 1.0")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--tp", "--tp-size", dest="tp", type=int, default=1, help="tensor-parallel size")
    p.add_argument("--page-size", type=int, default=1, help="KV page size (a power of two)")
    p.add_argument("--attn", default="auto", help="attention backend: auto | torch | triton | flashinfer | PREFILL,DECODE")
    p.add_argument("--memory-ratio", type=float, default=0.9)
    p.add_argument("--max-kv-tokens", type=int, default=None)
    p.add_argument("--context-length", "--max-model-len", dest="context_length", type=int, default=None,
                   help="longest prompt + reply served (default: the model's context length; "
                        "shorter also shrinks the page table)")
    p.add_argument("--cuda-graph-max-bs", type=int, default=None, help="largest decode batch captured (0 disables)")
    p.add_argument("--prefill-graph-max-tokens", type=int, default=None,
                   help="prefill batches of up to this many tokens (at most --max-prefill-length) "
                        "run as piecewise CUDA graphs (default 8192; 0 disables)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--load-format", default="auto", choices=["auto", "dummy"],
                   help="dummy: random weights of the checkpoint's shapes, none read (benchmarks "
                        "from a config and tokenizer alone)")
    p.add_argument("--cache", default="radix", choices=["radix", "naive"], help="prefix cache")
    p.add_argument("--max-prefill-length", type=int, default=None,
                   help=f"tokens per prefill batch: a longer prompt is prefilled in chunks "
                        f"(default {GPU_PREFILL_LENGTH} on a GPU, {CPU_PREFILL_LENGTH} on CPU)")
    p.add_argument("--max-running-requests", type=int, default=256)
    p.add_argument("--disable-overlap", action="store_true",
                   help="schedule the next batch only after the last one's tokens are read "
                        "(default: overlap them; RADIXSERVE_DISABLE_OVERLAP=1 does the same)")
    p.add_argument("--disable-mixed-chunk", dest="mixed_chunk", action="store_false",
                   help="prefill batches carry prompt tokens only (default: a prefill batch also "
                        "carries one decode token of every running request, so they keep "
                        "emitting while a long prompt is prefilled)")
    p.add_argument("--enable-mixed-chunk", dest="mixed_chunk", action="store_true",
                   help=argparse.SUPPRESS)  # the default; accepted so that commands that spell it out still run


def _pick(cls: type, args: argparse.Namespace) -> dict:
    return {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}


def configs_from_args(args: argparse.Namespace) -> tuple[EngineConfig, SchedulerConfig]:
    sched = _pick(SchedulerConfig, args)
    if getattr(args, "disable_overlap", False):  # else the default (RADIXSERVE_DISABLE_OVERLAP)
        sched["overlap"] = False
    return EngineConfig(**_pick(EngineConfig, args)), SchedulerConfig(**sched)
