"""`/v1/responses` through the official `openai` client (tiny random llama, real processes): the
same text as the chat route for the same conversation, the event sequence a stream must have
(the SDK's own stream helper rebuilds the response from it), reasoning items, and clear 400s for
what a server that stores nothing cannot do."""
from __future__ import annotations

import openai
import pytest

from tests.server.server_process import API_KEY, ServerProcess

STORY = "Tell me a story about a fox."
EXACT = {"ignore_eos": True}  # the random model must not end early: lengths become exact


def _client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return _client(server.base)


def _events_ok(events: list) -> None:
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[1].type == "response.in_progress"


def test_text_equals_chat_and_stream_equals_non_stream(client) -> None:
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": STORY}],
                                          max_tokens=20, temperature=0, extra_body=EXACT)
    r = client.responses.create(model="tiny", input=STORY, max_output_tokens=20, temperature=0,
                                extra_body=EXACT)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.output_text == chat.choices[0].message.content
    assert [item.type for item in r.output] == ["message"]
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert (r.usage.input_tokens, r.usage.output_tokens) == (chat.usage.prompt_tokens, 20)
    assert r.usage.total_tokens == chat.usage.prompt_tokens + 20

    events = list(client.responses.create(model="tiny", input=STORY, max_output_tokens=20,
                                          temperature=0, stream=True, extra_body=EXACT))
    _events_ok(events)
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == r.output_text and len(deltas) >= 2
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.output_text == r.output_text
    assert events[-1].response.usage.output_tokens == 20
    kinds = [e.type for e in events]
    assert kinds.index("response.output_item.added") < kinds.index("response.content_part.added") \
        < kinds.index("response.output_text.delta") < kinds.index("response.output_text.done") \
        < kinds.index("response.content_part.done") < kinds.index("response.output_item.done")

    # the SDK's helper rebuilds each item from the events, asserting their order as it goes
    with client.responses.stream(model="tiny", input=STORY, max_output_tokens=20, temperature=0,
                                 extra_body=EXACT) as stream:
        helped = list(stream)
    assert helped[-1].type == "response.incomplete"
    assert helped[-1].response.output_text == r.output_text


def test_instructions_and_messages_are_the_chat_conversation(client) -> None:
    convo = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello!"},
             {"role": "user", "content": [{"type": "input_text", "text": "A fox "},
                                          {"type": "input_text", "text": "story?"}]}]
    chat = client.chat.completions.create(
        model="tiny", temperature=0, max_tokens=12, extra_body=EXACT,
        messages=[{"role": "system", "content": "Be brief."}, *convo[:2],
                  {"role": "user", "content": "A fox story?"}])
    r = client.responses.create(model="tiny", instructions="Be brief.", input=convo,
                                temperature=0, max_output_tokens=12, extra_body=EXACT)
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.instructions == "Be brief."


@pytest.mark.parametrize("field,value", [("previous_response_id", "resp_1"), ("background", True),
                                         ("conversation", "conv_1")])
def test_what_needs_stored_state_is_a_400(client, field: str, value) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="tiny", input=STORY, **{field: value})
    assert e.value.body["param"] == field


def test_bad_input_and_unknown_model(client) -> None:
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="tiny", input=[])
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="tiny", input=STORY, max_output_tokens=0)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="other", input=STORY)


def test_reasoning_parser_gives_a_reasoning_item_first(tiny_model, tmp_path) -> None:
    """deepseek_r1 reads the output as thinking until `</think>`, which the random model never
    writes: all of it is reasoning, streamed as its own item, and the message is empty."""
    srv = ServerProcess(tiny_model, tmp_path / "server.log", "--api-key", API_KEY,
                        "--served-model-name", "tiny", "--max-kv-tokens", "4096",
                        "--reasoning-parser", "deepseek_r1")
    srv.wait_ready()
    try:
        client = _client(srv.base)
        chat = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": STORY}], max_tokens=10,
            temperature=0, extra_body=EXACT)
        thinking = chat.choices[0].message.model_extra["reasoning_content"]
        r = client.responses.create(model="tiny", input=STORY, max_output_tokens=10,
                                    temperature=0, extra_body=EXACT)
        assert [item.type for item in r.output] == ["reasoning", "message"]
        assert r.output[0].content[0].text == thinking and r.output_text == ""
        events = list(client.responses.create(model="tiny", input=STORY, max_output_tokens=10,
                                              temperature=0, stream=True, extra_body=EXACT))
        _events_ok(events)
        assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == thinking
        added = [e.item.type for e in events if e.type == "response.output_item.added"]
        assert added == ["reasoning", "message"]
        assert [i.type for i in events[-1].response.output] == ["reasoning", "message"]
    finally:
        assert srv.stop() == 0, srv.log()[-3000:]


def test_a_stopped_generation_is_completed(client, server, tiny_tokenizer) -> None:
    """Stopped by a stop token (the greedy answer's third) rather than by the limit: status
    `completed`, and the SDK's helper returns the final response."""
    import httpx

    templated = tiny_tokenizer.apply_chat_template([{"role": "user", "content": STORY}],
                                                   tokenize=False, add_generation_prompt=True)
    prompt = tiny_tokenizer.encode(templated, add_special_tokens=False)
    ids = httpx.post(f"{server.base}/generate", headers={"Authorization": f"Bearer {API_KEY}"},
                     json={"input_ids": prompt, "sampling_params": {"max_tokens": 3, "temperature": 0,
                                                                    "ignore_eos": True}},
                     timeout=60).json()["output_ids"]
    stop = {"stop_token_ids": [ids[2]]}
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": STORY}],
                                          max_tokens=20, temperature=0, extra_body=stop)
    r = client.responses.create(model="tiny", input=STORY, max_output_tokens=20, temperature=0,
                                extra_body=stop)
    assert chat.choices[0].finish_reason == "stop"
    assert r.status == "completed" and r.incomplete_details is None
    assert r.output_text == chat.choices[0].message.content
    with client.responses.stream(model="tiny", input=STORY, max_output_tokens=20, temperature=0,
                                 extra_body=stop) as stream:
        final = stream.get_final_response()
    assert final.status == "completed" and final.output_text == r.output_text
