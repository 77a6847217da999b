"""The server's IPC sockets bind wherever TMPDIR points: a directory too deep for a socket's path
(at most 107 bytes) gives way to /tmp."""
from __future__ import annotations

import tempfile
from pathlib import Path

import zmq

from radixserve.messages import IpcAddresses, make_socket


def test_sockets_bind_under_a_deep_tmpdir(tmp_path: Path, monkeypatch) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    addrs = IpcAddresses.create()
    ctx = zmq.Context()
    try:
        assert not addrs.root.startswith(str(deep))
        for addr in (addrs.tokenizer, addrs.scheduler, addrs.detokenizer, addrs.frontend):
            make_socket(ctx, zmq.PULL, addr, bind=True)  # (raised ZMQError past 107 bytes)
    finally:
        ctx.destroy(linger=0)
        addrs.remove()


def test_a_shallow_tmpdir_is_used_as_it_is(monkeypatch) -> None:
    shallow = Path(tempfile.mkdtemp(prefix="rs-", dir="/tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(shallow))
    addrs = IpcAddresses.create()
    try:
        assert Path(addrs.root).parent == shallow
    finally:
        addrs.remove()
        shallow.rmdir()
