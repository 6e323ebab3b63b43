"""The frameworks' staleness keys through `--keys`, `rcdiag export` and `rcdiag crosscheck`: verl's
training/off_policy/* and fully_async/partial/*, TRL AsyncGRPO's sample/staleness_*, read back with TensorBoard's
own EventAccumulator and from the offline W&B run's log, each value equal to a reference written here from the
framework's definition (tests.lag.test_lag_trend.verl_reference; trl_reference below).

Guards issue #31 "the trackers": the staleness a verl or TRL dashboard plots had no rcdiag counterpart, so a
trainer whose version counter was off (or a dump whose versions were lost) could not be caught by a cross-check;
and a run without versions must say it cannot check those keys instead of calling the log wrong or agreeing.
"""
from __future__ import annotations

import json

import pytest

from rcdiag.cli import main
from rcdiag.importers import ImportOptions, import_run
from rcdiag.trackers.crosscheck import crosscheck
from rcdiag.trackers.export import export_run, write_tensorboard
from rcdiag.trackers.read import read_wandb
from tests.lag.test_lag_trend import verl_reference
from tests.lag.versioned import samples, trl_async_rows, verl_rows

pytest.importorskip("tensorboard")
WRONG_STEP = 6
"""A global step at which the 'trainer' logged a staleness off by one version."""


@pytest.fixture(scope="module")
def verl(tmp_path_factory):
    root = tmp_path_factory.mktemp("verl")
    rows = verl_rows(root / "batch.jsonl", samples())
    return import_run("jsonl", rows, root / "run", ImportOptions(quiet=True))[0], verl_reference(rows)


@pytest.fixture(scope="module")
def trl(tmp_path_factory):
    root = tmp_path_factory.mktemp("trl")
    rows = trl_async_rows(root / "rows.jsonl", samples(seed=1))
    options = ImportOptions(quiet=True, train_logprobs_field="train_log_probs")
    return import_run("jsonl", rows, root / "run", options)[0], trl_reference(rows)


def trl_reference(path) -> dict[int, dict[str, float]]:
    """TRL AsyncGRPO's staleness per optimizer step (trl 1.16.0, trl/experimental/async_grpo/async_grpo_trainer.py,
    RolloutQueueDataset.__iter__ and _reduce_metric): per consumed sample, staleness = the trainer's model_version
    − sample.model_version, appended as float to sample/staleness_mean and sample/staleness_max; the logging window
    (logging_steps = 1: one optimizer step) reduces the `mean` key to sum(values) / len(values) and the `max` key to
    max(values)."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    out = {}
    for step in sorted({r["global_step"] for r in rows}):
        values = [float(r["current_model_version"] - r["model_version"]) for r in rows if r["global_step"] == step]
        out[step] = {"sample/staleness_mean": sum(values) / len(values), "sample/staleness_max": max(values)}
    return out


def test_verl_staleness_to_tensorboard(verl, tmp_path, capsys):
    """`rcdiag export --to tensorboard --keys verl`: every staleness key at its global step, read back with
    TensorBoard's reader, equal to verl's own arithmetic (float32 in the event file)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, reference = verl
    assert main(["export", str(run.path), "--to", "tensorboard", str(tmp_path / "tb"), "--keys", "verl"]) == 0
    capsys.readouterr()
    (event,) = (tmp_path / "tb" / "run").glob("events.out.tfevents*")
    accumulator = EventAccumulator(str(event))
    accumulator.Reload()
    for key in reference[5]:
        got = {e.step: e.value for e in accumulator.Scalars(key)}
        assert got == pytest.approx({g: values[key] for g, values in reference.items()}, rel=1e-7), key


def test_trl_staleness_to_wandb(trl, tmp_path, monkeypatch):
    """`--keys trl` to an offline W&B run: sample/staleness_{mean,max} per step, read back from its .wandb log,
    exactly TRL's numbers (W&B keeps float64)."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run, reference = trl
    export_run(run, "wandb", tmp_path / "wb", "trl")
    logged = read_wandb(tmp_path / "wb")
    for key in ("sample/staleness_mean", "sample/staleness_max"):
        got = logged[logged["key"] == key].set_index("step")["value"].to_dict()
        assert got == {step: values[key] for step, values in reference.items()}, key
    assert (logged["key"] == "sample/staleness_mean").sum() == 4


def verl_log(tmp_path, reference, wrong_step=None):
    """A TensorBoard log as verl writes it (its keys at global_steps), written by TensorBoard's own writer; at
    `wrong_step` the trajectory_staleness/max is one version too many (a trainer's version counter off by one)."""
    rows = [(g, {k: v + (1.0 if g == wrong_step and k.endswith("trajectory_staleness/max") else 0.0)
                 for k, v in values.items()}) for g, values in reference.items()]
    write_tensorboard(rows, tmp_path / "tb", "trainer")
    return tmp_path / "tb"


def test_crosscheck_verl_staleness_agrees_and_names_the_wrong_step(verl, tmp_path, capsys):
    run, reference = verl
    result = crosscheck(run, verl_log(tmp_path / "ok", reference), "tensorboard")
    assert result.keys == "verl" and result.bad_steps == [] and len(result.table) == 4 * 12
    result = crosscheck(run, verl_log(tmp_path / "bad", reference, WRONG_STEP), "tensorboard", "verl")
    assert result.bad_steps == [WRONG_STEP]
    (bad,) = result.disagreements.itertuples()
    assert bad.key == "training/off_policy/trajectory_staleness/max" and bad.logged == bad.recomputed + 1
    code = main(["crosscheck", str(run.path), "--tensorboard", str(tmp_path / "bad" / "tb"), "--quiet"])
    assert code == 1 and capsys.readouterr().out.startswith(f"Disagree (alarm) at step(s) {WRONG_STEP}: ")


def test_crosscheck_trl_history_csv(trl, tmp_path):
    """TRL's history as W&B's 'Export CSV' gives it (_step): the staleness keys agree."""
    import pandas as pd

    run, reference = trl
    pd.DataFrame([{"_step": s, **v} for s, v in reference.items()]).to_csv(tmp_path / "h.csv", index=False)
    result = crosscheck(run, tmp_path / "h.csv", "csv", "trl")
    assert result.bad_steps == [] and len(result.table) == 8 and not result.unversioned


def test_run_without_versions_says_it_cannot_check_staleness(verl, tmp_path, capsys):
    """The same batch imported without max/min_global_steps: the staleness keys are listed as not checked (with
    what to do), never compared against nothing nor called agreement."""
    _, reference = verl
    rows = [json.loads(x) for x in verl_rows(tmp_path / "v.jsonl", samples()).read_text().splitlines()]
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps({k: v for k, v in r.items() if not k.endswith("_global_steps")}) + "\n"
                             for r in rows))
    run = import_run("jsonl", plain, tmp_path / "run", ImportOptions(quiet=True))[0]
    result = crosscheck(run, verl_log(tmp_path, reference), "tensorboard", "verl")
    assert sorted(result.unversioned) == sorted(reference[5]) and result.table.empty and result.failed
    assert "Not checked: the log has staleness keys" in result.summary()
    code = main(["crosscheck", str(run.path), "--tensorboard", str(tmp_path / "tb"), "--keys", "verl"])
    out = capsys.readouterr().out
    assert code == 1 and out.startswith("Nothing compared: every logged verl key") and "re-import" in out
