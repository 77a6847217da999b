"""One log format for every radixserve process: plain lines by default, JSON lines with
`RADIXSERVE_LOG_FORMAT=json` (`--log-format json`) for log pipelines. Every line names its process
(`server`, `scheduler`, `detokenizer`, `tp1`, …) and, while a request is being served, its request
id. The parent sets the format in its environment, so spawned children log alike."""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import logging
import os
import sys
import time
from contextvars import ContextVar
from typing import Any

from radixserve import settings

FORMAT_ENV = settings.LOG_FORMAT.name
FORMATS = settings.LOG_FORMAT.choices

# The id of the HTTP request being served in this context (set by the access-log middleware).
request_id: ContextVar[str | None] = ContextVar("radixserve_request_id", default=None)


class _Context(logging.Filter):
    """Stamps every record with the process name and the current request id."""

    def __init__(self, process: str) -> None:
        super().__init__()
        self.process = process

    def filter(self, record: logging.LogRecord) -> bool:
        record.rs_process = self.process
        if getattr(record, "request_id", None) is None:
            record.request_id = request_id.get()
        return True


def _timestamp(record: logging.LogRecord) -> str:
    ms = int(record.msecs)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(record.created)) + f".{ms:03d}"


def _plain(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, str) and (not value or any(c in value for c in ' "=')):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


class PlainFormatter(logging.Formatter):
    """`TIME LEVEL [process] logger: message key=value… request_id=ID`. Structured records pass
    `extra={"fields": {...}}` (shown as key=value) and `message_fields` (already in the message)."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname} [{record.rs_process}] {record.name}: {record.getMessage()}"
        for key, value in (getattr(record, "fields", None) or {}).items():
            line += f" {key}={_plain(value)}"
        if record.request_id:
            line += f" request_id={record.request_id}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line; `message_fields` and `fields` given as `extra` become top-level keys."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": _timestamp(record), "level": record.levelname, "process": record.rs_process,
               "pid": record.process, "logger": record.name, "message": record.getMessage()}
        out |= (getattr(record, "message_fields", None) or {}) | (getattr(record, "fields", None) or {})
        if record.request_id:
            out["request_id"] = record.request_id
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def log_format() -> str:
    return settings.LOG_FORMAT.get()


def log_level(default: str = "INFO") -> str:
    return settings.LOG_LEVEL.get() or default.upper()


def setup_logging(process: str, default_level: str = "INFO") -> None:
    """Route every logger of this process (uvicorn's included) to stderr in the chosen format, at
    `RADIXSERVE_LOG_LEVEL` (else `default_level`). Raises ValueError for a bad format or level."""
    fmt, level = log_format(), log_level(default_level)
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_Context(process))
    handler.setFormatter(JsonFormatter() if fmt == "json" else PlainFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
    _route_transformers()
    if not sys.stderr.isatty():
        quiet_progress_bars()


_HF_LOGGING = "transformers.utils.logging"


def _route_transformers() -> None:
    """transformers logs through a handler of its own, in its own format: send its records here,
    now if it is imported, else as it is imported (importing it only for this would cost a
    command-line mistake seconds)."""
    module = sys.modules.get(_HF_LOGGING)  # the module that transformers' logging lives in
    if module is not None:
        _route(module)
    elif not any(isinstance(f, _RouteOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RouteOnImport())


def _route(hf_logging: Any) -> None:
    hf_logging.disable_default_handler()
    hf_logging.enable_propagation()
    if os.environ.get("TQDM_DISABLE") == "1":
        hf_logging.disable_progress_bar()


class _RouteOnImport(importlib.abc.MetaPathFinder):
    """Finds transformers' logging module as the path finder does, and routes it once run."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != _HF_LOGGING:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def run_and_route(module: Any) -> None:
            run(module)
            _route(module)

        spec.loader.exec_module = run_and_route  # type: ignore[method-assign]
        return spec


def quiet_progress_bars() -> None:
    """NOTE: a progress bar written to a file or a pipe is a stream of escape codes; the phases are
    logged as lines instead (with their time). The variables reach spawned children too; a library
    imported already is told directly."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")
    if "huggingface_hub" in sys.modules:
        sys.modules["huggingface_hub"].utils.disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
