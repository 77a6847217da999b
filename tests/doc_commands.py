"""The commands a Markdown document shows, read as a shell would, and checked against the real CLI:
every `radixserve ...` line parses with radixserve's own argparse parser, and so do the arguments
that a `docker run` or `kubectl run` of the runtime image hands its entrypoint
(`tini -- radixserve`)."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

from radixserve_operator.builders import IMAGE_ENTRYPOINT

ROOT = Path(__file__).resolve().parents[1]
RUNTIME_IMAGE = "ghcr.io/radixserve/radixserve:"  # the runtime images (not -operator, -router)
SEPARATORS = {"&&", "||", ";", "|", "&"}
FENCE = re.compile(r"^```(?:bash|sh|shell)\n(.*?)^```", re.MULTILINE | re.DOTALL)
SPAN = re.compile(r"`([^`\n]+(?:\n[^`\n]+)?)`")  # an inline code span, perhaps over one line break


def fenced_commands(text: str) -> list[list[str]]:
    """Each simple command of the document's shell blocks, as argv (continuations joined,
    comments dropped, split at `&&`, `;`, `|`, `&`; leading VAR=value assignments dropped)."""
    commands = []
    for block in FENCE.findall(text):
        pending = ""
        for line in block.replace("\\\n", " ").splitlines():
            pending += line + "\n"
            try:  # a quoted argument may run over several lines
                argv = shlex.split(pending, comments=True)
            except ValueError:
                continue
            commands += _split(argv)
            pending = ""
        assert not pending.strip(), f"unclosed quote in a shell block: {pending[:80]}"
    return commands


def span_commands(text: str) -> list[list[str]]:
    """Inline code spans that are whole command lines: a program and at least one `--flag`,
    and no usage syntax (`[OPTIONAL]`, `a|b`, `...`)."""
    commands = []
    for span in SPAN.findall(text):
        span = " ".join(span.split())
        if not re.search(r"(^|\s)--[a-z]", span) or re.search(r"\[|\||\.\.\.|…", span):
            continue
        try:
            commands += _split(shlex.split(span))
        except ValueError:
            continue
    return commands


def _split(argv: list[str]) -> list[list[str]]:
    out, cur = [], []
    for tok in argv:
        if tok in SEPARATORS:
            out.append(cur)
            cur = []
        else:
            cur.append(tok)
    out.append(cur)
    return [_drop_assignments(c) for c in out if c]


def _drop_assignments(argv: list[str]) -> list[str]:
    i = 0
    while i < len(argv) and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", argv[i]):
        i += 1
    return argv[i:]


def radixserve_argv(argv: list[str]) -> list[str] | None:
    """What `radixserve` receives from this command line: its own arguments for `radixserve ...`,
    the image's arguments for a `docker run` / `kubectl run` of the runtime image (which run
    `tini -- radixserve ARGS`), None when radixserve is not what runs."""
    assert IMAGE_ENTRYPOINT[-1] == "radixserve", IMAGE_ENTRYPOINT
    if not argv:
        return None
    if argv[0] == "radixserve":
        return argv[1:]
    if argv[:2] == ["python", "-m"] and argv[2:3] == ["radixserve"]:
        return argv[3:]
    if argv[:2] == ["docker", "run"]:
        if any(a.startswith("--entrypoint") for a in argv):
            return None
        image = next((i for i, a in enumerate(argv) if a.startswith(RUNTIME_IMAGE)), None)
        return None if image is None else argv[image + 1:]
    if argv[:2] == ["kubectl", "run"]:
        if not any(a.startswith("--image=" + RUNTIME_IMAGE) for a in argv) or "--" not in argv:
            return None
        dashes = argv.index("--")
        if "--command" in argv[:dashes]:  # ARGS replace the entrypoint: a command of its own
            return None
        return argv[dashes + 1:]
    return None


def parse_error(argv: list[str]) -> str | None:
    """None when radixserve's parser accepts `argv`, else its message."""
    import contextlib
    import io

    from radixserve.cli import build_parser

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            build_parser().parse_args(argv)
    except SystemExit as e:
        if e.code:
            return err.getvalue().strip().splitlines()[-1] if err.getvalue() else str(e)
    return None


def bad_commands(path: Path) -> list[str]:
    """`file: command: why` for every radixserve command line of `path` its parser refuses."""
    text = path.read_text()
    bad = []
    for argv in fenced_commands(text) + span_commands(text):
        args = radixserve_argv(argv)
        if args is None or not args:
            continue
        if why := parse_error(args):
            bad.append(f"{path.relative_to(ROOT)}: {shlex.join(argv)[:160]}: {why}")
    return bad
