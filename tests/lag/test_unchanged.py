"""The weights-unchanged check (rcdiag.analysis.training.unchanged) with checkpoints made here (tests/lag/checkpoints.py):
an fp32 update below bf16's ulp leaves a bf16 engine's log-probs bit-identical from one version to the next while
the fp32 trainer's move; a real update moves both. Guards issue #31 "fp32 trainer updates smaller than a bf16
engine's weight ulp (the engine never changes)"."""
from __future__ import annotations

import numpy as np
import pytest

import rcdiag
from rcdiag.analysis.training.lag_cause import lag_cause
from rcdiag.analysis.training.unchanged import context_keys, weights_unchanged
from rcdiag.record import Recorder
from tests.lag.checkpoints import checkpoints, prompt_ids  # noqa: F401 (fixture)

pytestmark = pytest.mark.model


def test_context_keys_match_equal_contexts_only():
    """Equal prompt + prefix + token → equal key; one token different anywhere before → a different key."""
    seq = np.array([0, 0, 0, 1, 1, 1, 2, 2])
    pos = np.array([0, 1, 2, 0, 1, 2, 0, 1])
    tok = np.array([5, 6, 7, 5, 6, 7, 5, 9])
    keys = context_keys(seq, pos, tok, {0: 11, 1: 11, 2: 11})
    assert keys[0] == keys[3] == keys[6] and keys[1] == keys[4] and keys[2] == keys[5]
    assert keys[7] != keys[1]
    other = context_keys(seq, pos, tok, {0: 11, 1: 12, 2: 11})
    assert other[3] != other[0]


def _score(path, pairs, dtype):
    from rcdiag.score.scoring import load_model, score_sequences

    model = load_model(path, dtype=dtype, device="cpu")
    scored = score_sequences(model, pairs)
    cu = scored.cu_seqlens
    return [scored.logprobs[cu[i]:cu[i + 1]] for i in range(len(pairs))]


def _two_versions(tmp_path, checkpoints, second):  # noqa: F811
    """The same 8 prompts and responses at versions 0 (A) and 1 (`second`): engine = the model in bf16, trainer
    = the model in float32, as an fp32 trainer with a bf16 engine."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoints["A"])
    rng = np.random.default_rng(0)
    pairs = [(p, rng.integers(3, 2000, 12).tolist()) for p in prompt_ids(tokenizer)]
    recorder = Recorder(tmp_path / "run")
    for version, model in ((0, checkpoints["A"]), (1, checkpoints[second])):
        engine, trainer = _score(model, pairs, "bfloat16"), _score(model, pairs, "float32")
        recorder.add(version, [p for p, _ in pairs], [r for _, r in pairs], engine, trainer, version=version)
    return rcdiag.open_run(tmp_path / "run")


def test_sub_ulp_update_is_caught_on_the_engine_side(tmp_path, checkpoints):  # noqa: F811
    run = _two_versions(tmp_path, checkpoints, "B_sub")
    engine, trainer = weights_unchanged(run)
    assert engine.fires and engine.pairs == 96 and engine.identical == 96, engine
    assert not trainer.fires, trainer
    cause = lag_cause(run)
    assert cause["cause"] == "weights not updated on the engine side" and "bf16" in cause["action"]


def test_a_real_update_fires_nothing(tmp_path, checkpoints):  # noqa: F811
    engine, trainer = weights_unchanged(_two_versions(tmp_path, checkpoints, "B"))
    assert not engine.fires and not trainer.fires and engine.pairs == 96
    assert engine.identical < 10
