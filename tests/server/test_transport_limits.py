"""Transport limits on a live server: connections that never finish their header block are closed
(slowloris), a body over the size limit gets a 413 with an error body whether its length is
declared or not, a stalled body a 408, and a request whose client left is logged as 499."""
from __future__ import annotations

import asyncio
import json
import re
import socket
import time

import httpx

from tests.server.server_process import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}
_LIMIT = 32 << 20  # the server's default --max-request-body-bytes


def _closed_by_peer(s: socket.socket) -> bool:
    s.settimeout(0.01)
    try:
        return s.recv(1024) == b""
    except TimeoutError:
        return False
    except OSError:  # reset
        return True


def test_connections_without_a_whole_header_block_are_closed(server) -> None:
    """40 connections, half sending nothing, half half a header block: the server closes every one
    (it held all of them for good before), and serves others meanwhile."""
    conns = []
    for i in range(40):
        s = socket.create_connection(("127.0.0.1", server.port))
        if i % 2:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: appl")
        conns.append(s)
    assert httpx.get(f"{server.base}/health", timeout=10).status_code == 200
    open_ = set(range(len(conns)))
    deadline = time.monotonic() + 60  # liveness only: the header timeout is 5 s
    while open_ and time.monotonic() < deadline:
        open_ -= {i for i in open_ if _closed_by_peer(conns[i])}
        time.sleep(0.2)
    for s in conns:
        s.close()
    assert not open_, f"{len(open_)} of {len(conns)} connections still held"


def _assert_413(r: httpx.Response) -> None:
    assert r.status_code == 413, r.text[:200]
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and str(_LIMIT) in err["message"]


def test_a_body_over_the_limit_is_413_by_its_declared_length(server) -> None:
    r = httpx.post(f"{server.base}/v1/completions", content=b" " * (_LIMIT + 1),
                   headers=AUTH | {"content-type": "application/json"}, timeout=60)
    _assert_413(r)


def test_a_chunked_body_over_the_limit_is_413_while_it_arrives(server) -> None:
    sent = 0

    def chunks():
        nonlocal sent
        for _ in range(_LIMIT // (1 << 20) + 8):
            sent += 1 << 20
            yield b" " * (1 << 20)

    total = (_LIMIT // (1 << 20) + 8) << 20
    try:
        r = httpx.post(f"{server.base}/v1/completions", content=chunks(),
                       headers=AUTH | {"content-type": "application/json"}, timeout=60)
    except httpx.TransportError:  # the server answered and closed before the client sent it all
        assert sent < total
    else:
        _assert_413(r)
    assert httpx.get(f"{server.base}/health", timeout=10).status_code == 200


def test_a_stalled_body_is_408() -> None:
    from radixserve.server.body_guard import BodyGuardMiddleware

    called, sent = [], []

    async def app(scope, receive, send) -> None:
        called.append(scope)

    async def receive() -> dict:
        if not sent:
            sent.append(1)
            return {"type": "http.request", "body": b'{"prom', "more_body": True}
        await asyncio.sleep(3600)  # the rest never comes
        raise AssertionError

    out: list[dict] = []

    async def send(message: dict) -> None:
        out.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}
    asyncio.run(BodyGuardMiddleware(app, max_bytes=1 << 20, idle_s=0.05)(scope, receive, send))
    assert not called and out[0]["status"] == 408
    assert json.loads(out[1]["body"])["error"]["type"] == "invalid_request_error"


def test_a_trickled_body_is_408() -> None:
    """A byte every 10 ms never leaves the body idle, yet it would take hours to send: once the
    body has had its idle time, it must average the minimum rate."""
    from radixserve.server.body_guard import BodyGuardMiddleware

    called, out = [], []
    body = b'{"prompt": "' + b"a" * 300 + b'"}'

    async def app(scope, receive, send) -> None:
        called.append(scope)

    async def receive() -> dict:
        await asyncio.sleep(0.01)
        i = len(out)
        out.append(None)
        return {"type": "http.request", "body": body[i:i + 1], "more_body": i + 1 < len(body)}

    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}
    asyncio.run(BodyGuardMiddleware(app, max_bytes=1 << 20, idle_s=0.2)(scope, receive, send))
    assert not called and sent[0]["status"] == 408, sent[:1]
    assert "the request body arrived slower than" in json.loads(sent[1]["body"])["error"]["message"]


def _access_line(server, request_id: str) -> str:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = re.search(rf"^.*radixserve\.access: .*request_id={request_id}.*$", server.log(), re.MULTILINE)
        if m:
            return m.group(0)
        time.sleep(0.2)
    raise AssertionError(f"no access line for {request_id}")


def _token_counts(line: str) -> tuple[int, int]:
    fields = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
    return int(fields["prompt_tokens"]), int(fields["completion_tokens"])


def test_a_stream_whose_client_left_is_logged_499(server) -> None:
    body = {"prompt": "a b c", "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server.base}/v1/completions", json=body,
                      headers=AUTH | {"X-Request-Id": "left-a-stream"}, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break  # leave after the first chunk
    line = _access_line(server, "left-a-stream")
    assert " 499 client closed" in line, line
    prompt, completion = _token_counts(line)  # the tokens it got before it left, not zeros
    assert prompt > 0 and 1 <= completion < 400, line


def test_a_request_whose_client_left_is_logged_499(server) -> None:
    body = json.dumps({"prompt": "a b c", "max_tokens": 1000, "ignore_eos": True}).encode()
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + API_KEY.encode()
              + b"\r\nX-Request-Id: left-a-request\r\nContent-Type: application/json\r\n"
              + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    time.sleep(0.2)  # admitted and generating: 1,000 tokens take longer than this, even unloaded
    s.close()
    line = _access_line(server, "left-a-request")
    assert " 499 client closed" in line, line


def test_connections_send_without_nagle_delay() -> None:
    """A listening socket bound with protocol number 0 (as the CLI binds it) gives connections
    asyncio leaves with Nagle's algorithm on; the server's protocol turns it off on each one."""
    import uvicorn
    from uvicorn.server import ServerState

    from radixserve.server.http_protocol import header_timeout_protocol

    async def app(scope, receive, send) -> None:
        raise AssertionError("no request is sent")

    async def run() -> int:
        config = uvicorn.Config(app, lifespan="off", log_level="warning")
        config.load()
        state = ServerState()
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        factory = header_timeout_protocol(5.0)
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: factory(config=config, server_state=state, app_state={}), sock=listener)
        try:
            _, writer = await asyncio.open_connection(*listener.getsockname())
            while not state.connections:
                await asyncio.sleep(0.01)
            (conn,) = state.connections
            nodelay = conn.transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            writer.close()
            return nodelay
        finally:
            server.close()

    assert asyncio.run(run()) != 0


def test_a_response_nobody_reads_is_dropped(monkeypatch) -> None:
    """A client that reads nothing of its response (its TCP window full) held the handler's send
    forever; past the stall limit its connection is dropped and the handler sees it gone."""
    import uvicorn
    from uvicorn.server import ServerState

    from radixserve.server import http_protocol

    monkeypatch.setattr(http_protocol, "SEND_STALL_S", 0.5, raising=False)

    async def run() -> bool:
        finished = asyncio.Event()

        async def app(scope, receive, send) -> None:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            for _ in range(2000):  # 128 MB: far more than any socket buffer
                await send({"type": "http.response.body", "body": b"x" * 65536, "more_body": True})
            finished.set()

        config = uvicorn.Config(app, lifespan="off", log_level="warning")
        config.load()
        state = ServerState()
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        factory = http_protocol.header_timeout_protocol(5.0)
        server = await asyncio.get_running_loop().create_server(
            lambda: factory(config=config, server_state=state, app_state={}), sock=listener)
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(listener.getsockname())
        client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # and never reads
        try:
            await asyncio.wait_for(finished.wait(), 20)
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            client.close()
            server.close()

    assert asyncio.run(run()), "the handler is still blocked on a response nobody reads"
