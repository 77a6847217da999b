from __future__ import annotations

from pathlib import Path

import pytest

from tests.server.server_process import API_KEY, ServerProcess


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from radixserve.testing import write_tiny_checkpoint

    return write_tiny_checkpoint("llama", tmp_path_factory.mktemp("server-ckpt") / "llama")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture(scope="session")
def server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory):
    """One server for the API tests: tiny random llama, API key, a separate tokenizer process."""
    log = tmp_path_factory.mktemp("server-log") / "server.log"
    srv = ServerProcess(tiny_model, log, "--api-key", API_KEY, "--num-tokenizer", "1",
                        "--served-model-name", "tiny", "--max-kv-tokens", "4096")
    srv.wait_ready()
    yield srv
    code = srv.stop()
    assert code == 0, f"server exited with {code} on SIGTERM:\n{srv.log()[-3000:]}"
