"""Docs, comments, docstrings and test names describe the project as it is: no narration of how
the work went (work periods, tracker numbers, commit hashes, clock times of runs, dates of
changes). git keeps the past; a reader needs the present and its reasons."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TREES = ("docs", "runtime", "kernels", "operator", "tests", "scripts", "charts", "manifests", ".ci")
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".sh", ".toml", ".txt", ".jinja"}
SELF = Path(__file__).resolve()

# Each pattern names a kind of narration; each is chosen to miss the legitimate uses around it
# (a pytest fixture's scope="session", a `session.prompt(...)` variable, "TZ": "UTC" in a pod,
# a "2026-01-01T00:00:00Z" timestamp in a status fixture).
PATTERNS = {
    "work period": re.compile(
        r"(?<![\"'\w.])sessions?\b(?!\s*=[^=]|\.\w|\(|\[|\"|:\s*[A-Z]\w*\s*=)", re.IGNORECASE),
    "tracker number": re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE),
    "commit hash": re.compile(
        r"(?:\bcommits?\s+|`)(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b`?"),
    "clock time of a run": re.compile(r"\b\d{1,2}:\d{2}(?:\s*[–-]\s*\d{1,2}:\d{2})?\s+UTC\b"),
    "date of a change": re.compile(r"\b(?:since|until|as of|before|after)\s+20\d\d-\d\d-\d\d\b",
                                   re.IGNORECASE),
    "abandoned attempt": re.compile(r"\btried and (?:dropped|not kept)\b", re.IGNORECASE),
}


def narration(text: str) -> list[tuple[int, str, str]]:
    """(line number, kind, the line) for every narration pattern found in `text`."""
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        for kind, pattern in PATTERNS.items():
            if pattern.search(line):
                found.append((n, kind, line.strip()))
    return found


def _files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "Makefile", ROOT / "Dockerfile"]
    for tree in TREES:
        files += [p for p in (ROOT / tree).rglob("*")
                  if p.is_file() and p.suffix in SUFFIXES and p.resolve() != SELF
                  and "__pycache__" not in p.parts]
    return sorted(files)


def test_no_narration_of_past_work() -> None:
    hits = [f"{p.relative_to(ROOT)}:{n}: {kind}: {line[:120]}"
            for p in _files() for n, kind, line in narration(p.read_text(errors="replace"))]
    assert not hits, "narration of past work (say it in the present, or leave it to git):\n" + \
        "\n".join(hits)


def _ids(lines: list[str]) -> list[str]:
    return [f"line{i}" for i in range(len(lines))]  # the lines themselves would be narration


CAUGHT = [
    "as measured in the tenth session (docs/benchmarks.md)",
    "the session's device time was spent",
    "Schemathesis against the spec (issue 19): a bounded run",
    "run against `8deb990` in the same call",
    "a copy of commit 5e9ceb4's runtime",
    "one call, 14:32–14:36 UTC",
    "at 06:28 UTC",
    "# the default since 2026-12-01; kept for old commands",
    "Split-K, tried and dropped",
]


@pytest.mark.parametrize("line", CAUGHT, ids=_ids(CAUGHT))
def test_narration_is_caught(line: str) -> None:
    assert narration(line), line


PASSED = [
    '@pytest.fixture(scope="session")',
    "    session: PromptSession = PromptSession()",
    '            line = session.prompt("you> ").strip()',
    '"env": [{"name": "TZ", "value": "UTC"}],',
    'now="2026-01-01T00:00:00Z"',
    "| 2 | offline, FP8 KV cache | 32,967 | bf16 cache | H200 | 2026-12-02 |",
    '"rope_theta": 1000000.0,',
    "`radixserve bench offline --repeat 3`",
    "expected e.g. 14800000000 or 14.8B",
]


@pytest.mark.parametrize("line", PASSED, ids=_ids(PASSED))
def test_present_tense_and_code_pass(line: str) -> None:
    assert not narration(line), line
