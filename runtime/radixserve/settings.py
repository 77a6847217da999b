"""Every `RADIXSERVE_*` environment variable, in one place, typed.

Each is read when asked (`SETTING.get()`), never at import: a test, the CLI or a parent process may
set it after this module is imported, and spawned children inherit the parent's environment. A bad
value raises ValueError naming the variable. `python -m radixserve.settings` prints the table that
docs/configuration.md carries (a test keeps the two equal).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class EnvSetting(Generic[T]):
    name: str
    default: T | None
    doc: str
    parse: Callable[[str], T]
    default_text: str = ""  # how the docs show the default, where `default` is computed

    def get(self) -> T | None:
        """The parsed value, or the default where the variable is unset or empty."""
        raw = os.environ.get(self.name, "").strip()
        if not raw:
            return self.default() if callable(self.default) else self.default
        try:
            return self.parse(raw)
        except ValueError as e:
            raise ValueError(f"{self.name} {e}, got {raw!r}") from None

    def is_set(self) -> bool:
        return bool(os.environ.get(self.name, "").strip())

    @property
    def choices(self) -> tuple[str, ...] | None:
        """The values a choice setting takes (its one list), or None."""
        return getattr(self.parse, "options", None)


def _seconds(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("must be a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise ValueError("must be a positive number of seconds")
    return value


def _non_negative(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("must be a number") from None
    if not 0 <= value < float("inf"):
        raise ValueError("must be a non-negative number")
    return value


def _mebibytes(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ValueError("must be a whole number of MiB") from None
    if value <= 0:
        raise ValueError("must be a positive number of MiB")
    return value


def _flag(raw: str) -> bool:
    low = raw.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError("must be 1/true/yes/on or 0/false/no/off")


class _Choice:
    """A parser for one of `options` (case-insensitive); its `options` are the choice list."""

    def __init__(self, *options: str) -> None:
        self.options = options

    def __call__(self, raw: str) -> str:
        low = raw.lower()
        if low not in self.options:
            raise ValueError(f"must be one of {', '.join(self.options)}")
        return low


def _text(raw: str) -> str:
    return raw


def _home_cache() -> Path:
    return Path.home() / ".cache" / "radixserve"


# --- serving ---
API_KEY: EnvSetting[str] = EnvSetting(
    "RADIXSERVE_API_KEY", None, "Bearer token the server requires (`--api-key`'s default; an "
    "environment variable does not show in `ps`).", _text, "none")
STARTUP_TIMEOUT: EnvSetting[float] = EnvSetting(
    "RADIXSERVE_STARTUP_TIMEOUT", 900.0, "Seconds the server waits for its processes (model load, "
    "KV sizing, graph capture) before it gives up; the operator sets it from the startup window.",
    _seconds)
HEARTBEAT_TIMEOUT_S: EnvSetting[float] = EnvSetting(
    "RADIXSERVE_HEARTBEAT_TIMEOUT_S", 5.0, "No scheduler heartbeat for this long: `/health` fails "
    "(the process is dead or frozen).", _seconds)
STUCK_STEP_S: EnvSetting[float] = EnvSetting(
    "RADIXSERVE_STUCK_STEP_S", 600.0, "One scheduler step running this long: `/health` fails "
    "(stuck); readiness stays up through shorter long steps.", _seconds)
DISABLE_OVERLAP: EnvSetting[bool] = EnvSetting(
    "RADIXSERVE_DISABLE_OVERLAP", False, "Turn overlap scheduling off (the default of "
    "`SchedulerConfig.overlap`; `--disable-overlap` does the same).", _flag, "off (overlap on)")
GRAMMAR_COMPILE_TIMEOUT_S: EnvSetting[float] = EnvSetting(
    "RADIXSERVE_GRAMMAR_COMPILE_TIMEOUT_S", 30.0, "Seconds one grammar (`response_format`, "
    "`regex`, `ebnf`, a forced tool call) may take to compile; past it the request gets a 400 "
    "naming this limit.", _seconds)
GRAMMAR_COMPILE_MEMORY_MB: EnvSetting[int] = EnvSetting(
    "RADIXSERVE_GRAMMAR_COMPILE_MEMORY_MB", 2048, "MiB of memory one grammar's compilation may "
    "use; a grammar that needs more gets a 400 naming this limit.", _mebibytes)
GRAMMAR_CACHE_MB: EnvSetting[int] = EnvSetting(
    "RADIXSERVE_GRAMMAR_CACHE_MB", 512, "MiB of compiled grammars the scheduler keeps for reuse "
    "(least recently used dropped first).", _mebibytes)
# --- model and memory ---
CACHE_DIR: EnvSetting[Path] = EnvSetting(
    "RADIXSERVE_CACHE_DIR", _home_cache, "Where converted models (the embedded GGUF) and bench "
    "presets are kept.", Path, "`~/.cache/radixserve`")
EMBEDDED_MODEL_DIR: EnvSetting[Path] = EnvSetting(
    "RADIXSERVE_EMBEDDED_MODEL_DIR", None, "The embedded model converted beforehand (the images "
    "convert it at build time); used when it holds config.json, else the model is converted into "
    "the cache dir on first use.", Path, "none")
MODEL_REVISION: EnvSetting[str] = EnvSetting(
    "RADIXSERVE_MODEL_REVISION", None, "Hugging Face revision (branch, tag or commit) of a hub "
    "model; the operator sets it on the download and serving containers.", _text, "the main branch")
CPU_KV_GIB: EnvSetting[float] = EnvSetting(
    "RADIXSERVE_CPU_KV_GIB", None, "KV-cache budget on CPU, in GiB, at most half the memory left "
    "(on GPUs it comes from free memory and `--memory-ratio`).", _non_negative,
    "what `--max-running-requests` x the context can use")
PDL: EnvSetting[bool] = EnvSetting(
    "RADIXSERVE_PDL", True, "Programmatic dependent launch of the decode-path Triton kernels on "
    "Hopper and later (the next kernel launches while one finishes); `0` turns it off.", _flag, "on")
# --- tensor parallelism ---
ALLREDUCE: EnvSetting[str] = EnvSetting(
    "RADIXSERVE_ALLREDUCE", "auto", "TP all-reduce: `auto` (symmetric-memory one-/two-shot over "
    "NVLink by size, NCCL above), `nccl`, `one_shot`, `two_shot`.",
    _Choice("auto", "nccl", "one_shot", "two_shot"))
TP_INIT_TIMEOUT_S: EnvSetting[float] = EnvSetting(
    "RADIXSERVE_TP_INIT_TIMEOUT_S", 600.0, "Seconds a tensor-parallel rank waits for the others to "
    "join the group.", _seconds)
# --- logging and debugging ---
LOG_FORMAT: EnvSetting[str] = EnvSetting(
    "RADIXSERVE_LOG_FORMAT", "plain", "`plain` or `json` (one JSON object per line); "
    "`--log-format` sets it for every process.", _Choice("plain", "json"))
LOG_LEVEL: EnvSetting[str] = EnvSetting(
    "RADIXSERVE_LOG_LEVEL", None, "DEBUG, INFO, WARNING, ERROR or CRITICAL for every process.",
    lambda raw: _Choice("debug", "info", "warning", "error", "critical")(raw).upper(), "INFO")
DEBUG: EnvSetting[bool] = EnvSetting(
    "RADIXSERVE_DEBUG", False, "Show tracebacks for user errors (as `--debug`).", _flag, "off")
STACK_DUMP_S: EnvSetting[float] = EnvSetting(
    "RADIXSERVE_STACK_DUMP_S", None, "Every process prints all its threads' Python stacks to "
    "stderr every N seconds (for a hang).", _seconds, "off")
# --- test hooks (the test suite sets them; never needed in production) ---
TP_FOLLOWER_DELAY_S: EnvSetting[float] = EnvSetting(
    "RADIXSERVE_TP_FOLLOWER_DELAY_S", 0.0, "Test hook: TP followers start this late.",
    _non_negative)
TP_FOLLOWER_FAIL: EnvSetting[str] = EnvSetting(
    "RADIXSERVE_TP_FOLLOWER_FAIL", None, "Test hook: TP followers fail at start with this message.",
    _text, "none")

ALL: tuple[EnvSetting, ...] = tuple(v for v in globals().values() if isinstance(v, EnvSetting))


def markdown_table() -> str:
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for s in ALL:
        default = s.default_text or f"`{s.default}`"
        rows.append(f"| `{s.name}` | {default} | {s.doc} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
