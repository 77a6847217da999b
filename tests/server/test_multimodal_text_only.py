"""A multimodal checkpoint (Gemma3ForConditionalGeneration) served text-only: text chat answers,
the log says the vision tower was not loaded, and a message with an image part is refused with a
400 naming the content."""
from __future__ import annotations

import httpx
import pytest

from tests.server.server_process import ServerProcess


@pytest.fixture(scope="module")
def vision_server(tmp_path_factory: pytest.TempPathFactory):
    from radixserve.testing import write_tiny_multimodal_checkpoint

    root = tmp_path_factory.mktemp("multimodal-server")
    model = write_tiny_multimodal_checkpoint("gemma3_vision", root / "gemma3", layout="hub")
    srv = ServerProcess(model, root / "server.log", "--max-kv-tokens", "2048")
    srv.wait_ready()
    yield srv
    code = srv.stop()
    assert code == 0, f"server exited with {code} on SIGTERM:\n{srv.log()[-3000:]}"


def _chat(base: str, content: object) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 4, "temperature": 0}
    return httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60)


def test_text_is_served_and_the_vision_tower_not_loaded(vision_server):
    r = _chat(vision_server.base, [{"type": "text", "text": "Hello, world!"}])
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] >= 1
    assert "vision tower not loaded (text-only)" in vision_server.log()


@pytest.mark.parametrize("parts", [
    [{"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}],
    [{"type": "text", "text": "What is in the picture?"},
     {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}],
])
def test_an_image_part_is_refused(vision_server, parts):
    r = _chat(vision_server.base, parts)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages.0.content" and "only text content parts" in err["message"]
    assert _chat(vision_server.base, "still serving?").status_code == 200
