from __future__ import annotations

from pathlib import Path

import pytest

from tests.server.server_process import API_KEY, ServerProcess

HERE = Path(__file__).resolve().parent
# Modules here that start no process: unit tests of the text and message code beside the server.
# Every other module here is the `server` tier (real processes on loopback), which `make
# test-fast` leaves out; a new module joins that tier unless it is named here.
IN_PROCESS = {"test_codec.py", "test_detokenize.py", "test_responses_stream.py",
              "test_scheduler_loop.py", "test_stop.py", "test_tools_plan.py"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.parent == HERE and item.path.name not in IN_PROCESS:
            item.add_marker(pytest.mark.server)


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
