"""Build `runtime-cpu` and serve a chat completion from it, where this machine can: it needs a
running Docker engine and the base image already pulled (the build itself fetches wheels)."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from tests.deploy.dockerfile_model import parse
from tests.deploy.support import REPO

TAG = "radixserve-test:runtime-cpu"


def _docker_or_skip():
    docker = pytest.importorskip("docker", reason="the docker SDK is not installed")
    try:
        client = docker.from_env(timeout=10)
        client.ping()
    except docker.errors.DockerException as e:  # no socket, engine down: cannot build here
        pytest.skip(f"no Docker engine reachable ({type(e).__name__}: {e})")
    base = parse().global_args["PYTHON_IMAGE"]
    try:
        client.images.get(base)
    except docker.errors.ImageNotFound:
        pytest.skip(f"base image {base} is not present locally (docker pull {base})")
    return client


def _wait_healthy(url: str, container, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        container.reload()
        assert container.status == "running", container.logs(tail=100).decode(errors="replace")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(2)
    pytest.fail("server not healthy in time:\n" + container.logs(tail=200).decode(errors="replace"))


@pytest.mark.slow
def test_runtime_cpu_image_builds_and_answers() -> None:
    client = _docker_or_skip()
    client.images.build(path=str(REPO), target="runtime-cpu", tag=TAG, rm=True, forcerm=True)
    image = client.images.get(TAG)
    assert image.attrs["Config"]["User"].split(":")[0] == "1000"
    container = client.containers.run(TAG, detach=True, ports={"8000/tcp": ("127.0.0.1", None)})
    try:
        container.reload()
        port = container.ports["8000/tcp"][0]["HostPort"]
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, container, timeout=600)
        with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as r:
            model = json.load(r)["data"][0]["id"]
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "What is 2+2?"}],
            "max_tokens": 16,
            "temperature": 0,
        }
        req = urllib.request.Request(
            f"{url}/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=120) as r:
            answer = json.load(r)
        assert answer["choices"][0]["message"]["content"].strip()
    finally:
        container.remove(force=True)
