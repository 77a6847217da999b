"""The build context's files, as the Dockerfile's build sees them through .dockerignore: the
cache key hashes exactly these, so a file the build reads must be in it and nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest
from scripts.images.context import context_files, with_dockerfile

from tests.deploy.support import REPO


def _tree(root: Path, files: list[str], ignore: str) -> None:
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    (root / ".dockerignore").write_text(ignore)


def test_allowlist_with_excluded_caches(tmp_path: Path) -> None:
    _tree(tmp_path, ["pyproject.toml", "src/a.py", "src/__pycache__/a.pyc", "src/deep/b.py",
                     "src/deep/__pycache__/b.pyc", "src/x.egg-info/PKG", "docs/d.md", "top.so",
                     "src/lib.so"],
          "**\n!pyproject.toml\n!src/\n**/__pycache__\n**/*.egg-info\n**/*.so\n")
    assert context_files(tmp_path) == ["pyproject.toml", "src/a.py", "src/deep/b.py"]


def test_denylist_and_reinclusion(tmp_path: Path) -> None:
    _tree(tmp_path, ["a.txt", "b.log", "logs/keep.log", "logs/x.log", "dir/sub/c.txt"],
          "# comment\n*.log\nlogs/*\n!logs/keep.log\ndir/sub\n")
    assert context_files(tmp_path) == [".dockerignore", "a.txt", "logs/keep.log"]


def test_matches_dockers_own_rules_on_this_repo() -> None:
    """Docker's Python SDK implements the same rules independently: both agree on the repo
    (it always sends the Dockerfile and .dockerignore, as the cache key hashes them too)."""
    build = pytest.importorskip("docker.utils.build", reason="the docker SDK is not installed")
    patterns = [ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines()
                if ln.strip() and not ln.startswith("#")]
    theirs = {p for p in build.exclude_paths(str(REPO), patterns) if (REPO / p).is_file()}
    ours = set(with_dockerfile(context_files(REPO)))
    assert ours == theirs, (sorted(ours - theirs)[:10], sorted(theirs - ours)[:10])
    assert "pyproject.toml" in ours and not any(p.startswith("tests/") for p in ours)
