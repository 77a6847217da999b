"""`--chat-template`: the server's chat prompts go through the given template, not the
checkpoint's, in the tokenizer processes that build them."""
from __future__ import annotations

import copy

import httpx

from tests.server.server_process import ServerProcess

# unlike any checkpoint's template, so its use is plain in the ids
PLAIN = ("{%- for m in messages %}{{ m.role | upper }}: {{ m.content }} | {% endfor %}"
         "{%- if add_generation_prompt %}ASSISTANT:{%- endif %}")
MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]


def test_chat_prompts_use_the_given_template(tiny_model, tiny_tokenizer, tmp_path) -> None:
    path = tmp_path / "plain.jinja"
    path.write_text(PLAIN)
    want_tok = copy.deepcopy(tiny_tokenizer)
    want_tok.chat_template = PLAIN
    text = want_tok.apply_chat_template(MSGS, tokenize=False, add_generation_prompt=True)
    assert text == "SYSTEM: Be brief. | USER: Name a colour. | ASSISTANT:"
    want = want_tok.encode(text, add_special_tokens=False)
    assert want != tiny_tokenizer.apply_chat_template(MSGS, add_generation_prompt=True)

    srv = ServerProcess(tiny_model, tmp_path / "server.log", "--chat-template", str(path),
                        "--max-kv-tokens", "4096")
    try:
        srv.wait_ready()
        r = httpx.post(f"{srv.base}/tokenize", json={"messages": MSGS}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["tokens"] == want
        r = httpx.post(f"{srv.base}/v1/chat/completions", timeout=60,
                       json={"messages": MSGS, "max_tokens": 2, "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == len(want)
    finally:
        assert srv.stop() == 0
