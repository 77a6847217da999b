"""The FastAPI application: the routers (OpenAI's, the native `/generate`, SGLang's), health and
metrics."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from radixserve.sampling_params import SamplingParams
from radixserve.server.access_log import AccessLogMiddleware
from radixserve.server.body_guard import BodyGuardMiddleware
from radixserve.server.dispatch import Dispatch, Prompt
from radixserve.server.embeddings_api import router as embeddings_router
from radixserve.server.errors import APIError, error_body, install_error_handlers
from radixserve.server.generate_api import router as generate_router
from radixserve.server.json_body import ParsedJsonRoute
from radixserve.server.lora_api import router as lora_router
from radixserve.server.middleware import AuthMiddleware, CatchAllMiddleware
from radixserve.server.openai_api import router as openai_router
from radixserve.server.openapi import install_openapi
from radixserve.server.responses_api import router as responses_router
from radixserve.server.sglang_api import router as sglang_router
from radixserve.server.state import ServerState, StateDep
from radixserve.server.tokenize_api import router as tokenize_router
from radixserve.version import __version__

_HEALTH_GENERATE_TIMEOUT_S = 30.0


async def _probe(s: ServerState) -> int:
    d = Dispatch(s.frontend, [Prompt(input_ids=[0])], SamplingParams(max_tokens=1, ignore_eos=True), 1, False)
    choices = await asyncio.wait_for(d.collect(None), _HEALTH_GENERATE_TIMEOUT_S)
    return len(choices[0].token_ids)


def create_app(state: ServerState) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.loop = asyncio.get_running_loop()
        state.frontend.start()
        yield

    app = FastAPI(title="radixserve", lifespan=lifespan)
    app.router.route_class = ParsedJsonRoute  # (its own routes below read the guard's parse too)
    app.state.server = state
    install_error_handlers(app)
    app.include_router(openai_router)
    app.include_router(responses_router)
    app.include_router(generate_router)
    app.include_router(tokenize_router)
    app.include_router(embeddings_router)
    app.include_router(sglang_router)
    app.include_router(lora_router)
    open_paths = frozenset({"/health"} | ({"/metrics"} if state.cfg.metrics_without_key else set()))
    install_openapi(app, open_paths, state.cfg.api_key is not None)
    # inside the key check: a keyless caller's body is never read
    app.add_middleware(BodyGuardMiddleware, max_bytes=state.cfg.max_request_body_bytes, idle_s=state.cfg.body_timeout)
    app.add_middleware(AuthMiddleware, api_key=state.cfg.api_key, open_paths=open_paths)
    app.add_middleware(CatchAllMiddleware)  # even the key check cannot reset a connection
    app.add_middleware(AccessLogMiddleware)  # outermost: every request gets its id and its line

    @app.get("/health")
    async def health(s: StateDep) -> Response:
        reason = s.unhealthy_reason()
        if reason:
            return JSONResponse(error_body(503, reason), status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/health_generate")
    async def health_generate(s: StateDep) -> Response:
        # NOTE: concurrent probes share one generation, so probing cannot load the engine
        if s.probe is None or s.probe.done():
            s.probe = asyncio.ensure_future(_probe(s))
        try:
            tokens = await asyncio.shield(s.probe)
        except (APIError, asyncio.TimeoutError) as e:
            reason = e.message if isinstance(e, APIError) else "timed out"
            return JSONResponse(error_body(503, f"could not generate a token: {reason}"), status_code=503)
        return JSONResponse({"status": "ok", "tokens": tokens})

    @app.get("/version")
    async def version() -> dict:
        return {"version": __version__}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics(s: StateDep) -> Response:
        return Response(s.metrics.render(), media_type="text/plain; version=0.0.4")

    return app
