"""What a gateway built for SGLang workers reads, from a real server: `/server_info`, `/model_info`
(and their `/get_` names), the load endpoints, and the SGLang-named load metrics that the Gateway
API Inference Extension's endpoint picker scrapes, which must follow the load: queued and running
requests and KV usage rise while requests hold the KV pool and fall back to zero after."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.server.server_process import API_KEY, ServerProcess

AUTH = {"Authorization": f"Bearer {API_KEY}"}
MAX_RUNNING, PAGE, KV_TOKENS = 2, 4, 4096


@pytest.fixture(scope="module")
def gw_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("gw-log") / "server.log"
    srv = ServerProcess(tiny_model, log, "--api-key", API_KEY, "--served-model-name", "tiny",
                        "--max-running-requests", str(MAX_RUNNING), "--page-size", str(PAGE),
                        "--max-kv-tokens", str(KV_TOKENS))
    srv.wait_ready()
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


def _get(srv: ServerProcess, path: str) -> dict | list:
    r = httpx.get(f"{srv.base}{path}", headers=AUTH, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def test_server_info_names_the_model_and_the_kv_geometry(gw_server, tiny_model: Path) -> None:
    info = _get(gw_server, "/server_info")
    same = _get(gw_server, "/get_server_info")
    assert {k: v for k, v in same.items() if k != "internal_states"} == {
        k: v for k, v in info.items() if k != "internal_states"}
    assert info["served_model_name"] == "tiny"
    assert info["model_path"] == str(tiny_model)  # as given to --model
    assert (info["tp_size"], info["dp_size"], info["page_size"]) == (1, 1, PAGE)
    assert info["max_running_requests"] == MAX_RUNNING
    assert info["max_total_num_tokens"] == KV_TOKENS
    card = _get(gw_server, "/v1/models")["data"][0]
    assert info["context_length"] == card["max_model_len"]


def test_model_info_reads_the_checkpoint_config(gw_server, tiny_model: Path) -> None:
    info = _get(gw_server, "/model_info")
    assert _get(gw_server, "/get_model_info") == info
    cfg = json.loads((tiny_model / "config.json").read_text())
    assert info["is_generation"] is True
    assert info["model_type"] == cfg["model_type"] and info["architectures"] == cfg["architectures"]


def test_gateway_endpoints_need_the_key(gw_server) -> None:
    for path in ("/server_info", "/get_server_info", "/model_info", "/get_model_info", "/get_load", "/v1/loads"):
        assert httpx.get(f"{gw_server.base}{path}", timeout=10).status_code == 401, path


def _sample(srv: ServerProcess) -> dict[str, float]:
    m = srv.metrics()
    load = _get(srv, "/get_load")[0]
    return {"queue": m["sglang:num_queue_reqs"], "running": m["sglang:num_running_reqs"],
            "usage": m["sglang:token_usage"], "used": m["sglang:num_used_tokens"],
            "own_usage": m["radixserve_kv_cache_usage_ratio"], "load_reqs": load["num_reqs"],
            "load_tokens": load["num_tokens"]}


def _hold(srv: ServerProcess, i: int, stop: threading.Event, first: threading.Semaphore) -> None:
    """A long stream that holds its KV until `stop`, then is closed (the server aborts it)."""
    body = {"model": "tiny", "prompt": f"request {i} holds the cache", "max_tokens": 900, "temperature": 0,
            "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{srv.base}/v1/completions", json=body, headers=AUTH, timeout=120) as r:
        assert r.status_code == 200
        for _ in r.iter_lines():
            first.release()
            if stop.is_set():
                return


def test_sglang_load_metrics_follow_the_load(gw_server) -> None:
    m = gw_server.metrics()
    geometry = next(k for k in m if k.startswith("sglang:cache_config_info{"))
    assert f'num_pages="{KV_TOKENS // PAGE}"' in geometry and f'page_size="{PAGE}"' in geometry
    assert m[geometry] == 1 and m["sglang:page_size"] == PAGE and m["sglang:num_pages"] == KV_TOKENS // PAGE
    assert m["sglang:max_total_num_tokens"] == KV_TOKENS

    n, stop, first = 3 * MAX_RUNNING, threading.Event(), threading.Semaphore(0)
    threads = [threading.Thread(target=_hold, args=(gw_server, i, stop, first)) for i in range(n)]
    for t in threads:
        t.start()
    try:
        assert first.acquire(timeout=120)  # a stream is generating
        deadline, busy = time.monotonic() + 60, {}
        while time.monotonic() < deadline:  # stats come every 0.25 s: wait for a sample of the full load
            busy = _sample(gw_server)
            if busy["running"] == MAX_RUNNING and busy["queue"] == n - MAX_RUNNING:
                break
            time.sleep(0.1)
        assert busy["running"] == MAX_RUNNING and busy["queue"] == n - MAX_RUNNING, busy
        assert busy["load_reqs"] == n
        assert 0 < busy["usage"] < 1 and busy["usage"] == busy["own_usage"], busy
        assert busy["used"] > 0 and busy["load_tokens"] > 0
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    deadline, idle = time.monotonic() + 60, {}
    while time.monotonic() < deadline:
        idle = _sample(gw_server)
        if idle["running"] == 0 and idle["queue"] == 0 and idle["used"] == 0:
            break
        time.sleep(0.2)
    assert idle == {"queue": 0, "running": 0, "usage": 0, "used": 0, "own_usage": 0, "load_reqs": 0,
                    "load_tokens": 0}, idle
    loads = _get(gw_server, "/v1/loads")["loads"][0]
    assert loads["num_running_reqs"] == 0 and loads["token_usage"] == 0
    assert loads["max_total_num_tokens"] == KV_TOKENS
