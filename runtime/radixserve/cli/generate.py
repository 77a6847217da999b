"""`radixserve generate "prompt"`: one-shot generation from the command line."""
from __future__ import annotations

import argparse

from radixserve.config import add_engine_args


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate a completion for one prompt and print it")
    p.add_argument("prompt", help="the prompt text")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    add_engine_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from radixserve.cli.preflight import check_engine, sampling_from_args

    sp = sampling_from_args(args)  # every flag before the model loads
    eng, sch = check_engine(args)
    from radixserve.llm import LLM

    llm = LLM(**{**eng.__dict__, **sch.__dict__})
    print(llm.generate(args.prompt, sp, chat=args.chat)[0].text)
    return 0
