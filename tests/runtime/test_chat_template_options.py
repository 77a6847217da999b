"""The chat template's options as the tokenizer applies them: variables from
`chat_template_kwargs` (Qwen3's `enable_thinking`) and `continue_final_message`."""
from __future__ import annotations

import json

import pytest

from radixserve.messages import TokenizeMsg
from radixserve.sampling_params import SamplingParams
from radixserve.testing import build_tokenizer
from radixserve.tokenizer.tokenize import TokenizeManager

TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{%- if not (loop.last and continue_final_message) %}<|im_end|>\n{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and not enable_thinking %}<think></think>{%- endif %}{%- endif %}"
)
CHAT = [{"role": "user", "content": "hi"}]


def _text(**kw) -> str:
    tok = build_tokenizer()
    tok.chat_template = TEMPLATE
    ids = TokenizeManager(tok).tokenize(TokenizeMsg(1, SamplingParams(), chat=kw.pop("chat", CHAT), **kw))
    return tok.decode(ids)


def test_template_kwargs_reach_the_template() -> None:
    assert _text().endswith("<|im_start|>assistant")
    assert _text(template_kwargs=json.dumps({"enable_thinking": False})).endswith("<think></think>")
    assert _text(template_kwargs=json.dumps({"enable_thinking": True})).endswith("assistant")


def test_continue_final_message_leaves_the_turn_open() -> None:
    chat = CHAT + [{"role": "assistant", "content": "Hello the"}]
    assert _text(chat=chat, add_generation_prompt=False, continue_final_message=True).endswith("Hello the")
    assert _text(chat=chat, add_generation_prompt=False).endswith("Hello the<|im_end|>")


def test_llm_passes_chat_template_kwargs(tiny_ckpts) -> None:
    from radixserve import LLM

    llm = LLM(str(tiny_ckpts["llama"]), dtype="float32", device="cpu",
              chat_template_kwargs={"enable_thinking": False})
    llm.tokenizer.chat_template = TEMPLATE
    assert llm.tokenizer.decode(llm.encode("hi", chat=True)).endswith("<think></think>")
    assert llm.tokenizer.decode(llm.encode(CHAT)).endswith("<think></think>")


# a template unlike any checkpoint's, so its use is plain to see in the rendered prompt
PLAIN = "{%- for m in messages %}{{ m.role | upper }}: {{ m.content }}\n{%- endfor %}" \
        "{%- if add_generation_prompt %}ASSISTANT:{%- endif %}"


def test_read_chat_template_takes_a_file_or_the_template(tmp_path) -> None:
    from radixserve.chat_template import read_chat_template

    path = tmp_path / "plain.jinja"
    path.write_text(PLAIN)
    assert read_chat_template(str(path)) == PLAIN
    assert read_chat_template(PLAIN) == PLAIN
    with pytest.raises(ValueError, match="'no/such.jinja' is neither a file nor a Jinja template"):
        read_chat_template("no/such.jinja")
    with pytest.raises(ValueError, match=r"does not parse: .*line 1"):
        read_chat_template("{% for m in messages %}{{ m.content }}")  # no endfor
    (tmp_path / "broken.jinja").write_text("{{ messages[0].content ")
    with pytest.raises(ValueError, match="does not parse"):
        read_chat_template(str(tmp_path / "broken.jinja"))


def test_llm_chat_template_replaces_the_checkpoints(tiny_ckpts, tmp_path) -> None:
    from radixserve import LLM

    path = tmp_path / "plain.jinja"
    path.write_text(PLAIN)
    llm = LLM(str(tiny_ckpts["llama"]), dtype="float32", device="cpu", chat_template=str(path))
    assert llm.tokenizer.decode(llm.encode("hi", chat=True)) == "USER: hiASSISTANT:"
    with pytest.raises(ValueError, match="neither a file nor a Jinja template"):
        LLM(str(tiny_ckpts["llama"]), dtype="float32", device="cpu", chat_template="plain.jinja")


def test_a_processors_template_serves_where_the_tokenizer_has_none(tmp_path) -> None:
    """Multimodal checkpoints may keep their template only in the processor's
    chat_template.json, which transformers' tokenizer does not read."""
    from radixserve.tokenizer.load import load_tokenizer

    tok = build_tokenizer()
    tok.chat_template = None
    tok.save_pretrained(tmp_path)
    assert load_tokenizer(str(tmp_path)).chat_template is None
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    got = load_tokenizer(str(tmp_path))
    assert got.chat_template == TEMPLATE
    ids = TokenizeManager(got).tokenize(TokenizeMsg(1, SamplingParams(), chat=CHAT))
    assert got.decode(ids) == "<|im_start|>user\nhi<|im_end|><|im_start|>assistant"
    assert load_tokenizer(str(tmp_path), chat_template="{{ 'x' }}").chat_template == "{{ 'x' }}"
