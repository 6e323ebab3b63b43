"""The manifest's context sections (issue #44): the model's architecture from a config, the trainers' correction
settings read in their own names, and which IS setting a report / export defaults to — the run's recorded trainer
setting, else the --keys framework's defaults, else rcdiag's; explicit values win. Older manifests (no such
sections) read unchanged."""
from __future__ import annotations

import json

import pytest

from rcdiag.analysis.correction.trainer_defaults import choose_correction
from rcdiag.analysis.defaults import IS_MODES
from rcdiag.errors import ConfigError, RunDirError
from rcdiag.report.options import ReportOptions
from rcdiag.store.context import IS_MODE_NAMES, correction_section, model_info, parse_settings
from rcdiag.store.manifest import Manifest, normalise

MOE = "sample_data/tiny-moe"
DENSE = "sample_data/tiny-model"


def test_the_store_names_the_same_is_modes_as_analysis():
    assert IS_MODE_NAMES == IS_MODES


def test_model_info_reads_dense_and_moe_configs(tmp_path):
    dense, moe = model_info(DENSE), model_info(MOE)
    assert (dense["architecture"], dense["model_type"], dense["architectures"]) == ("dense", "qwen2",
                                                                                    ["Qwen2ForCausalLM"])
    assert dense["config_dtype"] == "bfloat16" and dense["config"].endswith("tiny-model/config.json")
    assert (moe["architecture"], moe["num_experts"], moe["experts_per_token"]) == ("moe", 8, 2)
    # a multimodal config nests the text model; a tokenizer-only dir or a damaged config says nothing
    (tmp_path / "vl").mkdir()
    (tmp_path / "vl" / "config.json").write_text(json.dumps({"model_type": "x_vl", "text_config": {
        "num_experts": 64, "num_experts_per_tok": 8}}))
    assert model_info(tmp_path / "vl")["architecture"] == "moe"
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    assert model_info(tmp_path / "bad") is None and model_info(tmp_path) is None


@pytest.mark.parametrize("framework, given, expected", [
    ("trl", {}, {"enabled": True, "mode": "sequence_mask", "threshold": 3.0, "lower": None}),
    ("trl", {"vllm_importance_sampling_mode": "token_truncate", "vllm_importance_sampling_cap": 5},
     {"mode": "token_truncate", "threshold": 5.0}),
    ("verl", {}, {"enabled": False, "mode": None}),
    ("verl", {"rollout_is": "token", "rollout_is_threshold": "0.5_5.0"},
     {"enabled": True, "mode": "token_mask", "threshold": 5.0, "lower": 0.5}),
    ("swift", {"rollout_importance_sampling_mode": "sequence_truncate"},
     {"enabled": True, "mode": "sequence_truncate", "threshold": 2.0}),
    ("slime", {"use_tis": "true", "tis_clip": "1.5", "tis_clip_low": "0.1"},
     {"enabled": True, "mode": "token_truncate", "threshold": 1.5, "lower": 0.1}),
    ("slime", {}, {"enabled": False}),
])
def test_correction_settings_in_the_frameworks_own_names(framework, given, expected):
    section = correction_section(framework, given, "test")
    assert {k: section.get(k) for k in expected} == expected
    typed = Manifest.from_dict({"schema_version": 1, "trainer": {"correction": section}}).trainer.correction
    assert typed.framework == framework and typed.source == "test"


def test_bad_settings_name_the_setting():
    with pytest.raises(ConfigError, match="vllm_importance_sampling_mode='tokn_truncate'.*did you mean"):
        correction_section("trl", {"vllm_importance_sampling_mode": "tokn_truncate"}, "test")
    with pytest.raises(ConfigError, match="'rollout_iss' is not a correction setting.*did you mean 'rollout_is'"):
        parse_settings(["rollout_iss=token"])
    with pytest.raises(ConfigError, match="mixed"):
        parse_settings(["rollout_is=token", "use_tis=true"])
    with pytest.raises(ConfigError, match="NAME=VALUE"):
        parse_settings(["rollout_is"])
    assert parse_settings(["--rollout-is=token", "rollout_is_threshold=3"]) == (
        "verl", {"rollout_is": "token", "rollout_is_threshold": "3"})


def _recorded(**correction):
    return {"schema_version": 1, "trainer": {"correction": {**correction_section("trl", correction, "test")}}}


def test_the_recorded_setting_else_the_framework_else_rcdiag():
    trl_run = _recorded()
    assert choose_correction(trl_run, "trl").label() == "sequence_mask at C=3"
    assert choose_correction(trl_run, "canonical").origin == "recorded"  # the trainer's setting whatever the keys
    assert choose_correction(None, "trl").label() == "sequence_mask at C=3"
    assert choose_correction(None, "trl").origin == "framework"
    assert choose_correction(None, "verl").label() == "token_truncate at C=2"
    assert choose_correction(None, "canonical").origin == "rcdiag"
    given = choose_correction(trl_run, "trl", threshold=2)
    assert (given.label(), given.origin) == ("sequence_mask at C=2", "given")
    assert "the rest from the run's recorded trl settings" in given.why
    assert choose_correction(trl_run, "trl", mode="token_truncate", threshold=2).why == "given"
    with pytest.raises(ConfigError, match="unknown IS mode 'tokn_mask'"):
        choose_correction(None, mode="tokn_mask")


def test_bounds_a_convention_cannot_apply_are_said():
    no_upper = _recorded(vllm_importance_sampling_mode="token_mask", vllm_importance_sampling_clip_max=None,
                         vllm_importance_sampling_clip_min=0.2)
    under_trl = choose_correction(no_upper, "trl")
    assert (under_trl.threshold, under_trl.lower, under_trl.notes) == (None, 0.2, ())
    under_swift = choose_correction(no_upper, "swift")
    assert under_swift.threshold == 2.0 and under_swift.lower is None and len(under_swift.notes) == 2


def test_report_options_follow_the_run():
    options = ReportOptions()
    assert options.threshold == 2.0 and not options.threshold_given
    assert ReportOptions(keys="trl").threshold == 3.0
    resolved = options.for_run(_recorded())
    assert resolved.threshold == 3.0 and resolved.setting.origin == "recorded"
    assert ReportOptions(threshold=1.5).for_run(_recorded()).threshold == 1.5
    assert ReportOptions().for_run({"schema_version": 1}).setting.origin == "rcdiag"


def test_new_sections_round_trip_and_old_manifests_read():
    old = {"schema_version": 1, "engine": {"temperature": 1.0}, "trainer": {"dtype": "float32"}}
    assert normalise(old)["trainer"] == {"dtype": "float32"}
    assert Manifest.from_dict(old).model is None and Manifest.from_dict(old).trainer.correction is None
    new = {"schema_version": 1, "engine": {"quantization": "fp8", "kv_cache_dtype": "fp8_e4m3"},
           "model": {"architecture": "moe", "num_experts": 8}, "provenance": {"engine.quantization": "test"}}
    again = Manifest.from_dict(normalise(new))
    assert (again.engine.quantization, again.engine.kv_cache_dtype, again.model.num_experts) == ("fp8", "fp8_e4m3", 8)
    with pytest.raises(RunDirError, match="model.architecture"):
        Manifest.from_dict({"schema_version": 1, "model": {"architecture": "sparse"}})
    with pytest.raises(RunDirError, match="provenance"):
        Manifest.from_dict({"schema_version": 1, "provenance": {"a": 1}})
