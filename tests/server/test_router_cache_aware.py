"""Three real replicas behind the SGLang model gateway (`smg` from PyPI, a real process): the
gateway registers them through `/server_info` and `/model_info`, a client uses it like one
server, and on a multi-tenant shared-prefix workload its `cache_aware` policy makes the replicas
compute fewer prompt tokens than `round_robin` on the same requests (the work is read from the
replicas' own `/metrics`)."""
from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from radixserve.bench.workload import BenchRequest, text_workload
from tests.server.router_bench import replicas, route_through
from tests.server.router_process import RouterProcess, smg_available
from tests.server.server_process import API_KEY

pytestmark = pytest.mark.skipif(not smg_available(), reason="the SGLang model gateway `smg` is not installed "
                                                            "(dev extra: pip install smg)")
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def fleet(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory):
    # room for every system prompt of both runs on every replica: nothing is evicted
    with replicas(tiny_model, 3, tmp_path_factory.mktemp("fleet"), "--max-kv-tokens", "32768") as srvs:
        yield srvs


TOKEN_COUNTS = ("prompt_tokens", "completion_tokens", "total_tokens")


def test_the_router_is_used_like_one_server(fleet, tmp_path: Path) -> None:
    router = RouterProcess([s.base for s in fleet], "cache_aware", tmp_path / "router.log")
    try:
        router.wait_ready()
        workers = httpx.get(f"{router.base}/workers", headers=AUTH, timeout=10).json()["workers"]
        assert sorted(w["url"] for w in workers) == sorted(s.base for s in fleet)
        assert all(w["labels"]["served_model_name"] == "tiny" and w["is_healthy"] for w in workers)
        body = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
        direct = httpx.post(f"{fleet[0].base}/v1/completions", json=body, headers=AUTH, timeout=60).json()
        routed = httpx.post(f"{router.base}/v1/completions", json=body, headers=AUTH, timeout=60)
        assert routed.status_code == 200, routed.text
        assert routed.json()["choices"][0]["text"] == direct["choices"][0]["text"]
        # (the same counts; the second call of the prompt may find it in a replica's prefix cache)
        assert {k: routed.json()["usage"][k] for k in TOKEN_COUNTS} == {k: direct["usage"][k] for k in TOKEN_COUNTS}
        with httpx.stream("POST", f"{router.base}/v1/completions", json=body | {"stream": True},
                          headers=AUTH, timeout=60) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            chunks = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert chunks[-1] == "data: [DONE]" and len(chunks) == 8 + 1
        bad = httpx.post(f"{router.base}/v1/completions", json=body | {"max_tokens": -1}, headers=AUTH, timeout=60)
        assert bad.status_code == 400 and "max_tokens" in bad.text
    finally:
        router.stop()


def _tagged(reqs: list[BenchRequest], tag: str) -> list[BenchRequest]:
    """The same requests behind a one-letter tag: no prefix in common with another tag's run."""
    return [r._replace(text=f"{tag} {r.text}") for r in reqs]


def test_cache_aware_routing_computes_fewer_prompt_tokens_than_round_robin(fleet, tmp_path: Path) -> None:
    # 4 tenants' system prompts (~400 tokens of the tiny tokenizer each), 24 users' short questions
    reqs = text_workload(24, (4, 8), (2, 2), seed=1, num_prefixes=4, prefix_words=70)
    runs = {p: route_through(fleet, p, _tagged(reqs, tag), tmp_path)
            for p, tag in (("cache_aware", "A"), ("round_robin", "B"))}
    for run in runs.values():
        assert [r.error for r in run.results] == [""] * len(reqs), run.summary()
        assert sum(w.requests for w in run.replicas) == len(reqs)
        # what the replicas counted agrees with what the clients were told
        assert sum(w.prompt_tokens for w in run.replicas) == sum(r.prompt_tokens for r in run.results)
        assert sum(w.computed + w.cached for w in run.replicas) == sum(r.prompt_tokens for r in run.results)
    aware, rr = runs["cache_aware"], runs["round_robin"]
    assert [r.prompt_tokens for r in aware.results] == [r.prompt_tokens for r in rr.results]
    assert sorted(w.requests for w in rr.replicas) == [8, 8, 8]  # round robin spread them
    # round robin sends each tenant to every replica, which computes its system prompt once;
    # cache-aware keeps a tenant on one replica, so a system prompt is computed about once in all
    assert aware.computed < rr.computed, (aware.summary(), rr.summary())
    assert aware.hit_ratio > rr.hit_ratio
