"""Speculative decoding keeps the target's output: greedy tokens equal plain decoding (and so
transformers) token for token, for each drafter, page size, chunking, cache and overlap mode, with
stop ids, max_tokens, logprobs, aborts and grammars as without it; drafts rejected leave no KV
behind (the scheduler's integrity check after each run)."""
from __future__ import annotations

import pytest
import torch

from radixserve import SamplingParams
from radixserve.config import EngineConfig, SchedulerConfig
from radixserve.scheduler.scheduler import Scheduler
from tests.runtime.helpers import drain, fast_corners, random_prompts

MAX_NEW = 20


def _prompts(vocab: int) -> list[list[int]]:
    """Repetitive prompts (the n-gram drafter finds matches: its drafts are verified) beside random
    ones (little to find), of lengths that straddle pages and prefill chunks."""
    loops = [[5, 6, 7, 8] * 6, [9, 10, 11] * 9 + [9], list(range(20, 40)) * 2]
    return loops + random_prompts(3, [3, 17, 40], vocab, seed=3)


def _scheduler(path, page_size: int = 1, cache: str = "radix", overlap: bool = True,
               chunk: int | None = None, max_running: int = 16, **spec) -> Scheduler:
    return Scheduler(EngineConfig(model=str(path), dtype="float32", device="cpu",
                                  page_size=page_size, max_kv_tokens=8192),
                     SchedulerConfig(cache=cache, overlap=overlap, max_prefill_length=chunk,
                                     max_running_requests=max_running, **spec))


def _run(s: Scheduler, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]):
    for uid, p in enumerate(prompts):
        s.add_request(uid, p, params[uid] if isinstance(params, list) else params)
    return drain(s)


def _tokens(out: dict[int, list]) -> dict[int, list[int]]:
    return {uid: [o.token_id for o in outs] for uid, outs in out.items()}


def _spec(algo: str, path) -> dict:
    extra = {"speculative_draft_model_path": str(path)} if algo == "draft" else {}
    return {"speculative_algorithm": algo, **extra}


GRID = [(algo, ps, cache, overlap, chunk) for algo in ("ngram", "draft") for ps in (1, 4)
        for cache in ("radix", "naive") for overlap in (True, False) for chunk in (None, 16)]
FAST = {("ngram", 1, "radix", True, None), ("ngram", 4, "naive", False, 16),
        ("draft", 4, "radix", True, 16), ("draft", 1, "naive", False, None)}


@pytest.mark.parametrize(("algo", "page_size", "cache", "overlap", "chunk"), fast_corners(GRID, FAST))
def test_greedy_tokens_equal_plain_decoding(tiny_ckpts, algo, page_size, cache, overlap, chunk) -> None:
    path = tiny_ckpts["qwen3"]
    prompts = _prompts(300)
    sp = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
    plain = _tokens(_run(_scheduler(path, page_size, cache, overlap, chunk), prompts, sp))
    s = _scheduler(path, page_size, cache, overlap, chunk, **_spec(algo, path))
    got = _tokens(_run(s, prompts, sp))
    assert got == plain
    stats = s.stats()
    assert stats["spec_verify_steps"] > 0 and stats["spec_accepted_tokens"] > 0, stats


@pytest.mark.parametrize("as_decode", [True, False], ids=["decode-rows", "extend"])
def test_both_forms_of_the_verification_step_keep_the_greedy_tokens(tiny_ckpts, monkeypatch,
                                                                     as_decode) -> None:
    """A verification step runs as decode rows (a row a token, what the decode CUDA graphs
    replay) or, where no graph takes that many rows, as an extend: both give plain decoding's
    tokens, and the step takes the form asked for."""
    path = tiny_ckpts["llama"]
    prompts = _prompts(300)
    sp = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
    plain = _tokens(_run(_scheduler(path, page_size=4), prompts, sp))
    s = _scheduler(path, page_size=4, **_spec("ngram", path))
    monkeypatch.setattr(s.engine, "verifies_as_decode", lambda rows: as_decode)
    forms = []  # each verification step's form
    forward, forward_rows = s.engine.forward, s.engine.forward_rows
    monkeypatch.setattr(s.engine, "forward", lambda b: (b.verify and forms.append("decode"))
                        or forward(b))
    monkeypatch.setattr(s.engine, "forward_rows", lambda b, r: forms.append("extend")
                        or forward_rows(b, r))
    assert _tokens(_run(s, prompts, sp)) == plain
    assert forms and set(forms) == {"decode" if as_decode else "extend"}, forms
    assert s.stats()["spec_accepted_tokens"] > 0


@pytest.mark.parametrize("arch", ["llama", "llama3", "qwen2", "qwen3_moe"])
def test_every_architecture_keeps_its_greedy_tokens(tiny_ckpts, arch) -> None:
    path = tiny_ckpts[arch]
    prompts = _prompts(200)
    sp = SamplingParams(max_tokens=12, ignore_eos=True)
    plain = _tokens(_run(_scheduler(path), prompts, sp))
    assert _tokens(_run(_scheduler(path, **_spec("ngram", path)), prompts, sp)) == plain


def test_the_targets_own_weights_as_draft_keep_every_draft(tiny_ckpts) -> None:
    """The machinery's ceiling: a draft model that is the target proposes its greedy tokens."""
    path = tiny_ckpts["llama"]
    s = _scheduler(path, **_spec("draft", path))
    _run(s, _prompts(300), SamplingParams(max_tokens=MAX_NEW, ignore_eos=True))
    stats = s.stats()
    assert stats["spec_draft_tokens"] > 0
    assert stats["spec_accepted_tokens"] == stats["spec_draft_tokens"]


def test_a_stop_id_inside_a_kept_run_ends_the_request_there(tiny_ckpts) -> None:
    path = tiny_ckpts["qwen3"]
    prompts = _prompts(300)[:3]
    plain = _tokens(_run(_scheduler(path), prompts, SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)))
    params = [SamplingParams(max_tokens=MAX_NEW, ignore_eos=True, stop_token_ids=[toks[7]])
              for toks in plain.values()]
    want = _run(_scheduler(path), prompts, params)
    s = _scheduler(path, **_spec("draft", path))
    got = _run(s, prompts, params)
    assert _tokens(got) == _tokens(want)
    assert all(len(toks) <= 8 for toks in _tokens(got).values())
    assert [outs[-1].finish_reason for outs in got.values()] == ["stop"] * 3
    assert s.stats()["spec_accepted_tokens"] > 0


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 7])
def test_max_tokens_ends_exactly_where_it_says(tiny_ckpts, max_tokens) -> None:
    path = tiny_ckpts["qwen3"]
    prompts = _prompts(300)
    sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    plain = _run(_scheduler(path), prompts, sp)
    got = _run(_scheduler(path, **_spec("draft", path)), prompts, sp)
    assert _tokens(got) == _tokens(plain)
    assert all(len(o) == max_tokens and o[-1].finish_reason == "length" for o in got.values())


def test_logprobs_are_the_targets_at_each_kept_position(tiny_ckpts) -> None:
    path = tiny_ckpts["qwen3"]
    prompts = _prompts(300)
    sp = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True, logprobs=3)
    plain = _run(_scheduler(path), prompts, sp)
    s = _scheduler(path, **_spec("draft", path))
    got = _run(s, prompts, sp)
    assert _tokens(got) == _tokens(plain)
    for uid in plain:
        for a, b in zip(plain[uid], got[uid]):
            assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
            assert [t for t, _ in a.top_logprobs] == [t for t, _ in b.top_logprobs]
    assert s.stats()["spec_accepted_tokens"] > 0


def test_an_abort_mid_run_drops_the_request_and_its_kv(tiny_ckpts) -> None:
    path = tiny_ckpts["llama"]
    s = _scheduler(path, **_spec("draft", path))
    for uid, p in enumerate(_prompts(300)[:3]):
        s.add_request(uid, p, SamplingParams(max_tokens=MAX_NEW, ignore_eos=True))
    seen: dict[int, int] = {}
    for _ in range(4):
        for o in s.step():
            seen[o.uid] = seen.get(o.uid, 0) + 1
    assert s.abort(1)
    after = drain(s)
    assert 1 not in after and all(seen[u] + len(after[u]) == MAX_NEW for u in (0, 2))


def test_a_grammar_request_beside_drafting_ones_gets_its_plain_tokens(tiny_ckpts) -> None:
    """A constrained request does not draft; the batch beside it does, and both keep their
    plain tokens."""
    path = tiny_ckpts["qwen3"]
    prompts = _prompts(300)[:3]
    params = [SamplingParams(max_tokens=MAX_NEW, ignore_eos=True),
              SamplingParams(max_tokens=MAX_NEW, regex="[a-z ]{0,40}"),
              SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)]
    plain = _run(_scheduler(path), prompts, params)
    s = _scheduler(path, **_spec("ngram", path))
    assert _tokens(_run(s, prompts, params)) == _tokens(plain)
    assert s.stats()["spec_verify_steps"] > 0


# TP=2 over gloo, a second process for seconds: test_tp.py's TP=2 cases stay in the fast loop
@pytest.mark.slow  # (left out of `make test-fast`; `make test` runs it)
def test_tensor_parallel_ranks_verify_alike(tiny_ckpts) -> None:
    from radixserve import LLM

    path = tiny_ckpts["llama"]
    prompts = _prompts(300)
    sp = SamplingParams(max_tokens=12, ignore_eos=True)
    plain = [r.token_ids for r in LLM(str(path), dtype="float32", device="cpu").generate(prompts, sp)]
    llm = LLM(str(path), dtype="float32", device="cpu", tp=2, speculative_algorithm="ngram")
    try:
        assert [r.token_ids for r in llm.generate(prompts, sp)] == plain
        assert llm.scheduler.stats()["spec_verify_steps"] > 0
    finally:
        llm.close()


def test_drafting_backs_off_where_drafts_keep_failing(tiny_ckpts, monkeypatch) -> None:
    """A drafter whose every draft is wrong: each request soon stops drafting (one probe token
    now and then), so its steps stay plain decode steps."""
    from radixserve.speculative import ngram

    path = tiny_ckpts["llama"]
    s = _scheduler(path, **_spec("ngram", path))
    monkeypatch.setattr(ngram.NgramDrafter, "propose",
                        lambda self, reqs, lengths: [[0] * n for n in lengths])
    _run(s, _prompts(300)[:2], SamplingParams(max_tokens=60, ignore_eos=True))
    stats = s.stats()
    assert stats["spec_accepted_tokens"] < stats["spec_draft_tokens"] // 4
    assert stats["spec_verify_steps"] < 2 * 60 // 2  # most steps drafted nothing


def test_resting_requests_probe_on_the_same_steps(tiny_ckpts, monkeypatch) -> None:
    """Requests that arrived at different steps and stopped drafting probe together, on the
    shared clock's multiples of COOLDOWN: the other steps stay plain decode steps for the whole
    batch, however many requests rest."""
    from radixserve.speculative import ngram
    from radixserve.speculative.adaptive import COOLDOWN

    path = tiny_ckpts["llama"]
    s = _scheduler(path, **_spec("ngram", path))
    drafting_steps = []

    def wrong(self, reqs, lengths):
        if any(lengths):
            drafting_steps.append(s.spec.lengths.step - 1)  # (the clock ticked as it planned)
        return [[0] * n for n in lengths]

    monkeypatch.setattr(ngram.NgramDrafter, "propose", wrong)
    prompts = _prompts(300)[:4]
    sp = SamplingParams(max_tokens=120, ignore_eos=True)
    for step in range(10):
        if step % 3 == 0:
            s.add_request(step // 3, prompts[step // 3], sp)
        s.step()
    drain(s)
    late = [t for t in drafting_steps if t >= 3 * COOLDOWN]  # every request rests by then
    assert len(late) >= 2 and all(t % COOLDOWN == 0 for t in late), drafting_steps


def _chi2_pvalue(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """Pearson's chi-square test of `observed` counts against `expected` ones (cells with an
    expectation under 5 pooled), its p-value from the regularized upper incomplete gamma."""
    keep = expected >= 5
    obs = torch.cat([observed[keep], observed[~keep].sum()[None]]).double()
    exp = torch.cat([expected[keep], expected[~keep].sum()[None]]).double()
    if exp[-1] < 5:
        obs, exp = obs[:-1], exp[:-1]
    stat = float(((obs - exp) ** 2 / exp).sum())
    df = len(obs) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2), torch.tensor(stat / 2)))


ALPHA = 0.001  # a test of a correct verifier fails this seeded check with this probability


def test_sampled_tokens_have_the_targets_distribution() -> None:
    """Each kept position's token is distributed as the target's own p: the first verified token
    by row 0's softmax, and the second, given the first draft kept, by row 1's."""
    from radixserve.speculative.verify import verify

    first, second, p0, p1 = _positions(verify)
    assert _chi2_pvalue(first, p0 * first.sum()) > ALPHA
    assert _chi2_pvalue(second, p1 * second.sum()) > ALPHA


def test_a_biased_verifier_fails_the_same_check() -> None:
    """Negative control: a verifier that keeps every draft, or samples the rejection from p
    itself (not p without the draft), skews the first token away from p and is caught."""
    from radixserve.speculative import verify as verify_mod

    def keeps_all(logits, drafts, req, eos, g):
        return verify_mod.Verified(drafts + [int(logits[len(drafts)].argmax())])

    def resamples_p(logits, drafts, req, eos, g):
        p = torch.softmax(logits.float(), -1)
        out = []
        for j, d in enumerate(drafts):
            if float(torch.rand((), generator=g)) < float(p[j, d]):
                out.append(d)
                continue
            return verify_mod.Verified(out + [int(torch.multinomial(p[j], 1, generator=g))])
        return verify_mod.Verified(out + [int(torch.multinomial(p[len(drafts)], 1, generator=g))])

    for biased in (keeps_all, resamples_p):
        first, _, p0, _ = _positions(biased)
        assert _chi2_pvalue(first, p0 * first.sum()) < ALPHA, biased.__name__


def _positions(rule, n: int = 2000):
    """Over `n` draws of `rule` on fixed logits (6 tokens, temperature 1) with drafts that are
    each row's argmax: the counts of the first token, of the second where the first draft was
    kept, and the target's distributions at both positions."""
    from radixserve.core.request import Req

    g = torch.Generator().manual_seed(7)
    logits = torch.tensor([[2.0, 1.5, 0.5, 0.0, -1.0, 0.3], [0.1, 1.9, 1.8, -0.5, 0.0, 1.0],
                           [1.0, 0.0, 0.0, 0.0, 0.0, 0.5]])
    drafts = [int(logits[0].argmax()), int(logits[1].argmax())]
    req = Req(0, [1, 2, 3], SamplingParams(temperature=1.0, max_tokens=8))
    first, second = torch.zeros(6), torch.zeros(6)
    for _ in range(n):
        toks = rule(logits, drafts, req, frozenset(), g).tokens
        first[toks[0]] += 1
        if toks[0] == drafts[0] and len(toks) > 1:
            second[toks[1]] += 1
    return first, second, torch.softmax(logits[0], -1), torch.softmax(logits[1], -1)


def _homogeneity_pvalue(a: dict, b: dict) -> float:
    """Chi-square test that two samples of token pairs come from one distribution."""
    cells = sorted(set(a) | set(b))
    table = torch.tensor([[a.get(c, 0) for c in cells], [b.get(c, 0) for c in cells]], dtype=torch.float64)
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()
    keep = expected.min(0).values >= 5
    stat = float(((table[:, keep] - expected[:, keep]) ** 2 / expected[:, keep]).sum())
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2), torch.tensor(stat / 2)))


def _sampled_pairs(s: Scheduler, n: int = 800) -> dict:
    prompt = [5, 6, 7, 8] * 4
    out = _run(s, [prompt] * n, [SamplingParams(max_tokens=3, ignore_eos=True, temperature=1.0,
                                                top_k=3, seed=i) for i in range(n)])
    counts: dict = {}
    for outs in out.values():
        key = tuple(o.token_id for o in outs[:2])
        counts[key] = counts.get(key, 0) + 1
    return counts


@pytest.mark.parametrize("biased", [False, True], ids=["verifier", "biased-verifier"])
def test_sampled_requests_through_the_scheduler_keep_the_distribution(tiny_ckpts, monkeypatch,
                                                                     biased) -> None:
    """End to end: each request's first two sampled tokens (the second verified against a draft)
    are distributed as without speculation; a verifier that keeps every draft is caught."""
    from radixserve.scheduler import verify_step
    from radixserve.speculative.verify import Verified

    path = tiny_ckpts["llama"]
    plain = _sampled_pairs(_scheduler(path, max_running=256))
    if biased:
        monkeypatch.setattr(verify_step, "verify", lambda logits, drafts, req, eos, g, best: Verified(
            drafts + [int(logits[len(drafts)].argmax())]))
    s = _scheduler(path, max_running=256, **_spec("draft", path))
    spec = _sampled_pairs(s)
    assert s.stats()["spec_verify_steps"] > 0
    p = _homogeneity_pvalue(plain, spec)
    assert (p < ALPHA) if biased else (p > ALPHA), p


@pytest.mark.parametrize("limit", [None, 2])
def test_no_request_drafts_while_more_decode_than_the_limit(tiny_ckpts, limit) -> None:
    """--speculative-disable-by-batch-size: with six requests decoding, none drafts until at
    most `limit` are left (the short ones done); the tokens stay the plain ones. Without a limit
    (the control) the full batch drafts."""
    path = tiny_ckpts["llama"]
    prompts = _prompts(300)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (4, 4, 4, 4, 24, 24)]
    plain = _tokens(_run(_scheduler(path), prompts, params))
    s = _scheduler(path, speculative_disable_by_batch_size=limit, **_spec("draft", path))
    planned, plan = [], s.spec.plan
    s.spec.plan = lambda reqs: planned.append((len(reqs), bool((d := plan(reqs))[0]))) or d
    assert _tokens(_run(s, prompts, params)) == plain
    drafting = [n for n, drafted in planned if drafted]
    assert drafting, planned
    if limit is None:
        assert max(drafting) == len(prompts)
    else:
        assert max(drafting) <= limit
        assert any(n > limit for n, _ in planned), planned  # steps that did not draft
