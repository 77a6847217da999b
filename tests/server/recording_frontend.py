"""A `Frontend` with no processes behind it: what it would send to the tokenizers is recorded, so a
test can check that a refused request sent nothing."""
from __future__ import annotations

from radixserve.server.frontend import Frontend
from radixserve.server.metrics import ServerMetrics


class RecordingSocket:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    async def send(self, frame: bytes) -> None:
        self.sent.append(frame)


def recording_frontend() -> Frontend:
    """A frontend whose `to_tokenizer` is a `RecordingSocket` (its `.sent` lists the frames)."""
    frontend = Frontend(None, ServerMetrics())  # type: ignore[arg-type]
    frontend.to_tokenizer = RecordingSocket()
    return frontend
