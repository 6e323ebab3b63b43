"""`rcdiag score --rescore-only RUN --checkpoint A,B`: the checkpoint the rollout log-probs match, per step, with
the margin — on a run generated here by the real vLLM engine from the sample model A, rescored with A and with
B = A after three optimizer steps (tests/lag/checkpoints.py). Then a mixed-lag run from the same tokens (half
trained on by A, half by B) through the lag split, exactly decomposed with the checkpoint columns.

Guards issue #31: "the checkpoint attribution names A on an A-generated run rescored with {A, B}; … A/A → nothing
fires"."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rcdiag
from rcdiag.analysis.training.lag import lag_split
from rcdiag.analysis.training.lag_cause import lag_cause
from rcdiag.cli import main
from rcdiag.record import Recorder
from rcdiag.score.checkpoint import attribute_checkpoints, attribution, parse_checkpoints
from rcdiag.score.config import RescoreConfig
from tests.fixtures.engine import ENGINE_KWARGS
from tests.lag.checkpoints import checkpoints  # noqa: F401 (fixture)

pytestmark = [pytest.mark.vllm, pytest.mark.model]


@pytest.fixture(scope="module")
def generated(vllm_engine: Any, sample_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 prompts × 2 samples from A by the shared float32 engine, rescored with A (the A/A run)."""
    from rcdiag.score.generate import GenerateConfig, generate_run
    from rcdiag.score.rescore import rescore_run
    from rcdiag.score.sample import SAMPLE_PROMPTS

    out = tmp_path_factory.mktemp("ckpt") / "run"
    generate_run(sample_model, SAMPLE_PROMPTS, out, GenerateConfig(n=2, max_tokens=24, limit=8, **ENGINE_KWARGS),
                 llm=vllm_engine, silent=True)
    rescore_run(out, RescoreConfig(device="cpu"), silent=True)
    return out


def test_names_a_on_an_a_generated_run(generated, checkpoints, capsys):  # noqa: F811
    """{A, B}: A, by a wide factor (the float32 engine's floor against a real change of weights)."""
    text = f"{checkpoints['A']},{checkpoints['B']}"
    assert main(["score", "--rescore-only", str(generated), "--checkpoint", text, "--device", "cpu", "-q"]) == 0
    out = capsys.readouterr().out
    assert "all steps: rollout matches tiny-model" in out, out
    result = rcdiag.open_run(generated).manifest["checkpoints"]
    judged = __import__("json").loads((generated / result["attribution"]).read_text())["overall"]
    assert judged["best"] == "tiny-model" and judged["ratio"] > 50, judged
    assert judged["mean_abs_diff"]["tiny-model"] < 1e-3


def test_sub_ulp_checkpoint_is_indistinguishable_in_bf16(generated, checkpoints):  # noqa: F811
    """{A, B_sub} rescored in bf16: bit-identical log-probs, no winner named (the update never reaches bf16)."""
    chosen = parse_checkpoints(f"A={checkpoints['A']},Bsub={checkpoints['B_sub']}")
    result = attribute_checkpoints(generated, chosen, RescoreConfig(device="cpu", train_dtype="bfloat16"),
                                   silent=True)
    assert result["overall"]["best"] is None and result["overall"]["identical"] == [["A", "Bsub"]]


def test_a_a_fires_nothing(generated):
    """The A-generated, A-rescored run: no versions, no repeated contexts across versions → no lag cause."""
    assert lag_cause(generated) is None


def test_mixed_lag_run_from_real_tokens(generated, checkpoints, tmp_path):  # noqa: F811
    """Half the sequences trained on at version 0 (A: lag 0), half at version 1 (B: lag 1), all sampled by A:
    the lag split finds staleness; the checkpoints {0=A, 1=B} name 0 for every step and decompose ℓ exactly."""
    from rcdiag.score.scoring import load_model, score_sequences

    run = rcdiag.open_run(generated)
    tokens, seqs = run.tokens(), run.sequences()
    pairs = [(list(p), tokens[tokens.seq_id == s]["token_id"].tolist())
             for s, p in zip(seqs["seq_id"], seqs["prompt_token_ids"], strict=True)]
    b = [tokens[tokens.seq_id == s]["rollout_logprob"].to_numpy() for s in seqs["seq_id"]]
    model_b = load_model(checkpoints["B"], dtype="float32", device="cpu")
    scored = score_sequences(model_b, pairs)
    a_b = [scored.logprobs[scored.cu_seqlens[i]:scored.cu_seqlens[i + 1]] for i in range(len(pairs))]
    a_a = [tokens[tokens.seq_id == s]["train_logprob"].to_numpy() for s in seqs["seq_id"]]
    recorder = Recorder(tmp_path / "mixed")
    for step in (0, 1):
        idx = [i for i in range(len(pairs)) if i % 2 == step]
        recorder.add(step + 1, [pairs[i][0] for i in idx], [pairs[i][1] for i in idx], [b[i] for i in idx],
                     [(a_a if step == 0 else a_b)[i] for i in idx], version=0,
                     trainer_version=step)
    mixed = tmp_path / "mixed"
    chosen = parse_checkpoints(f"0={checkpoints['A']},1={checkpoints['B']}")
    result = attribute_checkpoints(mixed, chosen, RescoreConfig(device="cpu"), silent=True)
    assert [j["best"] for j in result["by_step"].values()] == ["0", "0"]
    split = lag_split(rcdiag.open_run(mixed))
    assert split.buckets["lag"].tolist() == [0, 1]
    assert split.staleness.loc[0, "times"] > 10
    exact = split.exact.set_index("lag")
    assert exact.loc[0, "staleness_mean_abs"] < 1e-6  # the rescore of A reproduces the run's own trainer side
    assert exact.loc[1, "staleness_mean_abs"] > 20 * exact.loc[1, "engine_mean_abs"]
    cause = lag_cause(mixed)
    assert cause is not None and cause["cause"].startswith("staleness")


def test_attribution_math():
    """The pure judgement: best, runner-up, margin, ratio and identical groups, on hand-made numbers."""
    rollout = np.array([-1.0, -2.0, -0.5, -1.5])
    mask = np.array([True, True, True, False])
    steps = np.array([0, 0, 1, 1])
    out = attribution(rollout, mask, steps, {"A": rollout + 0.01, "B": rollout + 0.2, "C": rollout + 0.2})
    assert out["overall"]["best"] == "A" and out["overall"]["runner_up"] == "B"
    assert out["overall"]["margin"] == pytest.approx(0.19) and out["overall"]["ratio"] == pytest.approx(20)
    assert out["overall"]["identical"] == [["B", "C"]] and out["by_step"][1]["tokens"] == 1
