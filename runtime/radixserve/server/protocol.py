"""Request bodies of the OpenAI-compatible and native endpoints, validated once at the edge.

Strict types (no `"5"` for 5, no `"yes"` for true), bounded integers (so nothing overflows msgpack or
the engine), finite floats and valid Unicode (no lone surrogates): a body either validates whole or
is rejected with a 400 before anything is queued. Unknown fields of the OpenAI routes are accepted
and ignored, as OpenAI's clients send fields this server lacks, but for other servers' fields this
one cannot honour (server/extensions.py refuses them).
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, Field, Tag

from radixserve.sampling_params import BOUNDS, MAX_LOGIT_BIAS, MAX_TOKEN_ID

MAX_INT32 = MAX_TOKEN_ID
MAX_SEED = 2**62  # seed + choice index must stay a valid 64-bit seed
MAX_N = 64
MAX_PROMPTS = 64
MAX_STOP = 16
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
    max_tokens: int | None = Field(None, **BOUNDS["max_tokens"].pydantic())
    temperature: float = Field(1.0, **BOUNDS["temperature"].pydantic())
    top_p: float = Field(1.0, **BOUNDS["top_p"].pydantic())
    top_k: int = Field(-1, **BOUNDS["top_k"].pydantic())
    min_p: float = Field(0.0, **BOUNDS["min_p"].pydantic())
    presence_penalty: float = Field(0.0, **BOUNDS["presence_penalty"].pydantic())
    frequency_penalty: float = Field(0.0, **BOUNDS["frequency_penalty"].pydantic())
    repetition_penalty: float = Field(1.0, **BOUNDS["repetition_penalty"].pydantic())
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    stop: Stop = None
    stop_token_ids: list[TokenId] | None = Field(None, max_length=1024)
    ignore_eos: bool = False
    logit_bias: dict[str, float] | None = Field(None, max_length=MAX_LOGIT_BIAS)  # "token id": bias
    min_tokens: int = Field(0, **BOUNDS["min_tokens"].pydantic())  # vLLM's: no EOS, stop token or string before
    priority: int = Field(0, **BOUNDS["priority"].pydantic())  # vLLM's: lower is admitted first
    skip_special_tokens: bool = True  # vLLM's: False keeps EOS and chat markers in the text
    truncate_prompt_tokens: int | None = Field(None, **BOUNDS["truncate_prompt_tokens"].pydantic())  # vLLM's: the last N
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


JsonSchemaText = Annotated[str, Field(min_length=1), AfterValidator(_unicode)]  # a schema as JSON text
Choices = Annotated[list[Text], Field(min_length=1, max_length=1024)]


class StructuredOutputs(_Strict):
    """vLLM's `structured_outputs`: one constraint of `json`, `regex`, `choice`, `grammar`,
    `json_object`. Its options that this server's grammars already follow are accepted; a key it
    does not know (or cannot honour: `structural_tag`, `whitespace_pattern`) is a 400."""

    model_config = ConfigDict(extra="forbid")

    json_: dict[str, Any] | JsonSchemaText | None = Field(None, alias="json")
    regex: Grammar | None = None
    choice: Choices | None = None
    grammar: Grammar | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False  # (JSON output here never has free whitespace)
    disable_fallback: bool = False  # (one grammar backend: nothing to fall back to)
    disable_additional_properties: Literal[False] = False
    whitespace_pattern: None = None
    structural_tag: None = None


class ConstraintFields(_Strict):
    """Structured output: OpenAI's `response_format`, SGLang's `regex`, `ebnf` and `json_schema`
    (JSON text), vLLM's `structured_outputs` and its older `guided_*` fields; at most one."""

    response_format: ResponseFormat | None = None
    regex: Grammar | None = None
    ebnf: Grammar | None = None
    json_schema: JsonSchemaText | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | JsonSchemaText | None = None
    guided_regex: Grammar | None = None
    guided_choice: Choices | None = None
    guided_grammar: Grammar | None = None
    guided_decoding_backend: Literal["auto", "xgrammar"] | None = None  # the one backend here
    guided_whitespace_pattern: None = None


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
    max_completion_tokens: int | None = Field(None, **BOUNDS["max_tokens"].pydantic())
    logprobs: bool = False
    top_logprobs: int | None = Field(None, **BOUNDS["logprobs"].pydantic())
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
    logprobs: int | None = Field(None, **BOUNDS["logprobs"].pydantic())
    echo: bool = False  # the prompt before the completion (and its logprobs, with logprobs)


class GenerateSampling(_Strict):
    """`/generate`'s `sampling_params`: the fields of `SamplingParams`, with its defaults, or
    SGLang's names for them (`max_new_tokens`, `min_new_tokens`, `sampling_seed`; a gateway
    built for SGLang sends those). SGLang's options this server cannot honour are accepted only
    at the value that changes nothing."""

    model_config = ConfigDict(extra="forbid")

    max_tokens: int | None = Field(None, **BOUNDS["max_tokens"].pydantic())  # None: 16
    temperature: float = Field(0.0, **BOUNDS["temperature"].pydantic())
    top_k: int = Field(-1, **BOUNDS["top_k"].pydantic())
    top_p: float = Field(1.0, **BOUNDS["top_p"].pydantic())
    min_p: float = Field(0.0, **BOUNDS["min_p"].pydantic())
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    ignore_eos: bool = False
    stop: Stop = None
    stop_token_ids: list[TokenId] = Field(default_factory=list, max_length=1024)
    presence_penalty: float = Field(0.0, **BOUNDS["presence_penalty"].pydantic())
    frequency_penalty: float = Field(0.0, **BOUNDS["frequency_penalty"].pydantic())
    repetition_penalty: float = Field(1.0, **BOUNDS["repetition_penalty"].pydantic())
    logprobs: int | None = Field(None, **BOUNDS["logprobs"].pydantic())
    logit_bias: dict[str, float] = Field(default_factory=dict, max_length=MAX_LOGIT_BIAS)
    min_tokens: int = Field(0, **BOUNDS["min_tokens"].pydantic())
    priority: int = Field(0, **BOUNDS["priority"].pydantic())
    skip_special_tokens: bool = True
    truncate_prompt_tokens: int | None = Field(None, **BOUNDS["truncate_prompt_tokens"].pydantic())
    json_schema: Annotated[str, Field(min_length=1), AfterValidator(_unicode)] | None = None  # JSON text
    regex: Grammar | None = None
    ebnf: Grammar | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    # SGLang's names
    max_new_tokens: int | None = Field(None, **BOUNDS["max_tokens"].pydantic())
    min_new_tokens: int | None = Field(None, **BOUNDS["min_tokens"].pydantic())
    sampling_seed: int | None = Field(None, ge=0, le=MAX_SEED)
    stream_interval: int | None = Field(None, ge=1)  # (every token is streamed)
    # refused unless at the value that changes nothing (server/extensions.py)
    spaces_between_special_tokens: bool | None = None
    no_stop_trim: bool | None = None
    stop_regex: Text | list[Text] | None = None
    structural_tag: Any = None
    custom_params: dict[str, Any] | None = None


class GenerateRequest(_Strict):
    """Native `/generate`: text or token ids in, token ids and text out; SGLang's request fields
    beside them."""

    model_config = ConfigDict(extra="forbid")

    # one prompt, or a batch of them (SGLang's: the answer is then a list)
    text: Prompt | Annotated[list[Prompt], Field(min_length=1, max_length=MAX_PROMPTS)] | None = None
    input_ids: (Annotated[list[TokenId], Field(min_length=1)]
                | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1, max_length=MAX_PROMPTS)]
                | None) = None
    sampling_params: GenerateSampling = Field(default_factory=GenerateSampling)
    stream: bool = False
    model: Text | None = None
    lora_path: Text | None = None  # SGLang's field: the name of the LoRA adapter to run with
    rid: Annotated[str, Field(max_length=128), AfterValidator(_unicode)] | None = None  # meta_info.id
    return_text_in_logprobs: bool = False
    # refused unless at the value that changes nothing (server/extensions.py)
    return_logprob: bool | None = None
    top_logprobs_num: int | None = None
    logprob_start_len: int | None = None
    return_hidden_states: bool | None = None
    session_params: dict[str, Any] | None = None
    custom_logit_processor: Text | None = None
    image_data: Any = None


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
    truncate_prompt_tokens: int | None = Field(None, **BOUNDS["truncate_prompt_tokens"].pydantic())  # vLLM's: the last N
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


class ReasoningText(_Strict):
    type: Literal["reasoning_text", "summary_text"]
    text: Text


class ResponseReasoningItem(_Strict):
    """An earlier turn's `reasoning` item, given back in `input` (as a response returned it): its
    text is the next assistant turn's thinking. `encrypted_content` is another server's and stays
    unread."""

    type: Literal["reasoning"]
    id: Text | None = None
    summary: list[ReasoningText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: Text | None = None
    status: ItemStatus | None = None


def _item_type(item: Any) -> str | None:
    """The item's `type`: a message may leave it out (OpenAI's short form `{"role", "content"}`)."""
    if isinstance(item, dict):
        return item.get("type", "message")
    return getattr(item, "type", None)


# tagged by `type`, so an item of another type is refused naming the types this server takes
ResponseInputItem = Annotated[
    Annotated[ResponseInputMessage, Tag("message")] | Annotated[ResponseFunctionCall, Tag("function_call")]
    | Annotated[ResponseFunctionCallOutput, Tag("function_call_output")]
    | Annotated[ResponseReasoningItem, Tag("reasoning")],
    Discriminator(_item_type, custom_error_type="invalid_item",
                  custom_error_message="the item's type must be message, function_call, function_call_output "
                                       "or reasoning (this server stores nothing an item_reference could name)")]


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
    max_output_tokens: int | None = Field(None, **BOUNDS["max_tokens"].pydantic())
    temperature: float | None = Field(None, **BOUNDS["temperature"].pydantic())
    top_p: float | None = Field(None, **BOUNDS["top_p"].pydantic())
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
