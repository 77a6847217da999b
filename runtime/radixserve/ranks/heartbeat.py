"""The scheduler's liveness signal, sent from a thread of its own so that a long step (an
8,000-token prefill on CPU runs for a minute) does not silence it. The loop calls `beat()` once per
iteration; each heartbeat says how long the current iteration has run, so the API can tell a busy
scheduler (recent heartbeat, step running) from a stuck one (a step beyond the stated limit) or a
dead or frozen one (no heartbeat)."""
from __future__ import annotations

import threading
import time

import zmq

from radixserve.messages import Heartbeat, IpcAddresses, encode, make_socket

HEARTBEAT_EVERY_S = 0.25


class HeartbeatThread:
    def __init__(self, ctx: zmq.Context, addrs: IpcAddresses) -> None:
        self.ctx, self.addrs = ctx, addrs
        self.step_started = time.monotonic()

    def beat(self) -> None:
        self.step_started = time.monotonic()

    def start(self) -> HeartbeatThread:
        threading.Thread(target=self._run, name="heartbeat", daemon=True).start()
        return self

    def _run(self) -> None:
        sock = make_socket(self.ctx, zmq.PUSH, self.addrs.frontend, bind=False)  # sockets are per thread
        while True:
            try:
                sock.send(encode(Heartbeat(time.monotonic() - self.step_started)), zmq.NOBLOCK)
            except zmq.Again:
                pass  # the API is not reading: it will see the heartbeat age grow
            time.sleep(HEARTBEAT_EVERY_S)
