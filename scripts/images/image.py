"""Build one image: base, wheelhouse, `buildah bud`, then a docker-archive under archives/,
skipped when the archive's key (Dockerfile, context, base recipe, locks, build args) is
unchanged."""

from __future__ import annotations

import contextlib
import fcntl
import json
import time
from collections.abc import Iterator
from pathlib import Path

from . import buildah
from .base import ensure_base
from .cachekey import files_digest, image_key
from .context import context_files, with_dockerfile
from .paths import REPO, archives_dir, cache_root, logs_dir, wheelhouse
from .progress import fmt, log, run_logged
from .prune import prune_after_build
from .specs import BASE_TAG, IMAGES, ImageSpec
from .tools import ensure_tools
from .wheelhouse import fill, locks_digest, stage_config


def build_args(spec: ImageSpec, pip_config: str) -> dict[str, str]:
    return {"PYTHON_IMAGE": BASE_TAG, "PIP_CONFIG_FILE": pip_config, **spec.build_args}


def archive_key(spec: ImageSpec, base_key: str, args: dict[str, str], repo: Path = REPO) -> str:
    return image_key({
        "context": files_digest(repo, with_dockerfile(context_files(repo))),
        "base": base_key,
        "locks": locks_digest(spec.locks),
        "target": spec.target,
        "tag": spec.tag,
        "build-args": json.dumps(args, sort_keys=True),
    })


def archive_path(name: str) -> Path:
    return archives_dir() / f"{name}.tar"


def is_current(archive: Path, key: str) -> bool:
    stamp = archive.with_suffix(".key")
    return archive.is_file() and stamp.is_file() and stamp.read_text() == key


@contextlib.contextmanager
def _exclusive() -> Iterator[None]:
    """One build at a time across processes (a test and `make images` may both ask): they share
    the base, the wheelhouse and each archive's `.part` file."""
    lock = cache_root() / ".build.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log("another build holds the images' cache; waiting for it")
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def build(name: str, force: bool = False) -> Path:
    """The archive of image `name` (a key of specs.IMAGES), built if its inputs changed."""
    if name not in IMAGES:
        raise KeyError(f"no image {name!r}; choose from {', '.join(IMAGES)}")
    with _exclusive():
        return _build(IMAGES[name], force)


def _build(spec: ImageSpec, force: bool) -> Path:
    name = spec.name
    t0 = time.monotonic()
    ensure_tools()
    base_key = ensure_base()
    fill(spec.locks)
    args = build_args(spec, stage_config(spec))
    key = archive_key(spec, base_key, args)
    archive = archive_path(name)
    if not force and is_current(archive, key):
        log(f"{name}: archive current ({archive})")
        return archive
    bud_log = logs_dir() / f"bud-{name}.log"
    log(f"{name}: buildah bud --target {spec.target} (log: {bud_log})")
    run_logged(buildah.bud_command(REPO, spec.target, spec.tag, wheelhouse(), args),
               bud_log, f"{name} build")
    prune_after_build(name, bud_log)
    archive.parent.mkdir(parents=True, exist_ok=True)
    part = archive.with_suffix(".tar.part")
    part.unlink(missing_ok=True)
    archive.unlink(missing_ok=True)  # stale: not kept beside its replacement (GBs at once)
    run_logged(buildah.push_command(spec.tag, part), logs_dir() / f"push-{name}.log",
               f"{name} archive")
    part.rename(archive)
    archive.with_suffix(".key").write_text(key)
    size = archive.stat().st_size / 2**30
    log(f"{name}: {archive} ({size:.2f} GiB) in {fmt(time.monotonic() - t0)}")
    return archive


def archives() -> dict[str, Path]:
    """The archives that exist now, by image name (whether current or not)."""
    return {name: archive_path(name) for name in IMAGES if archive_path(name).is_file()}
