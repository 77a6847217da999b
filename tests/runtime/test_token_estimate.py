"""Optimistic admission's estimate of the running requests' tokens to come: blind, it decays
linearly as SGLang's does; once requests finish, it closes on what they used far faster, and a
retraction raises it again."""
from __future__ import annotations

import pytest

from radixserve.core.request import Req
from radixserve.sampling_params import SamplingParams
from radixserve.scheduler.token_estimate import DECAY_STEPS, TokenEstimate


def _finished(max_tokens: int, made: int) -> Req:
    req = Req(0, [1, 2, 3], SamplingParams(max_tokens=max_tokens))
    req.output_ids = [7] * made
    return req


def test_without_finishes_the_ratio_decays_linearly_to_its_floor() -> None:
    est = TokenEstimate(1.0)
    for _ in range(DECAY_STEPS // 2):
        est.decode_step()
    assert est.ratio == pytest.approx((est.init + est.min) / 2)
    for _ in range(DECAY_STEPS):
        est.decode_step()
    assert est.ratio == pytest.approx(est.min)


def test_finishes_that_used_a_tenth_of_max_tokens_bring_the_ratio_down_within_60_steps() -> None:
    est, blind = TokenEstimate(1.0), TokenEstimate(1.0)
    est.finished(_finished(4096, 300))  # a chat answer: 7% of its max_tokens
    start = est.ratio - est.floor
    for _ in range(60):
        est.decode_step()
        blind.decode_step()
    assert est.ratio - est.floor <= 0.05 * start  # the linear decay has a tenth of the way behind it
    assert blind.ratio - blind.floor >= 0.85 * start
    assert est.ratio >= est.floor


def test_finishes_that_use_their_whole_budget_keep_the_ratio_up() -> None:
    est = TokenEstimate(1.0)
    for _ in range(50):
        est.finished(_finished(100, 100))
    for _ in range(2 * DECAY_STEPS):
        est.decode_step()
    assert est.ratio == pytest.approx(est.init)  # the floor is what they use, capped at init


def test_a_retraction_raises_the_ratio_after_a_fast_decay() -> None:
    est = TokenEstimate(1.0)
    est.finished(_finished(4096, 300))
    for _ in range(300):
        est.decode_step()
    low = est.ratio
    kept = [_finished(1000, 600), _finished(1000, 500)]
    est.retracted(kept)
    assert est.ratio > low
    assert est.ratio == pytest.approx((1100 + 2 * 20) / 2001)
