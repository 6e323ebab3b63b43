"""Policy versions and advantages survive an import: every importer whose source carries them fills the store's
optional columns (rcdiag.store.schema.SEQUENCE_OPTIONAL / TOKEN_OPTIONAL), validated.

Guards issue #28 "dumps that carry the policy version of each sample (slime weight_versions, AReaL per-token
versions, verl min/max_global_steps, TRL async model_version) lose it on import".
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from rcdiag.errors import InputError
from rcdiag.importers import ImportOptions, import_run
from rcdiag.store.writer import write_run
from tests.importers.dumps import make_truth, save_slime_rollout, save_verl, slime_sample, verl_tensors

Q = ImportOptions(quiet=True)
PICKLE = ImportOptions(quiet=True, allow_pickle=True)


def _write(tmp_path, rows, name="dump.jsonl"):
    file = tmp_path / name
    file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return file


def test_slime_weight_versions(tmp_path):
    """slime's Sample.weight_versions: one string per generate call (slime/utils/types.py @ 624b824, line 408);
    a partial rollout continued on newer weights spans versions: newest → policy_version, oldest → _min."""
    import torch

    truth = make_truth(seed=50, n=4)
    samples = [slime_sample(t, i) for i, t in enumerate(truth)]
    for sample, versions in zip(samples, (["3"], ["2", "3"], ["000003"], []), strict=True):
        sample["weight_versions"] = versions
    (tmp_path / "d").mkdir()
    torch.save({"rollout_id": 4, "samples": samples}, tmp_path / "d/4.pt")
    run, _ = import_run("slime", tmp_path / "d/4.pt", tmp_path / "run", PICKLE)
    seqs = run.sequences()
    assert seqs["policy_version"].tolist()[:3] == [3, 3, 3] and pd.isna(seqs["policy_version"].iloc[3])
    assert seqs["policy_version_min"].tolist()[:3] == [3, 2, 3]
    samples[0]["weight_versions"] = ["v1"]
    torch.save({"rollout_id": 4, "samples": samples}, tmp_path / "d/4.pt")
    with pytest.raises(InputError, match=r"row 1 field 'weight_versions': 'v1' \(str\) is not a whole number"):
        import_run("slime", tmp_path / "d/4.pt", tmp_path / "run2", PICKLE)


def test_slime_without_versions_writes_no_columns(tmp_path):
    """Additive: a dump without versions gives the run the columns it always had."""
    truth = make_truth(seed=51, n=3)
    save_slime_rollout(tmp_path / "3.pt", truth)
    run, _ = import_run("slime", tmp_path / "3.pt", tmp_path / "run", PICKLE)
    assert "policy_version" in run.sequences().columns  # weight_versions ["1"] in the fixture
    for column in ("trainer_version", "advantage"):
        assert column not in run.sequences().columns
    assert "policy_version" not in run.tokens().columns


def test_verl_min_max_global_steps(tmp_path):
    """verl's agent loop puts min/max_global_steps in the non-tensor batch; the trainer at global step g trains
    version g − 1 (verl/trainer/ppo/v1/trainer_base.py @ 1dda039, lines 1856-1870)."""
    truth = make_truth(seed=52, n=4)
    non_tensor = {"max_global_steps": np.array([6, 6, 5, 4], dtype=object),
                  "min_global_steps": np.array([6, 5, 5, 3], dtype=object)}
    save_verl(tmp_path / "dump/7/gen_batch.dp", truth, tmp_path / "pkgs", step=7, non_tensor=non_tensor)
    run, _ = import_run("verl", tmp_path / "dump", tmp_path / "run", PICKLE)
    seqs = run.sequences()
    assert seqs["policy_version"].tolist() == [6, 6, 5, 4]
    assert seqs["policy_version_min"].tolist() == [6, 5, 5, 3]
    assert seqs["trainer_version"].tolist() == [6] * 4
    lag = seqs["trainer_version"] - seqs["policy_version"]
    assert lag.tolist() == [0, 0, 1, 2]  # verl's training/off_policy/trajectory_staleness per sample


def test_verl_rows_and_trl_async_rows_carry_versions(tmp_path):
    """The generic importer: verl batch rows with max/min_global_steps; TRL AsyncGRPO rows with model_version
    (trl/experimental/async_grpo/async_rollout_worker.py @ f2cd577, RolloutSample) and a scalar advantage."""
    truth = [t for t in make_truth(seed=53) if len(t.response) and t.mask[0]]
    tensors = verl_tensors(truth)
    rows = [{k: v[i].tolist() for k, v in tensors.items() if k != "input_ids"}
            | {"global_steps": 9, "max_global_steps": 8 - i % 3, "min_global_steps": 7 - i % 3}
            for i in range(len(truth))]
    run, _ = import_run("jsonl", _write(tmp_path, rows), tmp_path / "verl", Q)
    seqs = run.sequences()
    assert (seqs["trainer_version"] - seqs["policy_version"]).tolist() == [i % 3 for i in range(len(truth))]
    rows = [{"input_ids": t.prompt + t.response, "completion_mask": [0] * len(t.prompt) + t.mask.tolist(),
             "old_log_probs": [0.0] * len(t.prompt) + t.rollout.tolist(), "advantage": 0.25 * i,
             "model_version": 10 + i} for i, t in enumerate(truth)]
    run, _ = import_run("jsonl", _write(tmp_path, rows, "async.jsonl"), tmp_path / "async", Q)
    seqs = run.sequences()
    assert seqs["policy_version"].tolist() == [10 + i for i in range(len(truth))]
    assert seqs["advantage"].tolist() == [0.25 * i for i in range(len(truth))]


def test_areal_per_token_versions(tmp_path):
    """AReaL's per-token `versions` (areal/workflow/rlvr.py @ cbff54d: −1 on the prompt, the engine's version on
    each output token; a partial rollout changes version mid-sequence): stored per token, and the sequence's
    newest/oldest derived from them."""
    truth = [t for t in make_truth(seed=54) if len(t.response) >= 2 and t.mask[0]]
    rows = []
    for t in truth:
        half = len(t.response) // 2
        versions = [-1] * len(t.prompt) + [4] * half + [5] * (len(t.response) - half)
        rows.append({"input_ids": t.prompt + t.response, "loss_mask": [0] * len(t.prompt) + t.mask.tolist(),
                     "logprobs": [0.0] * len(t.prompt) + t.rollout.tolist(), "versions": versions,
                     "rewards": t.reward})
    run, _ = import_run("jsonl", _write(tmp_path, rows), tmp_path / "run", Q)
    tokens, seqs = run.tokens(), run.sequences()
    for seq_id, t in enumerate(truth):
        half = len(t.response) // 2
        got = tokens[tokens.seq_id == seq_id]["policy_version"].tolist()
        assert got == [4] * half + [5] * (len(t.response) - half)
    assert seqs["policy_version"].tolist() == [5] * len(truth)
    assert seqs["policy_version_min"].tolist() == [4] * len(truth)


def test_per_token_advantages_openrlhf_and_swift(tmp_path):
    """Per-token advantages (OpenRLHF's Experience.advantages (B, A), ms-swift's GRPOBatch.advantages [B, T]) are
    cut like the log-probs; a sequence whose valid tokens share one value gets it as its advantage too."""
    truth = [t for t in make_truth(seed=55) if len(t.response) and t.mask[0]]
    rows = [{"input_ids": t.prompt + t.response, "completion_mask": t.mask.tolist(),
             "old_per_token_logps": t.train.tolist(), "rollout_per_token_logps": t.rollout.tolist(),
             "advantages": [float(i)] * len(t.response)} for i, t in enumerate(truth)]
    run, _ = import_run("jsonl", _write(tmp_path, rows), tmp_path / "run", Q)
    tokens, seqs = run.tokens(), run.sequences()
    assert tokens.groupby("seq_id")["advantage"].first().tolist() == [float(i) for i in range(len(truth))]
    assert seqs["advantage"].tolist() == [float(i) for i in range(len(truth))]
    rows[0]["advantages"] = rows[0]["advantages"][:-1]
    with pytest.raises(InputError, match="row 1 field 'advantages': has .* values for .* positions"):
        import_run("jsonl", _write(tmp_path, rows, "bad.jsonl"), tmp_path / "bad", Q)


def test_engine_newer_than_trainer_is_refused(tmp_path):
    """Validated: an engine version newer than the trainer's cannot be (lag < 0: versions counted from different
    origins, or the columns swapped); a fractional version is refused too."""
    truth = make_truth(seed=56, n=3)
    tensors = verl_tensors(truth)
    rows = [{k: v[i].tolist() for k, v in tensors.items() if k != "input_ids"}
            | {"global_steps": 5, "max_global_steps": 4 + i} for i in range(3)]
    with pytest.raises(InputError, match="policy_version 5 > 4 is newer than trainer_version"):
        import_run("jsonl", _write(tmp_path, rows), tmp_path / "run", Q)
    rows = [dict(r, max_global_steps=2.5) for r in rows]
    with pytest.raises(InputError, match=r"row 1 field 'max_global_steps': 2\.5 is not a whole number"):
        import_run("jsonl", _write(tmp_path, rows, "f.jsonl"), tmp_path / "run", Q)


def test_store_round_trip_and_old_runs(tmp_path):
    """write_run keeps the optional columns; shards with and without them read back as nulls where absent; a
    fractional version in a frame is refused by the store."""
    tokens = pd.DataFrame({"seq_id": [0, 0, 1], "pos": [0, 1, 0], "rollout_logprob": [-1.0, -2.0, -0.5],
                           "train_logprob": [-1.1, -2.0, -0.4], "policy_version": [3, 3, 2]})
    seqs = pd.DataFrame({"seq_id": [0, 1], "policy_version": [3, 2], "trainer_version": [4, 4],
                         "advantage": [0.5, -0.5]})
    run = write_run(tmp_path / "r", tokens, seqs, shard_tokens=2)
    assert len(run.token_files) == 2
    back = run.sequences()
    assert back["policy_version"].tolist() == [3, 2] and back["trainer_version"].tolist() == [4, 4]
    assert run.tokens()["policy_version"].tolist() == [3, 3, 2]
    plain = write_run(tmp_path / "p", tokens.drop(columns="policy_version"))
    assert "policy_version" not in plain.tokens().columns and "policy_version" not in plain.sequences().columns
    with pytest.raises(InputError, match="policy_version.*holds fractions"):
        write_run(tmp_path / "f", tokens, seqs.assign(policy_version=[3.5, 2.0]))
