"""Start the server: spawn the scheduler, the detokenizer and the tokenizers, wait for every one to
acknowledge, then serve HTTP until a signal (graceful: in-flight requests finish, up to
`shutdown_timeout`) or a child's death (logged; `/health` turns 503 and the process exits 1)."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import multiprocessing as mp
import os
import queue
import signal
import socket
import threading
import time
from multiprocessing.connection import wait
from pathlib import Path

import uvicorn

from radixserve import settings
from radixserve.chat_template import read_chat_template
from radixserve.config import ServerConfig, lora_path_pairs
from radixserve.messages import IpcAddresses
from radixserve.models.default_model import resolve_model_path
from radixserve.models.generation import sampling_defaults
from radixserve.ranks.process import run_scheduler_process
from radixserve.scheduler.loop import open_loop
from radixserve.server.app import create_app
from radixserve.server.frontend import Frontend
from radixserve.server.http_protocol import header_timeout_protocol
from radixserve.server.metrics import ServerMetrics
from radixserve.server.prompt_bound import PromptBound
from radixserve.server.sglang_api import ServerInfo
from radixserve.server.startup_responder import StartupResponder
from radixserve.server.state import ServerState
from radixserve.tokenizer.worker import run_tokenizer_process

logger = logging.getLogger("radixserve.server")
_DEATH_TO_EXIT_S = 0.5  # keep answering /health with 503 this long before stopping
_EXIT_BACKSTOP_S = 1.5  # after a child's death uvicorn gets this long to stop, then the process exits
_CHILD_GRACE_S = 1.5  # children get this long to leave after SIGTERM, then SIGKILL
_DRAIN_REPORT_S = 2.0
_DRAIN_MARGIN_S = 2.0  # streams still running this long before the graceful timeout get an error


def _spawn_children(cfg: ServerConfig, model_path: str, addrs: IpcAddresses, ack) -> list:
    ctx, pid = mp.get_context("spawn"), os.getpid()
    engine = dataclasses.replace(cfg.engine, model=model_path)
    template = read_chat_template(cfg.chat_template) if cfg.chat_template is not None else None
    children = [ctx.Process(target=run_scheduler_process, name="scheduler",
                            args=(engine, cfg.scheduler, addrs, ack, pid, open_loop))]
    children.append(ctx.Process(target=run_tokenizer_process, name="detokenizer",
                                args=(model_path, addrs, ack, pid, "detokenizer", cfg.num_tokenizer == 0, True,
                                      template)))
    for i in range(cfg.num_tokenizer):
        children.append(ctx.Process(target=run_tokenizer_process, name=f"tokenizer-{i}",
                                    args=(model_path, addrs, ack, pid, f"tokenizer-{i}", True, False,
                                          template)))
    for child in children:
        child.start()
        logger.info("started %s (pid %d)", child.name, child.pid)
    return children


def _wait_for_acks(children: list, ack, timeout: float) -> dict:
    waiting, info, deadline = {c.name for c in children}, {}, time.monotonic() + timeout
    while waiting:
        if time.monotonic() > deadline:
            raise RuntimeError(f"children not ready within {timeout:.0f}s: {sorted(waiting)}")
        dead = [c for c in children if not c.is_alive()]
        if dead:
            raise RuntimeError(f"child {dead[0].name} died during startup (exit code {dead[0].exitcode})")
        try:
            name, data = ack.get(timeout=0.5)
        except queue.Empty:
            continue
        logger.info("%s is ready", name)
        waiting.discard(name)
        info.update(data)
    return info


def _stop_children(children: list, grace_s: float = _CHILD_GRACE_S) -> None:
    """SIGTERM every child, then SIGKILL whatever still runs once `grace_s` (shared) has passed.
    NOTE: nothing a child holds outlives it (KV, weights), so a short grace loses nothing."""
    running = [c for c in children if c.is_alive()]
    if not running:
        return
    logger.info("stopping %s", ", ".join(f"{c.name} (pid {c.pid})" for c in running))
    for child in running:
        child.terminate()
    deadline = time.monotonic() + grace_s
    for child in running:
        child.join(timeout=max(0.0, deadline - time.monotonic()))
    for child in running:
        if child.is_alive():
            logger.warning("%s (pid %d) did not stop within %.1fs of SIGTERM; killing it", child.name, child.pid, grace_s)
            child.kill()
            child.join(timeout=2)


def _supervise(children: list, state: ServerState, server: uvicorn.Server) -> None:
    ready = wait([c.sentinel for c in children])
    if state.shutting_down:
        return
    # NOTE: the sentinel fires as the child exits, a moment before is_alive() turns False
    dead = next(c for c in children if c.sentinel in ready)
    dead.join(timeout=1.0)
    logger.error("child process %s (pid %s) died with exit code %s; shutting down", dead.name, dead.pid, dead.exitcode)
    state.dead_child = f"{dead.name} (exit code {dead.exitcode})"
    if state.loop is not None:
        state.loop.call_soon_threadsafe(state.frontend.fail, state.dead_child)
    time.sleep(_DEATH_TO_EXIT_S)  # the requests in flight end with their 503 meanwhile
    server.should_exit = True  # quick: every request in flight has failed, so nothing drains
    time.sleep(_EXIT_BACKSTOP_S)  # uvicorn did not stop: leave anyway, with the failure code
    logger.error("the server did not stop within %.1fs of a child's death; exiting", _EXIT_BACKSTOP_S)
    for child in children:
        if child.is_alive():
            child.kill()
    logging.shutdown()
    os._exit(1)


class _DrainingServer(uvicorn.Server):
    """uvicorn cancels the requests still running when its graceful timeout ends: a stream cut so
    ends without a word. The frontend ends them first, with an error event and `[DONE]`."""

    def __init__(self, state: ServerState, drain_s: float, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.state, self.drain_s = state, drain_s

    def handle_exit(self, sig: int, frame) -> None:
        if self.state.frontend.drain_deadline is None:
            margin = min(_DRAIN_MARGIN_S, max(1, int(self.drain_s)) / 2)
            self.state.frontend.drain_deadline = time.monotonic() + max(1, int(self.drain_s)) - margin
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's drain, with a line saying why it stops and, while requests remain, which."""
        if self.state.dead_child:
            logger.error("radixserve: shutting down: child process %s died", self.state.dead_child)
        else:
            why = ", ".join(signal.Signals(s).name for s in self._captured_signals) or "asked to stop"
            logger.info("radixserve: shutting down (%s); requests in flight get up to %ds to finish",
                        why, max(1, int(self.drain_s)))
        reporter = asyncio.ensure_future(self._report_drain())
        try:
            await super().shutdown(sockets)
        finally:
            reporter.cancel()

    async def _report_drain(self) -> None:
        t0 = time.monotonic()
        while True:
            running = [f"{c.cycle.scope['method']} {c.cycle.scope['path']}" for c in self.server_state.connections
                       if getattr(c, "cycle", None) is not None and not c.cycle.response_complete]
            if running:
                logger.info("waiting for %d request(s) in flight to finish: %s (%.0fs of %ds passed)",
                            len(running), ", ".join(sorted(running)[:8]), time.monotonic() - t0,
                            max(1, int(self.drain_s)))
            await asyncio.sleep(_DRAIN_REPORT_S)


def _server_info(cfg: ServerConfig, name: str, model_path: str, ack: dict) -> ServerInfo:
    model_type, archs = ServerInfo.read_model_config(model_path)
    return ServerInfo(model_path=cfg.engine.model or name, served_model_name=name, tp_size=cfg.engine.tp,
                      page_size=ack["kv_tokens_total"] // ack["kv_pages_total"], context_length=ack["max_seq_len"],
                      max_total_num_tokens=ack["kv_tokens_total"],
                      max_running_requests=cfg.scheduler.max_running_requests,
                      chunked_prefill_size=cfg.scheduler.max_prefill_length,
                      disable_radix_cache=cfg.scheduler.cache != "radix", model_type=model_type, architectures=archs)


def _raise_exit(*_) -> None:
    raise SystemExit(143)


def serve(cfg: ServerConfig, sock: socket.socket | None = None, model_path: str | None = None,
          loading: StartupResponder | None = None) -> int:
    """Run the server until it is stopped; 0 after a clean shutdown, 1 after a child died. `sock`:
    the listening socket the CLI bound before any work (else uvicorn binds one once ready); `model_path`: the
    resolved model directory (else resolved here); `loading`: what answers on `sock` until now,
    stopped just before the server takes the socket."""
    signal.signal(signal.SIGTERM, _raise_exit)  # during startup: clean up, then leave
    t0 = time.perf_counter()
    model_path = model_path or str(resolve_model_path(cfg.engine.model))
    addrs = IpcAddresses.create()
    logger.info("ipc sockets in %s", addrs.root)
    ack = mp.get_context("spawn").Queue()
    children: list = []
    state: ServerState | None = None
    try:
        children = _spawn_children(cfg, model_path, addrs, ack)
        try:
            info = _wait_for_acks(children, ack, settings.STARTUP_TIMEOUT.get())
        except RuntimeError as e:
            logger.error("radixserve: startup failed: %s", e)
            return 1
        logger.info("startup: every process ready in %.1fs", time.perf_counter() - t0)
        name = cfg.served_model_name or cfg.engine.model or Path(model_path).name
        metrics = ServerMetrics()
        parser = info.get("tool_parser") if cfg.tool_call_parser == "auto" else cfg.tool_call_parser
        state = ServerState(cfg, Frontend(addrs, metrics), metrics, name, model_path, info["max_seq_len"],
                            tool_parser=None if parser == "none" else parser,
                            request_defaults=(sampling_defaults(model_path)
                                               if cfg.sampling_defaults == "model" else {}))
        state.frontend.prompt_bound = PromptBound(info["max_seq_len"], info["max_token_chars"])
        state.server_info = _server_info(cfg, name, model_path, info)
        state.adapters = lora_path_pairs(cfg.engine.lora_paths)
        if state.request_defaults:
            logger.info("sampling defaults from the model's generation_config.json for requests "
                        "that leave them out: %s (--sampling-defaults openai ignores them)",
                        ", ".join(f"{k}={v}" for k, v in state.request_defaults.items()))
        logger.info("tool calls of tool_choice auto: %s", f"parsed as {parser}" if state.tool_parser
                    else "not parsed (no tool-call format in the chat template)")
        server = _DrainingServer(state, cfg.shutdown_timeout, uvicorn.Config(
            create_app(state), host=cfg.host, port=cfg.port, log_config=None, access_log=False,
            timeout_graceful_shutdown=max(1, int(cfg.shutdown_timeout)),
            http=header_timeout_protocol(cfg.header_timeout), timeout_keep_alive=max(1, int(cfg.keep_alive_timeout)),
            limit_concurrency=cfg.max_connections))
        threading.Thread(target=_supervise, args=(children, state, server), daemon=True).start()
        for sig in (signal.SIGTERM, signal.SIGINT):  # uvicorn re-raises the signal after its drain
            signal.signal(sig, lambda *_: None)
        logger.info("radixserve: serving %s on http://%s:%d", name, cfg.host, cfg.port)
        if loading is not None:
            loading.stop()
        server.run(sockets=[sock] if sock is not None else None)
        return 1 if state.dead_child else 0
    finally:
        if state is not None:
            state.shutting_down = True
        _stop_children(children)
        addrs.remove()
