"""An archive is rebuilt exactly when what goes into it changes."""

from __future__ import annotations

from pathlib import Path

from scripts.images.cachekey import files_digest, image_key


def _files(root: Path, contents: dict[str, str]) -> list[str]:
    for rel, text in contents.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return list(contents)


def test_files_digest_follows_content_names_and_membership(tmp_path: Path) -> None:
    files = _files(tmp_path, {"a.py": "x = 1\n", "pkg/b.py": "y = 2\n"})
    key = files_digest(tmp_path, files)
    assert files_digest(tmp_path, list(reversed(files))) == key, "order of the list is no input"
    (tmp_path / "a.py").write_text("x = 2\n")
    edited = files_digest(tmp_path, files)
    assert edited != key
    (tmp_path / "c.py").write_text("x = 2\n")
    assert files_digest(tmp_path, [*files, "c.py"]) != edited, "an added file counts"
    (tmp_path / "pkg/b.py").rename(tmp_path / "pkg/c.py")
    assert files_digest(tmp_path, ["a.py", "pkg/c.py"]) != edited, "a rename counts"


def test_files_digest_keeps_file_boundaries(tmp_path: Path) -> None:
    """Moving bytes from one file to the next is a change (lengths are part of the digest)."""
    _files(tmp_path, {"a": "ab", "b": "c"})
    one = files_digest(tmp_path, ["a", "b"])
    _files(tmp_path, {"a": "a", "b": "bc"})
    assert files_digest(tmp_path, ["a", "b"]) != one


def test_image_key_is_order_free_and_value_sensitive() -> None:
    parts = {"context": "c1", "base": "b1", "build-args": '{"A": "1"}'}
    key = image_key(parts)
    assert image_key(dict(reversed(list(parts.items())))) == key
    assert image_key({**parts, "build-args": '{"A": "2"}'}) != key
    assert image_key({**parts, "extra": ""}) != key
    assert image_key({"a": "b=c"}) != image_key({"a=b": "c"})
