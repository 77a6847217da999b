"""docs/benchmarks.md is a reference of current figures, not a lab log: short, one table whose rows
each say what, the figure, its same-command baseline, the command, the hardware and the date, no
before/after figures or abandoned attempts (git keeps those); its commands run on today's CLI, and
README's Performance paragraph quotes it faithfully."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.doc_commands import bad_commands

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks.md"
MAX_LINES = 300
# "X -> Y" / "X → Y" between figures, and the words of a diary
LAB_LOG = {
    "an arrow (before -> after)": re.compile(r"->|→"),
    "an abandoned attempt": re.compile(r"\btried\b", re.IGNORECASE),
    "an earlier build": re.compile(r"\b(?:the build before|previous build|older build|went from)\b",
                                   re.IGNORECASE),
}
COLUMNS = ["#", "what", "figure", "baseline, same command", "bound", "command", "hardware", "date"]
# README's Performance paragraph -> the figure in benchmarks.md it rounds
README_QUOTES = {
    "27,595 output tokens/s": "**27,594.7**",
    "45× slower": "**45.2×**",
    "0.81 ms": "**0.812**",
    "32,967 output tokens/s": "**32,967**",
    "ITL p99 is 51 ms": "**51 ms**",
    "against 205 ms without": "205 ms without mixed batches",
    "overlap scheduling +17%": "overlap +17.1%",
    "CUDA graphs +259%": "(+259.1%)",
}


def lab_log(text: str) -> list[str]:
    return [f"{n}: {kind}: {line.strip()[:100]}" for n, line in enumerate(text.splitlines(), 1)
            for kind, pattern in LAB_LOG.items() if pattern.search(line)]


def table_rows(text: str) -> list[dict[str, str]]:
    """The rows of the table under "## Current figures", by column name."""
    section = text.split("## Current figures", 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == COLUMNS, header
    return [dict(zip(header, (c.strip() for c in ln.strip("|").split("|")), strict=True))
            for ln in lines[2:]]


def test_a_reference_not_a_lab_log() -> None:
    text = DOC.read_text()
    assert len(text.splitlines()) <= MAX_LINES, f"{DOC.name}: over {MAX_LINES} lines"
    hits = lab_log(text)
    assert not hits, "superseded figures and experiments live in git history:\n" + "\n".join(hits)


@pytest.mark.parametrize("line", [
    "| 14 | 8B, batch 1 | 3.467 | the build before, same call: FP8 3.645 | H100 |",
    "The 8B step went 3.645 → 3.467 ms on the H100",
    "batch 1 1.175 -> 1.020 ms",
    "Tried and slower at one row: widening e4m3",
])
def test_lab_log_phrasing_is_caught(line: str) -> None:
    assert lab_log(line), line


@pytest.mark.parametrize("line", [
    "| 4 | decode step, batch 1 / 64 / 256, ms | **0.812** / 2.909 / 6.059 | 0.822 | H200 |",
    "a batch-64 step takes 2.903 ms against 2.971",
    "`tl.range(..., num_stages=)`",
])
def test_reference_phrasing_passes(line: str) -> None:
    assert not lab_log(line), line


def test_every_row_says_figure_baseline_command_hardware_and_date() -> None:
    rows = table_rows(DOC.read_text())
    assert [r["#"] for r in rows] == [str(i) for i in range(1, len(rows) + 1)], "rows numbered 1..N"
    for r in rows:
        for col in ("what", "figure", "baseline, same command", "command", "hardware"):
            assert r[col], f"row {r['#']}: no {col}"
        assert re.fullmatch(r"20\d\d-\d\d-\d\d", r["date"]), f"row {r['#']}: date {r['date']!r}"


def test_commands_parse_with_the_cli() -> None:
    bad = bad_commands(DOC)
    assert not bad, "commands the CLI refuses:\n" + "\n".join(bad)


def test_readme_quotes_the_current_figures() -> None:
    readme = (ROOT / "README.md").read_text()
    perf = readme.split("## Performance", 1)[1].split("\n## ", 1)[0]
    perf = " ".join(perf.split())
    doc = DOC.read_text()
    for quote, figure in README_QUOTES.items():
        assert quote in perf, f"README's Performance paragraph no longer says {quote!r}"
        assert figure in doc, f"benchmarks.md no longer has {figure!r} (README quotes it)"
