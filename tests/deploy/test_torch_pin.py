"""One torch: the version `make install` installs and the tests run with (the Makefile), the images'
(the Dockerfile's TORCH_VERSION, the CPU image's lock and its build argument in scripts/images) and
the one docs/deploy.md names; and one Triton, the one that torch pins."""

from __future__ import annotations

import re

from scripts.images import constraints
from scripts.images.specs import TORCH_CPU_VERSION

from tests.deploy.dockerfile_model import parse
from tests.deploy.support import REPO

DF = parse()


def _makefile_torch() -> str:
    m = re.search(r"^TORCH_VERSION \?= (\S+)$", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert m, "Makefile: no `TORCH_VERSION ?= X`"
    return m.group(1)


def _deploy_doc_pins() -> dict[str, str]:
    """docs/deploy.md's table of GPU-stack build arguments: argument -> default."""
    text = (REPO / "docs" / "deploy.md").read_text()
    return dict(re.findall(r"^\| `([A-Z_]+)` \| `([^`]+)` \|", text, re.MULTILINE))


def test_one_torch_version_everywhere() -> None:
    lock = constraints.read("cpu")
    pins = {
        "Makefile TORCH_VERSION": _makefile_torch(),
        "Dockerfile ARG TORCH_VERSION": DF.global_args["TORCH_VERSION"],
        "scripts/images/constraints/cpu.txt": lock["torch"],
        "scripts/images/specs.py TORCH_CPU_VERSION": TORCH_CPU_VERSION,
        "docs/deploy.md TORCH_VERSION": _deploy_doc_pins()["TORCH_VERSION"],
    }
    assert len(set(pins.values())) == 1, f"torch pinned differently: {pins}"


def test_one_triton_the_one_torch_pins() -> None:
    """The CPU lock resolves torch with its own `Requires-Dist: triton==X` (Linux)."""
    triton = constraints.read("cpu")["triton"]
    assert DF.global_args["TRITON_VERSION"] == triton
    assert _deploy_doc_pins()["TRITON_VERSION"] == triton


def test_deploy_doc_names_the_dockerfiles_gpu_stack() -> None:
    doc, g = _deploy_doc_pins(), DF.global_args
    for arg in ("TORCH_VERSION", "TRITON_VERSION", "CUDA_VERSION", "TORCH_CUDA_INDEX",
                "FLASHINFER_VERSION", "FLASHINFER_INDEX"):
        assert doc.get(arg) == g[arg], f"docs/deploy.md says {arg}={doc.get(arg)}, the Dockerfile {g[arg]}"
    text = (REPO / "docs" / "deploy.md").read_text()
    cu = "cu" + g["CUDA_VERSION"].replace(".", "")
    assert f"`{g['TORCH_VERSION']}+{cu}`" in text
    assert f"torch {g['TORCH_VERSION']} pins (`Requires-Dist: triton=={g['TRITON_VERSION']}`)" in text
