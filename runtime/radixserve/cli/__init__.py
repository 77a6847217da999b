"""`radixserve SUBCOMMAND …`: each subcommand lives in its own module with `add_parser`.

A user error (`UsageError`: a bad flag, a missing model, a busy port, `--tp` that does not fit the
model) is one line on stderr and exit code 2, with no traceback unless `--debug` is given."""
from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
import traceback
from typing import NoReturn

from radixserve import settings
from radixserve.cli.preflight import UsageError
from radixserve.logs import FORMAT_ENV, FORMATS, setup_logging

SUBCOMMANDS = {
    "serve": "radixserve.cli.serve",
    "shell": "radixserve.cli.shell",
    "generate": "radixserve.cli.generate",
    "bench": "radixserve.cli.bench",
    "download": "radixserve.cli.download",
}
USAGE_EXIT = 2
_PROCESS_NAMES = {"serve": "server"}  # the name in each log line of the parent process
# the server (and a download, in an init container's log) announces its phases; the interactive
# commands stay quiet unless asked (env)
_DEFAULT_LEVELS = {"serve": "INFO", "download": "INFO"}


class DefaultsHelp(argparse.HelpFormatter):
    """Every flag's help ends with its default, unless it already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default is argparse.SUPPRESS or not action.option_strings:
            return text
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            shown = "on" if action.default else "off"
        elif action.default is None:
            shown = "none"
        elif isinstance(action.default, list):
            shown = " ".join(map(str, action.default))
        else:
            shown = str(action.default)
        return f"{text} (default: {shown.replace('%', '%%')})"


class Parser(argparse.ArgumentParser):
    """One line for a mistake in the command line, with the flag it probably meant, instead of
    argparse's whole usage."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelp)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_EXIT, f"{self.prog}: error: {message}{self.hint(message)}\n")

    def hint(self, message: str) -> str:
        if message.startswith("unrecognized arguments: "):
            flags = [f for a in self._actions for f in a.option_strings if a.help != argparse.SUPPRESS]
            for word in message.removeprefix("unrecognized arguments: ").split():
                close = difflib.get_close_matches(word.split("=")[0], flags, n=1)
                if close:
                    return f" (did you mean {close[0]}?)"
        return f"; `{self.prog} --help` lists the flags"

    def parse_args(self, args=None, namespace=None):
        """NOTE: an unknown flag after a subcommand reaches the top parser, which would name
        neither the subcommand nor the flag it resembles: the innermost parser chosen reports it."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            _chosen(self, parsed).error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed


def _chosen(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost subcommand's parser that `ns` went through."""
    for action in parser._subparsers._group_actions if parser._subparsers else []:
        sub = action.choices.get(getattr(ns, action.dest, None) or "")
        if sub is not None:
            return _chosen(sub, ns)
    return parser


def _add_common(p: argparse.ArgumentParser, default: object) -> None:
    # NOTE: SUPPRESS on the subcommands, so `radixserve --debug serve` is not reset by serve's default
    p.add_argument("--debug", action="store_true", default=default,
                   help="show tracebacks of user errors (default: off; env RADIXSERVE_DEBUG)")
    p.add_argument("--log-format", choices=FORMATS, default=default,
                   help=f"plain lines or JSON lines (default: plain; env {FORMAT_ENV})")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="radixserve", description="A compact LLM serving engine.")
    _add_common(parser, None)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for module in SUBCOMMANDS.values():
        try:
            importlib.import_module(module).add_parser(sub)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
    for p in sub.choices.values():
        _add_common(p, argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    debug = bool(args.debug) or settings.DEBUG.get()
    try:
        if args.log_format:
            os.environ[FORMAT_ENV] = args.log_format  # spawned children inherit it
        try:
            setup_logging(_PROCESS_NAMES.get(args.command, args.command),
                          _DEFAULT_LEVELS.get(args.command, "WARNING"))
        except ValueError as e:
            raise UsageError(str(e)) from None
        from radixserve.utils.stack_dump import enable_stack_dumps

        enable_stack_dumps(f"radixserve {args.command}")
        return int(args.func(args) or 0)
    except UsageError as e:
        if debug:
            traceback.print_exc()
        print(f"radixserve {args.command}: error: {e}", file=sys.stderr, flush=True)
        return USAGE_EXIT
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print(f"radixserve {args.command}: interrupted", file=sys.stderr, flush=True)
        return 130


if __name__ == "__main__":
    sys.exit(main())
