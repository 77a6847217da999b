"""OpenAI's `/v1/embeddings`: each input's hidden state after the final norm at its last token,
L2-normalized (the pooling of Qwen3-Embedding and most decoder-based embedders; serve such a
checkpoint and it embeds as its model card says). `dimensions` keeps the first N and renormalizes
(Matryoshka-trained models); `encoding_format: "base64"` sends little-endian float32 bytes, as
OpenAI does."""
from __future__ import annotations

import base64
import math
import struct

from fastapi import APIRouter, Request

from radixserve.sampling_params import SamplingParams
from radixserve.server.dispatch import Dispatch, usage
from radixserve.server.errors import APIError
from radixserve.server.json_body import ParsedJsonRoute
from radixserve.server.openai_api import check_model, prompt_list, reject_empty
from radixserve.server.protocol import MAX_N, EmbeddingRequest
from radixserve.server.state import StateDep

router = APIRouter(route_class=ParsedJsonRoute)


def _shape(vector: list[float], dimensions: int | None, encoding: str) -> list[float] | str:
    if dimensions is not None:
        vector = vector[:dimensions]
        norm = math.sqrt(sum(x * x for x in vector)) or 1.0
        vector = [x / norm for x in vector]
    if encoding == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return vector


@router.post("/v1/embeddings")
async def embeddings(req: EmbeddingRequest, raw: Request, state: StateDep) -> dict:
    lora = check_model(state, req.model)
    prompts = prompt_list(req.input, "input")
    reject_empty(prompts, "input")
    if len(prompts) > MAX_N:
        raise APIError(400, f"input must hold at most {MAX_N} prompts, got {len(prompts)}", "input")
    params = SamplingParams(max_tokens=1, embed=True, truncate_prompt_tokens=req.truncate_prompt_tokens)
    d = Dispatch(state.frontend, prompts, params, 1, False, {"prompt": "input"}, lora=lora)
    choices = await d.collect(raw)
    data = []
    for c in choices:
        vector = c.embedding or []
        if req.dimensions is not None and req.dimensions > len(vector):
            raise APIError(400, f"dimensions must be at most the model's {len(vector)}", "dimensions")
        data.append({"object": "embedding", "index": c.index,
                     "embedding": _shape(vector, req.dimensions, req.encoding_format)})
    use = usage(choices, 1)
    return {"object": "list", "data": data, "model": lora or state.model_name,
            "usage": {"prompt_tokens": use["prompt_tokens"], "total_tokens": use["prompt_tokens"]}}
