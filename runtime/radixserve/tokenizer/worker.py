"""The tokenizer and detokenizer processes. With `--num-tokenizer 0` the detokenizer also
tokenizes, polling both of its inputs."""
from __future__ import annotations

import logging
import os
import signal
import time
from typing import Any

import zmq

from radixserve.logs import setup_logging
from radixserve.messages import (
    AbortMsg,
    IpcAddresses,
    RequestFailed,
    TextOpMsg,
    TextOpReply,
    TokenizeMsg,
    UserMsg,
    decode,
    make_socket,
    recv_nowait,
    send,
)
from radixserve.postprocess.auto_tool_parsers import detect_tool_parser
from radixserve.tokenizer.bounds import longest_token_chars
from radixserve.tokenizer.detokenize import DetokenizeManager
from radixserve.tokenizer.load import load_tokenizer
from radixserve.tokenizer.tokenize import TokenizeManager

logger = logging.getLogger("radixserve.tokenizer")
_POLL_MS = 200


class TokenizerWorker:
    def __init__(self, tokenizer, ctx: zmq.Context, addrs: IpcAddresses, tokenize: bool, detokenize: bool) -> None:
        self.poller = zmq.Poller()
        self.to_scheduler = make_socket(ctx, zmq.PUSH, addrs.scheduler, bind=False)
        self.to_api = make_socket(ctx, zmq.PUSH, addrs.frontend, bind=False)
        self.tok_in = self.detok_in = None
        if tokenize:
            self.tokenizer = TokenizeManager(tokenizer)
            self.tok_in = make_socket(ctx, zmq.PULL, addrs.tokenizer, bind=False)
            self.poller.register(self.tok_in, zmq.POLLIN)
        if detokenize:
            self.detokenizer = DetokenizeManager(tokenizer)
            self.detok_in = make_socket(ctx, zmq.PULL, addrs.detokenizer, bind=True)
            self.poller.register(self.detok_in, zmq.POLLIN)

    def _tokenize(self, msg: TokenizeMsg | TextOpMsg) -> None:
        if isinstance(msg, TextOpMsg):
            try:
                reply = self.tokenizer.text_op(msg)
            except Exception:
                logger.exception("tokenizer: could not %s for request %d", msg.op, msg.uid)
                reply = TextOpReply(msg.uid, error=f"internal error in {msg.op}")
            send(self.to_api, [reply])
            return
        try:
            ids = self.tokenizer.tokenize(msg)
        except ValueError as e:
            send(self.to_api, [RequestFailed(msg.uid, str(e), "messages" if msg.chat else "prompt")])
            return
        except Exception:  # this request's fault alone: it fails, the worker keeps serving
            logger.exception("tokenizer: could not tokenize request %d", msg.uid)
            send(self.to_api, [RequestFailed(msg.uid, "internal error while tokenizing the prompt", status=500)])
            return
        send(self.to_scheduler, UserMsg(msg.uid, ids, msg.params, msg.auto_max_tokens, msg.lora))

    def _detokenize(self, msgs: list[Any]) -> None:
        replies: list[Any] = []
        for msg in msgs:  # NOTE: `LLM` handles the same messages in-process (offline/pipeline.py)
            out, aborts = self.detokenizer.handle(msg)
            replies += out
            for uid in aborts:
                send(self.to_scheduler, AbortMsg(uid))
        if replies:
            send(self.to_api, replies)

    def run_forever(self, parent_pid: int) -> None:
        while os.getppid() == parent_pid:
            ready = dict(self.poller.poll(_POLL_MS))
            if self.detok_in is not None and self.detok_in in ready:
                self._detokenize(recv_nowait(self.detok_in))
            if self.tok_in is not None and self.tok_in in ready:
                try:
                    msg = self.tok_in.recv(zmq.NOBLOCK)  # one at a time: fair to other workers
                except zmq.Again:
                    continue
                self._tokenize(decode(msg))
        logger.error("tokenizer: the server process is gone; exiting")


def run_tokenizer_process(
    model_path: str,
    addrs: IpcAddresses,
    ack_queue,
    parent_pid: int,
    name: str,
    tokenize: bool,
    detokenize: bool,
    chat_template: str | None = None,
) -> None:
    """Entry point of a spawned tokenizer or detokenizer process; `chat_template` (its text)
    replaces the checkpoint's."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server process coordinates shutdown
    setup_logging(name)
    t0 = time.perf_counter()
    tokenizer = load_tokenizer(model_path, chat_template)
    worker = TokenizerWorker(tokenizer, zmq.Context(), addrs, tokenize, detokenize)
    logger.info("tokenizer loaded in %.1fs", time.perf_counter() - t0)
    # the API parses tool calls in the format the chat template teaches (it loads no tokenizer)
    ack_queue.put((name, {"tool_parser": detect_tool_parser(getattr(tokenizer, "chat_template", None)),
                          "max_token_chars": longest_token_chars(tokenizer)}))
    worker.run_forever(parent_pid)
