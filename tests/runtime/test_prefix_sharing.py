"""The radix cache shares a prompt's KV while its request still runs: a request arriving later
reuses it at once; requests arriving together with one system prompt compute it once (the others
wait for it); prompts sharing less than that run side by side, their duplicate pages freed. The
tokens are always those of the naive cache, and the books balance."""
from __future__ import annotations

import pytest

from radixserve.config import EngineConfig, SchedulerConfig
from radixserve.sampling_params import SamplingParams
from radixserve.scheduler.scheduler import Scheduler
from tests.runtime.helpers import drain, random_prompts


def make(path, cache: str, page_size: int, **sched) -> Scheduler:
    eng = EngineConfig(model=str(path), dtype="float32", device="cpu", page_size=page_size)
    return Scheduler(eng, SchedulerConfig(cache=cache, **{"max_running_requests": 32, **sched}))


def tokens(out: dict[int, list]) -> dict[int, list[int]]:
    return {uid: [o.token_id for o in outs] for uid, outs in out.items()}


@pytest.fixture(scope="module")
def path(tiny_ckpts):
    return tiny_ckpts["qwen3"]


@pytest.mark.parametrize("page_size", [1, 16])
def test_requests_arriving_together_compute_the_system_prompt_once(path, page_size) -> None:
    system = random_prompts(1, [300], 300, seed=21)[0]
    suffixes = random_prompts(16, [5, 23, 40, 1, 12], 300, seed=22)
    prompts = [system + s for s in suffixes]
    sp = SamplingParams(max_tokens=6, ignore_eos=True)
    runs = {}
    for cache in ("radix", "naive"):
        s = make(path, cache, page_size, max_prefill_length=1024)
        for uid, p in enumerate(prompts):
            s.add_request(uid, p, sp)
        runs[cache] = (tokens(drain(s)), s.stats()["prefill_tokens"])
    assert runs["radix"][0] == runs["naive"][0]
    assert runs["naive"][1] == sum(map(len, prompts))
    # the system prompt once, then each suffix (plus the tail of the prompt's last page)
    assert runs["radix"][1] <= len(system) + sum(len(x) + page_size for x in suffixes)


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_running_request_shares_its_prompt_before_it_ends(path, page_size) -> None:
    first = random_prompts(1, [200], 300, seed=23)[0]
    s = make(path, "radix", page_size)
    s.add_request(0, first, SamplingParams(max_tokens=40, ignore_eos=True))
    out: dict[int, list[int]] = {0: [], 1: []}
    while len(out[0]) < 3:  # request 0 is decoding, far from done
        for o in s.step():
            out[o.uid].append(o.token_id)
    hits = s.stats()["prefix_hit_tokens"]
    s.add_request(1, first + [7, 8, 9], SamplingParams(max_tokens=5, ignore_eos=True))
    for uid, outs in drain(s).items():
        out[uid] += [o.token_id for o in outs]
    assert s.stats()["prefix_hit_tokens"] - hits == len(first) // page_size * page_size
    cold = make(path, "naive", page_size)
    cold.add_request(0, first, SamplingParams(max_tokens=40, ignore_eos=True))
    cold.add_request(1, first + [7, 8, 9], SamplingParams(max_tokens=5, ignore_eos=True))
    assert out == tokens(drain(cold))


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("overlap", [True, False])
def test_short_shared_prefixes_run_together_and_free_their_duplicates(path, page_size,
                                                                      overlap) -> None:
    # 20 shared tokens: below the wait threshold, so the four are prefilled in one batch, each
    # computing the 20; all but the first find them cached when they share their prompt, and
    # point their rows at the cached copy (their own copies are freed: drain checks the books)
    head = random_prompts(1, [20], 300, seed=24)[0]
    prompts = [head + t for t in random_prompts(4, [30, 9, 50, 17], 300, seed=25)]
    sp = SamplingParams(max_tokens=8, ignore_eos=True)
    runs = {}
    for cache in ("radix", "naive"):
        s = make(path, cache, page_size, overlap=overlap)
        for uid, p in enumerate(prompts):
            s.add_request(uid, p, sp)
        first = s.step()
        rows = [s.reqs[uid].row for uid in range(4)]
        heads = s.table.page_table[rows, :20]
        assert (heads == heads[0]).all().item() == (cache == "radix")
        runs[cache] = tokens({o.uid: [o] for o in first})
        for uid, toks in tokens(drain(s)).items():
            runs[cache].setdefault(uid, []).extend(toks)
        assert s.stats()["prefill_tokens"] == sum(map(len, prompts))
    assert runs["radix"] == runs["naive"]
