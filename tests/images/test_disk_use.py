"""The disk the images and the node share: after each build, the dangling images that no target's
latest build named are removed (a stand-in `buildah` on PATH lists them and records what is
removed): an old build's leftovers go, the layers any target's last build committed or took from
the cache stay. The node's containerd drops the ID-only records of images no tag uses. An import
that could take the node below the kubelet's eviction margin is named before it runs."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from scripts.images import prune

CPU_LOG = """\
STEP 1/5: FROM localhost/radixserve-python:3.11-bookworm AS cpu-builder
--> Using cache 7aea241322d4adeddc08d28b04a0dd1a47ad6233f56a802df296858ea1125e8d
--> 7aea241322d
STEP 2/5: RUN pip install --no-index /wheelhouse/*.whl
Successfully installed torch-2.13.0
--> 6351124b2ce
[2/2] STEP 4/14: COPY --from=cpu-builder /opt/venv /opt/venv
--> 067196aa34f
Successfully tagged localhost/radixserve-cpu:dev
067196aa34f84d2b0a6b8c1e0d4c5b6a7f8e9d0c1b2a3f4e5d6c7b8a9f0e1d2c
"""


def test_a_log_names_the_layers_it_committed_and_reused() -> None:
    assert prune.used_ids(CPU_LOG) == {
        "7aea241322d4adeddc08d28b04a0dd1a47ad6233f56a802df296858ea1125e8d", "7aea241322d",
        "6351124b2ce", "067196aa34f"}


def test_stale_images_are_those_no_kept_id_names() -> None:
    kept = {"6351124b2ce", "7aea241322d4adeddc08d28b04a0dd1a47ad6233f56a802df296858ea1125e8d"}
    full = "7aea241322d4adeddc08d28b04a0dd1a47ad6233f56a802df296858ea1125e8d"
    dangling = ["sha256:6351124b2ce" + "0" * 53, full, "sha256:ebbb9b842bc1" + "1" * 52]
    assert prune.stale(dangling, kept) == ["ebbb9b842bc1" + "1" * 52]


@pytest.fixture
def fake_buildah(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `buildah` that lists the dangling IDs in dangling.txt and appends each `rmi` to rmi.txt."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "buildah"
    script.write_text(f"""#!/bin/sh
case "$1" in
  images) cat {tmp_path / 'dangling.txt'} ;;
  rmi) echo "$2" >> {tmp_path / 'rmi.txt'} ;;
esac
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("RADIXSERVE_IMAGES_CACHE", str(tmp_path / "cache"))
    return tmp_path


def test_a_build_removes_old_leftovers_and_keeps_every_targets_cache(fake_buildah: Path) -> None:
    old_cpu, operator_cache = "ebbb9b842bc1" + "1" * 52, "3b1586eb5a94" + "2" * 52
    cpu_cache = "6351124b2ce" + "0" * 53
    listed = fake_buildah / "dangling.txt"
    listed.write_text(f"sha256:{cpu_cache}\nsha256:{operator_cache}\n")
    op_log = fake_buildah / "bud-op.log"
    op_log.write_text("--> Using cache 3b1586eb5a94\n--> 3b1586eb5a94\n")
    cpu_log = fake_buildah / "bud-cpu.log"
    cpu_log.write_text(CPU_LOG)
    prune.prune_after_build("radixserve-cpu", cpu_log)
    prune.prune_after_build("radixserve-operator", op_log)
    # the first build of all could not tell the operator's layers from leftovers
    assert (fake_buildah / "rmi.txt").read_text().split() == [operator_cache]
    (fake_buildah / "rmi.txt").unlink()
    # from then on: a CPU rebuild's old image goes, both targets' caches stay
    listed.write_text(f"sha256:{old_cpu}\nsha256:{cpu_cache}\nsha256:{operator_cache}\n")
    prune.prune_after_build("radixserve-cpu", cpu_log)
    assert (fake_buildah / "rmi.txt").read_text().split() == [old_cpu]


def test_a_log_that_names_nothing_removes_nothing(fake_buildah: Path) -> None:
    (fake_buildah / "dangling.txt").write_text("sha256:" + "1" * 64 + "\n")
    empty = fake_buildah / "bud.log"
    empty.write_text("STEP 1/1: FROM scratch\n")
    prune.prune_after_build("radixserve-cpu", empty)
    assert not (fake_buildah / "rmi.txt").exists()


@pytest.mark.parametrize("free_gb,warned", [(40, False), (13.5, True)])
def test_an_import_that_could_run_the_node_short_of_disk_is_named(tmp_path: Path, monkeypatch,
                                                                  free_gb: float,
                                                                  warned: bool) -> None:
    """A 5.66 GB archive on a 252 GB disk needs 11.3 GB for the import and 2.5 GB of the
    kubelet's margin: 13.5 GB free is short of it, 40 GB is not."""
    import shutil

    from scripts.cluster import deploy

    monkeypatch.setattr(shutil, "disk_usage",
                        lambda p: shutil._ntuple_diskusage(252e9, 252e9 - free_gb * 1e9,
                                                           free_gb * 1e9))
    note = deploy.disk_shortfall(tmp_path / "images", int(5.66e9))
    assert (note is not None) == warned
    if warned:
        assert "13.5 GB free" in note and "11.3 GB" in note and "2.5 GB free" in note


LISTING = """\
REF                                          TYPE                                                 DIGEST            SIZE      PLATFORMS   LABELS
ghcr.io/radixserve/radixserve:0.1.0-cpu      application/vnd.docker.distribution.manifest.v2+json sha256:m-new-cpu  5.7 GiB   linux/amd64 -
localhost/radixserve-cpu:dev                 application/vnd.docker.distribution.manifest.v2+json sha256:m-new-cpu  5.7 GiB   linux/amd64 -
localhost/radixserve-pause:3.10              application/vnd.oci.image.index.v1+json              sha256:i-pause    1.4 MiB   linux/amd64 -
sha256:c-new-cpu                             application/vnd.docker.distribution.manifest.v2+json sha256:m-new-cpu  5.7 GiB   linux/amd64 io.cri-containerd.image=managed
sha256:c-old-cpu                             application/vnd.docker.distribution.manifest.v2+json sha256:m-old-cpu  5.7 GiB   linux/amd64 io.cri-containerd.image=managed
sha256:c-pause                               application/vnd.oci.image.index.v1+json              sha256:i-pause    1.4 MiB   linux/amd64 io.cri-containerd.image=managed
"""
BLOBS = {"sha256:m-new-cpu": {"config": {"digest": "sha256:c-new-cpu"}},
         "sha256:m-old-cpu": {"config": {"digest": "sha256:c-old-cpu"}},
         "sha256:i-pause": {"manifests": [{"digest": "sha256:m-pause"}]},
         "sha256:m-pause": {"config": {"digest": "sha256:c-pause"}}}


def test_the_node_drops_the_id_records_no_tag_uses() -> None:
    """CRI's `sha256:<id>` record of a rebuilt image's predecessor kept its 11 GB alive; the
    records of tagged images (an index's manifest included) stay; an unreadable blob removes
    nothing."""
    import json
    import subprocess

    from scripts.cluster import node_image_ids

    removed: list[str] = []
    blobs = dict(BLOBS)

    def ctr(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        if args[:2] == ("images", "ls"):
            return subprocess.CompletedProcess(args, 0, LISTING, "")
        if args[:2] == ("content", "get"):
            blob = blobs.get(args[2])
            return subprocess.CompletedProcess(args, 0 if blob else 1, json.dumps(blob), "")
        removed.append(args[-1])
        return subprocess.CompletedProcess(args, 0, "", "")

    assert node_image_ids.drop_stale_ids(ctr) == ["sha256:c-old-cpu"] == removed
    removed.clear()
    del blobs["sha256:m-pause"]
    assert node_image_ids.drop_stale_ids(ctr) == [] == removed
