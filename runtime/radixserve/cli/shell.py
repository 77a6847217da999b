"""`radixserve shell`: chat with a model in the terminal. The engine runs in this process
(`offline/pipeline.py`: the server's admission, stop handling and incremental detokenizer over
one `Scheduler`); replies stream as they are generated.
`/help` lists the commands, `/reset` clears the history, `/exit` or Ctrl-D leaves, Ctrl-C cancels
the reply being written (nothing more of it is printed, and the cancelled turn is not kept)."""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import signal
import sys

from radixserve.config import ServerConfig, add_engine_args
from radixserve.messages import RequestFailed, TokenizeMsg, UserMsg
from radixserve.options import add_options
from radixserve.sampling_params import SamplingParams

HELP = "Type a message. /help shows this, /reset clears the history, /exit (or Ctrl-D) leaves, Ctrl-C cancels a reply."


class ChatShell:
    def __init__(self, scheduler, tokenizer, params: SamplingParams, system: str | None) -> None:
        from radixserve.offline.pipeline import LocalPipeline
        from radixserve.tokenizer.tokenize import TokenizeManager

        self.params, self.system = params, system
        self.tokenize = TokenizeManager(tokenizer)
        self.pipeline = LocalPipeline(scheduler, tokenizer)  # the server's admission and stops
        self.uids = itertools.count(1)
        self.history: list[dict] = []
        self.cancelled = False

    def reset(self) -> None:
        self.history.clear()

    def _on_sigint(self, *_) -> None:
        self.cancelled = True

    def turn(self, text: str, out=sys.stdout) -> None:
        """Answer one user message, streaming the reply to `out`; keeps both in the history.
        Ctrl-C anywhere in the turn cancels it (checked between scheduler steps)."""
        self.cancelled = False
        previous = signal.signal(signal.SIGINT, self._on_sigint)
        try:
            self._turn(text, out)
        finally:
            signal.signal(signal.SIGINT, previous)

    def _turn(self, text: str, out) -> None:
        system = [{"role": "system", "content": self.system}] if self.system else []
        chat = system + self.history + [{"role": "user", "content": text}]
        ids = self.tokenize.tokenize(TokenizeMsg(0, self.params, chat=chat))
        uid = next(self.uids)
        # auto: a long history leaves less room to reply (`--max-tokens` is the longest reply)
        replies = self.pipeline.submit(UserMsg(uid, ids, self.params, auto_max_tokens=True))
        reply, generated, reason = "", 0, None
        while True:
            for r in replies:
                if isinstance(r, RequestFailed):
                    full = r.code == "context_length_exceeded"
                    hint = " (/reset clears the history)" if full else ""
                    out.write(f"[error: {r.message}{hint}]\n")
                    return
                if r.uid != uid or self.cancelled:  # NOTE: Ctrl-C during the step: print no more
                    continue
                reply, generated = reply + r.text, r.completion_tokens
                out.write(r.text)
                out.flush()
                reason = r.finish_reason if r.finished else None
            if reason is not None:
                break
            if self.cancelled:  # checked between steps, so the scheduler is never torn mid-step
                self.pipeline.abort(uid)
                reason = "cancelled"
                break
            replies = self.pipeline.step()
        while self.pipeline.scheduler.has_work:  # the in-flight batch: the KV back to the cache
            self.pipeline.step()
        if reason != "cancelled":  # a cancelled turn is not part of the conversation
            self.history += [{"role": "user", "content": text}, {"role": "assistant", "content": reply}]
        out.write(f"\n[{len(ids)} prompt tokens, {generated} generated, {reason}]\n")


def command(shell: ChatShell, line: str) -> str:
    """What a `/command` (other than /exit) does, and the line to print."""
    if line == "/help":
        return HELP
    if line == "/reset":
        shell.reset()
        return "[history cleared]"
    return f"[unknown command {line}] {HELP}"


def run(args: argparse.Namespace) -> int:
    from prompt_toolkit import PromptSession

    from radixserve.chat_template import read_chat_template
    from radixserve.cli.preflight import UsageError, check_setup, sampling_from_args, server_config
    from radixserve.scheduler.scheduler import Scheduler
    from radixserve.tokenizer.load import load_tokenizer

    cfg = server_config(args)  # (the engine's flags and --chat-template)
    params = sampling_from_args(args)
    if cfg.engine.tp > 1:
        raise UsageError("--tp: the shell runs the engine in its own process; use `radixserve serve --tp N`")
    model_path = str(check_setup(cfg.engine))
    print(f"loading {cfg.engine.model or model_path} …", flush=True)
    scheduler = Scheduler(dataclasses.replace(cfg.engine, model=model_path), cfg.scheduler)
    template = read_chat_template(cfg.chat_template) if cfg.chat_template is not None else None
    tokenizer = load_tokenizer(model_path, template)
    shell = ChatShell(scheduler, tokenizer, params, args.system)
    session: PromptSession = PromptSession()
    print(HELP, flush=True)
    while True:
        try:
            line = session.prompt("you> ").strip()
        except KeyboardInterrupt:
            continue
        except EOFError:
            break
        if line == "/exit":
            break
        if line.startswith("/"):
            print(command(shell, line), flush=True)
        elif line:
            shell.turn(line)
    print("bye", flush=True)
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("shell", help="chat with the model in the terminal")
    add_engine_args(p)
    p.add_argument("--max-tokens", type=int, default=512, help="longest reply")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--system", default=None, help="a system prompt (default: none)")
    add_options(p, ServerConfig, only=("chat_template",))
    p.set_defaults(func=run)
