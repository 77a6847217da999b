"""Typed inter-process messages (dataclasses encoded with msgpack) and their ZMQ transport."""
from __future__ import annotations

from radixserve.messages.codec import decode, encode, message
from radixserve.messages.transport import IpcAddresses, make_socket, recv_nowait, send
from radixserve.messages.types import (
    AbortMsg,
    GrammarsReady,
    Heartbeat,
    LeaveGroup,
    LoadLoRA,
    LoRAReply,
    RequestFailed,
    RequestStarted,
    SchedulerStats,
    TextOpMsg,
    TextOpReply,
    TokenBatch,
    TokenizeMsg,
    TokenLogprob,
    TokenMsg,
    UnloadLoRA,
    UserMsg,
    UserReply,
)

__all__ = [
    "AbortMsg",
    "GrammarsReady",
    "Heartbeat",
    "IpcAddresses",
    "LeaveGroup",
    "LoRAReply",
    "LoadLoRA",
    "RequestFailed",
    "RequestStarted",
    "SchedulerStats",
    "TextOpMsg",
    "TextOpReply",
    "TokenBatch",
    "TokenLogprob",
    "TokenMsg",
    "TokenizeMsg",
    "UnloadLoRA",
    "UserMsg",
    "UserReply",
    "decode",
    "encode",
    "make_socket",
    "message",
    "recv_nowait",
    "send",
]
