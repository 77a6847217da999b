"""On CPU the default prefill chunk is small: a long prompt arriving beside running streams is
prefilled over several steps, each step gives every stream exactly one token, and no attention
call in those steps holds more scores than one chunk over the prompt's own length."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch.nn.functional as F

from radixserve import SamplingParams
from radixserve.config import EngineConfig, SchedulerConfig, add_engine_args, configs_from_args
from radixserve.scheduler.scheduler import Scheduler
from tests.runtime.helpers import drain, random_prompts, spy_batches

STREAMS = 8
LONG = 2000  # prompt tokens: four chunks of at most 512 (minus the streams' decode tokens)


@pytest.fixture(scope="module")
def long_context_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from radixserve.testing import write_tiny_checkpoint

    return write_tiny_checkpoint("llama", tmp_path_factory.mktemp("ckpt4k") / "llama",
                                 max_position_embeddings=4096)


def test_prefill_length_defaults_by_device() -> None:
    assert SchedulerConfig().prefill_length("cpu") == 512
    assert SchedulerConfig().prefill_length("cuda") == 8192  # the GPU default, as measured
    assert SchedulerConfig(max_prefill_length=100).prefill_length("cpu") == 100
    assert SchedulerConfig(max_prefill_length=100).prefill_length("cuda") == 100
    p = argparse.ArgumentParser()
    add_engine_args(p)
    assert configs_from_args(p.parse_args([]))[1].max_prefill_length is None
    assert configs_from_args(p.parse_args(["--max-prefill-length", "64"]))[1].max_prefill_length == 64
    with pytest.raises(ValueError, match="max_prefill_length"):
        SchedulerConfig(max_prefill_length=0)


def test_streams_get_a_token_every_step_while_a_long_prompt_prefills(
    long_context_ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = Scheduler(EngineConfig(model=str(long_context_ckpt), dtype="float32", device="cpu"),
                  SchedulerConfig(max_running_requests=16, overlap=False))
    assert s.prefill_length == 512  # the CPU default: nothing asked for
    stream_sp = SamplingParams(max_tokens=200, ignore_eos=True)
    for uid, prompt in enumerate(random_prompts(STREAMS, [20, 35], 300, seed=3)):
        s.add_request(uid, prompt, stream_sp)
    emitted: dict[int, int] = dict.fromkeys(range(STREAMS), 0)
    while min(emitted.values()) == 0:
        for o in s.step():
            emitted[o.uid] += 1

    batches = spy_batches(monkeypatch)
    hq = s.engine.attn_cfg.num_qo_heads
    scores: list[int] = []
    real = F.scaled_dot_product_attention

    def spy(query, key, value, *args, **kwargs):
        scores.append(query.shape[:-1].numel() * key.shape[-2])
        return real(query, key, value, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    long_uid = STREAMS
    s.add_request(long_uid, random_prompts(1, [LONG], 300, seed=4)[0],
                  SamplingParams(max_tokens=4, ignore_eos=True))
    per_step: list[dict[int, int]] = []  # tokens each request got in each step
    while not per_step or long_uid not in per_step[-1]:
        counts: dict[int, int] = {}
        for o in s.step():
            counts[o.uid] = counts.get(o.uid, 0) + 1
        per_step.append(counts)

    prefill_batches = [ext for ext, done, decode in batches if not decode and not all(done)]
    assert len(prefill_batches) >= 4, "the long prompt went in fewer than four chunks"
    assert all(sum(ext) <= 512 for ext, _, _ in batches)
    assert len(per_step) == len(prefill_batches)
    for step, counts in enumerate(per_step):
        streams = {uid: counts.get(uid, 0) for uid in range(STREAMS)}
        assert streams == dict.fromkeys(range(STREAMS), 1), f"step {step}: {streams}"
    # attention scratch: one chunk over the prompt's own keys at most, never the batch's rows
    assert max(scores) <= hq * 512 * LONG
    monkeypatch.undo()
    drain(s)
