"""The FastAPI application: OpenAI routes plus health, metrics and the native `/generate`."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from radixserve.sampling_params import SamplingParams
from radixserve.server.dispatch import Choice, Dispatch, Prompt, sse
from radixserve.server.errors import APIError, bad_value, error_body, install_error_handlers
from radixserve.server.openai_api import router as openai_router
from radixserve.server.protocol import GenerateRequest
from radixserve.server.state import ServerState, StateDep, authorize

_HEALTH_GENERATE_TIMEOUT_S = 30.0


def _generate_result(c: Choice) -> dict:
    return {"text": c.text, "output_ids": c.token_ids, "finish_reason": c.finish_reason,
            "usage": {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens}}


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

    @app.get("/health")
    async def health(s: StateDep) -> Response:
        reason = s.unhealthy_reason()
        if reason:
            return JSONResponse(error_body(503, reason), status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/health_generate")
    async def health_generate(raw: Request, s: StateDep) -> Response:
        d = Dispatch(s.frontend, [Prompt(input_ids=[0])], SamplingParams(max_tokens=1, ignore_eos=True), 1, False)
        try:
            choices = await asyncio.wait_for(d.collect(raw), _HEALTH_GENERATE_TIMEOUT_S)
        except (APIError, asyncio.TimeoutError) as e:
            return JSONResponse(error_body(503, f"could not generate a token: {e!r}"), status_code=503)
        return JSONResponse({"status": "ok", "tokens": len(choices[0].token_ids)})

    @app.get("/metrics")
    async def metrics(s: StateDep) -> Response:
        return Response(s.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.post("/generate", dependencies=[Depends(authorize)])
    async def generate(req: GenerateRequest, raw: Request, s: StateDep):
        if (req.text is None) == (req.input_ids is None):
            raise APIError(400, "give exactly one of text and input_ids", "text")
        if req.text == "" or req.input_ids == []:
            raise APIError(400, "prompt must not be empty", "text" if req.text is not None else "input_ids")
        try:
            params = SamplingParams(**req.sampling_params)
        except TypeError as e:
            raise APIError(400, f"sampling_params: {e}", "sampling_params") from None
        except ValueError as e:
            raise bad_value(e) from None
        d = Dispatch(s.frontend, [Prompt(text=req.text, input_ids=req.input_ids)], params, 1, False)
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

        return StreamingResponse(events(await d.start()), media_type="text/event-stream")

    return app
