"""The draft model of spec.speculative from the hub, as the serving pod gets it: the operator's
`draft-download` init container's command against a hub on loopback, then, with the hub gone and
HF_HUB_OFFLINE=1, `radixserve serve` with the operator's speculative flags on that cache, drafting
with the draft model it finds there by its hub id."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.deploy.fake_hub import FakeHub
from tests.deploy.test_model_download import DEAD_HUB, _env, download
from tests.server.server_process import ServerProcess

DRAFT_ID = "org/tiny-draft"


@pytest.mark.slow  # (left out of `make test-fast`; `make test` runs it)
def test_the_pods_draft_model_is_downloaded_then_drafts_offline(tmp_path: Path) -> None:
    from radixserve.testing import write_tiny_checkpoint
    from radixserve_operator.builders import build_workload
    from radixserve_operator.spec import parse_spec

    target = write_tiny_checkpoint("qwen3", tmp_path / "target")
    draft = write_tiny_checkpoint("qwen3", tmp_path / "draft", seed=1)
    spec = {"model": {"source": str(target)}, "gpu": {"enabled": False},
            "speculative": {"algorithm": "draft", "numDraftTokens": 3,
                            "draftModel": {"source": DRAFT_ID}}}
    body = {"metadata": {"name": "llm", "namespace": "serving"}, "spec": spec}
    pod = build_workload(parse_spec(body), 1, 1)["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    args = pod["containers"][0]["args"]
    assert init["args"][0] == "download"  # `radixserve download …` through the image's ENTRYPOINT

    cache = tmp_path / "models-cache"
    pod_env = {"RADIXSERVE_CACHE_DIR": str(cache), "HF_HOME": str(cache / "huggingface")}
    hub = FakeHub({DRAFT_ID: draft}).start()
    try:
        got = download(*init["args"][1:], env=_env(HF_ENDPOINT=hub.endpoint, **pod_env))
    finally:
        hub.stop()
    assert got.returncode == 0, got.stderr
    assert Path(got.stdout.strip()).parent.parent == cache / "huggingface/hub/models--org--tiny-draft"

    offline = _env(HF_ENDPOINT=DEAD_HUB, HF_HUB_OFFLINE="1", **pod_env)
    flags = args[args.index("--speculative-algorithm"):]
    assert flags[flags.index("--speculative-draft-model-path") + 1] == DRAFT_ID
    server = ServerProcess(target, tmp_path / "serve.log", *flags, env=offline)
    try:
        server.wait_ready(120)
        body = {"model": str(target), "prompt": "one two one two one two", "max_tokens": 12,
                "temperature": 0, "ignore_eos": True}
        r = httpx.post(f"{server.base}/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        assert usage["completion_tokens"] == 12
        assert usage["speculative"]["draft_tokens"] > 0, usage  # the draft model drafted
    finally:
        assert server.stop() == 0, server.log()[-3000:]
