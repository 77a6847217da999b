"""`radixserve serve`: the OpenAI-compatible HTTP server."""
from __future__ import annotations

import argparse
import logging
import os
import sys

from radixserve.cli.preflight import bind_port, check_setup, resolve_model, server_config
from radixserve.config import ServerConfig, add_engine_args
from radixserve.options import add_options
from radixserve.server.startup_responder import StartupResponder


def run(args: argparse.Namespace) -> int:
    """Errors before work: every flag, the port, the device and the model's shape are checked
    before the model is converted or downloaded and before any child process starts."""
    cfg = server_config(args)  # the flags' values alone: answered at once
    sock = bind_port(cfg.host, cfg.port)
    loading = StartupResponder(sock).start()  # /health: 503 "loading" at once, until serving
    try:
        check_setup(cfg.engine)
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
    add_options(p, ServerConfig)
    p.set_defaults(func=run)
