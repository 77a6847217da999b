"""Server flags that change what a request sees, on one server: `--chat-template` (chat prompts
go through the given template, not the checkpoint's, in the tokenizer processes that build
them), `--max-model-len` (the context served, below the model's 1,024), and the model's
generation_config.json sampling values as defaults for the fields a request leaves out
(`--sampling-defaults model`, the default)."""
from __future__ import annotations

import copy
import json

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

    model = tmp_path / "model"  # the tiny model, recommending top_k 1 (greedy) in its generation config
    model.mkdir()
    for f in tiny_model.iterdir():
        (model / f.name).symlink_to(f)
    gen = tiny_model / "generation_config.json"
    (model / gen.name).unlink(missing_ok=True)
    (model / gen.name).write_text(json.dumps({**(json.loads(gen.read_text()) if gen.exists() else {}), "top_k": 1}))

    srv = ServerProcess(model, tmp_path / "server.log", "--chat-template", str(path),
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

        def complete(**fields) -> list[str]:
            body = {"prompt": "a b c", "max_tokens": 16, "ignore_eos": True, "logprobs": 0, **fields}
            r = httpx.post(f"{srv.base}/v1/completions", timeout=60, json=body)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["logprobs"]["tokens"]

        greedy = complete(temperature=0)
        assert complete(seed=1) == greedy  # top_k 1 from the model's config: greedy at temperature 1
        assert complete(seed=1, top_k=-1) != greedy  # a field the request gives is its own
        assert "sampling defaults from the model's generation_config.json" in srv.log()
    finally:
        assert srv.stop() == 0
