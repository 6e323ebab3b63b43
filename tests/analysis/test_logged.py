"""logged_values: each framework's per-step number, from per-group values averaged the framework's way, held
against an independent reference built from tests/analysis/frameworks.py (one micro-batch / generation call on one
rank at a time) and the averaging written from the trainers' `log()` and gathers (ms-swift v4.5.2: ranks nanmean,
max / min for log_ppl_diff_max / _min, then sum/len; TRL v1.9.0: ranks mean / max / nanmin / nanmean / nanmax,
then the mean of non-NaN values; verl v0.9.0: one batch per step)."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest

import rcdiag
from rcdiag.analysis.training.logged import logged_values
from rcdiag.errors import ConfigError, InputError
from tests.analysis import frameworks as fw
from tests.analysis.helpers import make_tokens
from tests.analysis.test_frameworks import compare

SWIFT_RANK = {"rollout_correction/log_ppl_diff_max": max, "rollout_correction/log_ppl_diff_min": min}
TRL_RANK = {"sampling/sampling_logp_difference/mean": np.mean, "sampling/sampling_logp_difference/max": np.max,
            "sampling/importance_sampling_ratio/min": np.nanmin,
            "sampling/importance_sampling_ratio/mean": np.nanmean,
            "sampling/importance_sampling_ratio/max": np.nanmax}


def _data(seed: int):
    """Tokens with all-masked and empty sequences, and a sequences frame: 2 steps × 2 micro-batches × 2 ranks."""
    tokens = make_tokens(seed, n_seq=16, max_len=6, scale=0.4, mask_p=0.25)
    rng = np.random.default_rng(seed)
    ids = sorted(set(tokens["seq_id"].tolist()) | {1000, 1001})  # two sequences without token rows
    # one group made only of an all-masked sequence: the frameworks' no-data values enter the average
    tokens.loc[tokens["seq_id"] == ids[0], "mask"] = False
    n = len(ids)
    frame = pd.DataFrame({"seq_id": np.array(ids, np.int64), "step": rng.integers(0, 2, n),
                          "mb": rng.integers(0, 2, n), "rank": rng.integers(0, 2, n)})
    frame.loc[0, ["step", "mb", "rank"]] = [0, 9, 0]
    return tokens, frame


def _groups(tokens, frame, keys):
    for key, rows in frame.groupby(keys, sort=True):
        ids = rows["seq_id"].tolist()
        yield key, fw.padded(tokens[tokens["seq_id"].isin(ids)], ids)


def _reference(tokens, frame, framework, mode, threshold):
    """{step: {key: value}} the framework's way, from the one-group references."""
    out = {}
    for step, in_step in frame.groupby("step"):
        per_unit = []
        for _, in_unit in in_step.groupby("mb"):
            per_rank = [fw.swift(a, b, m, mode, threshold) if framework == "swift" else
                        fw.trl(a, b, m, mode, threshold) for _, (a, b, m) in _groups(tokens, in_unit, "rank")]
            reduce = SWIFT_RANK if framework == "swift" else TRL_RANK
            per_unit.append({k: float((reduce.get(k) or np.nanmean)([r[k] for r in per_rank]))
                             for k in per_rank[0]})
        if framework == "swift":  # log(): sum(val) / len(val)
            out[step] = {k: sum(u[k] for u in per_unit) / len(per_unit) for k in per_unit[0]}
        else:  # log(): NaN dropped
            out[step] = {k: float(np.mean([u[k] for u in per_unit if not math.isnan(u[k])])) for k in per_unit[0]}
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("framework", "mode", "threshold"), [
    ("swift", "token_truncate", 2.0), ("swift", "sequence_mask", 1.5), ("swift", "token_mask", 3.0),
    ("trl", "sequence_mask", 3.0), ("trl", "token_truncate", 2.0), ("trl", "sequence_truncate", 1.5)])
def test_per_step_values_averaged_the_frameworks_way(seed, framework, mode, threshold):
    tokens, frame = _data(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want = _reference(tokens, frame, framework, mode, threshold)
        got = logged_values(tokens, framework, mode, threshold, unit="mb", rank="rank", sequences=frame)
    assert got["step"].tolist() == sorted(want)
    for _, row in got.iterrows():
        compare(row.to_dict(), want[int(row["step"])], f"[{framework} {mode} step {row['step']}]")


def test_verl_is_one_batch_per_step():
    """verl's per-step numbers (rollout_corr/ and training/) equal the single-batch reference on each step's rows;
    a micro-batch or rank column is refused (decoupled mode has none, bypass mode is not reproducible)."""
    tokens, frame = _data(7)
    got = logged_values(tokens, "verl", "token_mask", 2.0, 0.5, sequences=frame, batch_normalize=True,
                        rejection=rcdiag.verl_rejections("seq_mean_k1", "0.5_2.0"))
    for step, in_step in frame.groupby("step"):
        ids = in_step["seq_id"].tolist()
        a, b, m = fw.padded(tokens[tokens["seq_id"].isin(ids)], ids)
        want = fw.verl(a, b, m, "token", "0.5_2.0", True, "seq_mean_k1", "0.5_2.0")
        compare(got[got["step"] == step].iloc[0].to_dict(), want, f"[verl step {step}]")
    with pytest.raises(ConfigError, match="group by step only"):
        logged_values(tokens, "verl", unit="mb", sequences=frame)


def test_groups_default_and_bad_columns():
    """No step column: one logged point equal to the pooled numbers; a missing, null or two-valued group column
    is an InputError naming it; a non-framework convention is refused."""
    tokens, frame = _data(3)
    pooled = rcdiag.compute_metrics(tokens, sequences=frame[["seq_id"]], keys="swift")
    one = logged_values(tokens, "swift", sequences=frame[["seq_id"]])
    assert len(one) == 1 and one["groups"].item() == 1
    compare(one.iloc[0].to_dict(), {k: v for k, v in pooled.items() if k.startswith("rollout_correction/")},
            "[swift one group]", rel=1e-12)
    with pytest.raises(InputError, match="missing group column 'mb'"):
        logged_values(tokens, "swift", unit="mb", sequences=frame[["seq_id", "step"]])
    bad = frame.astype({"mb": "float64"})
    bad.loc[2, "mb"] = np.nan
    with pytest.raises(InputError, match="'mb' is null") as info:
        logged_values(tokens, "swift", unit="mb", sequences=bad)
    assert info.value.row == 3
    with pytest.raises(ConfigError, match="one of verl, swift, trl"):
        logged_values(tokens, "canonical")
    per_group = logged_values(tokens, "trl", "sequence_mask", 3.0, unit="mb", rank="rank", sequences=frame,
                              per_group=True)
    assert len(per_group) == len(frame.drop_duplicates(["step", "mb", "rank"]))


def test_every_key_in_the_tables_is_documented():
    """docs/framework-keys.md names every framework key rcdiag can return (full strings; the per-option rejection
    keys by their pattern), so the list and the key tables cannot drift apart."""
    from pathlib import Path

    from rcdiag.analysis.correction.verlstats import RS_SUFFIXES
    from rcdiag.analysis.keys import TABLES

    doc = (Path(__file__).parents[2] / "docs" / "framework-keys.md").read_text()
    missing = [key for table in TABLES.values() for key in table.values() if f"`{key}`" not in doc]
    assert not missing, missing
    assert "`rollout_corr/rollout_rs_<option>`" in doc and all(f"`_{suffix}`" in doc for suffix in RS_SUFFIXES)


def test_a_run_directory_groups_by_its_step_column(tmp_path):
    """On a real run directory (Parquet): each step's row equals compute_metrics / simulate on that step's
    sequences alone; a run without steps is one step 0; steps null for some sequences only are refused."""
    tokens, frame = _data(5)
    run = rcdiag.write_run(tmp_path / "run", tokens.drop(columns=["token_id"]), frame[["seq_id", "step"]])
    got = logged_values(run, "swift", "sequence_truncate", 2.0)
    assert got["step"].tolist() == sorted(frame["step"].unique().tolist())
    for step, in_step in frame.groupby("step"):
        ids = in_step["seq_id"]
        part = tokens[tokens["seq_id"].isin(ids)]
        want = rcdiag.compute_metrics(part, sequences=in_step[["seq_id"]], keys="swift")
        want.update(rcdiag.simulate(part, "sequence_truncate", 2.0, sequences=in_step[["seq_id"]], keys="swift"))
        row = got[got["step"] == step].iloc[0].to_dict()
        compare(row, {k: v for k, v in want.items() if not k.startswith("rcdiag/")}, f"[run step {step}]",
                rel=1e-12)
        assert row["rcdiag/sequences"] == len(in_step)
    flat = rcdiag.write_run(tmp_path / "flat", tokens.drop(columns=["token_id"]), frame[["seq_id"]])
    one = logged_values(flat, "trl", "sequence_mask", 3.0)
    assert one["step"].tolist() == [0] and one["rcdiag/sequences"].item() == len(frame)
    partial = frame[["seq_id", "step"]].astype({"step": "float64"})
    partial.loc[3, "step"] = np.nan
    broken = rcdiag.write_run(tmp_path / "partial", tokens.drop(columns=["token_id"]),
                              partial.astype({"step": "Int64"}))
    with pytest.raises(InputError, match="'step' is null") as info:
        logged_values(broken, "verl")
    assert info.value.row == 4
