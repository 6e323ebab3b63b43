"""rcdiag.Recorder: a trainer-shaped loop writes a run that opens and reports after every recorded step, resumes
without doubling steps, and holds exactly what was given (padded bf16 tensors included).

Guards issue #28 "rcdiag's best analyses wait for per-token data that nobody writes by default".
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import rcdiag
from rcdiag.errors import ConfigError, InputError
from rcdiag.record import Recorder


def trainer_batch(rng: np.random.Generator, batch: int = 6, width: int = 10, pad: int = 0):
    """A GRPO step as a trainer holds it: right-padded ids [B, T] (long), an int mask, bf16 log-probs."""
    lengths = rng.integers(1, width + 1, batch)
    ids = torch.full((batch, width), pad, dtype=torch.long)
    mask = torch.zeros((batch, width), dtype=torch.long)
    engine = torch.zeros((batch, width), dtype=torch.bfloat16)
    trainer = torch.zeros((batch, width), dtype=torch.float32)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.from_numpy(rng.integers(1, 500, n))
        mask[i, :n] = 1
        lp = -rng.exponential(1.0, n)
        engine[i, :n] = torch.from_numpy(lp).to(torch.bfloat16)
        trainer[i, :n] = torch.from_numpy(lp + rng.normal(0, 0.01, n)).float()
    prompts = [rng.integers(1, 500, int(rng.integers(2, 6))).tolist() for _ in range(batch)]
    return prompts, ids, engine, trainer, mask, lengths


def test_trainer_loop_every_k_reports_per_step(tmp_path):
    """Every 2nd of 6 steps recorded; after each one the run opens; the values are the inputs (bf16 widened);
    rcdiag.trend gives one row per recorded step."""
    rng = np.random.default_rng(80)
    recorder = Recorder(tmp_path / "live", every=2)
    given = {}
    for step in range(6):
        prompts, ids, engine, trainer, mask, lengths = trainer_batch(rng)
        wrote = recorder.add(step, prompts, ids, engine, trainer, mask, reward=rng.random(6).tolist())
        assert wrote == (step % 2 == 0)
        if wrote:
            given[step] = (prompts, ids, engine, trainer, lengths)
            assert rcdiag.open_run(tmp_path / "live").num_sequences == 6 * len(given)
    run = rcdiag.open_run(tmp_path / "live")
    assert sorted(set(run.sequences()["step"])) == [0, 2, 4]
    tokens, seqs = run.tokens(), run.sequences()
    prompts, ids, engine, trainer, lengths = given[2]
    for i in range(6):
        seq = seqs[(seqs.step == 2) & (seqs.sample_index == i)].iloc[0]
        rows = tokens[tokens.seq_id == seq.seq_id]
        assert rows["token_id"].tolist() == ids[i, :lengths[i]].tolist()
        np.testing.assert_array_equal(rows["rollout_logprob"].to_numpy(), engine[i, :lengths[i]].float().numpy())
        np.testing.assert_array_equal(rows["train_logprob"].to_numpy(), trainer[i, :lengths[i]].numpy())
        assert list(seq.prompt_token_ids) == prompts[i]
    assert len(rcdiag.trend(run)) == 3
    assert run.manifest["source"]["kind"] == "recorded" and run.manifest["measured"]["rollout"] == "sampled"


def test_resume_skips_recorded_steps_and_drops_a_cut_shard(tmp_path):
    """A restarted job re-adds step 2: skipped. A shard cut off mid-write (tokens without sequences) is removed
    when the recorder reopens, and seq_ids continue after the last complete shard."""
    rng = np.random.default_rng(81)
    first = Recorder(tmp_path / "live")
    for step in (0, 1, 2):
        first.add(step, *trainer_batch(rng)[:5])
    (tmp_path / "live/tokens/part-00003.parquet").write_bytes(b"half a file")
    again = Recorder(tmp_path / "live", every=1)
    assert again.steps == [0, 1, 2] and not (tmp_path / "live/tokens/part-00003.parquet").exists()
    assert again.add(2, *trainer_batch(rng)[:5]) is False
    assert again.add(3, *trainer_batch(rng)[:5]) is True
    run = rcdiag.open_run(tmp_path / "live")
    seqs = run.sequences()
    assert seqs["step"].value_counts().to_dict() == {0: 6, 1: 6, 2: 6, 3: 6}
    assert seqs["seq_id"].tolist() == list(range(24))


def test_versions_lag_and_advantages(tmp_path):
    """Per-sample versions (async: some samples one or two steps old), the trainer's version the step; a
    per-token advantage [B, T]; max_samples bounds a step's cost."""
    rng = np.random.default_rng(82)
    recorder = Recorder(tmp_path / "live", max_samples=4)
    prompts, ids, engine, trainer, mask, _ = trainer_batch(rng)
    advantage = torch.arange(6, dtype=torch.float32)[:, None].expand(6, 10)
    recorder.add(7, prompts, ids, engine, trainer, mask, version=[7, 6, 5, 7, 7, 7], advantage=advantage)
    seqs = rcdiag.open_run(tmp_path / "live").sequences()
    assert len(seqs) == 4
    assert (seqs["trainer_version"] - seqs["policy_version"]).tolist() == [0, 1, 2, 0]
    assert seqs["advantage"].tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(InputError, match=r"recorded step 8 row 1 field .policy_version.: policy_version 9 > 7 is newer than trainer_version"):
        recorder.add(8, prompts, ids, engine, trainer, mask, version=9, trainer_version=7)
    assert recorder.steps == [7]


def test_bad_input_is_named(tmp_path):
    rng = np.random.default_rng(83)
    prompts, ids, engine, trainer, mask, _ = trainer_batch(rng)
    recorder = Recorder(tmp_path / "live")
    with pytest.raises(ConfigError, match="needs rollout_logprobs and/or train_logprobs"):
        recorder.add(0, prompts, ids)
    with pytest.raises(InputError, match="rollout_logprobs.*has 5 samples, the response ids 6"):
        recorder.add(0, prompts, ids, engine[:5], trainer, mask)
    with pytest.raises(InputError, match=r"Recorder.add\(step=0\) row 1 .* train_logprobs has 3 values"):
        recorder.add(0, None, [[1, 2, 3, 4]], [[-1.0] * 4], [[-1.0] * 3])
    with pytest.raises(ConfigError, match="every=0"):
        Recorder(tmp_path / "other", every=0)
    assert not (tmp_path / "live/manifest.json").exists()
