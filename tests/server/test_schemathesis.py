"""Schemathesis against the server's own OpenAPI document, every route of it: a bounded,
deterministic run of every check but one must find nothing: no 5xx, no status code, content type
or body the spec does not document, no invalid request accepted, auth enforced, 405s with `Allow`,
no request past its timeout (a hang); and the server is healthy afterwards (`/health` 200, a
normal request answered). The hand-written hostile bodies a schema cannot express are
`hostile_corpus.py`'s (`test_hostile.py`).

Excluded: `positive_data_acceptance` (every schema-valid body gets a 2xx). Some rules cannot be
written in JSON Schema: limits of the loaded model (context length, vocabulary size) and rules that
tie fields together (`top_logprobs` needs `logprobs`, exactly one of `text` and `input_ids`);
those bodies get a documented 400."""
from __future__ import annotations

import shutil
import subprocess

import httpx
import pytest

from tests.server.server_process import API_KEY, ServerProcess

# (about 2,600 requests: 20 s on two cores)
_SEEDED_ARGS = ["--max-examples", "20", "--generation-deterministic", "--seed", "19",
                "--checks", "all", "--exclude-checks", "positive_data_acceptance",
                "--max-response-time", "30", "--request-timeout", "30"]


@pytest.fixture(scope="module")
def keyed_server(tiny_model, tmp_path_factory: pytest.TempPathFactory):
    """Like the shared server, but a chat without max_tokens generates 16 tokens, not the whole
    context: the run stays short however many bodies omit the field."""
    log = tmp_path_factory.mktemp("schemathesis") / "server.log"
    srv = ServerProcess(tiny_model, log, "--api-key", API_KEY, "--served-model-name", "tiny",
                        "--max-kv-tokens", "4096", "--default-max-tokens", "16")
    srv.wait_ready()
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


@pytest.mark.skipif(shutil.which("schemathesis") is None, reason="schemathesis is not installed (dev extra)")
def test_schemathesis_finds_nothing(keyed_server, tmp_path) -> None:
    server = keyed_server
    cmd = ["schemathesis", "run", f"{server.base}/openapi.json", "-H", f"Authorization: Bearer {API_KEY}", *_SEEDED_ARGS]
    r = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    auth = {"Authorization": f"Bearer {API_KEY}"}
    spec = httpx.get(f"{server.base}/openapi.json", headers=auth, timeout=10).json()
    ops = sum(len(methods) for methods in spec["paths"].values())
    assert ops >= 19 and f"{ops}/{ops}" in r.stdout, r.stdout[-3000:]  # every operation was tested
    assert httpx.get(f"{server.base}/health", timeout=10).status_code == 200
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}
    ok = httpx.post(f"{server.base}/v1/chat/completions", headers=auth, json=body, timeout=60)
    assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] in ("stop", "length"), ok.text
    assert "Traceback" not in server.log()
