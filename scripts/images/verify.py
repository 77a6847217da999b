"""Smoke checks of a built image, run in a buildah container with no network: the CPU image
imports the engine and answers a prompt with the embedded model; the operator image imports
the operator and kopf; the router image runs the gateway's binary."""

from __future__ import annotations

import subprocess

from . import buildah
from .progress import log
from .specs import IMAGES

PROMPT = "The capital of France is"
EXPECTED = "Paris"

CHECKS: dict[str, list[list[str]]] = {
    "radixserve-cpu": [
        ["python", "-c", "import radixserve, torch; print('torch', torch.__version__)"],
        ["radixserve", "generate", PROMPT, "--max-tokens", "8"],
    ],
    "radixserve-operator": [
        ["python", "-c", "import radixserve_operator.spec, kopf; print('kopf', kopf.__version__)"],
        ["python", "-c", "import importlib.util as u; assert u.find_spec('torch') is None"],
        ["radixserve-operator", "--help"],  # the entry point's script, on PATH, in the venv
    ],
    "radixserve-router": [["smg", "--version"]],
}


def verify(name: str, timeout: float = 900) -> list[str]:
    """Run the image's checks; the output of each. Raises ImageBuildError when one fails, and
    AssertionError when the CPU image's completion lacks EXPECTED."""
    tag = IMAGES[name].tag
    ctr = buildah.call(["buildah", "from", "--pull=never", tag]).stdout.strip().splitlines()[-1]
    outputs = []
    try:
        for argv in CHECKS[name]:
            log(f"verify {name}: {' '.join(argv)}")
            out = buildah.call(buildah.run_command(ctr, argv), timeout=timeout).stdout.strip()
            shown = " | ".join(ln.strip() for ln in out.splitlines() if ln.strip())
            log(f"verify {name}:   -> {shown[:160] or '(no output)'}")
            outputs.append(out)
    finally:
        subprocess.run(["buildah", "rm", ctr], capture_output=True, check=False)
    if name == "radixserve-cpu" and EXPECTED not in outputs[-1]:
        raise AssertionError(f"{PROMPT!r} -> {outputs[-1]!r}: expected {EXPECTED!r}")
    return outputs
