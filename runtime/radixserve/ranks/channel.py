"""Rank 0 to every other rank: the typed messages each rank applies before a step, encoded by the
messages' own codec and broadcast over the group's gloo control group (a collective, so nothing is
dropped however late a rank joins, and an idle group just waits)."""
from __future__ import annotations

from typing import Any

from radixserve.distributed import get_comm
from radixserve.messages import decode, encode


class LeaderLost(RuntimeError):
    """A follower's exchange with rank 0 failed: rank 0 is gone."""


def publish(msgs: list[Any]) -> None:
    """Rank 0: send this step's messages (a collective: every follower must be receiving)."""
    get_comm().broadcast_bytes(encode(msgs))


def receive() -> list[Any]:
    """A follower: the messages rank 0 published for the next step; `LeaderLost` if it is gone."""
    try:
        return decode(get_comm().broadcast_bytes(None))
    except RuntimeError as e:
        raise LeaderLost(str(e).splitlines()[0] if str(e) else type(e).__name__) from e
