"""`radixserve SUBCOMMAND …`: each subcommand lives in its own module with `add_parser`."""
from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS = {
    "serve": "radixserve.cli.serve",
    "shell": "radixserve.cli.shell",
    "generate": "radixserve.cli.generate",
    "bench": "radixserve.cli.bench",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="radixserve", description="A compact LLM serving engine.")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in SUBCOMMANDS.values():
        try:
            importlib.import_module(module).add_parser(sub)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
    args = parser.parse_args(argv)
    from radixserve.utils.stack_dump import enable_stack_dumps

    enable_stack_dumps(f"radixserve {args.command}")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
