"""LoRA adapters through a real server: the OpenAI client reaches each adapter by name (and by
BASE:NAME) with transformers + PEFT's greedy tokens, concurrently with the base model; adapters
load and unload at run time at SGLang's and vLLM's paths, behind the API key; a bad one is a 400
before anything loads and leaves the server as it was; an unknown name is a 404 naming what is
served; the adapters' requests show in the metrics a LoRA-affinity router reads."""
from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from tests.peft_adapters import peft_greedy, write_adapters, write_peft_adapter
from tests.runtime.helpers import random_prompts
from tests.server.router_process import RouterProcess, smg_available
from tests.server.server_process import API_KEY, ServerProcess

MAX_NEW = 8
PROMPTS = random_prompts(3, [6, 31, 50], 300, seed=5)
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def lora_server(tiny_model: Path, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-server")
    adapters = write_adapters(tiny_model, root)
    want = {name: peft_greedy(tiny_model, adapters.get(name), PROMPTS, MAX_NEW)
            for name in (None, *adapters)}
    srv = ServerProcess(tiny_model, root / "server.log", "--api-key", API_KEY,
                        "--served-model-name", "tiny", "--max-kv-tokens", "4096",
                        "--lora-paths", f"sql={adapters['sql']}", f"chat={adapters['chat']}",
                        "--max-loras-per-batch", "2", "--max-lora-rank", "16")
    srv.wait_ready()
    yield srv, adapters, want, root / "more"
    assert srv.stop() == 0, srv.log()[-3000:]


def _generate(srv: ServerProcess, prompt: list[int], lora: str | None) -> list[int]:
    body = {"input_ids": prompt, "sampling_params": {"max_tokens": MAX_NEW, "temperature": 0,
                                                     "ignore_eos": True}}
    if lora is not None:
        body["lora_path"] = lora
    r = httpx.post(f"{srv.base}/generate", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["output_ids"]


def _text(tokenizer, tokens: list[int]) -> str:
    """The text of `tokens` as the server returns it: without a last character left incomplete."""
    return tokenizer.decode(tokens).rstrip("\ufffd")


def test_openai_client_reaches_each_adapter_by_name(lora_server, tiny_tokenizer) -> None:
    srv, _, want, _ = lora_server
    client = openai.OpenAI(base_url=f"{srv.base}/v1", api_key=API_KEY, max_retries=0, timeout=60)
    cards = {m.id: m.model_dump() for m in client.models.list()}
    assert list(cards) == ["tiny", "chat", "sql"]
    assert cards["sql"]["parent"] == cards["chat"]["parent"] == "tiny"
    assert cards["tiny"]["parent"] is None
    for model, name in (("sql", "sql"), ("tiny:chat", "chat"), ("tiny", None)):
        out = client.completions.create(model=model, prompt=PROMPTS[1], max_tokens=MAX_NEW,
                                        temperature=0, extra_body={"ignore_eos": True})
        assert out.model == (name or "tiny")
        assert out.choices[0].text == _text(tiny_tokenizer, want[name][1]), model
    # SGLang's `lora_path` field beside the base model's name (what a gateway passes through)
    out = client.completions.create(model="tiny", prompt=PROMPTS[2], max_tokens=MAX_NEW, temperature=0,
                                    extra_body={"ignore_eos": True, "lora_path": "chat"})
    assert out.model == "chat" and out.choices[0].text == _text(tiny_tokenizer, want["chat"][2])
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="nope", prompt="hi", max_tokens=2)
    assert "'tiny', 'chat', 'sql'" in str(e.value)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="tiny", prompt="hi", max_tokens=2, extra_body={"lora_path": "nope"})


@pytest.mark.skipif(not smg_available(), reason="the SGLang model gateway `smg` is not installed")
def test_through_the_sglang_gateway_by_lora_path(lora_server, tmp_path) -> None:
    """The gateway knows each replica by the base model's name alone; SGLang's `lora_path`
    field beside it reaches the adapter through it (docs/lora.md: what the gateway does not)."""
    srv = lora_server[0]
    router = RouterProcess([srv.base], "cache_aware", tmp_path / "router.log")
    try:
        router.wait_ready()
        body = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": MAX_NEW,
                "temperature": 0, "ignore_eos": True}  # (the gateway takes text prompts only)

        def text(base: str, **extra: str) -> str:
            r = httpx.post(f"{base}/v1/completions", json=body | extra, headers=AUTH, timeout=60)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["text"]

        routed = text(router.base, lora_path="sql")
        assert routed == text(srv.base, model="sql") != text(srv.base)
    finally:
        router.stop()


def test_concurrent_requests_of_every_adapter_equal_peft(lora_server) -> None:
    srv, _, want, _ = lora_server
    jobs = [(name, i) for i in range(len(PROMPTS)) for name in (None, "sql", "chat")] * 2
    with ThreadPoolExecutor(len(jobs)) as pool:
        got = list(pool.map(lambda job: _generate(srv, PROMPTS[job[1]], job[0]), jobs))
    for (name, i), tokens in zip(jobs, got):
        assert tokens == want[name][i], f"{name or 'base'}, prompt {i}"


def test_load_and_unload_at_both_paths_behind_the_key(lora_server, tiny_model) -> None:
    srv, adapters, want, root = lora_server
    post = lambda path, body, **kw: httpx.post(f"{srv.base}{path}", json=body, timeout=60, **kw)
    body = {"lora_name": "mlp", "lora_path": str(adapters["mlp"])}
    assert post("/v1/load_lora_adapter", body).status_code == 401  # no key
    bad = write_peft_adapter(tiny_model, root / "bad-rank", 9, r=32, target_modules=["q_proj"])
    r = post("/load_lora_adapter", {"lora_name": "big", "lora_path": str(bad)}, headers=AUTH)
    assert r.status_code == 400 and "rank 32 is above" in r.json()["error"]["message"]
    r = post("/load_lora_adapter", {"lora_name": "x", "lora_path": str(root / "none")}, headers=AUTH)
    assert r.status_code == 400 and "no such adapter directory" in r.text
    r = post("/v1/load_lora_adapter", body, headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json()["loaded_adapters"].keys() == {"sql", "chat", "mlp"}
    assert post("/load_lora_adapter", body, headers=AUTH).status_code == 400  # already loaded
    assert _generate(srv, PROMPTS[0], "mlp") == want["mlp"][0]
    assert _generate(srv, PROMPTS[0], None) == want[None][0]  # the base model unharmed
    assert post("/unload_lora_adapter", {"lora_name": "mlp"}, headers=AUTH).status_code == 200
    r = post("/v1/unload_lora_adapter", {"lora_name": "mlp"}, headers=AUTH)
    assert r.status_code == 404 and "'mlp' is not loaded" in r.text
    r = httpx.post(f"{srv.base}/v1/completions", headers=AUTH, timeout=60,
                   json={"model": "mlp", "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert [m["id"] for m in httpx.get(f"{srv.base}/v1/models", headers=AUTH).json()["data"]] == [
        "tiny", "chat", "sql"]


def test_metrics_name_the_running_adapter(lora_server) -> None:
    """While a long request of `sql` runs, the metrics say so as vLLM's do."""
    srv, _, _, _ = lora_server
    body = {"input_ids": PROMPTS[0], "lora_path": "sql",
            "sampling_params": {"max_tokens": 400, "ignore_eos": True}}
    with ThreadPoolExecutor(1) as pool:
        job = pool.submit(httpx.post, f"{srv.base}/generate", json=body, headers=AUTH, timeout=120)
        deadline, labels = time.monotonic() + 60, ""
        while not job.done() and time.monotonic() < deadline:
            text = httpx.get(f"{srv.base}/metrics", headers=AUTH, timeout=10).text
            info = re.search(r"^vllm:lora_requests_info\{(.*)\} ", text, re.MULTILINE)
            labels = info.group(1) if info else ""
            if 'running_lora_adapters="sql"' in labels:
                break
            time.sleep(0.05)
        assert job.result().status_code == 200
    assert 'running_lora_adapters="sql"' in labels and 'max_lora="2"' in labels, labels
    assert 'radixserve_lora_running_requests{adapter="sql"} 1.0' in text
    assert "radixserve_lora_slots 2.0" in text


def test_a_server_without_lora_refuses_to_load_one(server) -> None:
    body = {"lora_name": "sql", "lora_path": "org/sql-lora"}
    r = httpx.post(f"{server.base}/v1/load_lora_adapter", json=body, headers=AUTH, timeout=10)
    assert r.status_code == 400 and "--enable-lora" in r.json()["error"]["message"]
    r = httpx.post(f"{server.base}/v1/completions", headers=AUTH, timeout=10,
                   json={"model": "tiny", "lora_path": "sql", "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 404 and "this server serves 'tiny'." in r.text
