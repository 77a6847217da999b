from __future__ import annotations

import msgpack
import pytest

from radixserve.messages import (
    RequestFailed,
    TokenBatch,
    TokenizeMsg,
    TokenMsg,
    UserReply,
    decode,
    encode,
)
from radixserve.sampling_params import SamplingParams


def test_round_trip_keeps_types_and_nested_messages() -> None:
    msg = TokenizeMsg(7, SamplingParams(max_tokens=3, stop=["\n"], seed=5), chat=[{"role": "user", "content": "héllo"}])
    back = decode(encode(msg))
    assert back == msg and isinstance(back.params, SamplingParams)
    batch = TokenBatch([TokenMsg(1, 42, True, "stop", 9, -0.25, [[42, -0.25], [3, -2.0]])])
    assert decode(encode(batch)) == batch
    replies = [UserReply(1, "a", [5]), RequestFailed(2, "bad", "prompt")]
    assert decode(encode(replies)) == replies


def test_wire_format_is_plain_msgpack_not_pickle() -> None:
    raw = msgpack.unpackb(encode(UserReply(3, "x", [1, 2])), raw=False)
    assert raw["__t"] == "UserReply" and raw["token_ids"] == [1, 2]


def test_unknown_message_type_is_refused() -> None:
    data = msgpack.packb({"__t": "os.system", "cmd": "true"})
    with pytest.raises(ValueError, match="unknown message type"):
        decode(data)


def test_decoded_sampling_params_are_validated() -> None:
    data = msgpack.packb({"__t": "SamplingParams", "max_tokens": -1})
    with pytest.raises(ValueError, match="max_tokens"):
        decode(data)
