"""uvicorn's h11 protocol with a header timeout: a connection must send a request's whole header
block within `header_timeout_s` of opening (or of its first byte after a keep-alive pause), else it
is closed. uvicorn bounds only the idle time between requests (`timeout_keep_alive`), so without
this hundreds of connections that send no or half a header block are held forever (slowloris).

A response the client stops reading is dropped after `SEND_STALL_S`: uvicorn waits for a full
write buffer to drain without a limit, so a client that reads nothing (a zero TCP window) held its
handler, its request and a connection forever.

Every connection also sends with TCP_NODELAY. asyncio sets it only on sockets whose protocol
number says TCP, and the CLI binds the listening socket itself (protocol 0), so its connections
had Nagle's algorithm on: a response's body waited for the client's delayed ACK of its headers,
40 ms on every request of a keep-alive connection, and a stream's small events were held alike."""
from __future__ import annotations

import asyncio
import functools
import logging
import socket
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger("radixserve.server")
SEND_STALL_S = 60.0  # a response's writes blocked this long by a client that reads nothing: dropped


class HeaderTimeoutProtocol(H11Protocol):
    def __init__(self, *args: Any, header_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout_s = header_timeout_s
        self.header_timer: asyncio.TimerHandle | None = None
        self.send_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle
        super().data_received(data)
        if self.cycle is not cycle:  # a request's headers are complete
            self._disarm()
        elif self.header_timer is None and (self.cycle is None or self.cycle.response_complete):
            self._arm()  # the first bytes of the next request on a keep-alive connection

    def on_response_complete(self) -> None:
        self._disarm()  # from here uvicorn's keep-alive timeout bounds the wait for the next request
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._send_flowing()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.send_timer is None:
            self.send_timer = self.loop.call_later(SEND_STALL_S, self._send_stalled)

    def resume_writing(self) -> None:
        self._send_flowing()
        super().resume_writing()

    def _send_flowing(self) -> None:
        if self.send_timer is not None:
            self.send_timer.cancel()
            self.send_timer = None

    def _send_stalled(self) -> None:
        self.send_timer = None
        logger.warning("dropping a connection that read nothing of its response for %gs", SEND_STALL_S)
        self.transport.abort()  # (close would wait for the unread buffer to drain)

    def _arm(self) -> None:
        self._disarm()
        self.header_timer = self.loop.call_later(self.header_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def _expired(self) -> None:
        self.header_timer = None
        if not self.transport.is_closing():
            logger.debug("closing a connection that sent no complete request header in %gs", self.header_timeout_s)
            self.transport.close()


def header_timeout_protocol(header_timeout_s: float) -> Any:
    """The `http` argument of `uvicorn.Config`: the h11 protocol with this header timeout."""
    return functools.partial(HeaderTimeoutProtocol, header_timeout_s=header_timeout_s)
