"""`/v1/embeddings` through the official `openai` client: each input's hidden state after the
final norm at its last token, L2-normalized, equal to transformers' own; `dimensions` and base64
as OpenAI sends them; a prompt in the radix cache embeds the same; 400s naming the field."""
from __future__ import annotations

import base64
import struct

import httpx
import openai
import pytest
import torch

from tests.server.server_process import API_KEY

TEXTS = ["The capital of France is", "a quick brown fox", "x"]


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base}/v1", api_key=API_KEY, max_retries=0, timeout=60)


@torch.inference_mode()
def _hf_embeddings(model_dir, ids: list[list[int]]) -> list[torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return [torch.nn.functional.normalize(
        model(torch.tensor([p]), output_hidden_states=True).hidden_states[-1][0, -1], dim=-1) for p in ids]


def test_embeddings_equal_transformers_last_hidden_state(client, tiny_model, tiny_tokenizer) -> None:
    out = client.embeddings.create(model="tiny", input=TEXTS, encoding_format="float")
    want = _hf_embeddings(tiny_model, [tiny_tokenizer.encode(t) for t in TEXTS])
    assert [d.index for d in out.data] == [0, 1, 2]
    for d, w in zip(out.data, want):
        got = torch.tensor(d.embedding)
        assert got.shape == w.shape and torch.allclose(got, w, atol=1e-5)
    assert out.usage.prompt_tokens == sum(len(tiny_tokenizer.encode(t)) for t in TEXTS)
    # again: the prompts now come from the radix cache (the last token is always computed)
    again = client.embeddings.create(model="tiny", input=TEXTS, encoding_format="float")
    assert all(torch.allclose(torch.tensor(a.embedding), torch.tensor(b.embedding), atol=1e-6)
               for a, b in zip(again.data, out.data))


def test_dimensions_and_base64(server, client) -> None:
    full = torch.tensor(client.embeddings.create(model="tiny", input=TEXTS[0], encoding_format="float").data[0].embedding)
    r = httpx.post(f"{server.base}/v1/embeddings", headers={"Authorization": f"Bearer {API_KEY}"},
                   json={"input": [TEXTS[1], TEXTS[0]], "dimensions": 16, "encoding_format": "base64"},
                   timeout=60).json()
    vec = torch.tensor(struct.unpack("<16f", base64.b64decode(r["data"][1]["embedding"])))
    assert torch.allclose(vec, torch.nn.functional.normalize(full[:16], dim=-1), atol=1e-5)
    assert len(r["data"]) == 2 and r["usage"]["prompt_tokens"] == r["usage"]["total_tokens"]


@pytest.mark.parametrize("body,param", [
    ({"input": ""}, "input"),
    ({"input": [[5, 6], []]}, "input.1"),
    ({"input": "x", "dimensions": 10**6}, "dimensions"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "x", "model": "nope"}, "model"),
])
def test_bad_requests_name_the_field(server, body, param) -> None:
    r = httpx.post(f"{server.base}/v1/embeddings", headers={"Authorization": f"Bearer {API_KEY}"},
                   json=body, timeout=60)
    assert r.status_code in (400, 404), r.text
    assert r.json()["error"]["param"] == param


def test_an_input_of_the_whole_context_is_embedded(server, client, tiny_model) -> None:
    """No completion token is reserved for an embedding: the context's length fits, one more not."""
    context = client.models.list().data[0].model_extra["max_model_len"]
    ids = [(7 * i) % 300 + 3 for i in range(context)]
    out = client.embeddings.create(model="tiny", input=[ids], encoding_format="float")
    assert torch.allclose(torch.tensor(out.data[0].embedding), _hf_embeddings(tiny_model, [ids])[0], atol=1e-4)
    assert out.usage.prompt_tokens == context
    r = httpx.post(f"{server.base}/v1/embeddings", headers={"Authorization": f"Bearer {API_KEY}"},
                   json={"input": [ids + [5]]}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "input", err
    assert f"has {context + 1} tokens" in err["message"], err
