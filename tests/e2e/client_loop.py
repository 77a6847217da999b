"""A client that runs inside the cluster, in a pod of the runtime image: one completion after
another against a Service URL until told to stop, then a JSON tally of what succeeded and failed.
Each request opens a new connection, so kube-proxy picks an endpoint for every one of them."""

from __future__ import annotations

import json
import uuid

from tests.e2e.kind_cluster import Kubectl, wait_for

STOP_FILE = "/tmp/stop"

SCRIPT = r"""
import json, os, sys, time, urllib.request
base, stop = sys.argv[1], sys.argv[2]
model = json.load(urllib.request.urlopen(base + "/models", timeout=60))["data"][0]["id"]
body = json.dumps({"model": model, "prompt": "The capital of France is", "max_tokens": 4,
                   "temperature": 0}).encode()
ok, failed, errors = 0, 0, []
while not os.path.exists(stop):
    req = urllib.request.Request(base + "/completions", body, {"Content-Type": "application/json"})
    try:
        reply = json.load(urllib.request.urlopen(req, timeout=120))
        assert reply["choices"][0]["text"], reply
        ok += 1
    except Exception as e:  # every failure counts; the first few are reported
        failed += 1
        errors.append(f"{time.strftime('%H:%M:%S')} {type(e).__name__}: {e}"[:300])
        time.sleep(0.2)
    if (ok + failed) % 5 == 0:
        print(f"progress ok={ok} failed={failed}", flush=True)
print(json.dumps({"ok": ok, "failed": failed, "errors": errors[:10]}), flush=True)
"""


class ClientLoop:
    """``start`` a client pod; ``wait_ok(n)`` until it has n successes; ``stop`` for the tally."""

    def __init__(self, kubectl: Kubectl, namespace: str, image: str, base_url: str) -> None:
        self.kubectl, self.namespace = kubectl, namespace
        self.pod = f"client-{uuid.uuid4().hex[:6]}"
        kubectl("run", self.pod, "-n", namespace, f"--image={image}", "--image-pull-policy=Never",
                "--restart=Never", "--command", "--", "python", "-c", SCRIPT, base_url, STOP_FILE)
        wait_for(f"client pod {self.pod} running", lambda: self._phase() == "Running", 300)

    def _phase(self) -> str:
        return self.kubectl("get", "pod", self.pod, "-n", self.namespace, "-o",
                            "jsonpath={.status.phase}", check=False).strip()

    def _counts(self) -> tuple[int, int]:
        lines = [ln for ln in self.kubectl("logs", self.pod, "-n", self.namespace,
                                           check=False).splitlines() if ln.startswith("progress")]
        if not lines:
            return 0, 0
        ok, failed = (int(part.split("=")[1]) for part in lines[-1].split()[1:])
        return ok, failed

    def ok_seen(self) -> int:
        return self._counts()[0]

    def wait_ok(self, n: int, timeout: float = 300) -> None:
        wait_for(f"{n} answers through the client loop", lambda: self._counts()[0] >= n, timeout)

    def stop(self) -> dict:
        """Stop the loop and return its tally: {"ok": n, "failed": m, "errors": [...]}."""
        try:
            self.kubectl("exec", self.pod, "-n", self.namespace, "--", "python", "-c",
                         f"open({STOP_FILE!r}, 'w').close()")
            wait_for(f"client pod {self.pod} to finish",
                     lambda: self._phase() in ("Succeeded", "Failed"), 300)
            logs = self.kubectl("logs", self.pod, "-n", self.namespace)
            return json.loads(logs.strip().splitlines()[-1])
        finally:
            self.kubectl("delete", "pod", self.pod, "-n", self.namespace, "--wait=false",
                         check=False)
