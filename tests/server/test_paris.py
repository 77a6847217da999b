"""The embedded SmolLM2-135M-Instruct, served for real: one real-text check."""
from __future__ import annotations

import openai

from tests.server.server_process import ServerProcess


def test_embedded_model_knows_the_capital_of_france(tmp_path) -> None:
    srv = ServerProcess(None, tmp_path / "server.log")
    try:
        srv.wait_ready(timeout=300)
        client = openai.OpenAI(base_url=f"{srv.base}/v1", api_key="none", max_retries=0, timeout=120)
        r = client.chat.completions.create(
            model=client.models.list().data[0].id, temperature=0, max_tokens=24,
            messages=[{"role": "user", "content": "What is the capital of France?"}])
        assert "Paris" in r.choices[0].message.content, r.choices[0].message.content
    finally:
        assert srv.stop() == 0
