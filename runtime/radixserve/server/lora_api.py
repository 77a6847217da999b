"""Loading and unloading LoRA adapters at run time: SGLang's `/load_lora_adapter` and
`/unload_lora_adapter`, also at vLLM's `/v1/load_lora_adapter` and `/v1/unload_lora_adapter`
(the paths vLLM's clients, the Gateway API Inference Extension's adapter syncer and AIBrix call).
Behind the API key like every route but `/health`. The scheduler does the work (every TP rank
alike) and answers: a bad adapter or name is a 400 before anything is loaded, an unknown name to
unload a 404; either way the server keeps serving what it served. `lora_path` is a directory the
server reads, or a Hugging Face hub id (fetched by this process first)."""
from __future__ import annotations

import asyncio

from fastapi import APIRouter

from radixserve.lora.source import AdapterError, resolve_adapter_dir
from radixserve.messages import LoadLoRA, LoRAReply, UnloadLoRA
from radixserve.server.errors import APIError
from radixserve.server.protocol import LoadLoRARequest, UnloadLoRARequest
from radixserve.server.state import ServerState, StateDep

router = APIRouter()


async def _change(state: ServerState, msg: LoadLoRA | UnloadLoRA) -> dict:
    reply: LoRAReply = await state.frontend.change_lora(msg)
    state.adapters = dict(reply.adapters)
    if reply.error is not None:
        raise APIError(reply.status, reply.error, "lora_path" if reply.status == 400 and
                       isinstance(msg, LoadLoRA) else "lora_name")
    # SGLang's answer; vLLM's clients read the status alone
    return {"success": True, "error_message": None, "loaded_adapters": state.adapters}


@router.post("/load_lora_adapter")
@router.post("/v1/load_lora_adapter")
async def load_lora_adapter(req: LoadLoRARequest, state: StateDep) -> dict:
    if not state.cfg.engine.lora:  # nothing fetched for a server that cannot serve it
        raise APIError(400, "LoRA adapters are not served: start with --enable-lora", "lora_path")
    if req.lora_name == state.model_name:
        raise APIError(400, f"adapter name {req.lora_name!r} is the base model's", "lora_name")
    try:  # a hub id is fetched here, off the event loop: the scheduler never waits on the network
        path = await asyncio.to_thread(resolve_adapter_dir, req.lora_path)
    except AdapterError as e:
        raise APIError(400, e.message, "lora_path") from None
    return await _change(state, LoadLoRA(state.frontend.new_uid(), req.lora_name, str(path)))


@router.post("/unload_lora_adapter")
@router.post("/v1/unload_lora_adapter")
async def unload_lora_adapter(req: UnloadLoRARequest, state: StateDep) -> dict:
    return await _change(state, UnloadLoRA(state.frontend.new_uid(), req.lora_name))
