"""`radixserve serve`: the OpenAI-compatible HTTP server."""
from __future__ import annotations

import argparse
import logging
import os
import sys

from radixserve import settings
from radixserve.cli.preflight import (
    UsageError,
    bind_port,
    chat_template_from_args,
    check_engine,
    resolve_model,
)
from radixserve.config import ServerConfig, add_chat_template_arg, add_engine_args
from radixserve.postprocess.reasoning import REASONING_PARSERS
from radixserve.server.startup_responder import StartupResponder


def add_server_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None, help="the model name clients use (default: --model)")
    p.add_argument("--num-tokenizer", type=int, default=0, help="tokenizer processes (0: the detokenizer tokenizes too)")
    p.add_argument("--api-key", default=settings.API_KEY.get(),
                   help="require this bearer token; prefer env RADIXSERVE_API_KEY (a flag shows in `ps`)")
    p.add_argument("--metrics-without-key", action="store_true", help="serve /metrics without the API key (for scrapers)")
    p.add_argument("--shutdown-timeout", type=float, default=30.0, help="seconds in-flight requests get to finish on SIGTERM")
    p.add_argument("--header-timeout", type=float, default=5.0,
                   help="seconds a connection gets to send a request's whole header block, else it is closed")
    p.add_argument("--keep-alive-timeout", type=float, default=5.0,
                   help="seconds an idle keep-alive connection is kept open between requests")
    p.add_argument("--max-request-body-bytes", type=int, default=32 << 20,
                   help="a larger request body is refused with 413 (default 32 MiB)")
    p.add_argument("--body-timeout", type=float, default=30.0,
                   help="seconds without a byte of a request body that is still arriving: 408")
    p.add_argument("--max-connections", type=int, default=1024,
                   help="connections and requests at once; past it a request gets 503")
    p.add_argument("--default-max-tokens", type=int, default=2048,
                   help="max_tokens of a chat request that gives none (capped to the context left)")
    p.add_argument("--tool-call-parser", default="auto", choices=["auto", "hermes", "llama3", "none"],
                   help="the model's tool-call format, parsed for tool_choice auto (auto: from its chat template)")
    p.add_argument("--reasoning-parser", default=None, choices=list(REASONING_PARSERS),
                   help="return a reasoning model's <think> block as the message's reasoning_content, "
                        "apart from content (qwen3: the model opens it; deepseek_r1: the prompt does)")
    add_chat_template_arg(p)
    p.add_argument("--sampling-defaults", default="model", choices=["model", "openai"],
                   help="sampling fields a request leaves out: the model's generation_config.json "
                        "values (model, as vLLM and SGLang) or OpenAI's defaults (openai)")


def server_config_from_args(args: argparse.Namespace) -> ServerConfig:
    """Every flag, the device and the model's presence and shape checked (`UsageError`), loading no
    weight (a hub id is downloaded here to read its config)."""
    if args.num_tokenizer < 0:
        raise UsageError(f"--num-tokenizer must be non-negative, got {args.num_tokenizer}")
    if args.default_max_tokens < 1:
        raise UsageError(f"--default-max-tokens must be positive, got {args.default_max_tokens}")
    if args.shutdown_timeout < 0:
        raise UsageError(f"--shutdown-timeout must be non-negative, got {args.shutdown_timeout}")
    for flag in ("header_timeout", "keep_alive_timeout", "body_timeout", "max_request_body_bytes", "max_connections"):
        if getattr(args, flag) <= 0:
            raise UsageError(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    engine, sched = check_engine(args)
    return ServerConfig(engine=engine, scheduler=sched, host=args.host, port=args.port,
                        served_model_name=args.served_model_name, num_tokenizer=args.num_tokenizer,
                        api_key=args.api_key or None, shutdown_timeout=args.shutdown_timeout,
                        default_max_tokens=args.default_max_tokens, metrics_without_key=args.metrics_without_key,
                        tool_call_parser=args.tool_call_parser, reasoning_parser=args.reasoning_parser,
                        chat_template=chat_template_from_args(args), sampling_defaults=args.sampling_defaults,
                        header_timeout=args.header_timeout, keep_alive_timeout=args.keep_alive_timeout,
                        max_request_body_bytes=args.max_request_body_bytes, body_timeout=args.body_timeout,
                        max_connections=args.max_connections)


def run(args: argparse.Namespace) -> int:
    """Errors before work: the port is bound and every check passed before the model is
    converted or downloaded and before any child process starts."""
    sock = bind_port(args.host, args.port)
    loading = StartupResponder(sock).start()  # /health: 503 "loading" at once, until serving
    try:
        cfg = server_config_from_args(args)
        model_path = resolve_model(cfg.engine.model)
        from radixserve.server.launch import serve

        code = serve(cfg, sock=sock, model_path=str(model_path), loading=loading)
    finally:
        loading.stop()
        sock.close()
    # NOTE: every child has stopped and every file is closed; the interpreter's own teardown of a
    # process that imported torch takes seconds more, which an orchestrator's stop waits for
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("serve", help="serve the OpenAI-compatible HTTP API")
    add_engine_args(p)
    add_server_args(p)
    p.set_defaults(func=run)
