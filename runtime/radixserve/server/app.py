"""The FastAPI application: OpenAI routes plus health, metrics and the native `/generate`."""
from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from radixserve.sampling_params import SamplingParams
from radixserve.server.access_log import AccessLogMiddleware
from radixserve.server.body_guard import BodyGuardMiddleware
from radixserve.server.dispatch import Choice, Dispatch, Prompt, ending_properly, sse
from radixserve.server.embeddings_api import router as embeddings_router
from radixserve.server.errors import APIError, bad_value, error_body, install_error_handlers
from radixserve.server.lora_api import router as lora_router
from radixserve.server.middleware import AuthMiddleware, CatchAllMiddleware
from radixserve.server.openai_api import requested_adapter
from radixserve.server.openai_api import router as openai_router
from radixserve.server.openapi import install_openapi
from radixserve.server.protocol import GenerateRequest
from radixserve.server.responses_api import router as responses_router
from radixserve.server.sglang_api import router as sglang_router
from radixserve.server.state import ServerState, StateDep
from radixserve.server.structured_output import check_json_schema
from radixserve.server.tokenize_api import router as tokenize_router

_HEALTH_GENERATE_TIMEOUT_S = 30.0


def _generate_result(c: Choice) -> dict:
    return {"text": c.text, "output_ids": c.token_ids, "finish_reason": c.finish_reason,
            "usage": {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens}}


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
    app.state.server = state
    install_error_handlers(app)
    app.include_router(openai_router)
    app.include_router(responses_router)
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

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics(s: StateDep) -> Response:
        return Response(s.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.post("/generate")
    async def generate(req: GenerateRequest, raw: Request, s: StateDep):
        if (req.text is None) == (req.input_ids is None):
            raise APIError(400, "give exactly one of text and input_ids", "text")
        if req.text == "" or req.input_ids == []:
            raise APIError(400, "prompt must not be empty", "text" if req.text is not None else "input_ids")
        lora = requested_adapter(s, None, req.lora_path)
        sp = req.sampling_params
        fields = sp.model_dump() | {"stop": [sp.stop] if isinstance(sp.stop, str) else list(sp.stop or [])}
        try:
            params = SamplingParams(**fields)
        except ValueError as e:
            raise bad_value(e) from None
        if params.json_schema is not None:
            check_json_schema(json.loads(params.json_schema), "json_schema")
        d = Dispatch(s.frontend, [Prompt(text=req.text, input_ids=req.input_ids)], params, 1, False,
                     lora=lora)
        if not req.stream:
            return _generate_result((await d.collect(raw))[0])

        async def events(first) -> AsyncIterator[str]:
            c = Choice(0)
            async for _, r in d.events(first, raw):
                c.add(r)
                yield sse({"text": r.text, "output_ids": r.token_ids, "finished": r.finished,
                           "finish_reason": r.finish_reason})
            yield sse(_generate_result(c))
            yield sse("[DONE]")

        first = await d.start(raw)
        if first is None:
            return Response(status_code=204)  # the client is gone: nobody reads this
        return StreamingResponse(ending_properly(events(first)), media_type="text/event-stream")

    return app
