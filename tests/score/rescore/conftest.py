"""Fixtures for the rescoring tests: a tiny random Qwen2 (float32, sdpa_varlen) and its float64 eager twin."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.score.rescore.helpers import build_model_dir


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    return build_model_dir(tmp_path_factory.mktemp("tiny-qwen2"), tokenizer=True)


@pytest.fixture(scope="session")
def model(model_dir: Path):
    from rcdiag.score.scoring import load_model

    return load_model(model_dir, dtype="float32", attn="sdpa_varlen")


@pytest.fixture(scope="session")
def model64(model_dir: Path):
    """The same weights in float64 with transformers' eager attention: the independent reference."""
    from rcdiag.score.scoring import load_model

    return load_model(model_dir, dtype="float32", attn="eager").double()
