"""`radixserve SUBCOMMAND …`: each subcommand lives in its own module with `add_parser`.

A user error (`UsageError`: a bad flag, a missing model, a busy port, `--tp` that does not fit the
model) is one line on stderr and exit code 2, with no traceback unless `--debug` is given."""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback

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


def _add_common(p: argparse.ArgumentParser, default: object) -> None:
    # NOTE: SUPPRESS on the subcommands, so `radixserve --debug serve` is not reset by serve's default
    p.add_argument("--debug", action="store_true", default=default, help="show tracebacks of user errors")
    p.add_argument("--log-format", choices=FORMATS, default=default,
                   help=f"plain lines or JSON lines (env {FORMAT_ENV}; default plain)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixserve", description="A compact LLM serving engine.")
    _add_common(parser, None)
    sub = parser.add_subparsers(dest="command", required=True)
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
