"""The offline API: `LLM(model).generate(prompts, SamplingParams(...))`, in-process."""
from __future__ import annotations

import atexit
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, fields

from tqdm import tqdm

from radixserve.config import EngineConfig, SchedulerConfig
from radixserve.sampling_params import SamplingParams
from radixserve.scheduler.scheduler import Scheduler

Prompt = str | list[int]


@dataclass
class GenerateResult:
    text: str
    token_ids: list[int]  # generated tokens only
    finish_reason: str  # "stop" | "length"
    prompt_token_ids: list[int]


def _split_kwargs(kwargs: dict) -> tuple[dict, dict]:
    eng = {f.name for f in fields(EngineConfig)}
    sch = {f.name for f in fields(SchedulerConfig)}
    unknown = set(kwargs) - eng - sch
    if unknown:
        raise TypeError(
            f"LLM got unknown options {sorted(unknown)}; known: {sorted((eng | sch) - {'model'})}"
        )
    return ({k: v for k, v in kwargs.items() if k in eng}, {k: v for k, v in kwargs.items() if k in sch})


def truncate_at_stop(text: str, stop: list[str]) -> tuple[str, bool]:
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


class LLM:
    def __init__(
        self, model: str | None = None, *, dtype: str = "auto", device: str = "auto",
        page_size: int = 1, cache: str = "radix", max_prefill_length: int = 8192,
        max_running_requests: int = 256, **more: object,
    ) -> None:
        from transformers import AutoTokenizer

        eng, sch = _split_kwargs(dict(
            model=model, dtype=dtype, device=device, page_size=page_size, cache=cache,
            max_prefill_length=max_prefill_length, max_running_requests=max_running_requests,
            **more,
        ))
        eng_cfg, sch_cfg = EngineConfig(**eng), SchedulerConfig(**sch)
        if eng_cfg.tp > 1:  # NOTE: one TP group per process (torch.distributed is global)
            from radixserve.scheduler.tp_launch import start_group

            self.scheduler = start_group(eng_cfg, sch_cfg)
            atexit.register(self.close)
        else:
            self.scheduler = Scheduler(eng_cfg, sch_cfg)
        self.tokenizer = AutoTokenizer.from_pretrained(self.scheduler.model_path)
        self._uids = itertools.count()

    def close(self) -> None:
        """Stop the tensor-parallel followers and leave the group (a no-op at TP=1)."""
        close = getattr(self.scheduler, "close", None)
        if close is not None:
            close()

    def encode(self, prompt: Prompt, chat: bool) -> list[int]:
        if not isinstance(prompt, str):
            return list(prompt)
        if chat:
            msgs = [{"role": "user", "content": prompt}]
            text = self.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            return self.tokenizer.encode(text, add_special_tokens=False)
        return self.tokenizer.encode(prompt) if prompt else []

    def generate(
        self, prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *, chat: bool = False, progress: bool = False,
    ) -> list[GenerateResult]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        params = sampling_params or SamplingParams()
        plist = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(plist) != len(prompts):
            raise ValueError(f"sampling_params: {len(plist)} given for {len(prompts)} prompts")
        ids = [self.encode(p, chat) for p in prompts]
        uids = [next(self._uids) for _ in ids]
        sched = self.scheduler
        for n, (uid, toks, sp) in enumerate(zip(uids, ids, plist)):
            try:
                sched.add_request(uid, toks, sp)
            except ValueError as e:
                for u in uids[:n]:
                    sched.abort(u)
                raise ValueError(f"prompt {n}: {e}") from None
        outputs: dict[int, list[int]] = {u: [] for u in uids}
        reasons: dict[int, str] = {}
        bar = tqdm(total=len(uids), desc="generate", disable=not progress)
        while len(reasons) < len(uids) or sched.has_work:  # has_work: drain the in-flight batch
            for out in sched.step():
                outputs[out.uid].append(out.token_id)
                if out.finished:
                    reasons[out.uid] = out.finish_reason or "stop"
                    bar.update()
            if failures := sched.take_failures():  # a grammar that did not compile
                for u in uids:
                    sched.abort(u)
                while sched.has_work:
                    sched.step()
                bar.close()
                f = failures[0]
                raise (ValueError if f.status < 500 else RuntimeError)(
                    f"prompt {uids.index(f.uid)}: {f.message}")
        bar.close()
        results = []
        for uid, toks, sp in zip(uids, ids, plist):
            text = self.tokenizer.decode(outputs[uid], skip_special_tokens=True)
            text, hit = truncate_at_stop(text, sp.stop) if sp.stop else (text, False)
            results.append(GenerateResult(text, outputs[uid], "stop" if hit else reasons[uid], toks))
        return results
