"""The factor table: every selection carries the reference and the baselines its settings are measured against."""
from __future__ import annotations

import pytest

from rcdiag.errors import ConfigError
from rcdiag.probe.factors import DEFAULT_FACTORS, FACTORS, REFERENCE, EngineSetting, select_settings


def test_baselines_come_along() -> None:
    """`packing` alone still measures bf16-packed against bf16-alone (a dtype-free packing effect)."""
    names = [s.name for s in select_settings(("packing",), "bfloat16")]
    assert names[0] == REFERENCE and "train_bf16" in names
    assert len(names) == len(set(names))


@pytest.mark.parametrize(("run_dtype", "other"), [("bfloat16", "float32"), ("float16", "float32"),
                                                  ("float32", "bfloat16")])
def test_engine_dtype_compares_against_the_other_dtype(run_dtype: str, other: str) -> None:
    settings = select_settings(("engine_dtype",), run_dtype)
    engine = [s for s in settings if isinstance(s, EngineSetting) and s.factor == "engine_dtype"]
    assert [(s.name, s.dtype) for s in engine] == [(f"engine_{other}", other)]
    assert "engine_replay" in [s.name for s in settings], "engine factors need the replay at the run's settings"


def test_default_grid_needs_two_engines() -> None:
    settings = select_settings(DEFAULT_FACTORS, "bfloat16")
    keys = {s.engine_key("auto", False) for s in settings if isinstance(s, EngineSetting)}
    assert keys == {("auto", False), ("float32", False)}
    settings = select_settings((*DEFAULT_FACTORS, "prefix_caching"), "bfloat16")
    keys = {s.engine_key("auto", False) for s in settings if isinstance(s, EngineSetting)}
    assert keys == {("auto", False), ("float32", False), ("auto", True)}
    keys = {s.engine_key("auto", True) for s in settings if isinstance(s, EngineSetting)}
    assert keys == {("auto", True), ("float32", True)}, "a run with prefix caching on shares one engine"


def test_every_baseline_exists_and_names_are_unique() -> None:
    names = [s.name for group in FACTORS.values() for s in group]
    assert len(names) == len(set(names))
    for setting in (s for group in FACTORS.values() for s in group):
        assert setting.baseline in {*names, REFERENCE}, setting


def test_unknown_factor_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="unknown factor.*choose from train_dtype"):
        select_settings(("train_dtype", "nope"), "auto")
