"""The files a build context sends, by the repo's .dockerignore (Docker's matching rules:
the last pattern that matches a path or one of its parent folders decides; `!` re-includes)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    pattern = pattern.strip().strip("/")
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


def parse_ignore(text: str) -> list[tuple[bool, re.Pattern[str]]]:
    """(excludes, regex) per pattern line; comments and blank lines dropped."""
    rules = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        rules.append((not negate, _pattern_regex(line.lstrip("!"))))
    return rules


def is_excluded(rel: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    parts = rel.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    excluded = False
    for excludes, regex in rules:
        if any(regex.match(p) for p in prefixes):
            excluded = excludes
    return excluded


def context_files(root: Path, ignore_text: str | None = None) -> list[str]:
    """Paths (relative, '/'-separated, sorted) of the regular files the context sends."""
    if ignore_text is None:
        ignore = root / ".dockerignore"
        ignore_text = ignore.read_text() if ignore.exists() else ""
    rules = parse_ignore(ignore_text)
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in filenames:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if os.path.isfile(os.path.join(dirpath, name)) and not is_excluded(rel, rules):
                found.append(rel)
    return sorted(found)


def with_dockerfile(files: Iterable[str]) -> list[str]:
    return sorted({*files, "Dockerfile", ".dockerignore"})
