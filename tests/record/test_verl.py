"""The verl hook on verl's training batch as `RayPPOTrainer.fit` holds it after `batch.union(old_log_prob)`
(verl/trainer/ppo/ray_trainer.py @ 1dda039, line 1610): a real `tensordict.TensorDict` of the tensors with verl's
shapes and dtypes (prompts [B, P] int64 left-padded, responses [B, R] int64 right-padded, attention_mask
[B, P+R] int64, response_mask [B, R] int64, rollout_log_probs / old_log_probs [B, R] float32 — `_compute_old_log_prob`
returns `log_probs.float()`), and numpy object arrays for uid and the agent loop's min/max_global_steps. verl itself
cannot be installed here (its wheel pins transformers 5.10 and tokenizers 0.22); DataProto is the two attributes
rcdiag reads (rcdiag.record.verl.DataProtoLike)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

import rcdiag
from rcdiag.record import Recorder
from rcdiag.record.verl import DataProtoLike, record_verl_batch
from tests.importers.dumps import assert_run_matches, make_truth, verl_tensors


@dataclass
class DataProto:
    batch: object
    non_tensor_batch: dict = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)


def test_record_verl_batch(tmp_path):
    from tensordict import TensorDict

    truth = make_truth(seed=84, n=6)
    tensors = verl_tensors(truth, resp_len=14)
    tensors.pop("input_ids")
    batch = DataProto(TensorDict(tensors, batch_size=[6]),
                      {"uid": np.array([f"u{i // 2}" for i in range(6)], dtype=object),
                       "max_global_steps": np.array([4, 4, 3, 4, 2, 4], dtype=object),
                       "min_global_steps": np.array([4, 3, 3, 4, 2, 4], dtype=object)})
    assert isinstance(batch, DataProtoLike)
    recorder = Recorder(tmp_path / "live", every=5)
    assert record_verl_batch(recorder, batch, step=4) is False  # not due
    assert record_verl_batch(recorder, batch, step=5) is True
    run = rcdiag.open_run(tmp_path / "live")
    assert_run_matches(run, truth)
    seqs = run.sequences()
    assert (seqs["trainer_version"] - seqs["policy_version"]).tolist() == [0, 0, 1, 0, 2, 0]
    assert seqs["policy_version_min"].tolist() == [4, 3, 3, 4, 2, 4]
    assert seqs["prompt_id"].tolist() == ["u0", "u0", "u1", "u1", "u2", "u2"]
    assert tensors["old_log_probs"].dtype == torch.float32
