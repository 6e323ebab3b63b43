"""Trainer settings to paste: exact names and quoting per framework (rcdiag.report.settings docstring cites the
source files and versions), and the notes where a framework cannot express the mode."""
from __future__ import annotations

from rcdiag.report.settings import trainer_settings


def by_name(*args, **kwargs):
    return {s.framework: s for s in trainer_settings(*args, **kwargs)}


def test_token_mask_uses_quoted_icepop_string_in_verl():
    s = by_name("token_mask", 2.0)
    assert "'algorithm.rollout_correction.rollout_is_threshold=\"1e-09_2\"'" in s["verl"].code
    assert "rollout_is=token" in s["verl"].code and "bypass_mode=false" in s["verl"].code
    assert 'vllm_importance_sampling_mode="token_mask"' in s["TRL"].code
    assert "icepop_function" in s["slime"].code


def test_lower_bound_where_it_exists_and_notes_where_not():
    s = by_name("token_truncate", 5.0, 0.5)
    assert "vllm_importance_sampling_clip_min=0.5" in s["TRL"].code and "--tis-clip-low 0.5" in s["slime"].code
    assert "lower bound L cannot be expressed" in s["verl"].note and "No lower bound" in s["ms-swift"].note


def test_sequence_modes_warn_about_ratio_definitions():
    s = by_name("sequence_mask", 3.0, convention="canonical", sequence_ratio="geometric")
    assert "GEOMETRIC" in s["ms-swift"].note and "--convention verl" in s["verl"].note
    assert "tis_mode: \"mask\"" in s["slime"].code and "tis_upper_bound: 3.0" in s["slime"].code
    product = by_name("sequence_truncate", 3.0, convention="verl", sequence_ratio="product_clamped")
    assert "--convention" not in product["verl"].note


def test_no_correction_is_metrics_only():
    s = by_name(None)
    assert "rollout_is=null" in s["verl"].code and "vllm_importance_sampling_correction=False" in s["TRL"].code
    assert all(x.version and x.source for x in s.values())
