"""Run a Python script in a throwaway pod of the runtime image, inside the cluster (so Service DNS
names resolve), and read its last output line as JSON; and the question every suite asks."""

from __future__ import annotations

import json
import uuid

from tests.e2e.conftest import RUNTIME_CPU_IMAGE, Stack
from tests.e2e.kind_cluster import wait_for

# A greedy chat call: argv base URL (…/v1) and, optionally, the model (else the first served).
ASK_CAPITAL = """
import json, sys, urllib.request
base = sys.argv[1]
model = sys.argv[2] if len(sys.argv) > 2 else json.load(
    urllib.request.urlopen(base + "/models", timeout=60))["data"][0]["id"]
body = {"model": model, "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 24, "temperature": 0}
req = urllib.request.Request(base + "/chat/completions", json.dumps(body).encode(),
                             {"Content-Type": "application/json"})
print(json.dumps(json.load(urllib.request.urlopen(req, timeout=300))))
"""


def run_in_pod(stack: Stack, script: str, *args: str, timeout: float = 420) -> dict:
    """`python -c script args...` in a pod of the serving namespace; its last line, parsed. The
    pod must succeed (its log is the assertion's message)."""
    k, ns, pod = stack.kubectl, stack.serving_ns, f"run-{uuid.uuid4().hex[:6]}"
    k("run", pod, "-n", ns, f"--image={RUNTIME_CPU_IMAGE}", "--image-pull-policy=Never",
      "--restart=Never", "--command", "--", "python", "-c", script, *args)

    def finished() -> str | None:
        phase = k("get", "pod", pod, "-n", ns, "-o", "jsonpath={.status.phase}").strip()
        return phase if phase in ("Succeeded", "Failed") else None

    try:
        phase = wait_for(f"pod {pod} to finish", finished, timeout=timeout)
        logs = k("logs", pod, "-n", ns)
        assert phase == "Succeeded", logs
        return json.loads(logs.strip().splitlines()[-1])
    finally:
        k("delete", "pod", pod, "-n", ns, "--wait=false", check=False)
