"""A tensor-parallel group on CPU (gloo) starts, fails and ends cleanly: a follower that dies or
fails while the group forms makes `LLM(tp=2)` raise an error naming the rank and why, with no
rank or rendezvous left behind; a script read from standard input (which spawn cannot import
again) runs TP=2 like any other; and `close()` returns with every rank gone."""
from __future__ import annotations

import multiprocessing
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from radixserve import LLM, SamplingParams

KW = {"dtype": "float32", "device": "cpu"}


def tp_children() -> list:
    return [p for p in multiprocessing.active_children() if p.name.startswith("radixserve-tp")]


@pytest.fixture
def private_tmp(tmp_path, monkeypatch) -> Path:
    """The rendezvous folder goes under a temp dir of this test's own, to be checked after."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def kill_rank1_once_started() -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if kids := tp_children():
            time.sleep(1.0)  # let it get past its imports: a death mid-start, not at spawn
            kids[0].kill()
            return
        time.sleep(0.05)


def test_follower_killed_while_starting_names_the_rank(tiny_ckpts, private_tmp, monkeypatch) -> None:
    monkeypatch.setenv("RADIXSERVE_TP_FOLLOWER_DELAY_S", "120")  # still starting when killed
    killer = threading.Thread(target=kill_rank1_once_started)
    killer.start()
    with pytest.raises(RuntimeError, match=r"rank 1 \(pid \d+\) was killed by SIGKILL while starting"):
        LLM(str(tiny_ckpts["llama"]), tp=2, **KW)
    killer.join()
    assert not tp_children()
    assert not list(private_tmp.glob("radixserve-tp-*"))


def test_follower_failing_to_start_names_the_rank_and_reason(tiny_ckpts, private_tmp, monkeypatch) -> None:
    monkeypatch.setenv("RADIXSERVE_TP_FOLLOWER_FAIL", "no such GPU")
    with pytest.raises(RuntimeError,
                       match=r"rank 1 \(pid \d+\) exited with code 1: RuntimeError: no such GPU"):
        LLM(str(tiny_ckpts["llama"]), tp=2, **KW)
    assert not tp_children()
    assert not list(private_tmp.glob("radixserve-tp-*"))


def test_close_leaves_no_rank_and_no_rendezvous(tiny_ckpts, private_tmp) -> None:
    llm = LLM(str(tiny_ckpts["llama"]), tp=2, **KW)
    followers = llm.scheduler.followers
    assert llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2, ignore_eos=True))[0].token_ids
    llm.close()
    assert [p.exitcode for p in followers] == [0]  # left the group and returned, not killed
    assert not list(private_tmp.glob("radixserve-tp-*"))
    llm.close()  # twice is harmless


SCRIPT = """
from radixserve import LLM, SamplingParams
sp = SamplingParams(max_tokens=6, ignore_eos=True)
want = LLM({model!r}, dtype="float32", device="cpu").generate([[5, 6, 7]], sp)[0].token_ids
llm = LLM({model!r}, tp=2, dtype="float32", device="cpu")  # no __main__ guard, on purpose
got = llm.generate([[5, 6, 7]], sp)[0].token_ids
llm.close()
print("SAME" if got == want else f"DIFFERENT {{got}} {{want}}")
"""


@pytest.mark.slow  # (left out of `make test-fast`; `make test` runs it)
def test_tp_from_a_script_on_stdin(tiny_ckpts, tmp_path) -> None:
    script = SCRIPT.format(model=str(tiny_ckpts["llama"]))
    done = subprocess.run([sys.executable, "-"], check=False, input=script, text=True, capture_output=True,
                          cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "SAME"
