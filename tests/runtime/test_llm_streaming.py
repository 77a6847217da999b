"""`LLM` beyond `generate`: streaming iteration, asyncio calls that batch together in one engine
loop, early exits that abort, and an engine failure that reaches every caller instead of hanging."""
from __future__ import annotations

import asyncio

import pytest

from radixserve import LLM, SamplingParams

SP = SamplingParams(max_tokens=12, ignore_eos=True)
PROMPTS = [[5, 6, 7], [9, 8, 7, 6, 5], [11] * 20, [40, 41]]


def _llm(tiny_ckpts) -> LLM:
    return LLM(str(tiny_ckpts["qwen3"]), dtype="float32", device="cpu", max_kv_tokens=2048)


@pytest.fixture(scope="module")
def llm(tiny_ckpts):
    return _llm(tiny_ckpts)


def _idle(llm: LLM) -> None:
    llm._engine.settle()  # the background thread may still be finishing the in-flight batch
    s = llm.scheduler
    assert not s.has_work and s.stats()["running"] == s.stats()["waiting"] == 0
    s.check_integrity()


def test_stream_yields_each_choices_deltas(llm) -> None:
    want = llm.generate(PROMPTS[:2], SP, n=2)
    got: dict[int, list[int]] = {}
    for out in llm.stream(PROMPTS[:2], SP, n=2):
        got.setdefault(out.index, []).extend(out.token_ids)
    assert [got[i] for i in range(4)] == [r.token_ids for r in want]
    _idle(llm)


def test_leaving_a_stream_early_aborts_it(llm) -> None:
    gen = llm.stream(PROMPTS[2], SamplingParams(max_tokens=200, ignore_eos=True))
    first = next(gen)
    assert first.token_ids and not first.finished
    gen.close()
    _idle(llm)


def test_concurrent_async_calls_batch_together(llm, monkeypatch) -> None:
    want = [r.token_ids for r in llm.generate(PROMPTS, SP)]
    s = llm.scheduler
    sizes: list[int] = []
    step = s.step
    monkeypatch.setattr(s, "step", lambda: (sizes.append(len(s.running)), step())[1])

    async def run() -> list[list[int]]:
        one = [llm.agenerate([p], SP) for p in PROMPTS]  # four callers, one request each
        return [r[0].token_ids for r in await asyncio.gather(*one)]

    assert asyncio.run(run()) == want
    assert max(sizes) > 1, "the callers' requests ran in one batch"
    _idle(llm)


def test_astream_and_cancelled_agenerate_abort_their_requests(llm) -> None:
    async def run() -> list:
        long = asyncio.ensure_future(llm.agenerate(PROMPTS[0], SamplingParams(max_tokens=500,
                                                                             ignore_eos=True)))
        deltas = []
        async for out in llm.astream(PROMPTS[1], SP):
            deltas.append(out)
            if len(deltas) == 3:
                break  # leaves the async generator: aborted (closed by the loop, below)
        long.cancel()
        with pytest.raises(asyncio.CancelledError):
            await long
        return deltas

    deltas = asyncio.run(run())
    assert len(deltas) == 3
    _idle(llm)


def test_n_and_params_are_checked_before_anything_runs(llm) -> None:
    with pytest.raises(ValueError, match="n must be a positive integer"):
        llm.generate(PROMPTS[0], SP, n=0)
    with pytest.raises(ValueError, match="2 given for 4 prompts"):
        llm.generate(PROMPTS, [SP, SP])
    _idle(llm)


def test_a_failing_step_reaches_every_caller_and_later_calls(tiny_ckpts, monkeypatch) -> None:
    llm = _llm(tiny_ckpts)

    def boom() -> list:
        raise RuntimeError("boom")

    monkeypatch.setattr(llm.scheduler, "step", boom)

    async def run() -> list:
        return await asyncio.gather(*[llm.agenerate(p, SP) for p in PROMPTS],
                                    return_exceptions=True)

    errors = asyncio.run(run())
    assert all(isinstance(e, RuntimeError) and "boom" in str(e) for e in errors)
    with pytest.raises(RuntimeError, match="the engine failed earlier: boom"):
        llm.generate(PROMPTS[0], SP)
    llm.close()


# TP=2 over gloo, a second process for seconds: test_tp.py's TP=2 cases stay in the fast loop
@pytest.mark.slow  # (left out of `make test-fast`; `make test` runs it)
def test_tp2_async_calls_step_the_group_from_the_engine_thread(tiny_ckpts) -> None:
    """Under tensor parallelism the background thread broadcasts to the followers (gloo)."""
    llm = LLM(str(tiny_ckpts["llama"]), tp=2, dtype="float32", device="cpu")
    try:
        want = [r.token_ids for r in llm.generate(PROMPTS, SP)]

        async def run() -> list:
            return await asyncio.gather(*[llm.agenerate(p, SP) for p in PROMPTS])

        assert [r[0].token_ids for r in asyncio.run(run())] == want
        assert [t for o in llm.stream(PROMPTS[0], SP) for t in o.token_ids] == want[0]
    finally:
        llm.close()


def test_truncate_prompt_tokens_offline_is_the_prompts_end(llm) -> None:
    """`SamplingParams(truncate_prompt_tokens=N)` in `LLM` as on the server: the last N prompt
    tokens only, so the same greedy tokens as those N sent as the prompt."""
    long = list(range(20, 60))
    cut, tail, whole = llm.generate([long, long[-6:], long], [
        SamplingParams(max_tokens=8, ignore_eos=True, temperature=0, truncate_prompt_tokens=6),
        SamplingParams(max_tokens=8, ignore_eos=True, temperature=0),
        SamplingParams(max_tokens=8, ignore_eos=True, temperature=0)])
    assert cut.prompt_token_ids == tail.prompt_token_ids == long[-6:] and whole.prompt_token_ids == long
    assert cut.token_ids == tail.token_ids
    with pytest.raises(ValueError, match="truncate_prompt_tokens"):
        SamplingParams(truncate_prompt_tokens=0)
    _idle(llm)
