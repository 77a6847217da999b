"""Typed inter-process messages (dataclasses encoded with msgpack) and their ZMQ transport."""
from __future__ import annotations

from radixserve.messages.codec import decode, encode, message
from radixserve.messages.transport import IpcAddresses, make_socket, recv_nowait, send
from radixserve.messages.types import (
    AbortMsg,
    GrammarsReady,
    Heartbeat,
    LeaveGroup,
    RequestFailed,
    RequestStarted,
    SchedulerStats,
    TextOpMsg,
    TextOpReply,
    TokenBatch,
    TokenizeMsg,
    TokenLogprob,
    TokenMsg,
    UserMsg,
    UserReply,
)

__all__ = [
    "AbortMsg",
    "GrammarsReady",
    "Heartbeat",
    "IpcAddresses",
    "LeaveGroup",
    "RequestFailed",
    "RequestStarted",
    "SchedulerStats",
    "TextOpMsg",
    "TextOpReply",
    "TokenBatch",
    "TokenLogprob",
    "TokenMsg",
    "TokenizeMsg",
    "UserMsg",
    "UserReply",
    "decode",
    "encode",
    "make_socket",
    "message",
    "recv_nowait",
    "send",
]
