"""Server flags that change what a request sees, on one server: `--chat-template` (chat prompts
go through the given template, not the checkpoint's, in the tokenizer processes that build
them) and `--max-model-len` (the context served, below the model's 1,024)."""
from __future__ import annotations

import copy

import httpx

from tests.server.server_process import ServerProcess

# unlike any checkpoint's template, so its use is plain in the ids
PLAIN = ("{%- for m in messages %}{{ m.role | upper }}: {{ m.content }} | {% endfor %}"
         "{%- if add_generation_prompt %}ASSISTANT:{%- endif %}")
MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]


def test_chat_template_and_context_length(tiny_model, tiny_tokenizer, tmp_path) -> None:
    path = tmp_path / "plain.jinja"
    path.write_text(PLAIN)
    want_tok = copy.deepcopy(tiny_tokenizer)
    want_tok.chat_template = PLAIN
    text = want_tok.apply_chat_template(MSGS, tokenize=False, add_generation_prompt=True)
    assert text == "SYSTEM: Be brief. | USER: Name a colour. | ASSISTANT:"
    want = want_tok.encode(text, add_special_tokens=False)
    assert want != tiny_tokenizer.apply_chat_template(MSGS, add_generation_prompt=True)

    srv = ServerProcess(tiny_model, tmp_path / "server.log", "--chat-template", str(path),
                        "--max-model-len", "100", "--max-kv-tokens", "4096")
    try:
        srv.wait_ready()
        r = httpx.post(f"{srv.base}/tokenize", json={"messages": MSGS}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["tokens"] == want
        r = httpx.post(f"{srv.base}/v1/chat/completions", timeout=60,
                       json={"messages": MSGS, "max_tokens": 2, "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == len(want)

        models = httpx.get(f"{srv.base}/v1/models", timeout=10).json()
        assert models["data"][0]["max_model_len"] == 100
        r = httpx.post(f"{srv.base}/v1/completions", timeout=60,
                       json={"prompt": [5] * 90, "max_tokens": 20})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["code"] == "context_length_exceeded" and "maximum context length is 100" in err["message"]
    finally:
        assert srv.stop() == 0
