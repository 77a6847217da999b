"""The base image, made here from Debian packages: mmdebstrap writes a rootfs tarball, buildah
turns it into an image tagged BASE_TAG. Both are kept, keyed by the recipe; a changed recipe
(packages, suite, mirrors, options) makes a new one, an unchanged one is never rebuilt."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from .cachekey import image_key
from .paths import base_dir, logs_dir
from .progress import ImageBuildError, log, run_logged
from .specs import BASE_MIRRORS, BASE_PACKAGES, BASE_SUITE, BASE_TAG

KEY_LABEL = "dev.radixserve.base-recipe"
ENV = (
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG=C.UTF-8",
)
# NOTE: no apt lists in the image, docs and man pages left out: the final stages' `apt-get
# install tini` finds tini already installed (from dpkg's status) with no index to download.
_SLIM = (
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-include=/usr/share/doc/*/copyright",
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
    "--customize-hook=rm -rf \"$1\"/var/lib/apt/lists/* \"$1\"/var/cache/apt/*.bin",
)


def mmdebstrap_command(out_tar: Path) -> list[str]:
    return [
        "mmdebstrap", "--variant=minbase", "--mode=root", "--format=tar",
        "--include=" + ",".join(BASE_PACKAGES), *_SLIM, BASE_SUITE, str(out_tar), *BASE_MIRRORS,
    ]


def recipe_key() -> str:
    """The key of everything that shapes the base: the mmdebstrap command and the image config."""
    return image_key({"mmdebstrap": json.dumps(mmdebstrap_command(Path("OUT"))),
                      "env": json.dumps(ENV), "tag": BASE_TAG})


def image_label(image: str, label: str) -> str | None:
    proc = subprocess.run(["buildah", "inspect", "--type", "image", image],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return None
    labels = json.loads(proc.stdout).get("OCIv1", {}).get("config", {}).get("Labels") or {}
    return labels.get(label)


def _rootfs(key: str) -> Path:
    tar = base_dir() / f"rootfs-{key[:16]}.tar"
    if tar.exists():
        log(f"base: rootfs cached ({tar})")
        return tar
    tar.parent.mkdir(parents=True, exist_ok=True)
    for old in tar.parent.glob("rootfs-*.tar*"):  # an older recipe's rootfs is not needed again
        old.unlink()
    part = tar.with_suffix(".tar.part")
    log(f"base: mmdebstrap {BASE_SUITE} with {', '.join(BASE_PACKAGES)}")
    run_logged(mmdebstrap_command(part), logs_dir() / "base-mmdebstrap.log", "base rootfs")
    part.rename(tar)
    return tar


def _buildah(*args: str) -> str:
    proc = subprocess.run(["buildah", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ImageBuildError(f"buildah {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def ensure_base() -> str:
    """BASE_TAG in buildah's storage, made from the current recipe; returns the recipe key."""
    key = recipe_key()
    if image_label(BASE_TAG, KEY_LABEL) == key:
        log(f"base: {BASE_TAG} cached")
        return key
    tar = _rootfs(key)
    ctr = _buildah("from", "scratch")
    try:
        _buildah("add", ctr, str(tar), "/")
        config = [arg for e in ENV for arg in ("--env", e)]
        _buildah("config", *config, "--cmd", "python3", "--label", f"{KEY_LABEL}={key}", ctr)
        _buildah("commit", "--quiet", "--rm", ctr, BASE_TAG)
    except ImageBuildError:
        subprocess.run(["buildah", "rm", ctr], capture_output=True, check=False)
        raise
    log(f"base: {BASE_TAG} imported from {tar.name}")
    return key
