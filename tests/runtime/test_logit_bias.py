"""`logit_bias` and `min_tokens` against transformers' own processors (`sequence_bias`,
`min_new_tokens`), greedy in float32, with overlap on and off; and the offline API's errors."""
from __future__ import annotations

import pytest
import torch

from radixserve import LLM, SamplingParams
from radixserve.testing import EOS_IDS
from tests.runtime.helpers import random_prompts

MAX_NEW = 12


@torch.inference_mode()
def hf_generate(path, prompts: list[list[int]], max_new: int, **kw) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    outs = []
    for p in prompts:
        ids = torch.tensor([p])
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                             do_sample=False, pad_token_id=0, **kw)
        outs.append(gen[0, len(p):].tolist())
    return outs


@pytest.fixture(scope="module")
def path(tiny_ckpts):
    return tiny_ckpts["qwen3"]


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(4, [5, 40, 17, 90], 300, seed=31)


@pytest.mark.parametrize("overlap", [True, False])
def test_logit_bias_matches_transformers_sequence_bias(path, prompts, overlap) -> None:
    plain = hf_generate(path, prompts, MAX_NEW, eos_token_id=None)
    # ban the first prompt's greedy first token, favour one token, disfavour another
    bias = {plain[0][0]: -100.0, 77: 3.5, plain[1][2]: -2.0}
    want = hf_generate(path, prompts, MAX_NEW, eos_token_id=None,
                       sequence_bias={(t,): b for t, b in bias.items()})
    assert want != plain and all(plain[0][0] not in w for w in want)
    llm = LLM(str(path), dtype="float32", device="cpu", overlap=overlap)
    sp = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True, logit_bias=bias)
    assert [r.token_ids for r in llm.generate(prompts, sp)] == want
    # string keys, as JSON sends them, are the same bias
    sp_str = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True,
                            logit_bias={str(t): b for t, b in bias.items()})
    assert [r.token_ids for r in llm.generate(prompts, sp_str)] == want


@pytest.mark.parametrize("overlap", [True, False])
def test_min_tokens_holds_back_eos_and_stop_tokens_as_transformers(path, prompts, overlap) -> None:
    llm = LLM(str(path), dtype="float32", device="cpu", overlap=overlap)
    eos = EOS_IDS[0]
    # EOS favoured so strongly that only min_tokens keeps the reply going: it ends right after
    want = hf_generate(path, prompts, MAX_NEW, eos_token_id=list(EOS_IDS), min_new_tokens=5,
                       sequence_bias={(eos,): 50.0})
    sp = SamplingParams(max_tokens=MAX_NEW, logit_bias={eos: 50.0}, min_tokens=5)
    got = llm.generate(prompts, sp)
    assert [r.token_ids for r in got] == want
    assert all(len(r.token_ids) == 6 and r.token_ids[-1] == eos and r.finish_reason == "stop"
               for r in got)
    # a stop token id, held back the same way
    want = hf_generate(path, prompts, MAX_NEW, eos_token_id=[*EOS_IDS, 77], min_new_tokens=3,
                       sequence_bias={(77,): 50.0})
    sp = SamplingParams(max_tokens=MAX_NEW, logit_bias={77: 50.0}, min_tokens=3, stop_token_ids=[77])
    got = llm.generate(prompts, sp)
    assert [r.token_ids for r in got] == want and all(len(r.token_ids) == 4 for r in got)


def test_min_tokens_holds_back_stop_strings(path) -> None:
    llm = LLM(str(path), dtype="float32", device="cpu")
    prompt = random_prompts(1, [12], 300, seed=32)[0]
    full = llm.generate([prompt], SamplingParams(max_tokens=MAX_NEW, ignore_eos=True))[0]
    stop = llm.tokenizer.decode(full.token_ids[1:2])  # the text of the second token
    assert stop.strip() and stop in full.text
    early = llm.generate([prompt], SamplingParams(max_tokens=MAX_NEW, ignore_eos=True,
                                                  stop=[stop]))[0]
    assert early.finish_reason == "stop" and len(early.token_ids) < MAX_NEW
    held = llm.generate([prompt], SamplingParams(max_tokens=MAX_NEW, ignore_eos=True, stop=[stop],
                                                 min_tokens=6))[0]
    # the early stop string is passed over (it may still end the reply from token 6 on)
    assert len(held.token_ids) >= 6 and held.token_ids[:6] == full.token_ids[:6]
    assert stop in held.text


def test_offline_errors_name_the_field(path) -> None:
    llm = LLM(str(path), dtype="float32", device="cpu")
    with pytest.raises(ValueError, match="logit_bias: token ids must be in"):
        llm.generate([[5, 6]], SamplingParams(logit_bias={10**6: 1.0}))
    with pytest.raises(ValueError, match="^logit_bias values"):
        SamplingParams(logit_bias={5: -101.0})
    with pytest.raises(ValueError, match="^logit_bias keys"):
        SamplingParams(logit_bias={"x5": 1.0})
    with pytest.raises(ValueError, match="^min_tokens"):
        SamplingParams(max_tokens=3, min_tokens=4)
    with pytest.raises(ValueError, match="^min_tokens cannot be combined with regex"):
        SamplingParams(min_tokens=2, regex="a+")
