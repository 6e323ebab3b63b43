"""The hooks record what the trainer's config says (the manifest's context) and never break training: a verl batch
whose agent loop left min/max_global_steps None (verl/experimental/agent_loop/agent_loop.py @ 1dda039 fills a fixed
key set with `extra_fields.get(key)`) records without versions; a batch the recorder cannot read is one warning and
a skipped step, never an exception into `fit`. Guards issue #45 ("A recorder must never break training") and #44
(context)."""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import pytest

import rcdiag
from rcdiag.record import Recorder
from rcdiag.record.hooks import RecorderWarning
from rcdiag.record.verl import record_verl_batch
from tests.importers.dumps import make_truth, verl_tensors

MODEL = "sample_data/tiny-model"


@dataclass
class DataProto:
    batch: object
    non_tensor_batch: dict = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)


def _batch(n=6, versions=None):
    from tensordict import TensorDict

    truth = make_truth(seed=3, n=n)
    tensors = verl_tensors(truth, resp_len=14)
    tensors.pop("input_ids")
    extra = {"uid": np.array([f"u{i // 2}" for i in range(n)], dtype=object)}
    if versions is not None:
        extra["max_global_steps"] = np.array(versions, dtype=object)
        extra["min_global_steps"] = np.array(versions, dtype=object)
    return DataProto(TensorDict(tensors, batch_size=[n]), extra)


def verl_config(path, **correction):
    """verl's config as `fit` holds it, the keys rcdiag reads at their _generated_ppo_trainer.yaml defaults
    (verl @ 1dda039) — a plain dict of the DictConfig's shape (omegaconf is not a dependency of rcdiag)."""
    return {
        "actor_rollout_ref": {
            "model": {"path": str(path)},
            "actor": {"strategy": "fsdp", "fsdp_config": {"dtype": "bfloat16", "model_dtype": "fp32"}},
            "rollout": {"name": "vllm", "dtype": "bfloat16", "temperature": 0.7, "top_k": -1, "top_p": 1,
                        "logprobs_mode": "processed_logprobs", "quantization": None, "calculate_log_probs": True,
                        "engine_kwargs": {"vllm": {"kv_cache_dtype": "fp8"}}}},
        "algorithm": {"rollout_correction": {"rollout_is": None, "rollout_is_threshold": 2.0, "rollout_rs": None,
                                             "rollout_rs_threshold": None, "bypass_mode": False,
                                             "rollout_is_batch_normalize": False, **correction}},
    }


def test_none_versions_record_without_versions(tmp_path):
    recorder = Recorder(tmp_path / "live")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecorderWarning)  # a None version is not a failure: no warning at all
        assert record_verl_batch(recorder, _batch(versions=[3, None, 3, None, None, 2]), step=4) is True
        assert record_verl_batch(recorder, _batch(versions=[None] * 6), step=5) is True
    seqs = rcdiag.open_run(tmp_path / "live").sequences()
    first = seqs[seqs.step == 4]
    assert first["policy_version"].isna().tolist() == [False, True, False, True, True, False]
    assert first["policy_version"].dropna().tolist() == [3, 3, 2]
    assert first["trainer_version"].isna().tolist() == [False, True, False, True, True, False]
    assert seqs[seqs.step == 5]["policy_version"].isna().all()


def test_a_broken_batch_is_one_warning_and_a_skipped_step(tmp_path):
    recorder = Recorder(tmp_path / "live")
    broken = _batch()
    del broken.batch["attention_mask"]
    with pytest.warns(RecorderWarning, match=r"step 1 was not recorded \(KeyError") as said:
        assert record_verl_batch(recorder, broken, step=1) is False
        assert record_verl_batch(recorder, broken, step=2) is False  # the same kind again: silent
        assert record_verl_batch(recorder, _batch(), step=3) is True  # training and recording go on
    assert len([w for w in said if issubclass(w.category, RecorderWarning)]) == 1
    assert rcdiag.open_run(tmp_path / "live").sequences()["step"].unique().tolist() == [3]


@pytest.mark.parametrize("correction, expected", [
    ({}, {"enabled": False}),
    ({"rollout_is": "token", "rollout_is_threshold": 2.0}, {"enabled": True, "mode": "token_truncate", "threshold": 2.0}),
    ({"rollout_is": "sequence", "rollout_is_threshold": "0.5_5.0", "rollout_rs": "token_k1,seq_mean_k3",
      "rollout_rs_threshold": "0.6_1.6,0.01"},
     {"enabled": True, "mode": "sequence_mask", "threshold": 5.0, "lower": 0.5,
      "rejection": ["token_k1:0.6_1.6", "seq_mean_k3:0.01"]}),
])
def test_verl_config_becomes_the_manifest_context(tmp_path, correction, expected):
    recorder = Recorder(tmp_path / "live")
    assert record_verl_batch(recorder, _batch(), step=1, config=verl_config(MODEL, **correction)) is True
    info = rcdiag.open_run(tmp_path / "live").info
    assert info.engine.name == "vllm" and info.engine.temperature == 0.7 and info.engine.top_k == -1
    assert info.engine.engine_dtype == "bfloat16" and info.engine.kv_cache_dtype == "fp8"
    assert info.engine.logprobs_mode == "processed_logprobs" and info.engine.quantization is None
    assert info.trainer.dtype == "bfloat16" and info.trainer.framework == "verl"
    assert info.model.architecture == "dense" and info.model.model_type == "qwen2"
    got = info.trainer.correction
    for name, value in expected.items():
        assert getattr(got, name) == value, name
    assert got.settings["rollout_is_threshold"] == correction.get("rollout_is_threshold", 2.0)
