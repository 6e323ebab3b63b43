"""Fixtures for the sample-data tests: the task generator module, the shipped tokenizer (raw and Auto), the model."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from rcdiag.score.sample import SAMPLE_DIR, SAMPLE_MODEL, SAMPLE_PROMPTS


def load_task() -> ModuleType:
    """sample_data/task.py (a script folder, not a package) imported under a unique name."""
    spec = importlib.util.spec_from_file_location("rcdiag_sample_task", SAMPLE_DIR / "task.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # dataclasses look their module up while the class is created
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def task() -> ModuleType:
    return load_task()


@pytest.fixture(scope="session")
def prompts() -> list[dict[str, Any]]:
    with SAMPLE_PROMPTS.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="session")
def raw_tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(SAMPLE_MODEL / "tokenizer.json"))


@pytest.fixture(scope="session")
def auto_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(SAMPLE_MODEL)


@pytest.fixture(scope="session")
def hf_model():
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(min(2, torch.get_num_threads()))
    return AutoModelForCausalLM.from_pretrained(SAMPLE_MODEL, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def model_dir() -> Path:
    if not (SAMPLE_MODEL / "config.json").is_file():
        pytest.fail(f"sample model missing at {SAMPLE_MODEL}; rebuild with python sample_data/build_model.py")
    return SAMPLE_MODEL
