"""A `--tp 2` server (gloo on CPU) gives the TP=1 greedy tokens; killing rank 1 takes it down;
SIGTERM stops it cleanly: exit code 0, no traceback, nothing left in its temp dir."""
from __future__ import annotations

import os
import re
import signal
import time

import httpx
import pytest

from radixserve import LLM, SamplingParams
from tests.runtime.helpers import random_prompts
from tests.server.server_process import ServerProcess

PROMPTS = random_prompts(4, [3, 40, 9, 120], 300, seed=21)


@pytest.fixture
def tp_server(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))  # the server's (and its ranks') temp dir
    (tmp_path / "tmp").mkdir()
    srv = ServerProcess(tiny_model, tmp_path / "server.log", "--tp", "2", "--max-prefill-length", "32")
    srv.wait_ready()
    yield srv
    srv.stop()


def _rank1_pid(srv: ServerProcess, timeout: float = 30.0) -> int:
    """Rank 1's pid from its "ready" line, which it logs after its last step in the group's
    start: a moment after the server answers /health (seen on a loaded 2-core CI machine)."""
    deadline = time.monotonic() + timeout
    while not (m := re.search(r"tensor-parallel rank 1 ready \(pid (\d+)\)", srv.log())):
        assert time.monotonic() < deadline, "rank 1 logs its pid"
        time.sleep(0.1)
    return int(m.group(1))


def test_tp2_server_matches_tp1_tokens(tp_server, tiny_model) -> None:
    ref = LLM(str(tiny_model), dtype="float32", device="cpu").generate(
        PROMPTS, SamplingParams(max_tokens=10, ignore_eos=True))
    for p, want in zip(PROMPTS, ref):
        body = {"input_ids": p, "sampling_params": {"max_tokens": 10, "ignore_eos": True}}
        got = httpx.post(f"{tp_server.base}/generate", json=body, timeout=60).json()
        assert got["output_ids"] == want.token_ids


def test_killing_rank1_exits_server_nonzero(tp_server) -> None:
    os.kill(_rank1_pid(tp_server), signal.SIGKILL)
    t0 = time.monotonic()
    code = tp_server.proc.wait(timeout=30)
    assert code != 0 and time.monotonic() - t0 < 30
    assert re.search(r"tensor-parallel rank 1 \(pid \d+\) was killed by SIGKILL", tp_server.log())


def test_sigterm_stops_tp_server_cleanly(tp_server, tmp_path) -> None:
    body = {"input_ids": PROMPTS[0], "sampling_params": {"max_tokens": 4, "ignore_eos": True}}
    assert httpx.post(f"{tp_server.base}/generate", json=body, timeout=60).status_code == 200
    follower = _rank1_pid(tp_server)
    assert tp_server.stop() == 0, tp_server.log()[-3000:]
    log = tp_server.log()
    assert "Traceback" not in log, log[-3000:]
    assert "tensor-parallel rank 1 left the group" in log
    assert not list((tmp_path / "tmp").glob("radixserve-tp-*"))
    with pytest.raises(ProcessLookupError):
        os.kill(follower, 0)
