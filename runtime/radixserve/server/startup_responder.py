"""While the model loads, the bound port answers every request at once with 503 and the reason
(`loading`), instead of leaving connections in the listen backlog until the server is ready: a
probe or a client learns why it must wait, and nothing hangs. One thread, one connection at a
time, each given a short deadline; it stops before uvicorn takes the socket over."""
from __future__ import annotations

import json
import logging
import select
import socket
import threading
import time

logger = logging.getLogger("radixserve.server")
_CONNECTION_S = 2.0  # the most one connection may take to send its request head
_HEAD_LIMIT = 16384
_POLL_S = 0.1


def _reply(reason: str) -> bytes:
    # NOTE: the error body of errors.py, written out: this module is imported before FastAPI is
    body = json.dumps({"error": {"message": f"the server is {reason}; retry shortly",
                                 "type": "service_unavailable", "param": None, "code": reason}}).encode()
    head = ("HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nretry-after: 5\r\nconnection: close\r\n\r\n")
    return head.encode() + body


class StartupResponder:
    def __init__(self, sock: socket.socket, reason: str = "loading") -> None:
        self.sock, self.reply = sock, _reply(reason)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="startup-responder", daemon=True)

    def start(self) -> StartupResponder:
        self.thread.start()
        return self

    def stop(self) -> None:
        """Stop answering (idempotent); connections from here on wait for the real server."""
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                readable, _, _ = select.select([self.sock], [], [], _POLL_S)
                if not readable:
                    continue
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:  # the socket was closed under us: startup is over
                return
            with conn:
                self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        """Read the request head (within a deadline) so the client sees the answer, not a reset."""
        deadline, head = time.monotonic() + _CONNECTION_S, b""
        try:
            conn.setblocking(True)
            while b"\r\n\r\n" not in head and len(head) < _HEAD_LIMIT:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                conn.settimeout(left)
                chunk = conn.recv(4096)
                if not chunk:
                    return
                head += chunk
            conn.sendall(self.reply)
            conn.shutdown(socket.SHUT_WR)
            # NOTE: read what the client still sends (a body) until it closes: closing with unread
            # bytes resets the connection, and a reset can destroy the answer before it is read
            while time.monotonic() < deadline:
                conn.settimeout(max(0.01, deadline - time.monotonic()))
                if not conn.recv(4096):
                    return
        except OSError:
            return
