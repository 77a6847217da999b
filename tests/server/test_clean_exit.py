"""An idle server stopped by SIGTERM: the scheduler (and at TP > 1 every rank) leaves on its own,
well within the 1.5 s the server grants before it kills one, and no process of the server's tree
(children, ranks, multiprocessing's resource tracker) outlives the server by more than a second.
And the idle embedded model's server holds under 1.5 GB resident in all its processes."""
from __future__ import annotations

import re
import signal
import time

import psutil
import pytest

from tests.server.server_process import ServerProcess

GONE_WITHIN_S = 1.0


def _living(procs: list[psutil.Process]) -> list[psutil.Process]:
    return [p for p in procs if p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.parametrize("tp", [1, 2])
def test_an_idle_sigterm_lets_every_process_leave_on_its_own(tiny_model, tmp_path, tp: int) -> None:
    srv = ServerProcess(tiny_model, tmp_path / "server.log", "--tp", str(tp))
    try:
        srv.wait_ready()
        deadline = time.monotonic() + 30
        while tp > 1 and not re.search(rf"tensor-parallel rank {tp - 1} ready", srv.log()):
            assert time.monotonic() < deadline, "the last rank logs that it is ready"
            time.sleep(0.1)
        tree = _living(psutil.Process(srv.proc.pid).children(recursive=True))
        names = " ".join(" ".join(p.cmdline()) for p in tree)
        assert len(tree) >= 3 + (tp - 1) and "resource_tracker" in names, names
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(30) == 0
        _, alive = psutil.wait_procs(tree, timeout=GONE_WITHIN_S)
        alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not alive, f"outlived the server: {[' '.join(p.cmdline())[:80] for p in alive]}"
    finally:
        srv.stop()
    log = srv.log()
    assert "did not stop within" not in log and "killing it" not in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]


def test_the_idle_embedded_server_is_small(tmp_path) -> None:
    """Resident memory summed over the server's processes (shared pages counted in each), and
    the KV budget stated at start-up."""
    srv = ServerProcess(None, tmp_path / "server.log")
    try:
        srv.wait_ready(timeout=600)  # (the first run converts the embedded model)
        procs = _living([psutil.Process(srv.proc.pid),
                         *psutil.Process(srv.proc.pid).children(recursive=True)])
        resident = sum(p.memory_info().rss for p in procs)
    finally:
        srv.stop()
    assert resident < 1.5e9, f"{resident / 1e9:.2f} GB resident"
    assert re.search(r"KV budget on CPU: [\d.]+ GiB, ", srv.log())
