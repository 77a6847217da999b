"""The scheduler process's loop around the real `Scheduler`, driven in-process over real ZMQ
sockets: the upstream bugs it must not repeat (empty prompt, too-long prompt dropped silently,
abort during an in-flight prefill, abort that overtakes its request)."""
from __future__ import annotations

import pytest
import zmq

from radixserve.config import EngineConfig, SchedulerConfig
from radixserve.messages import (
    AbortMsg,
    IpcAddresses,
    RequestFailed,
    RequestStarted,
    TokenBatch,
    UserMsg,
    make_socket,
    recv_nowait,
)
from radixserve.sampling_params import SamplingParams
from radixserve.scheduler.loop import SchedulerLoop


@pytest.fixture(scope="module")
def env(tiny_model):
    from radixserve.scheduler.scheduler import Scheduler

    scheduler = Scheduler(EngineConfig(model=str(tiny_model), device="cpu", max_kv_tokens=512), SchedulerConfig())
    addrs, ctx = IpcAddresses.create(), zmq.Context()
    detok = make_socket(ctx, zmq.PULL, addrs.detokenizer, bind=True)
    make_socket(ctx, zmq.PULL, addrs.frontend, bind=True)
    yield SchedulerLoop(scheduler, ctx, addrs), detok
    addrs.remove()
    ctx.destroy(linger=0)


def _run(loop: SchedulerLoop, detok: zmq.Socket, *msgs) -> list:
    for m in msgs:
        loop.handle(m)
    while loop.scheduler.has_work:
        loop.step()
    out = []
    while detok.poll(300):
        out += recv_nowait(detok)
    return out


def _tokens(msgs: list, uid: int) -> list:
    return [o for m in msgs if isinstance(m, TokenBatch) for o in m.outputs if o.uid == uid]


def _assert_idle(loop: SchedulerLoop) -> None:
    loop.scheduler.check_integrity()
    s = loop.scheduler.stats()
    assert s["running"] == s["waiting"] == s["protected_tokens"] == 0


def _params(n: int = 4) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True)


def test_empty_prompt_is_rejected_and_the_loop_keeps_serving(env) -> None:
    loop, detok = env
    out = _run(loop, detok, UserMsg(1, [], _params()), UserMsg(2, [5, 6, 7], _params()))
    failed = [m for m in out if isinstance(m, RequestFailed)]
    assert [f.uid for f in failed] == [1] and "empty" in failed[0].message
    toks = _tokens(out, 2)
    assert len(toks) == 4 and toks[-1].finished and toks[-1].finish_reason == "length"
    assert toks[0].prompt_tokens == 3
    _assert_idle(loop)


def test_too_long_prompt_gets_an_error_naming_the_limits(env) -> None:
    loop, detok = env
    limit = loop.scheduler.max_seq_len
    out = _run(loop, detok, UserMsg(3, [5] * limit, _params(2)))
    (failed,) = out
    assert isinstance(failed, RequestFailed) and failed.code == "context_length_exceeded"
    assert str(limit) in failed.message and str(limit + 2) in failed.message


@pytest.mark.parametrize("default", [5, 10**6])
def test_auto_max_tokens_is_the_default_capped_to_the_context_left(env, default: int) -> None:
    loop, _ = env
    uid = 4 if default == 5 else 5
    msg = UserMsg(uid, [5] * 10, _params(default), auto_max_tokens=True)
    loop.handle(msg)
    admitted = loop.scheduler.reqs[uid].params
    room = min(loop.scheduler.max_seq_len, loop.scheduler.limits.kv_capacity) - 10
    assert admitted.max_tokens == min(default, room)  # (the KV cache here is the smaller)
    assert msg.params.max_tokens == default, "the caller's params are never modified"
    loop.handle(AbortMsg(uid))
    while loop.scheduler.has_work:
        loop.step()


def test_abort_while_prefill_is_in_flight_frees_once(env) -> None:
    loop, detok = env
    prompt = list(range(3, 40))
    loop.handle(UserMsg(10, prompt, _params(8)))
    first = loop.scheduler.step()  # launches the prefill (with overlap, still in flight)
    assert all(o.uid == 10 for o in first)
    out = _run(loop, detok, AbortMsg(10))
    assert not [o for o in _tokens(out, 10) if not o.finished], "no tokens after the abort"
    assert any(isinstance(m, AbortMsg) and m.uid == 10 for m in out)
    _assert_idle(loop)
    again = _run(loop, detok, UserMsg(11, prompt, _params(8)))  # the same prefix, cached or not
    assert len(_tokens(again, 11)) == 8
    _assert_idle(loop)


def test_abort_that_overtakes_its_request_drops_it(env) -> None:
    loop, detok = env
    out = _run(loop, detok, AbortMsg(20), UserMsg(20, [5, 6, 7], _params()))
    assert not _tokens(out, 20) and not any(isinstance(m, RequestStarted) for m in out)
    assert not loop.scheduler.has_work
