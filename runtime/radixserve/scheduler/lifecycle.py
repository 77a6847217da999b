"""The `Scheduler`'s request API as the pipeline's messages: what the scheduler process sends the
detokenizer (`scheduler/loop.py`) and what the in-process engine feeds its own detokenizer
(`radixserve/offline/pipeline.py`). One set of functions for both, so a request is admitted,
aborted, stopped and reported alike whether it came over HTTP or through `LLM`.

Where each decision lives:
- admission (every check, `max_tokens` auto-fill): `Scheduler.add_request` (`admission.py`)
- abort before or after arrival: `Scheduler.abort` (`ledger.py`)
- EOS, stop token ids, `max_tokens`, a complete grammar: `Scheduler.step`
- stop strings: the detokenizer (`tokenizer/detokenize.py`), which sees the text; it asks for an
  abort, which frees the KV at once
- grammar compile failures: `Scheduler.take_failures`
- LoRA adapters loaded and unloaded: `Scheduler.load_lora`, `unload_lora`
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from radixserve.lora.source import AdapterError
from radixserve.messages import (
    AbortMsg,
    GrammarsReady,
    LoadLoRA,
    LoRAReply,
    RequestFailed,
    RequestStarted,
    TokenMsg,
    UnloadLoRA,
    UserMsg,
)
from radixserve.scheduler.admission import AdmissionError

if TYPE_CHECKING:
    from radixserve.core.output import TokenOutput
    from radixserve.scheduler.scheduler import Scheduler

logger = logging.getLogger(__name__)


def admit(sched: Scheduler, msg: UserMsg) -> RequestStarted | RequestFailed | None:
    """Queue the request: RequestStarted (the detokenizer's cue, with its stop strings),
    RequestFailed (refused; its 4xx), or None (its abort came first: it is dropped silently)."""
    try:
        params = sched.add_request(msg.uid, msg.input_ids, msg.params,
                                   auto_max_tokens=msg.auto_max_tokens, lora=msg.lora)
    except AdmissionError as e:
        return RequestFailed(msg.uid, e.message, e.param, e.code, e.status)
    except Exception:  # a fault of this request alone: it fails, the others keep running
        logger.exception("scheduler: could not admit request %d", msg.uid)
        return RequestFailed(msg.uid, "internal error while admitting the request", status=500)
    if params is None:
        return None
    return RequestStarted(msg.uid, params.stop, params.logprobs is not None, params.min_tokens,
                          params.skip_special_tokens)


def abort(sched: Scheduler, uid: int) -> AbortMsg | None:
    """Drop the request in any state: AbortMsg (the detokenizer ends its reply with "abort") if it
    was live, None if it had finished or has not arrived yet."""
    return AbortMsg(uid) if sched.abort(uid) else None


def change_lora(sched: Scheduler, msg: LoadLoRA | UnloadLoRA) -> LoRAReply:
    """Load or unload an adapter: the adapters served after it, or why it could not be done (a
    bad adapter or name: 400 before anything is loaded; an unknown name: 404)."""
    try:
        if isinstance(msg, LoadLoRA):
            sched.load_lora(msg.name, msg.path)
        else:
            sched.unload_lora(msg.name)
    except AdapterError as e:
        return LoRAReply(msg.uid, sched.served_loras(), e.message, e.status)
    except Exception as e:  # the adapter's fault alone: the server keeps serving the others
        logger.exception("scheduler: could not change LoRA adapter %r", msg.name)
        return LoRAReply(msg.uid, sched.served_loras(), f"internal error: {e}", 500)
    return LoRAReply(msg.uid, sched.served_loras())


def settle_grammars(sched: Scheduler, msg: GrammarsReady) -> None:
    """A follower: queue the requests whose grammar rank 0 queued (waiting for this rank's own
    compilation if late) and forget those it failed (rank 0 reports them)."""
    sched.drop_grammars(msg.failed)
    if failed := sched.admit_grammars(msg.compiled):
        raise RuntimeError(f"the grammars of requests {failed} compiled on rank 0 but not on "
                           f"this rank (see its log)")


def apply(sched: Scheduler, msg: UserMsg | AbortMsg | GrammarsReady | LoadLoRA | UnloadLoRA) -> None:
    """A follower applies a message rank 0 published, as rank 0 applied it; the replies are
    rank 0's to send. (Rank 0 publishes a LoRA change only once it succeeded there.)"""
    if isinstance(msg, UserMsg):
        admit(sched, msg)
    elif isinstance(msg, AbortMsg):
        abort(sched, msg.uid)
    elif isinstance(msg, GrammarsReady):
        settle_grammars(sched, msg)
    elif isinstance(msg, (LoadLoRA, UnloadLoRA)):
        if (err := change_lora(sched, msg).error) is not None:
            raise RuntimeError(f"LoRA adapter {msg.name!r} changed on rank 0 but not on this "
                               f"rank: {err}")
    else:
        raise TypeError(f"a follower cannot apply {type(msg).__name__}")


def token_msg(out: TokenOutput) -> TokenMsg:
    top = [list(t) for t in out.top_logprobs] if out.top_logprobs is not None else None
    plp = None
    if out.prompt_logprobs is not None:
        plp = [[t, lp, [list(x) for x in best]] for t, lp, best in out.prompt_logprobs]
    return TokenMsg(out.uid, out.token_id, out.finished, out.finish_reason, out.prompt_tokens,
                    out.logprob, top, plp, out.embedding, out.cached_tokens, out.spec_drafted,
                    out.spec_accepted, out.spec_steps)


def step(sched: Scheduler) -> tuple[list[TokenMsg], list[RequestFailed]]:
    """One scheduler step: the tokens it produced, then the requests it failed (a grammar that did
    not compile: its 400; a token that broke one: its 500)."""
    tokens = [token_msg(o) for o in sched.step()]
    failed = [RequestFailed(f.uid, f.message, f.param, None, f.status)
              for f in sched.take_failures()]
    return tokens, failed
