"""Configuration by composition: a server holds an engine and a scheduler config; nothing overrides
a parent's field. Every field is a setting declared once (`options.option`): its default, flags,
choices, check and help; the flags of every entry point (serve, generate, bench, shell), the
`LLM(...)` keywords and docs/configuration.md's table come from these declarations, and each
config checks its values when it is made (`options.check_options`), before anything loads."""
from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field

from radixserve import settings
from radixserve.chat_template import read_chat_template
from radixserve.options import (
    add_options,
    at_least,
    check_options,
    markdown_table,
    non_negative,
    option,
    positive,
    power_of_two,
    values_from_args,
    within,
)

# NOTE: names only, so importing the config needs no torch (`kvcache/kv_dtype.py` maps them)
KV_CACHE_DTYPE_CHOICES = ("auto", "bfloat16", "float16", "fp8_e4m3")
DTYPE_CHOICES = ("auto", "bfloat16", "float16", "float32")
# the attention backends `--attn` names (each registered by `attention/<name>_backend.py`)
ATTN_CHOICES = ("torch", "triton", "flashinfer")
CACHE_CHOICES = ("radix", "naive")  # the prefix caches `kvcache.PREFIX_CACHES` registers
# the waiting queue's order (SGLang's names): arrival, longest prefix match, tree-weighted DFS
SCHEDULE_POLICIES = ("fcfs", "lpm", "dfs-weight")
KV_ADMISSION_CHOICES = ("optimistic", "reserve")
HICACHE_WRITE_POLICIES = ("write_through", "write_back")
TOOL_CALL_PARSERS = ("auto", "hermes", "llama3", "none")
# the drafters `speculative/` registers (none: no speculation)
SPECULATIVE_ALGORITHMS = ("none", "ngram", "draft", "eagle3")
REASONING_PARSERS = ("qwen3", "deepseek_r1")

# Tokens per prefill batch (the prefill chunk) unless `--max-prefill-length` says otherwise. On a
# GPU 8,192 (measured on the H200, docs/benchmarks.md). On CPU a step's cost grows with its tokens
# and every running stream waits for the whole step, so a long prompt goes in chunks of 512 and
# the streams beside it get a token every step.
GPU_PREFILL_LENGTH = 8192
CPU_PREFILL_LENGTH = 512


def _device_spec(v: str) -> str | None:
    return None if re.fullmatch(r"auto|cpu|cuda(:\d+)?", v) else "must be auto, cpu, cuda or cuda:N"


def attn_names(spec: str) -> list[str]:
    """The backends an `--attn` value names: `auto`, one name, or `PREFILL,DECODE`."""
    return [p.strip() for p in spec.split(",")] if spec != "auto" else []


def _attn_spec(v: str) -> str | None:
    parts = attn_names(v)
    if v != "auto" and (len(parts) > 2 or not all(parts)):
        return "must be auto, a backend, or PREFILL,DECODE"
    if bad := [p for p in parts if p not in ATTN_CHOICES]:
        return (f"{v}: unknown attention backend {bad[0]!r}; choose one of: auto, "
                f"{', '.join(ATTN_CHOICES)}")
    return None


# an adapter's name as clients give it in `model` ("name" or "base:name")
_ADAPTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")


def adapter_name_fault(name: str) -> str | None:
    """Why `name` cannot name a LoRA adapter, or None."""
    if not _ADAPTER_NAME.fullmatch(name):
        return (f"adapter name {name!r} must start with a letter or digit and hold only letters, "
                "digits and . _ / -")
    return None


def lora_path_pairs(specs: tuple[str, ...] | None) -> dict[str, str]:
    """`--lora-paths` as {name: path}: each NAME=PATH, or a PATH named by its last component."""
    pairs = {}
    for spec in specs or ():
        name, sep, path = spec.partition("=")
        if not sep:
            name, path = spec.rstrip("/").rsplit("/", 1)[-1], spec
        pairs[name] = path
    return pairs


def _lora_paths(v: tuple[str, ...]) -> str | None:
    names = [n for spec in v for n in lora_path_pairs((spec,))]
    for name in names:
        if (why := adapter_name_fault(name)) is not None:
            return why
    if dup := sorted({n for n in names if names.count(n) > 1}):
        return f"names adapter {dup[0]!r} twice"
    return None


def _chat_template(v: str) -> str | None:
    try:
        read_chat_template(v)
    except (ValueError, OSError) as e:
        return f"must be a Jinja template or a file holding one: {e}"
    return None


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = option(
        None, "--model", help="Hugging Face model directory or hub id",
        default_text="the embedded SmolLM2-135M-Instruct")
    dtype: str = option("auto", "--dtype", choices=DTYPE_CHOICES,
                        help="weights' and activations' dtype (auto: the checkpoint's)")
    kv_cache_dtype: str = option(
        "auto", "--kv-cache-dtype", choices=KV_CACHE_DTYPE_CHOICES,
        help="KV cache dtype (auto: the model's); fp8_e4m3 holds twice the tokens, scaled by the "
             "checkpoint's k_scale/v_scale or 1.0")
    device: str = option("auto", "--device", check=_device_spec,
                         help="auto | cpu | cuda | cuda:N (auto: CUDA where there is one)")
    tp: int = option(1, "--tp", "--tp-size", parse=int, check=at_least(1),
                     help="tensor-parallel size (one process and GPU a rank)")
    page_size: int = option(1, "--page-size", parse=int, check=power_of_two,
                            help="KV page size in tokens (a power of two)")
    attn: str = option("auto", "--attn", check=_attn_spec, metavar="auto|NAME|PREFILL,DECODE",
                       help=f"attention backend ({', '.join(ATTN_CHOICES)}), or one for "
                            "prefill and one for decode")
    memory_ratio: float = option(0.9, "--memory-ratio", parse=float,
                                 check=within(0, 1, open_low=True),
                                 help="share of the GPU's free memory for weights and KV")
    max_kv_tokens: int | None = option(
        None, "--max-kv-tokens", parse=int, check=positive,
        help="KV capacity in tokens", default_text="from free memory (GPU), or what "
        "--max-running-requests and the context need within the machine's memory (CPU)")
    cuda_graph_max_bs: int | None = option(
        None, "--cuda-graph-max-bs", parse=int, check=non_negative,
        help="largest decode batch captured as a CUDA graph (0 disables)",
        default_text="chosen from memory")
    prefill_graph_max_tokens: int | None = option(
        None, "--prefill-graph-max-tokens", parse=int, check=non_negative,
        help="prefill batches of up to this many tokens (at most --max-prefill-length) run as "
             "piecewise CUDA graphs (0 disables)", default_text=str(GPU_PREFILL_LENGTH))
    seed: int = option(0, "--seed", parse=int, help="seed of the engine's random sampling")
    load_format: str = option(
        "auto", "--load-format", choices=("auto", "dummy"),
        help="dummy: random weights of the checkpoint's shapes, none read (benchmarks from a "
             "config and tokenizer alone)")
    context_length: int | None = option(
        None, "--context-length", "--max-model-len", parse=int, check=at_least(2),
        help="longest prompt + reply served (shorter than the model's also shrinks the page "
             "table)", default_text="the model's context length")
    # LoRA adapters (SGLang's flags): docs/lora.md
    enable_lora: bool = option(
        False, "--enable-lora", store=True, default_text="off",
        help="serve PEFT LoRA adapters beside the model: those of --lora-paths and any loaded "
             "at run time (on whenever --lora-paths is given)")
    lora_paths: tuple[str, ...] | None = option(
        None, "--lora-paths", nargs="+", check=_lora_paths, metavar="NAME=PATH",
        help="adapters served from the start, each NAME=PATH (or PATH, named by its last "
             "component); a request picks one with model NAME or BASE:NAME")
    max_loras_per_batch: int = option(
        8, "--max-loras-per-batch", parse=int, check=positive,
        help="adapter slots on the device: the most adapters running requests use at once (a "
             "request of another waits; slots are refilled from host memory, least recently "
             "used first)")
    max_lora_rank: int | None = option(
        None, "--max-lora-rank", parse=int, check=within(1, 256),
        default_text="the largest rank of --lora-paths, at least 16",
        help="the largest adapter rank served (the slots' size; a larger adapter is refused)")

    def __post_init__(self) -> None:
        check_options(self)
        if isinstance(self.lora_paths, list):  # (frozen: the command line gives a tuple)
            object.__setattr__(self, "lora_paths", tuple(self.lora_paths))

    @property
    def lora(self) -> bool:
        """Whether LoRA adapters are served (`--enable-lora`, or any `--lora-paths`)."""
        return self.enable_lora or bool(self.lora_paths)

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
    cache: str = option("radix", "--cache", choices=CACHE_CHOICES, help="prefix cache")
    max_prefill_length: int | None = option(
        None, "--max-prefill-length", parse=int, check=positive,
        help="tokens per prefill batch: a longer prompt is prefilled in chunks",
        default_text=f"{GPU_PREFILL_LENGTH} on a GPU, {CPU_PREFILL_LENGTH} on CPU")
    max_running_requests: int = option(256, "--max-running-requests", parse=int, check=positive,
                                       help="requests decoded at once")
    overlap: bool = option(
        lambda: not settings.DISABLE_OVERLAP.get(), "--disable-overlap", store=False,
        env=settings.DISABLE_OVERLAP, default_text="overlap on",
        help="schedule the next batch only after the last one's tokens are read, instead of "
             "overlapping the two")
    # prefill batches also carry the running requests' decode tokens (on: ITL p99 under long
    # prompts, measured on the H200, docs/benchmarks.md)
    mixed_chunk: bool = option(
        True, "--disable-mixed-chunk", store=False, hidden=("--enable-mixed-chunk",),
        default_text="mixed batches on",
        help="prefill batches carry prompt tokens only, instead of also one decode token of "
             "every running request (so they keep emitting while a long prompt is prefilled)")
    schedule_policy: str = option(
        "fcfs", "--schedule-policy", choices=SCHEDULE_POLICIES,
        help="order of the waiting queue within a priority: arrival (fcfs), longest cached "
             "prefix first (lpm), or grouped by shared prefix, largest group first (dfs-weight)")
    kv_admission: str = option(
        "optimistic", "--kv-admission", choices=KV_ADMISSION_CHOICES,
        help="optimistic: admit on the prompt plus an estimate of the tokens still to come, and "
             "retract the requests that lose least when decoding runs out of KV; reserve: "
             "reserve prompt + max_tokens at admission (never retracts)")
    schedule_conservativeness: float = option(
        1.0, "--schedule-conservativeness", parse=float, check=positive,
        help="scales the optimistic estimate of the tokens running requests will still write "
             "(SGLang's): higher admits fewer requests and retracts less")
    enable_hierarchical_cache: bool = option(
        False, "--enable-hierarchical-cache", store=True, default_text="off",
        help="keep prefix-cache KV evicted from the device in a host-memory tier (pinned on a "
             "GPU) and load it back on a hit")
    hicache_ratio: float = option(
        2.0, "--hicache-ratio", parse=float, check=at_least(1),
        help="host tier size as a multiple of the device KV pool")
    hicache_size: float | None = option(
        None, "--hicache-size", parse=float, check=positive, default_text="from --hicache-ratio",
        help="host tier size in GiB per rank (instead of --hicache-ratio)")
    hicache_write_policy: str = option(
        "write_through", "--hicache-write-policy", choices=HICACHE_WRITE_POLICIES,
        help="copy new prefix-cache KV to the host tier as soon as it is computed "
             "(write_through) or only when the device evicts it (write_back)")

    speculative_algorithm: str = option(
        "none", "--speculative-algorithm", choices=SPECULATIVE_ALGORITHMS,
        help="speculative decoding: each decode step the target verifies the tokens a drafter "
             "proposes, and keeps those it would have produced (greedy: the same tokens; sampled: "
             "the same distribution). ngram: looked up in the request's own prompt and output; "
             "draft: a smaller model sharing the target's tokenizer (--speculative-draft-model-path); "
             "eagle3: an EAGLE-3 draft head (--speculative-draft-model-path) fed the target's "
             "hidden states; each a chain, or a tree with --speculative-eagle-topk; on a GPU "
             "eagle3's target then runs without CUDA graphs, and the host KV tier is refused")
    speculative_num_draft_tokens: int = option(
        4, "--speculative-num-draft-tokens", parse=int, check=within(1, 16),
        help="the most tokens drafted for a request in one step, a tree's nodes (fewer, or "
             "none, where its drafts keep being rejected); SGLang's flag of this name also counts "
             "the verified last token, so its N drafts N − 1")
    speculative_num_steps: int | None = option(
        None, "--speculative-num-steps", parse=int, check=within(1, 16), default_text="none",
        help="draft, eagle3 and ngram trees: the deepest a drafted path goes (a draft model's "
             "steps a round); default --speculative-num-draft-tokens, which a chain's must equal "
             "(with --speculative-eagle-topk 1 and no n-gram breadth)")
    speculative_eagle_topk: int = option(
        1, "--speculative-eagle-topk", parse=int, check=within(1, 8),
        help="draft and eagle3: each draft step's k likeliest tokens; the chain follows the "
             "first, the others branch off it (one token each, likeliest paths first) and all "
             "are verified together as a tree of at most --speculative-num-draft-tokens nodes "
             "(SGLang's flag, whose branches grow further; needs --page-size 1; a step verified "
             "as an extend, as eagle3's are on a GPU, verifies the chain alone)")
    speculative_draft_model_path: str | None = option(
        None, "--speculative-draft-model-path", default_text="none",
        help="the draft model of --speculative-algorithm draft (a Hugging Face directory or hub id "
             "of a model with the target's vocabulary), or the EAGLE-3 head of eagle3 (a directory "
             "or hub id with its config.json and safetensors, trained for this target)")
    speculative_disable_by_batch_size: int | None = option(
        None, "--speculative-disable-by-batch-size", parse=int, check=positive, default_text="none",
        help="no request drafts while more than this many requests decode (vLLM's flag): past a "
             "batch of a few requests a verification step costs about what its kept drafts save "
             "(docs/benchmarks.md)")
    speculative_ngram_min_match_window_size: int = option(
        2, "--speculative-ngram-min-match-window-size", parse=int, check=within(1, 64),
        help="ngram: the shortest suffix of a request's tokens looked up earlier in them")
    speculative_ngram_max_match_window_size: int = option(
        8, "--speculative-ngram-max-match-window-size", parse=int, check=within(1, 64),
        help="ngram: the longest suffix looked up (the longest match found drafts)")
    speculative_ngram_max_bfs_breadth: int = option(
        1, "--speculative-ngram-max-bfs-breadth", parse=int, check=within(1, 8),
        help="ngram: up to this many matches' continuations a step, verified together as a tree "
             "(their shared first tokens once; at most --speculative-num-draft-tokens nodes; "
             "SGLang's flag; needs --page-size 1)")

    def __post_init__(self) -> None:
        check_options(self)
        if self.speculative_ngram_min_match_window_size > self.speculative_ngram_max_match_window_size:
            raise ValueError("speculative_ngram_min_match_window_size must be at most "
                             "--speculative-ngram-max-match-window-size, got "
                             f"{self.speculative_ngram_min_match_window_size} > "
                             f"{self.speculative_ngram_max_match_window_size}")
        if self.speculative_ngram_max_bfs_breadth > 1 and self.speculative_algorithm in (
                "draft", "eagle3"):
            raise ValueError("speculative_ngram_max_bfs_breadth > 1 drafts a tree of n-gram "
                             "matches: it needs --speculative-algorithm ngram (draft and eagle3 "
                             "branch by --speculative-eagle-topk)")
        if self.speculative_eagle_topk > 1 and self.speculative_algorithm == "ngram":
            raise ValueError("speculative_eagle_topk > 1 branches a draft model's or an EAGLE-3 "
                             "head's steps: n-gram trees take --speculative-ngram-max-bfs-breadth")
        steps = self.speculative_num_steps
        if steps is not None and self.speculates:
            if steps > self.speculative_num_draft_tokens:
                raise ValueError(f"speculative_num_steps ({steps}) must be at most "
                                 "--speculative-num-draft-tokens "
                                 f"({self.speculative_num_draft_tokens}): a path of the tree is "
                                 "at most all of its nodes")
            if self.speculative_breadth == 1 and steps != self.speculative_num_draft_tokens:
                raise ValueError(f"speculative_num_steps ({steps}): a chain of drafts (no "
                                 "--speculative-eagle-topk or n-gram breadth above 1) drafts "
                                 "--speculative-num-draft-tokens "
                                 f"({self.speculative_num_draft_tokens}) steps deep; leave it "
                                 "out or make them equal")
        if ((self.speculative_algorithm in ("draft", "eagle3"))
                != (self.speculative_draft_model_path is not None)):
            raise ValueError("speculative_draft_model_path is needed by --speculative-algorithm "
                             "draft and eagle3, and only by them")
        if self.speculative_algorithm == "eagle3" and self.enable_hierarchical_cache:
            raise ValueError("enable_hierarchical_cache: --speculative-algorithm eagle3 reads the "
                             "target's hidden states kept beside its device KV, which the host "
                             "tier does not keep")
        if self.cache == "naive":
            if self.enable_hierarchical_cache:
                raise ValueError("enable_hierarchical_cache needs the radix cache (--cache radix)")
            if self.schedule_policy != "fcfs":
                raise ValueError(f"schedule_policy {self.schedule_policy} orders by the prefix "
                                 "cache: it needs --cache radix")

    @property
    def speculates(self) -> bool:
        return self.speculative_algorithm != "none"

    @property
    def speculative_breadth(self) -> int:
        """The most candidates a drafting request's tree branches into (1: a chain)."""
        return max(self.speculative_eagle_topk, self.speculative_ngram_max_bfs_breadth)

    @property
    def speculative_depth(self) -> int:
        """The most drafts on one path (the chain's length)."""
        return self.speculative_num_steps or self.speculative_num_draft_tokens

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
    host: str = option("127.0.0.1", "--host", help="address to listen on")
    port: int = option(8000, "--port", parse=int, check=within(1, 65535), help="port to listen on")
    served_model_name: str | None = option(None, "--served-model-name", default_text="--model",
                                           help="the model name clients use")
    num_tokenizer: int = option(0, "--num-tokenizer", parse=int, check=non_negative,
                                help="tokenizer processes (0: the detokenizer tokenizes too)")
    api_key: str | None = option(
        lambda: settings.API_KEY.get(), "--api-key", env=settings.API_KEY, default_text="none",
        help="require this bearer token (prefer the environment variable: a flag shows in `ps`)")
    shutdown_timeout: float = option(30.0, "--shutdown-timeout", parse=float, check=non_negative,
                                     help="seconds in-flight requests get to finish on SIGTERM")
    # a chat request without max_tokens: bounds its KV reservation
    default_max_tokens: int = option(
        2048, "--default-max-tokens", parse=int, check=positive,
        help="max_tokens of a chat request that gives none (capped to the context left)")
    metrics_without_key: bool = option(False, "--metrics-without-key", store=True, default_text="off",
                                       help="serve /metrics without the API key (for scrapers)")
    tool_call_parser: str = option(
        "auto", "--tool-call-parser", choices=TOOL_CALL_PARSERS,
        help="the model's tool-call format, parsed for tool_choice auto (auto: from its chat "
             "template)")
    reasoning_parser: str | None = option(
        None, "--reasoning-parser", choices=REASONING_PARSERS,
        help="return a reasoning model's <think> block as the message's reasoning_content, apart "
             "from content (qwen3: the model opens it; deepseek_r1: the prompt does)")
    chat_template: str | None = option(
        None, "--chat-template", check=_chat_template, metavar="FILE_OR_TEMPLATE",
        help="a Jinja chat template (a file, or the template itself) used in place of the "
             "checkpoint's, e.g. for a base model that has none")
    sampling_defaults: str = option(
        "model", "--sampling-defaults", choices=("model", "openai"),
        help="sampling fields a request leaves out: the model's generation_config.json values "
             "(model, as vLLM and SGLang) or OpenAI's defaults (openai)")
    # transport limits (docs/api.md)
    header_timeout: float = option(
        5.0, "--header-timeout", parse=float, check=positive,
        help="seconds a connection gets to send a request's whole header block, else it is closed")
    keep_alive_timeout: float = option(
        5.0, "--keep-alive-timeout", parse=float, check=positive,
        help="seconds an idle keep-alive connection is kept open between requests")
    max_request_body_bytes: int = option(
        32 << 20, "--max-request-body-bytes", parse=int, check=positive,
        help="a larger request body is refused with 413 (32 MiB holds a full 128k-token context "
             "as JSON many times)")
    body_timeout: float = option(
        30.0, "--body-timeout", parse=float, check=positive,
        help="seconds without a byte of a request body that is still arriving: 408")
    max_connections: int = option(1024, "--max-connections", parse=int, check=positive,
                                  help="connections and requests at once; past it a request gets 503")

    def __post_init__(self) -> None:
        check_options(self)


CONFIGS = (EngineConfig, SchedulerConfig, ServerConfig)  # every declared setting, in docs order


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """The engine's and the scheduler's flags, shared by every entry point."""
    add_options(p, EngineConfig)
    add_options(p, SchedulerConfig)


def configs_from_args(args: argparse.Namespace) -> tuple[EngineConfig, SchedulerConfig]:
    """The configs of the flags given (those left out take the declared defaults); ValueError
    naming the field of a refused value."""
    return (EngineConfig(**values_from_args(EngineConfig, args)),
            SchedulerConfig(**values_from_args(SchedulerConfig, args)))


def flags_markdown() -> str:
    """docs/configuration.md's tables of flags, from the declarations above."""
    return ("### Engine and scheduler: `serve`, `generate`, `shell`, `bench offline|latency`, "
            "`LLM(...)`\n\n" + markdown_table((EngineConfig, SchedulerConfig), "`LLM(...)` keyword")
            + "\n### Server: `serve` (`--chat-template` also `shell` and `LLM(chat_template=...)`)\n\n"
            + markdown_table((ServerConfig,), "`ServerConfig` field"))


if __name__ == "__main__":
    print(flags_markdown(), end="")
