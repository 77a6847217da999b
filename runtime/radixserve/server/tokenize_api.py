"""`/tokenize` and `/detokenize` (also under `/v1/`), as vLLM serves them: a client counts a
prompt's tokens against the context, or reads ids back as text, with the server's own tokenizer
and chat template, and nothing is generated."""
from __future__ import annotations

from fastapi import APIRouter

from radixserve.messages import TextOpMsg
from radixserve.server.errors import APIError
from radixserve.server.json_body import ParsedJsonRoute
from radixserve.server.openai_api import chat_messages, check_model, template_options
from radixserve.server.protocol import DetokenizeRequest, TokenizeRequest
from radixserve.server.state import StateDep

router = APIRouter(route_class=ParsedJsonRoute)


@router.post("/tokenize")
@router.post("/v1/tokenize")
async def tokenize(req: TokenizeRequest, state: StateDep) -> dict:
    check_model(state, req.model)
    if (req.prompt is None) == (req.messages is None):
        raise APIError(400, "give exactly one of prompt and messages", "prompt")
    chat, options = None, {}
    if req.messages is not None:
        chat = chat_messages(req.messages)
        options = template_options(req.messages, req.add_generation_prompt,
                                   req.continue_final_message, req.chat_template_kwargs)
    msg = TextOpMsg(state.frontend.new_uid(), "tokenize", text=req.prompt, chat=chat,
                    add_special_tokens=req.add_special_tokens, **options)
    tokens = (await state.frontend.text_op(msg)).tokens or []
    return {"count": len(tokens), "max_model_len": state.max_seq_len, "tokens": tokens}


@router.post("/detokenize")
@router.post("/v1/detokenize")
async def detokenize(req: DetokenizeRequest, state: StateDep) -> dict:
    check_model(state, req.model)
    msg = TextOpMsg(state.frontend.new_uid(), "detokenize", tokens=list(req.tokens))
    return {"prompt": (await state.frontend.text_op(msg)).text or ""}
