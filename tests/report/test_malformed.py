"""Malformed runs, each made from a copy of a clean run by one real Parquet edit: `rcdiag report` (a real
subprocess) prints `Error:` naming file/row/field and exits 1 — never a traceback. Before the door check in
rcdiag/store/validate.py each of these was a numpy/Arrow traceback."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from rcdiag.errors import ConfigError
from rcdiag.report.gate import parse

ROOT = Path(__file__).resolve().parents[2]


def _edit(run: Path, table: str, edit) -> None:
    file = run / table / "part-00000.parquet"
    pq.write_table(edit(pq.read_table(file)), file)


def _set(table: pa.Table, name: str, values) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, values)


def _extra_shard(run: Path) -> None:
    shutil.copy(run / "sequences" / "part-00000.parquet", run / "sequences" / "part-00099.parquet")


DAMAGE = {
    "mask_as_strings": (lambda r: _edit(r, "tokens", lambda t: _set(t, "mask", pc.cast(t["mask"], pa.string()))),
                        "tokens/part-00000.parquet field 'mask': wrong dtype string: must be a boolean"),
    "reward_as_strings": (lambda r: _edit(r, "sequences", lambda t: _set(t, "reward",
                                                                          pc.cast(t["reward"], pa.string()))),
                          "sequences/part-00000.parquet field 'reward': wrong dtype string: must be a numeric"),
    "duplicated_sequence_row": (lambda r: _edit(r, "sequences", lambda t: pa.concat_tables([t, t.slice(0, 1)])),
                                "sequences/part-00000.parquet row 1 field 'seq_id': seq_id 0 appears twice"),
    "extra_sequences_shard": (_extra_shard, "sequences/part-00099.parquet has no matching tokens/part-00099"),
    "tokens_without_sequence": (lambda r: _edit(r, "sequences", lambda t: t.slice(1)),
                                "tokens/part-00000.parquet row 1 field 'seq_id': seq_id 0 has token rows but no "
                                "row in sequences/"),
    "null_seq_id": (lambda r: _edit(r, "tokens", lambda t: _set(t, "seq_id", pa.array(
        [None, *t["seq_id"].to_pylist()[1:]], pa.int64()))), "tokens/part-00000.parquet row 1 field 'seq_id': is null"),
}


def _report(run: Path, out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "rcdiag", "report", str(run), "--out", str(out), "--quiet"],
                          capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_report_on_a_malformed_run_is_a_clear_error(clean_run, tmp_path, case):
    run = tmp_path / case
    shutil.copytree(clean_run.path, run)
    damage, message = DAMAGE[case]
    damage(run)
    result = _report(run, tmp_path / "rep")
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stderr.startswith("Error: ") and message in result.stderr, result.stderr
    assert not (tmp_path / "rep").exists()


def test_sequences_without_optional_columns_still_report(clean_run, tmp_path):
    """Optional columns are optional: only seq_id and response_len kept (was "unreadable … corrupt")."""
    run = tmp_path / "minimal"
    shutil.copytree(clean_run.path, run)
    for file in (run / "sequences").glob("part-*.parquet"):
        pq.write_table(pq.read_table(file, columns=["seq_id", "response_len"]), file)
    result = _report(run, tmp_path / "rep")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "rep" / "report.html").is_file()


@pytest.mark.parametrize("threshold", ["nan", "NaN", "inf", "-inf"])
def test_fail_if_refuses_a_threshold_that_can_never_fire(threshold):
    with pytest.raises(ConfigError, match="the threshold must be a finite number"):
        parse(f"kl>{threshold}")


def test_refused_metrics_print_no_interval_and_no_clean_verdict(tmp_path):
    """NaN on both sides at the same valid positions: the share is of valid tokens (was up to "200 %"), the
    summary says the metrics refused the data, and no bootstrap interval is printed for the refused numbers."""
    import rcdiag
    from rcdiag.report.make import make_report
    from rcdiag.report.options import ReportOptions
    from tests.fixtures.runs import defect_frames

    tokens, sequences = defect_frames("clean", seed=5)
    bad = tokens.index[tokens["mask"]][:40]
    tokens.loc[bad, ["rollout_logprob", "train_logprob"]] = float("nan")
    run = rcdiag.write_run(tmp_path / "both", tokens, sequences)
    result = make_report([run], tmp_path / "rep", ReportOptions(replicates=50))
    report = result.reports[0]
    finding = next(f for f in report.checks if f.name == "placeholders")
    assert finding.evidence["share"] == pytest.approx(40 / int(tokens["mask"].sum()))
    assert report.metrics_error and report.intervals == {}
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "but the metrics refused the data" in md and "| kl | — |  |" in md


def test_comparison_with_a_run_named_dotdot_keeps_the_comparison(synthetic_runs, tmp_path):
    """A run given as `RUN/tokens/..` is named '..': its report went to runs/../, over the comparison's files."""
    from rcdiag.report.make import make_report
    from rcdiag.report.options import ReportOptions

    clean = synthetic_runs["clean"].path
    result = make_report([synthetic_runs["bf16"], clean / "tokens" / ".."], tmp_path / "cmp",
                         ReportOptions(replicates=50))
    assert (result.out / "runs" / "run" / "report.html").is_file()
    assert json.loads((result.out / "metrics.json").read_text())["comparison"] == ["bf16", "run"]


def test_unfinished_rescore_says_rerun_the_rescore(tmp_path):
    """Null training log-probs on valid tokens (a rescore stopped half-way): the fix names the rescore, not vLLM's
    SamplingParams (which is about the rollout side)."""
    import rcdiag
    from rcdiag.report.make import make_report
    from rcdiag.report.options import ReportOptions
    from tests.fixtures.runs import defect_frames

    tokens, sequences = defect_frames("clean", seed=7)
    tokens.loc[tokens.index[-300:], "train_logprob"] = None
    run = rcdiag.write_run(tmp_path / "half", tokens, sequences)
    report = make_report([run], tmp_path / "rep", ReportOptions(replicates=50)).reports[0]
    finding = next(f for f in report.checks if f.name == "placeholders")
    assert finding.severity == "error" and "re-run the rescore" in finding.fix
    assert "SamplingParams" not in finding.fix


def test_placeholders_the_metrics_accept_withhold_the_means(tmp_path, recwarn):
    """-1e30 on five valid rollout positions: finite, so the metrics took it and printed kl = -2.6e27 with a numpy
    cast warning. The placeholders error now withholds the means and their intervals (max |ℓ| still shows 1e30)."""
    import rcdiag
    from rcdiag.report.make import make_report
    from rcdiag.report.options import ReportOptions
    from tests.fixtures.runs import defect_frames

    tokens, sequences = defect_frames("clean", seed=9)
    tokens.loc[tokens.index[tokens["mask"]][:5], "rollout_logprob"] = -1e30
    run = rcdiag.write_run(tmp_path / "huge", tokens, sequences)
    report = make_report([run], tmp_path / "rep", ReportOptions(replicates=50)).reports[0]
    assert report.metrics == {} and report.intervals == {} and "abs_log_ratio_mean" not in report.tails
    assert report.tails["abs_log_ratio_max"] == pytest.approx(1e30, rel=1e-6)
    assert report.metrics_error.startswith("withheld: placeholder or impossible log-probs")
    assert not [w for w in recwarn if "invalid value encountered in cast" in str(w.message)]
