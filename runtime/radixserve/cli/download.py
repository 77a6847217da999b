"""`radixserve download [MODEL] [--revision R] [--cache-dir DIR]`: put a model where `serve` will
find it, so that `serve` then starts without the network (`HF_HUB_OFFLINE=1`). The operator runs it
as the serving pod's init container, so the startup probe's window is spent loading, not downloading.

MODEL is resolved as `serve --model` resolves it: none (the embedded model, converted once into the
cache), a local directory (checked), or a Hugging Face hub id, fetched with `snapshot_download` into
the hub cache `serve` reads: `DIR/huggingface/hub` with `--cache-dir DIR` (the pods' layout:
`RADIXSERVE_CACHE_DIR=DIR`, `HF_HOME=DIR/huggingface`), else Hugging Face's own (`HF_HUB_CACHE`,
`HF_HOME`). Files already there are not fetched again. `HF_TOKEN` and `HF_ENDPOINT` are honoured.
The snapshot's directory is printed on stdout; progress goes to the log (lines, not a bar, when
stderr is not a terminal)."""
from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Self

from radixserve import settings
from radixserve.cli.preflight import UsageError, check_model
from radixserve.models.default_model import HUB_FILES

logger = logging.getLogger(__name__)

PROGRESS_EVERY_S = 10.0
REVISION_ENV = settings.MODEL_REVISION.name  # the operator sets it on both containers


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "download", help="fetch a model into the cache, so that `serve` starts without the network"
    )
    p.add_argument("model", nargs="?", default=None,
                   help="a Hugging Face hub id (org/name) or a local directory; none: the embedded model")
    p.add_argument("--revision", default=None,
                   help=f"hub branch, tag or commit (env {REVISION_ENV}; default: the repo's main branch)")
    p.add_argument("--cache-dir", default=None,
                   help="the cache serve reads with RADIXSERVE_CACHE_DIR=DIR and HF_HOME=DIR/huggingface "
                        "(default: RADIXSERVE_CACHE_DIR, and Hugging Face's own hub cache)")
    p.set_defaults(func=run)


def serve_hub_cache() -> Path:
    """The hub cache `serve` reads in this environment (Hugging Face's rule)."""
    env = os.environ
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def hub_cache_for(cache_dir: str | None) -> Path | None:
    """Where hub files go: `DIR/huggingface/hub` with `--cache-dir`, else None (Hugging Face's own).
    A Hugging Face variable that would send `serve` elsewhere is a mistake to say now, not a
    download that `serve` cannot find later."""
    if cache_dir is None:
        return None
    hub = Path(cache_dir).expanduser().absolute() / "huggingface" / "hub"
    named = [v for v in ("HF_HUB_CACHE", "HF_HOME") if os.environ.get(v)]
    if named and serve_hub_cache().absolute() != hub:
        raise UsageError(
            f"--cache-dir {cache_dir} puts hub files in {hub}, but {named[0]}={os.environ[named[0]]} "
            f"makes serve read {serve_hub_cache()}: set HF_HOME={hub.parent} (and unset HF_HUB_CACHE), "
            "or drop --cache-dir"
        )
    return hub


def run(args: argparse.Namespace) -> int:
    if args.cache_dir is not None:
        if not args.cache_dir:
            raise UsageError("--cache-dir must not be empty")
        os.environ[settings.CACHE_DIR.name] = args.cache_dir  # the embedded model converts there
    hub_cache = hub_cache_for(args.cache_dir)
    for name in ("httpx", "httpx2"):  # a line per HTTP request is noise in a pod's log
        logging.getLogger(name).setLevel(logging.WARNING)
    t0 = time.perf_counter()
    model = args.model
    if model is None or _is_local(model):
        if args.revision:
            raise UsageError(f"--revision {args.revision}: {model or 'the embedded model'} is not a hub model")
        path = _resolve_local(model)
    else:
        path = fetch(model, args.revision or settings.MODEL_REVISION.get(), hub_cache)
    files = [f for f in path.rglob("*") if f.is_file()]
    logger.info("download: %s ready in %.1fs: %d files, %s in %s", model or "the embedded model",
                time.perf_counter() - t0, len(files), _size(sum(f.stat().st_size for f in files)), path)
    if hub_cache is not None and not os.environ.get("HF_HOME"):
        logger.info("download: serve it without the network with RADIXSERVE_CACHE_DIR=%s HF_HOME=%s "
                    "HF_HUB_OFFLINE=1", args.cache_dir, hub_cache.parent)
    print(path, flush=True)
    return 0


def _is_local(model: str) -> bool:
    path = Path(model).expanduser()
    return path.exists() or model.startswith((".", "/", "~")) or model.count("/") > 1


def _resolve_local(model: str | None) -> Path:
    """The embedded model (converted once into the cache) or a local directory: no network."""
    from radixserve.cli.preflight import resolve_model

    try:
        check_model(model)
        return resolve_model(model)
    except UsageError as e:  # preflight speaks of serve's flag; here MODEL is an argument
        raise UsageError(str(e).removeprefix("--model ")) from None


def fetch(repo_id: str, revision: str | None, hub_cache: Path | None) -> Path:
    """`snapshot_download` of the files serve reads; every failure a user can act on is a one-line
    `UsageError` naming the endpoint, the repo and the revision."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    endpoint = constants.ENDPOINT
    where = hub_cache or Path(constants.HF_HUB_CACHE)
    at = f"{repo_id}@{revision or 'main'}"
    offline = constants.HF_HUB_OFFLINE
    logger.info("download: %s from %s into %s%s", at, endpoint, where,
                " (HF_HUB_OFFLINE: checking the cache only)" if offline else "")
    token_hint = "the token in HF_TOKEN has no access to it" if os.environ.get("HF_TOKEN") else "set HF_TOKEN"
    try:
        return Path(snapshot_download(
            repo_id, revision=revision, cache_dir=hub_cache, allow_patterns=HUB_FILES,
            tqdm_class=None if sys.stderr.isatty() else LogProgress,
        ))
    except HFValidationError:
        raise UsageError(f"{repo_id!r} is neither a local directory nor a valid Hugging Face id (org/name)") from None
    except GatedRepoError:
        raise UsageError(f"{repo_id} is gated on {endpoint}: accept its terms on the hub with an account "
                         f"whose token is in HF_TOKEN ({token_hint})") from None
    except RepositoryNotFoundError:
        raise UsageError(f"{repo_id}: no such model on {endpoint} (or a private one: {token_hint})") from None
    except RevisionNotFoundError:
        raise UsageError(f"{repo_id}: no revision {revision!r} on {endpoint}") from None
    except LocalEntryNotFoundError as e:  # the hub was not reachable and the cache has no full copy
        if offline:
            raise UsageError(f"{at}: HF_HUB_OFFLINE is set and {where} holds no complete copy") from None
        raise UsageError(f"{at}: cannot reach {endpoint} ({_cause(e)}) and {where} holds no complete copy; "
                         "check the network, proxy and HF_ENDPOINT") from None
    except HfHubHTTPError as e:
        status = getattr(getattr(e, "response", None), "status_code", "?")
        hint = f": {token_hint}" if status in (401, 403) else ""
        raise UsageError(f"{at}: {endpoint} answered HTTP {status}{hint}") from None
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise UsageError(f"{at}: no space left in {where}: give the model cache more room") from None
        if e.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
            raise UsageError(f"{at}: cannot write {where} ({e.strerror})") from None
        raise


def _cause(error: BaseException) -> str:
    """The innermost reason of a chained error, on one line."""
    while error.__cause__ is not None:
        error = error.__cause__
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


class LogProgress:
    """A tqdm look-alike that logs a line per bar at most every `PROGRESS_EVERY_S` and one when it
    closes, so a pod's log shows where a long download is without a stream of escape codes."""

    def __init__(self, iterable=None, desc: str | None = None, total: float | None = None,
                 initial: float = 0, unit: str = "it", **_: object) -> None:
        self.iterable, self.desc, self.total, self.n, self.unit = iterable, desc or "", total, initial, unit
        self._t0 = self._last = time.monotonic()
        self._closed = False
        self._mutex = threading.Lock()  # files download in threads, all updating one bar

    # -- the tqdm surface huggingface_hub uses
    def __iter__(self):
        for item in self.iterable or ():
            yield item
            self.update(1)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def update(self, n: float | None = 1) -> None:
        with self._mutex:
            self.n += n or 0
            now = time.monotonic()
            due = now - self._last >= PROGRESS_EVERY_S
            if due:
                self._last = now
        if due:
            self._log("")

    def close(self) -> None:
        if not self._closed and self.n:
            self._log(" (done)")
        self._closed = True

    def refresh(self, *_: object, **__: object) -> None:
        pass

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        self.desc = desc or ""

    set_description_str = set_description

    def set_postfix_str(self, *_: object, **__: object) -> None:
        pass

    @property
    def format_dict(self) -> dict[str, object]:
        elapsed = time.monotonic() - self._t0
        return {"n": self.n, "total": self.total, "elapsed": elapsed, "rate": self.n / elapsed if elapsed else None}

    def _log(self, suffix: str) -> None:
        # NOTE: huggingface_hub's network-bytes bar has an estimated total; the bytes-written bar
        # is the one that says how far along the model is.
        if self.desc.startswith("Downloading bytes"):
            return
        desc = self.desc.split(" (")[0] or "progress"
        rate = self.format_dict["rate"]
        if self.unit == "B":
            done = f"{_size(self.n)} of {_size(self.total)}" if self.total else _size(self.n)
            speed = f", {_size(rate)}/s" if rate else ""
        else:
            done, speed = (f"{int(self.n)}/{int(self.total)}" if self.total else f"{int(self.n)}"), ""
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        logger.info("download: %s: %s%s%s%s", desc, done, pct, speed, suffix)


def _size(n: float | None) -> str:
    n = float(n or 0)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"
