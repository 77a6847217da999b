"""A LoRA adapter of spec.lora from the hub, as the serving pod gets it: the init container's
`radixserve download ADAPTER --revision main` (what the operator writes) against a hub on
loopback, then, with the hub gone and HF_HUB_OFFLINE=1, `radixserve serve --lora-paths
NAME=HUB_ID` on that cache (as the server container is started) answering through the adapter as
it answers from the adapter's own directory."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.deploy.fake_hub import FakeHub
from tests.deploy.test_model_download import DEAD_HUB, _env, download
from tests.peft_adapters import write_peft_adapter
from tests.server.server_process import ServerProcess

ADAPTER_ID = "org/sql-lora"


def _answer(server: ServerProcess, model: str) -> list[int]:
    body = {"input_ids": [5, 9, 31, 7], "lora_path": model,
            "sampling_params": {"max_tokens": 8, "ignore_eos": True}}
    r = httpx.post(f"{server.base}/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["output_ids"]


@pytest.mark.slow  # (left out of `make test-fast`; `make test` runs it)
def test_download_the_adapter_then_serve_it_offline(tmp_path: Path) -> None:
    from radixserve.testing import write_tiny_checkpoint

    base = write_tiny_checkpoint("qwen3", tmp_path / "base")
    adapter = write_peft_adapter(base, tmp_path / "adapter", 3, r=4, target_modules=["q_proj", "v_proj"])
    (adapter / "README.md").write_text("not a file serve reads: never downloaded\n")
    cache = tmp_path / "models-cache"
    pod_env = {"RADIXSERVE_CACHE_DIR": str(cache), "HF_HOME": str(cache / "huggingface")}
    hub = FakeHub({ADAPTER_ID: adapter}).start()
    try:
        got = download(ADAPTER_ID, "--revision", "main", env=_env(HF_ENDPOINT=hub.endpoint, **pod_env))
    finally:
        hub.stop()
    assert got.returncode == 0, got.stderr
    snapshot = Path(got.stdout.strip())
    assert {f.name for f in snapshot.iterdir()} == {"adapter_config.json", "adapter_model.safetensors"}

    offline = _env(HF_ENDPOINT=DEAD_HUB, HF_HUB_OFFLINE="1", **pod_env)
    answers = {}
    for name, source in (("sql", ADAPTER_ID), ("local", str(adapter))):
        server = ServerProcess(base, tmp_path / f"{name}.log", "--lora-paths", f"{name}={source}",
                               env=offline)
        try:
            server.wait_ready(120)
            answers[name] = _answer(server, name)
        finally:
            assert server.stop() == 0, server.log()[-3000:]
    assert answers["sql"] == answers["local"]
