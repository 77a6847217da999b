"""Request bodies of the OpenAI-compatible and native endpoints, validated once at the edge.

Strict types (no `"5"` for 5, no `"yes"` for true), bounded integers (so nothing overflows msgpack or
the engine), finite floats and valid Unicode (no lone surrogates): a body either validates whole or
is rejected with a 400 before anything is queued. Unknown fields of the OpenAI routes are accepted
and ignored, as OpenAI's clients send fields this server lacks.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from radixserve.sampling_params import MAX_LOGIT_BIAS

MAX_INT32 = 2**31 - 1
MAX_SEED = 2**62  # seed + choice index must stay a valid 64-bit seed
MAX_N = 64
MAX_PROMPTS = 64
MAX_STOP = 16
MAX_LOGPROBS = 20
MAX_TOOLS = 128
MAX_GRAMMAR_CHARS = 1 << 16  # a regex or EBNF grammar; JSON schemas are bounded by the body size


def _unicode(s: str) -> str:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text (it contains a lone surrogate)") from None
    return s


Text = Annotated[str, AfterValidator(_unicode)]
StopString = Annotated[str, Field(min_length=1), AfterValidator(_unicode)]
Prompt = StopString  # a prompt is never empty either
TokenId = Annotated[int, Field(ge=0, le=MAX_INT32)]
Stop = StopString | Annotated[list[StopString], Field(max_length=MAX_STOP)] | None
# OpenAI's rule for function and schema names
Name = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")]
Grammar = Annotated[str, Field(min_length=1, max_length=MAX_GRAMMAR_CHARS), AfterValidator(_unicode)]
FormatType = Literal["text", "json_object", "json_schema"]  # response_format / text.format
ToolChoiceMode = Literal["none", "auto", "required"]
ItemStatus = Literal["in_progress", "completed", "incomplete"]  # a Responses item's


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="allow")


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: every chunk carries the usage so far


class SamplingFields(_Strict):
    model: Text | None = None
    # SGLang's field: the LoRA adapter to run with, beside `model` (what a gateway that knows only
    # the base model's name, the SGLang model gateway, passes through unchanged)
    lora_path: Text | None = None
    max_tokens: int | None = Field(None, ge=1, le=MAX_INT32)
    temperature: float = Field(1.0, ge=0.0, le=100.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1, le=MAX_INT32)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(1.0, gt=0.0, le=2.0)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    stop: Stop = None
    stop_token_ids: list[TokenId] | None = Field(None, max_length=1024)
    ignore_eos: bool = False
    logit_bias: dict[str, float] | None = Field(None, max_length=MAX_LOGIT_BIAS)  # "token id": bias
    min_tokens: int = Field(0, ge=0, le=MAX_INT32)  # vLLM's: no EOS, stop token or string before
    priority: int = Field(0, ge=-MAX_INT32 - 1, le=MAX_INT32)  # vLLM's: lower is admitted first
    skip_special_tokens: bool = True  # vLLM's: False keeps EOS and chat markers in the text
    truncate_prompt_tokens: int | None = Field(None, ge=1, le=MAX_INT32)  # vLLM's: the last N
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None


class TextPart(_Strict):
    type: Text
    text: Text | None = None


class JsonSchemaFormat(_Strict):
    name: Name
    schema_: dict[str, Any] | None = Field(None, alias="schema")  # None: any JSON object
    strict: bool | None = None  # the schema is always enforced
    description: Text | None = None


class ResponseFormat(_Strict):
    type: FormatType
    json_schema: JsonSchemaFormat | None = None


class ConstraintFields(_Strict):
    """Structured output: OpenAI's `response_format`, SGLang's `regex` and `ebnf`; at most one."""

    response_format: ResponseFormat | None = None
    regex: Grammar | None = None
    ebnf: Grammar | None = None


class FunctionCall(_Strict):
    name: Text
    arguments: Text  # JSON text, as OpenAI sends it


class ToolCall(_Strict):
    id: Text
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: Text | list[TextPart] | None = None
    name: Text | None = None
    tool_calls: list[ToolCall] | None = None  # assistant only
    tool_call_id: Text | None = None  # tool only
    reasoning_content: Text | None = None  # assistant only: its thinking, as a reply gave it


class FunctionDefinition(_Strict):
    name: Name
    description: Text | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; None: no parameters
    strict: bool | None = None  # the schema is always enforced when the call is


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: Text


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = ToolChoiceMode | NamedToolChoice


class ChatCompletionRequest(SamplingFields, ConstraintFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_INT32)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[Tool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None  # None: "auto" with tools, else "none"
    parallel_tool_calls: bool = True
    # vLLM's chat template options: a reply that continues the last (assistant) message, and
    # variables for the template (Qwen3's enable_thinking)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None


# one prompt or several: text, token ids, or a list of either
Prompts = (Prompt | Annotated[list[Prompt], Field(min_length=1, max_length=MAX_PROMPTS)]
           | Annotated[list[TokenId], Field(min_length=1)]
           | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1, max_length=MAX_PROMPTS)])


class CompletionRequest(SamplingFields, ConstraintFields):
    prompt: Prompts
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False  # the prompt before the completion (and its logprobs, with logprobs)


class GenerateSampling(_Strict):
    """`/generate`'s `sampling_params`: the fields of `SamplingParams`, with its defaults."""

    model_config = ConfigDict(extra="forbid")

    max_tokens: int = Field(16, ge=1, le=MAX_INT32)
    temperature: float = Field(0.0, ge=0.0, le=100.0)
    top_k: int = Field(-1, ge=-1, le=MAX_INT32)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    ignore_eos: bool = False
    stop: Stop = None
    stop_token_ids: list[TokenId] = Field(default_factory=list, max_length=1024)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(1.0, gt=0.0, le=2.0)
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    logit_bias: dict[str, float] = Field(default_factory=dict, max_length=MAX_LOGIT_BIAS)
    min_tokens: int = Field(0, ge=0, le=MAX_INT32)
    priority: int = Field(0, ge=-MAX_INT32 - 1, le=MAX_INT32)
    skip_special_tokens: bool = True
    truncate_prompt_tokens: int | None = Field(None, ge=1, le=MAX_INT32)
    json_schema: Annotated[str, Field(min_length=1), AfterValidator(_unicode)] | None = None  # JSON text
    regex: Grammar | None = None
    ebnf: Grammar | None = None


class GenerateRequest(_Strict):
    """Native `/generate`: text or token ids in, token ids and text out."""

    model_config = ConfigDict(extra="forbid")

    text: Prompt | None = None
    input_ids: Annotated[list[TokenId], Field(min_length=1)] | None = None
    sampling_params: GenerateSampling = Field(default_factory=GenerateSampling)
    stream: bool = False
    lora_path: Text | None = None  # SGLang's field: the name of the LoRA adapter to run with


class LoadLoRARequest(_Strict):
    """`/load_lora_adapter` (SGLang's; also vLLM's `/v1/...`): serve the PEFT adapter at
    `lora_path` (a directory the server can read) as `lora_name`. Other fields (SGLang's
    `pinned`) are accepted and ignored."""

    lora_name: Annotated[Text, Field(min_length=1, max_length=256)]
    lora_path: Annotated[Text, Field(min_length=1, max_length=4096)]


class UnloadLoRARequest(_Strict):
    """`/unload_lora_adapter` (also vLLM's `/v1/...`): stop serving adapter `lora_name`."""

    lora_name: Annotated[Text, Field(min_length=1, max_length=256)]


class TokenizeRequest(_Strict):
    """`/tokenize` (vLLM's): a text or a conversation (through the chat template) to token ids."""

    model: Text | None = None
    prompt: Prompt | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: bool = True  # a prompt: the tokenizer's BOS/EOS, as completions add them
    add_generation_prompt: bool = True  # messages: end with the assistant's turn, as chat does
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(_Strict):
    """`/detokenize` (vLLM's): token ids to text, special tokens included."""

    model: Text | None = None
    tokens: list[TokenId] = Field(max_length=1 << 20)


class EmbeddingRequest(_Strict):
    """OpenAI's `/v1/embeddings`: the prompt's last hidden state, L2-normalized."""

    model: Text | None = None
    input: Prompts
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1, le=MAX_INT32)  # the first N, renormalized (MRL)
    truncate_prompt_tokens: int | None = Field(None, ge=1, le=MAX_INT32)  # vLLM's: the last N
    user: Text | None = None


class ResponseInputText(_Strict):
    type: Literal["input_text", "output_text", "text"]
    text: Text


class ResponseInputMessage(_Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Text | list[ResponseInputText]


class ResponseFunctionCall(_Strict):
    """An earlier turn's function call, given back in `input` (as the Responses API returns it)."""

    type: Literal["function_call"]
    call_id: Text
    name: Name
    arguments: Text
    id: Text | None = None
    status: ItemStatus | None = None


class ResponseFunctionCallOutput(_Strict):
    """The caller's result of a function call, in `input`."""

    type: Literal["function_call_output"]
    call_id: Text
    output: Text
    id: Text | None = None
    status: ItemStatus | None = None


ResponseInputItem = ResponseInputMessage | ResponseFunctionCall | ResponseFunctionCallOutput


class ResponseFunctionTool(FunctionDefinition):
    """A Responses API function tool: chat's `function` definition, flattened in beside `type`."""

    type: Literal["function"]


class ResponseNamedToolChoice(_Strict):
    type: Literal["function"]
    name: Text


class ResponseTextFormat(JsonSchemaFormat):
    """`text.format`: plain text, any JSON object, or JSON following `schema` (the fields of
    chat's `response_format.json_schema`, flattened in beside `type`)."""

    type: FormatType
    name: Name | None = None


class ResponseText(_Strict):
    format: ResponseTextFormat | None = None


class ResponsesRequest(_Strict):
    """OpenAI's `/v1/responses`, for text (server/responses_api.py)."""

    model: Text | None = None
    input: Text | list[ResponseInputItem] = Field(min_length=1)
    instructions: Text | None = None
    max_output_tokens: int | None = Field(None, ge=1, le=MAX_INT32)
    temperature: float | None = Field(None, ge=0.0, le=100.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stream: bool = False
    store: bool = True  # OpenAI's default; this server stores nothing (see the module's note)
    metadata: dict[str, Text] | None = Field(None, max_length=16)
    text: ResponseText | None = None
    tools: list[ResponseFunctionTool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: ToolChoiceMode | ResponseNamedToolChoice | None = None
    parallel_tool_calls: bool = True
    # refused when set: they need stored state
    previous_response_id: Text | None = None
    conversation: Any = None
    background: bool = False
