"""The offline API: the engine in this process.

    llm = LLM(model)
    llm.generate(prompts, SamplingParams(...))        # whole results, batched
    for out in llm.stream(prompt, params): ...        # deltas as they are generated
    await llm.agenerate(prompts, params)              # asyncio
    async for out in llm.astream(prompt, params): ... # asyncio, deltas
    LLM(model, lora_paths=["sql=/adapters/sql"]).generate(prompts, params, lora="sql")

A request goes through the server's own code after the HTTP layer: prompts are tokenized by
`tokenizer/tokenize.py`, fanned out to `n` choices by `choice_params`, admitted, stepped, stopped
and decoded by `offline/pipeline.py` (the scheduler loop's and the detokenizer's code), so `LLM`
and the server give one request the same tokens and text. Every call, from any thread or event
loop, shares one engine loop (`offline/engine_loop.py`): concurrent callers batch together.
"""
from __future__ import annotations

import asyncio
import atexit
import json
from collections import deque
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from radixserve.chat_template import read_chat_template
from radixserve.config import EngineConfig, SchedulerConfig, ServerConfig
from radixserve.messages import LoadLoRA, RequestFailed, TokenizeMsg, UnloadLoRA, UserMsg
from radixserve.offline.engine_loop import EngineLoop
from radixserve.offline.outputs import (
    Collector,
    GenerateResult,
    StreamOutput,
    request_error,
    stream_output,
)
from radixserve.offline.pipeline import LocalPipeline, Reply
from radixserve.options import declared, options_of
from radixserve.sampling_params import SamplingParams, choice_params
from radixserve.scheduler.scheduler import Scheduler
from radixserve.tokenizer.load import load_tokenizer
from radixserve.tokenizer.tokenize import TokenizeManager, truncated

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["LLM", "GenerateResult", "StreamOutput"]

Prompt = str | list[int] | list[dict]  # text, token ids, or a chat conversation (list of messages)
Params = SamplingParams | Sequence[SamplingParams] | None
_DEFAULT_PARAMS = SamplingParams()


# `LLM(...)`'s keywords: every engine and scheduler setting, and the server's chat template
_OWNERS = {f.name: cls for cls in (EngineConfig, SchedulerConfig) for f, _ in options_of(cls)
           if f.name != "model"}
_OWNERS["chat_template"] = ServerConfig


def llm_config(model: str | None, options: dict[str, Any]) -> ServerConfig:
    """The configuration of `LLM(model, **options)`: TypeError for an unknown keyword,
    ValueError for a refused value (named as the keyword)."""
    if unknown := sorted(set(options) - set(_OWNERS)):
        raise TypeError(f"LLM got unknown options {unknown}; known: {sorted(_OWNERS)}")
    given = {cls: {k: v for k, v in options.items() if _OWNERS[k] is cls}
             for cls in (EngineConfig, SchedulerConfig, ServerConfig)}
    return ServerConfig(engine=EngineConfig(model=model, **given[EngineConfig]),
                        scheduler=SchedulerConfig(**given[SchedulerConfig]), **given[ServerConfig])


def _options_doc() -> str:
    lines = []
    for name, cls in _OWNERS.items():
        opt = declared(cls, name)
        lines.append(f"    {name} ({opt.flag}): {opt.help}")
    return "\n".join(lines)


def _prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str) or (prompts and isinstance(prompts[0], (int, dict))):
        return [prompts]  # type: ignore[list-item]
    return list(prompts)  # type: ignore[arg-type]


class LLM:
    def __init__(self, model: str | None = None, *, chat_template_kwargs: dict | None = None,
                 **options: Any) -> None:
        """`model`: a Hugging Face directory or hub id (None: the embedded model).
        `chat_template_kwargs`: variables for the chat template of every chat prompt (Qwen3's
        `{"enable_thinking": False}`), as the server's request field of that name.
        `options`: the server's settings by their names (docs/configuration.md), each with the
        default and check of its flag; ValueError for a refused value, TypeError for an unknown
        name."""
        cfg = llm_config(model, options)
        eng_cfg, sch_cfg = cfg.engine, cfg.scheduler
        template = read_chat_template(cfg.chat_template) if cfg.chat_template is not None else None
        self._template_kwargs = json.dumps(chat_template_kwargs) if chat_template_kwargs else None
        if eng_cfg.tp > 1:  # NOTE: one TP group per process (torch.distributed is global)
            from radixserve.scheduler.tp import start_leader

            self.scheduler = start_leader(eng_cfg, sch_cfg)
            atexit.register(self.close)
        else:
            self.scheduler = Scheduler(eng_cfg, sch_cfg)
        self.tokenizer = load_tokenizer(self.scheduler.model_path, template)
        self._tokenize = TokenizeManager(self.tokenizer)
        self._engine = EngineLoop(LocalPipeline(self.scheduler, self.tokenizer))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the engine loop (waiting callers get an error) and, under tensor parallelism,
        the followers; idempotent."""
        self._engine.close()
        close = getattr(self.scheduler, "close", None)
        if close is not None:
            close()

    def encode(self, prompt: Prompt, chat: bool = False) -> list[int]:
        """A prompt's token ids, as the server makes them (`tokenizer/tokenize.py`): text with the
        tokenizer's special tokens; with `chat`, or for a conversation, through the model's chat
        template with the generation prompt; token ids as given."""
        if isinstance(prompt, str):
            if not prompt:
                return []  # refused at admission, as the server refuses it
            msg = (TokenizeMsg(0, _DEFAULT_PARAMS, chat=[{"role": "user", "content": prompt}],
                               template_kwargs=self._template_kwargs)
                   if chat else TokenizeMsg(0, _DEFAULT_PARAMS, text=prompt))
        elif prompt and isinstance(prompt[0], dict):
            msg = TokenizeMsg(0, _DEFAULT_PARAMS, chat=list(prompt),  # type: ignore[arg-type]
                              template_kwargs=self._template_kwargs)
        else:
            return list(prompt)  # type: ignore[arg-type]
        return self._tokenize.tokenize(msg)

    def embed(self, prompts: Prompt | Sequence[Prompt], *, chat: bool = False) -> list[list[float]]:
        """Each prompt's embedding, as `/v1/embeddings` gives it: the hidden state after the
        final norm at its last token, L2-normalized (Qwen3-Embedding's pooling)."""
        return [r.embedding or [] for r in self.generate(
            prompts, SamplingParams(max_tokens=1, embed=True), chat=chat)]

    def generate(self, prompts: Prompt | Sequence[Prompt], sampling_params: Params = None, *,
                 chat: bool = False, progress: bool = False, n: int = 1,
                 lora: str | None = None) -> list[GenerateResult]:
        """One result per prompt and choice (prompt-major: prompt i's choice j is at i*n + j).
        Stops as the server does: EOS, stop token ids, stop strings (the text ends before one;
        the tokens end with the one that completed it), max_tokens, a complete grammar. A refused
        or failed request raises ValueError (RuntimeError for an internal error) naming its
        prompt, and the call's other requests are dropped. `lora`: the name of a served LoRA
        adapter to run with (`lora_paths`, `load_lora`); None: the base model."""
        msgs, index, ids = self._requests(prompts, sampling_params, chat, n, lora)
        if not msgs:
            return []
        bar = tqdm(total=len(msgs), desc="generate", disable=not progress)
        col = Collector(index, n, ids, on_finished=bar.update)
        self._engine.submit(msgs, col.add)
        try:
            self._engine.run_until(col.done)
        finally:
            bar.close()
            self._drop_unfinished(col, index)
        return col.results()

    def stream(self, prompts: Prompt | Sequence[Prompt], sampling_params: Params = None, *,
               chat: bool = False, n: int = 1, lora: str | None = None) -> Iterator[StreamOutput]:
        """Each choice's new text and tokens as they are generated (text is released once whole
        characters are decoded and no stop string can begin in it). Leaving the loop early
        aborts what is left."""
        msgs, index, _ = self._requests(prompts, sampling_params, chat, n, lora)
        pending: deque = deque()
        live = set(index)
        self._engine.submit(msgs, pending.append)
        try:
            while live:
                self._engine.run_until(lambda: bool(pending))
                while pending:
                    out = self._delta(pending.popleft(), index, n, live)
                    yield out
        finally:
            if live:
                self._engine.abort(live)
            self._engine.settle()

    async def agenerate(self, prompts: Prompt | Sequence[Prompt], sampling_params: Params = None,
                        *, chat: bool = False, n: int = 1,
                        lora: str | None = None) -> list[GenerateResult]:
        """`generate` for asyncio: the engine steps on its own thread, so the event loop stays
        free, and concurrent calls batch together. Cancelling the call aborts its requests."""
        msgs, index, ids = self._requests(prompts, sampling_params, chat, n, lora)
        if not msgs:
            return []
        loop = asyncio.get_running_loop()
        col, done = Collector(index, n, ids), asyncio.Event()

        def deliver(r: Reply | Exception) -> None:
            col.add(r)
            if col.done():
                done.set()

        self._engine.submit(msgs, lambda r: loop.call_soon_threadsafe(deliver, r),
                            background=True)
        try:
            await done.wait()
        finally:
            if not col.done() or col.failure is not None:
                self._engine.abort(list(index))
        return col.results()

    async def astream(self, prompts: Prompt | Sequence[Prompt], sampling_params: Params = None,
                      *, chat: bool = False, n: int = 1,
                      lora: str | None = None) -> AsyncIterator[StreamOutput]:
        """`stream` for asyncio (`async for out in llm.astream(...)`)."""
        msgs, index, _ = self._requests(prompts, sampling_params, chat, n, lora)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        live = set(index)
        self._engine.submit(msgs, lambda r: loop.call_soon_threadsafe(queue.put_nowait, r),
                            background=True)
        try:
            while live:
                yield self._delta(await queue.get(), index, n, live)
        finally:
            if live:
                self._engine.abort(live)

    def load_lora(self, name: str, path: str) -> None:
        """Serve the PEFT LoRA adapter at `path` as `name` (LoRA on: `enable_lora` or
        `lora_paths`); ValueError, with nothing loaded, if it cannot be."""
        self._engine.change_lora(LoadLoRA(0, name, path))

    def unload_lora(self, name: str) -> None:
        """Stop serving adapter `name`; ValueError if it is not served."""
        self._engine.change_lora(UnloadLoRA(0, name))

    def _requests(self, prompts: Prompt | Sequence[Prompt], sampling_params: Params, chat: bool,
                  n: int, lora: str | None = None) -> tuple[list[UserMsg], dict[int, int], list[list[int]]]:
        """The call's requests (prompts × n), uid -> choice index, and each prompt's token ids."""
        plist = _prompt_list(prompts)
        params = sampling_params or _DEFAULT_PARAMS
        per_prompt = [params] * len(plist) if isinstance(params, SamplingParams) else list(params)
        if len(per_prompt) != len(plist):
            raise ValueError(f"sampling_params: {len(per_prompt)} given for {len(plist)} prompts")
        ids = []
        for i, p in enumerate(plist):
            try:
                ids.append(truncated(self.encode(p, chat), per_prompt[i]))
            except ValueError as e:
                raise ValueError(f"prompt {i}: {e}") from None
        msgs, index = [], {}
        for i, (toks, sp) in enumerate(zip(ids, per_prompt)):
            for j, choice in enumerate(choice_params(sp, n)):
                uid = self._engine.new_uid()
                index[uid] = i * n + j
                msgs.append(UserMsg(uid, toks, choice, lora=lora))
        return msgs, index, ids

    @staticmethod
    def _delta(r: Reply | Exception, index: dict[int, int], n: int,
               live: set[int]) -> StreamOutput:
        if isinstance(r, RequestFailed):
            raise request_error(r, index[r.uid] // n)
        if isinstance(r, Exception):
            raise r
        if r.finished:
            live.discard(r.uid)
        return stream_output(r, index[r.uid])

    def _drop_unfinished(self, col: Collector, index: dict[int, int]) -> None:
        """After a call: abort what is left of it (interrupted, or one of its requests failed),
        then let the engine finish what is in flight if nobody else is using it."""
        if not col.done() or col.failure is not None:
            self._engine.abort(list(index))
        self._engine.settle()


LLM.__init__.__doc__ = f"{LLM.__init__.__doc__}\n\n    Options:\n{_options_doc()}"
