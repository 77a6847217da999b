"""`radixserve download`, what the serving pod's init container runs: against a Hugging Face hub on
loopback (tests/deploy/fake_hub.py) serving a tiny checkpoint — a real download into the pods'
cache layout, a second run that fetches nothing, the token sent, one-line errors with exit code 2
naming the endpoint tried — and then, with the hub gone and HF_HUB_OFFLINE=1, `radixserve serve`
on that cache answering, as the server container does after the init container."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.deploy.fake_hub import FakeHub

REPO_ID = "org/tiny"
DEAD_HUB = "http://127.0.0.1:9"  # refuses at once
TOKEN = "hf_test_token"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from radixserve.testing import write_tiny_checkpoint

    path = write_tiny_checkpoint("qwen3", tmp_path_factory.mktemp("repo") / "tiny")
    (path / "README.md").write_text("not a file serve reads: never downloaded\n")
    return path


@pytest.fixture
def hub(checkpoint: Path):
    h = FakeHub(
        {REPO_ID: checkpoint, "org/gated": checkpoint}, token=TOKEN, gated={"org/gated"}
    ).start()
    yield h
    h.stop()


def _env(**extra: str) -> dict[str, str]:
    """A clean Hugging Face environment (nothing of the machine's), plus `extra`."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING", "RADIXSERVE_"))
    }
    return env | {"PYTHONUNBUFFERED": "1"} | extra


def download(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "radixserve", "download", *args],
        check=False, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@pytest.mark.slow  # (left out of `make test-fast`; `make test` runs it)
def test_download_then_again_then_serve_offline(hub: FakeHub, tmp_path: Path) -> None:
    from tests.server.server_process import ServerProcess

    cache = tmp_path / "models-cache"
    # the pod's env: the operator sets both, and the init container passes no --cache-dir
    pod_env = {"RADIXSERVE_CACHE_DIR": str(cache), "HF_HOME": str(cache / "huggingface")}
    env = _env(HF_ENDPOINT=hub.endpoint, HF_TOKEN=TOKEN, **pod_env)

    first = download(REPO_ID, env=env)
    assert first.returncode == 0, first.stderr
    snapshot = Path(first.stdout.strip())
    assert snapshot.parent.parent == cache / "huggingface/hub/models--org--tiny"
    assert snapshot.name == FakeHub.commit(hub.repos[REPO_ID])
    assert {f.name for f in snapshot.iterdir()} >= {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    }
    assert not (snapshot / "README.md").exists()  # only the files serve reads
    assert sorted(p.rsplit("/", 1)[-1] for p in hub.downloads()) == sorted(
        f.name for f in snapshot.iterdir()
    )
    repo_calls = [r for r in hub.requests if REPO_ID in r.path]
    assert {r.authorization for r in repo_calls} == {f"Bearer {TOKEN}"}  # HF_TOKEN honoured
    assert f"from {hub.endpoint}" in first.stderr and "ready in" in first.stderr
    assert "\r" not in first.stderr and "\x1b[" not in first.stderr  # lines, not a progress bar

    hub.requests.clear()
    t0 = time.monotonic()
    again = download(REPO_ID, "--cache-dir", str(cache), env=env)  # the same place, said twice
    assert again.returncode == 0, again.stderr
    assert Path(again.stdout.strip()) == snapshot
    assert hub.downloads() == []  # the revision's commit asked, nothing fetched
    assert [r.path for r in hub.requests if REPO_ID in r.path] == [
        f"/api/models/{REPO_ID}/revision/main"
    ]
    assert time.monotonic() - t0 < 30

    hub.stop()  # no hub any more: a cached model needs no network, offline on purpose or not
    for extra in ({"HF_HUB_OFFLINE": "1"}, {}):
        out = download(REPO_ID, env=_env(HF_ENDPOINT=DEAD_HUB, **pod_env, **extra))
        assert (out.returncode, out.stdout.strip()) == (0, str(snapshot)), out.stderr

    # the server container: HF_HUB_OFFLINE=1, the same cache
    offline = _env(HF_ENDPOINT=DEAD_HUB, HF_HUB_OFFLINE="1", **pod_env)
    server = ServerProcess(REPO_ID, tmp_path / "serve.log", env=offline)  # type: ignore[arg-type]
    try:
        server.wait_ready(120)
        import httpx

        models = httpx.get(f"{server.base}/v1/models", timeout=5).json()
        assert [m["id"] for m in models["data"]] == [REPO_ID]
    finally:
        assert server.stop() == 0, server.log()[-3000:]
    assert str(snapshot) in server.log()  # it loaded what the download wrote


MISTAKES = {
    "unknown-repo": (["org/nope"], {}, "org/nope: no such model on {hub} (or a private one: set HF_TOKEN)"),
    "unknown-revision": ([REPO_ID, "--revision", "v9"], {}, "org/tiny: no revision 'v9' on {hub}"),
    "gated": (["org/gated"], {}, "org/gated is gated on {hub}"),
    "gated-bad-token": (["org/gated"], {"HF_TOKEN": "hf_wrong"}, "the token in HF_TOKEN has no access to it"),
    "no-network": ([REPO_ID], {"HF_ENDPOINT": DEAD_HUB}, f"org/tiny@main: cannot reach {DEAD_HUB} (ConnectError"),
    "offline-empty": ([REPO_ID], {"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE is set and"),
}  # fmt: skip
# Mistakes found before any hub call: checked in this process.
LOCAL_MISTAKES = {
    "bad-id": (["bad id!"], {}, "'bad id!' is neither a local directory nor a valid Hugging Face id"),
    "no-dir": (["./no/such/dir"], {}, "./no/such/dir: no such model directory"),
    "revision-of-a-dir": (["{tmp}", "--revision", "v1"], {}, "--revision v1: {tmp} is not a hub model"),
    "cache-dir-vs-hf-home": ([REPO_ID], {"HF_HOME": "/elsewhere"}, "HF_HOME=/elsewhere makes serve read /elsewhere/hub"),
}  # fmt: skip


@pytest.fixture(scope="module")
def mistakes(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory):
    """Every mistake's download, run at once (each is a process start)."""
    from concurrent.futures import ThreadPoolExecutor

    tmp = tmp_path_factory.mktemp("mistakes")
    hub = FakeHub({REPO_ID: checkpoint, "org/gated": checkpoint}, token=TOKEN, gated={"org/gated"})
    hub.start()

    def one(case: str) -> tuple[subprocess.CompletedProcess, str]:
        args, env, message = MISTAKES[case]
        args = [a.format(tmp=tmp) for a in args]
        cache = str(tmp / case)
        out = download(*args, "--cache-dir", cache, env=_env(HF_ENDPOINT=hub.endpoint) | env)
        return out, message.format(hub=hub.endpoint, tmp=tmp)

    try:
        with ThreadPoolExecutor(len(MISTAKES)) as pool:
            yield dict(zip(MISTAKES, pool.map(one, MISTAKES), strict=True))
    finally:
        hub.stop()


@pytest.mark.parametrize("case", MISTAKES)
def test_user_mistakes_are_one_line_and_exit_2(mistakes, case: str) -> None:
    out, message = mistakes[case]
    assert out.returncode == 2, out.stderr
    (line,) = [x for x in out.stderr.splitlines() if "error:" in x]
    assert line.startswith("radixserve download: error: ")
    assert message in line, line
    assert "Traceback" not in out.stderr and out.stdout == ""


def _run_here(monkeypatch, env: dict[str, str], *args: str) -> None:
    from radixserve.cli import build_parser

    for name in [n for n in os.environ if n.startswith(("HF_", "RADIXSERVE_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HF_ENDPOINT", DEAD_HUB)
    monkeypatch.setenv("RADIXSERVE_CACHE_DIR", "unused")  # restored after the test: run() sets it
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    parsed = build_parser().parse_args(["download", *args])
    assert parsed.func(parsed) == 0


@pytest.mark.parametrize("case", LOCAL_MISTAKES)
def test_mistakes_found_before_any_hub_call(monkeypatch, tmp_path: Path, case: str) -> None:
    from radixserve.cli.preflight import UsageError

    args, env, message = LOCAL_MISTAKES[case]
    with pytest.raises(UsageError) as e:
        _run_here(
            monkeypatch, env, *[a.format(tmp=tmp_path) for a in args], "--cache-dir", str(tmp_path)
        )
    assert message.format(tmp=tmp_path) in str(e.value)


def test_embedded_default_and_a_local_directory_resolve_without_network(
    checkpoint: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    cache = tmp_path / "c"
    # the embedded model once converted into this cache (a stand-in: converting takes a while)
    embedded = cache / "SmolLM2-135M-Instruct"
    embedded.mkdir(parents=True)
    (embedded / "config.json").write_text("{}")
    _run_here(monkeypatch, {}, "--cache-dir", str(cache))
    assert capsys.readouterr().out.strip() == str(embedded)
    _run_here(monkeypatch, {}, str(checkpoint))
    assert capsys.readouterr().out.strip() == str(checkpoint)


def test_download_fetches_exactly_what_serve_reads(monkeypatch) -> None:
    """The same allow_patterns as the runtime's own hub download, so an offline serve finds the
    snapshot complete (huggingface_hub checks it against the cached tree listing)."""
    import huggingface_hub

    from radixserve.models import default_model
    from radixserve.models.default_model import HUB_FILES

    seen: dict = {}

    def fake_snapshot_download(repo_id: str, **kwargs) -> str:
        seen.update(kwargs)
        return "/x"

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    default_model._download("org/tiny")
    assert sorted(seen["allow_patterns"]) == sorted(HUB_FILES)


def test_progress_is_logged_as_lines(monkeypatch, caplog) -> None:
    from radixserve.cli import download as dl

    monkeypatch.setattr(dl, "PROGRESS_EVERY_S", 0.0)
    caplog.set_level("INFO", logger=dl.logger.name)
    with dl.LogProgress(desc="Reconstructing (incomplete total...)", total=0, unit="B") as bar:
        bar.total = 3_000_000_000
        bar.update(1_500_000_000)
    files = dl.LogProgress(desc="Fetching 4 files", total=4)
    for _ in range(4):
        files.update(1)
    files.close()
    hidden = dl.LogProgress(desc="Downloading bytes", total=10, unit="B")  # an estimate: not shown
    hidden.update(5)
    hidden.close()
    lines = [r.getMessage() for r in caplog.records]
    assert "download: Reconstructing: 1.5 GB of 3.0 GB (50%)" in lines[0]
    assert lines[-1] == "download: Fetching 4 files: 4/4 (100%) (done)"
    assert not [x for x in lines if "Downloading bytes" in x]
