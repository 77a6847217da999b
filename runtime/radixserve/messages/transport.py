"""ZMQ IPC endpoints in a private per-instance directory, and typed send/receive over them."""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

import zmq

from radixserve.messages.codec import decode, encode

MAX_SOCKET_PATH = 100  # sockaddr_un's sun_path is 108 bytes; the longest socket name is 11


@dataclass(frozen=True)
class IpcAddresses:
    root: str

    @classmethod
    def create(cls) -> IpcAddresses:
        """A private directory for the sockets; under /tmp where TMPDIR is too deep for them
        (a socket's path holds at most 107 bytes)."""
        root = tempfile.mkdtemp(prefix="radixserve-")
        if len(root) + len("/detokenizer") > MAX_SOCKET_PATH:
            os.rmdir(root)
            root = tempfile.mkdtemp(prefix="radixserve-", dir="/tmp")
        return cls(root)

    def _addr(self, name: str) -> str:
        return f"ipc://{os.path.join(self.root, name)}"

    @property
    def tokenizer(self) -> str:  # API binds PUSH, tokenizer workers connect PULL (round robin)
        return self._addr("tokenizer")

    @property
    def scheduler(self) -> str:  # rank-0 scheduler binds PULL
        return self._addr("scheduler")

    @property
    def detokenizer(self) -> str:  # detokenizer binds PULL
        return self._addr("detokenizer")

    @property
    def frontend(self) -> str:  # API binds PULL
        return self._addr("frontend")

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def make_socket(ctx: zmq.Context, kind: int, addr: str, bind: bool) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    (sock.bind if bind else sock.connect)(addr)
    return sock


def send(sock: zmq.Socket, msg: Any) -> None:
    sock.send(encode(msg))


def recv_nowait(sock: zmq.Socket) -> list[Any]:
    """Everything already queued on `sock`, without blocking."""
    out = []
    while True:
        try:
            out.append(decode(sock.recv(zmq.NOBLOCK)))
        except zmq.Again:
            return out
