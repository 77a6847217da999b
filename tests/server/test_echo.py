"""Completions' `echo` (with and without `logprobs`), as lm-evaluation-harness calls it for
log-likelihoods: the prompt's token logprobs equal transformers' log-softmax over the same prompt;
a text prompt comes back as sent, before the completion; streaming gives the same text."""
from __future__ import annotations

import httpx
import pytest
import torch

from tests.runtime.helpers import random_prompts
from tests.server.server_process import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def _post(server, body: dict) -> dict:
    r = httpx.post(f"{server.base}/v1/completions", headers=AUTH, timeout=60,
                   json={"model": "tiny", "temperature": 0} | body)
    assert r.status_code == 200, r.text
    return r.json()


@torch.inference_mode()
def _hf_prompt_logprobs(model_dir, prompt: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    logp = torch.log_softmax(model(torch.tensor([prompt])).logits[0].float(), -1)
    return logp[:-1].gather(1, torch.tensor(prompt[1:])[:, None])[:, 0]


def test_lm_eval_loglikelihood_request(server, tiny_model, tiny_tokenizer) -> None:
    prompts = random_prompts(2, [40, 9], len(tiny_tokenizer), seed=41)
    # lm-eval's payload: token prompts, max_tokens 1, logprobs 1, echo
    out = _post(server, {"prompt": prompts, "max_tokens": 1, "logprobs": 1, "echo": True})
    for choice, prompt in zip(sorted(out["choices"], key=lambda c: c["index"]), prompts):
        lp = choice["logprobs"]
        assert len(lp["token_logprobs"]) == len(lp["tokens"]) == len(lp["top_logprobs"]) == len(prompt) + 1
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        want = _hf_prompt_logprobs(tiny_model, prompt)
        got = torch.tensor(lp["token_logprobs"][1:len(prompt)])
        assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()
        for tok_lp, top in zip(lp["token_logprobs"][1:], lp["top_logprobs"][1:]):
            assert len(top) >= 1 and max(top.values()) >= tok_lp - 1e-6
        assert lp["tokens"][:len(prompt)] == [tiny_tokenizer.decode([t]) for t in prompt]
        assert choice["text"].startswith(tiny_tokenizer.decode(prompt))
    assert out["usage"]["prompt_tokens"] == sum(map(len, prompts))


@pytest.mark.parametrize("logprobs", [None, 2])
def test_text_prompt_is_echoed_as_sent_streaming_or_not(server, logprobs) -> None:
    body = {"prompt": "The quick brown fox", "max_tokens": 8, "ignore_eos": True}
    if logprobs is not None:
        body["logprobs"] = logprobs
    plain = _post(server, body)["choices"][0]
    echoed = _post(server, body | {"echo": True})["choices"][0]
    assert echoed["text"] == "The quick brown fox" + plain["text"]
    with httpx.stream("POST", f"{server.base}/v1/completions", headers=AUTH, timeout=60,
                      json={"model": "tiny", "temperature": 0, "echo": True, "stream": True} | body) as r:
        import json

        chunks = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: {")]
    assert chunks[0]["choices"][0]["text"] == "The quick brown fox"
    assert "".join(c["choices"][0]["text"] for c in chunks) == echoed["text"]
    if logprobs is not None:
        streamed = [x for c in chunks for x in c["choices"][0]["logprobs"]["token_logprobs"]]
        assert streamed == echoed["logprobs"]["token_logprobs"]
        assert streamed[0] is None and len(streamed) > 8
