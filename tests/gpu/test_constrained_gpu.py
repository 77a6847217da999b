"""Grammar-constrained decoding on the GPU with decode CUDA graphs and overlap scheduling on (the
mask is filled on the host while the forward runs, applied by xgrammar's Triton kernel to the
graph's logits): every constrained output obeys its grammar (an independent xgrammar matcher
checks each token), unconstrained neighbours keep their greedy tokens, overlap on and off agree,
and the embedded SmolLM2 answers bounded schemas with JSON that validates."""
from __future__ import annotations

import json

import jsonschema
import pytest

from radixserve.sampling_params import SamplingParams
from tests.gpu.helpers import GRAPH_BACKENDS, NEEDS_EMBEDDED
from tests.runtime.helpers import random_prompts
from tests.runtime.test_constrained import GRAMMARS, assert_follows, drain
from tests.runtime.test_constrained_embedded import SCHEMAS

pytestmark = pytest.mark.gpu


def _scheduler(path, overlap: bool, dtype: str = "float32", attn: str = "triton", **sched):
    from radixserve.config import EngineConfig, SchedulerConfig
    from radixserve.scheduler.scheduler import Scheduler

    eng = EngineConfig(model=str(path) if path else None, dtype=dtype, device="cuda",
                       page_size=16, attn=attn)
    s = Scheduler(eng, SchedulerConfig(**{"max_running_requests": 16, "overlap": overlap, **sched}))
    assert s.engine.graph_runner is not None and s.overlap == overlap
    return s


def _run(s, prompts, params) -> dict[int, list]:
    for u, (p, sp) in enumerate(zip(prompts, params)):
        if sp is not None:
            s.add_request(u, p, sp)
    return drain(s)


@pytest.mark.parametrize("attn", GRAPH_BACKENDS)
def test_mixed_batches_with_graphs_and_overlap_fp32(tiny_ckpts_hd64, attn) -> None:
    path = tiny_ckpts_hd64["qwen3_moe"]
    prompts = random_prompts(16, [3, 50, 9, 120, 1, 33], 300, seed=17)
    plain = SamplingParams(max_tokens=20, ignore_eos=True)
    constrained = {u: SamplingParams(max_tokens=32, **dict([GRAMMARS[u % 3]]))
                   for u in range(1, 16, 2)}
    ref = _run(_scheduler(path, True, attn=attn), prompts,
               [None if u in constrained else plain for u in range(16)])
    runs = {}
    for overlap in (True, False):
        out = _run(_scheduler(path, overlap, attn=attn), prompts,
                   [constrained.get(u, plain) for u in range(16)])
        runs[overlap] = {u: [o.token_id for o in outs] for u, outs in out.items()}
        for u, outs in out.items():
            if u in constrained:
                assert_follows(path, *constrained[u].grammar, runs[overlap][u],
                               outs[-1].finish_reason)
            else:
                assert runs[overlap][u] == [o.token_id for o in ref[u]], u
    assert runs[True] == runs[False]


def test_bf16_sampled_constrained_requests_obey(tiny_ckpts_hd64) -> None:
    path = tiny_ckpts_hd64["qwen3"]
    prompts = random_prompts(24, [4, 60, 17], 300, seed=19)
    params = [SamplingParams(max_tokens=40, temperature=1.0, top_p=0.95, seed=u, logprobs=2,
                             **dict([GRAMMARS[u % 3]])) for u in range(24)]
    out = _run(_scheduler(path, True, dtype="bfloat16"), prompts, params)
    for u, outs in out.items():
        assert_follows(path, *params[u].grammar, [o.token_id for o in outs],
                       outs[-1].finish_reason)


@NEEDS_EMBEDDED
def test_embedded_schemas_validate_on_gpu() -> None:
    from transformers import AutoTokenizer

    s = _scheduler(None, True, dtype="bfloat16")
    tok = AutoTokenizer.from_pretrained(s.model_path)
    prompts, params = [], []
    for question, schema in SCHEMAS:
        text = tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                       add_generation_prompt=True)
        ids = tok.encode(text, add_special_tokens=False)
        for _ in range(2):  # n = 2
            prompts.append(list(ids))
            params.append(SamplingParams(max_tokens=96, json_schema=json.dumps(schema)))
    for warm in range(2):  # the second pass meets a warm radix cache
        out = _run(s, prompts, params)
        for u, outs in out.items():
            toks = [o.token_id for o in outs]
            assert outs[-1].finish_reason == "stop", (warm, u, tok.decode(toks))
            jsonschema.validate(json.loads(tok.decode(toks, skip_special_tokens=True)),
                                SCHEMAS[u // 2][1])
            assert_follows(s.model_path, "json_schema", params[u].json_schema, toks, "stop")
        assert s.stats()["prefix_hit_tokens"] > 0 or warm == 0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_dead_ends_and_nan_rows_fail_alone_with_graphs(tiny_ckpts_hd64, temperature) -> None:
    """On CUDA a row with nothing to sample would be a device assert that ends the process: a
    grammar refused at its start (its trial forked from this CUDA process), one dead after a
    choice, and a row of NaN logits each fail their request alone; the neighbours keep their
    tokens, with decode graphs and overlap on."""
    import json as json_

    from tests.runtime.test_constrained_bounds import ADMITS_NOTHING, DEAD_AFTER_A_CHOICE, run

    path = tiny_ckpts_hd64["qwen3"]
    prompts = random_prompts(4, [6, 9, 5, 12], 300, seed=23)
    plain = SamplingParams(max_tokens=12, ignore_eos=True, temperature=temperature, seed=1)
    alone = _scheduler(path, True)
    alone.add_request(0, prompts[0], plain)
    ref, _ = run(alone)
    s = _scheduler(path, True)
    sample = s.sampler.sample

    def poisoned(logits, reqs, store=None):  # a model that answers NaN for request 3
        for i, r in enumerate(reqs):
            if r.uid == 3:
                logits[i] = float("nan")
        return sample(logits, reqs, store)

    s.sampler.sample = poisoned
    s.add_request(0, prompts[0], plain)
    s.add_request(1, prompts[1], SamplingParams(max_tokens=8, temperature=temperature, seed=2,
                                                ebnf=DEAD_AFTER_A_CHOICE))
    kind, text = ADMITS_NOTHING[3]
    s.add_request(2, prompts[2], SamplingParams(max_tokens=8, temperature=temperature, **{kind: text}))
    s.add_request(3, prompts[3], SamplingParams(max_tokens=8, temperature=0.7, seed=4, json_schema=json_.dumps(
        {"type": "object"})))
    outs, failures = run(s)
    got = sorted((f.uid, f.param, f.status) for f in failures)
    assert got == [(1, "ebnf", 400), (2, kind, 400), (3, None, 500)], failures
    assert [o.token_id for o in outs[0]] == [o.token_id for o in ref[0]]
    s.check_integrity()
