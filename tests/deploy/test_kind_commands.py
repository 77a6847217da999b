"""How the kind suite builds and loads its images (no Docker needed): attestation-free builds, and
`docker save` + `kind load image-archive`, since `kind load docker-image` fails on images that
Docker >= 29 builds with attestations (kind#3795). Here, not in tests/e2e, whose tests all skip
without Docker and kind."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.kind_cluster import KindCluster, build_command, load_commands


def test_build_has_no_provenance_attestation() -> None:
    cmd = build_command(Path("/repo"), "runtime-cpu", "ghcr.io/radixserve/radixserve:0.1.0-cpu")
    assert cmd[:2] == ["docker", "build"] and "--provenance=false" in cmd
    assert cmd[cmd.index("--target") + 1] == "runtime-cpu"
    assert cmd[cmd.index("--tag") + 1] == "ghcr.io/radixserve/radixserve:0.1.0-cpu"
    assert cmd[-1] == "/repo"


def test_load_saves_an_archive_then_loads_it() -> None:
    archive = Path("/tmp/x/radixserve_0.1.0-cpu.tar")
    save, load = load_commands("ghcr.io/radixserve/radixserve:0.1.0-cpu", "e2e", archive)
    assert save == ["docker", "save", "--output", str(archive),
                    "ghcr.io/radixserve/radixserve:0.1.0-cpu"]
    assert load == ["kind", "load", "image-archive", str(archive), "--name", "e2e"]
    assert "docker-image" not in load


def test_load_image_runs_both_and_removes_the_archive(monkeypatch, tmp_path: Path) -> None:
    from tests.e2e import kind_cluster

    ran: list[list[str]] = []

    def fake_run(cmd: list[str], *, timeout: float, **_: object) -> str:
        ran.append(cmd)
        if cmd[:2] == ["docker", "save"]:
            Path(cmd[3]).write_bytes(b"tar")
        return ""

    monkeypatch.setattr(kind_cluster, "run", fake_run)
    KindCluster("e2e", tmp_path / "kubeconfig").load_image("example/op:1", tmp_path)
    assert [c[:3] for c in ran] == [["docker", "save", "--output"], ["kind", "load", "image-archive"]]
    assert ran[0][3] == ran[1][3] and not Path(ran[0][3]).exists()
