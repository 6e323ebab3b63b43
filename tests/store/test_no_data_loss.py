"""rcdiag never deletes or overwrites what it did not write (issue #34 item 2), checked through the real CLI.

Guards: `import --overwrite` / `score --overwrite` took any directory holding a file named manifest.json or
pending.json for a run and deleted its contents (a web project's src/ went); a real run with the user's notes in
it lost them too; `export RUN --to csv RUN/manifest.json` replaced the run's manifest; `report --out
RUN/tokens/part-00001.parquet` made a directory there and the run no longer opened; export replaced any existing
file silently.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

import rcdiag
from rcdiag.errors import RunDirError
from rcdiag.store.writer import RunWriter, write_run
from tests.fixtures.cli import assert_user_error, run_cli


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _jsonl(tmp_path: Path) -> Path:
    file = tmp_path / "rollouts.jsonl"
    file.write_text('{"response_ids": [1, 2, 3], "rollout_logprobs": [-0.1, -0.2, -0.3]}\n'
                    '{"response_ids": [4, 5], "rollout_logprobs": [-0.5, -0.6]}\n')
    return file


def _run(path: Path) -> Path:
    write_run(path, pd.DataFrame({"seq_id": [0, 0, 1], "pos": [0, 1, 0], "rollout_logprob": [-0.1, -0.2, -0.3],
                                  "train_logprob": [-0.1, -0.25, -0.3]}))
    return path


def _web_project(root: Path, marker: str) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.js").write_text("console.log('mine')\n")
    (root / marker).write_text(json.dumps({"name": "web", "spec": {}, "started": "yesterday"}))
    return root


@pytest.mark.parametrize("marker", ["manifest.json", "pending.json"])
def test_import_overwrite_refuses_a_directory_that_only_holds_a_manifest_named_file(tmp_path, marker):
    project = _web_project(tmp_path / "proj", marker)
    before = _tree(project)
    result = run_cli(["import", "jsonl", str(_jsonl(tmp_path)), "--out", str(project), "--overwrite", "-q"])
    assert_user_error(result, str(project), "nothing was removed")
    assert _tree(project) == before


def test_import_overwrite_refuses_a_run_holding_the_users_files(tmp_path):
    """A real rcdiag run, plus a notes file and a folder of the user's: --overwrite names them and keeps all."""
    run = _run(tmp_path / "run")
    (run / "notes.md").write_text("what I saw\n")
    (run / "plots").mkdir()
    (run / "plots" / "mine.png").write_bytes(b"\x89PNG")
    (run / "tokens" / "my-extra.parquet").write_bytes(b"PAR1")
    before = _tree(run)
    result = run_cli(["import", "jsonl", str(_jsonl(tmp_path)), "--out", str(run), "--overwrite", "-q"])
    assert_user_error(result, "notes.md", "plots/", "tokens/my-extra.parquet")
    assert _tree(run) == before


def test_import_overwrite_replaces_rcdiags_own_run(tmp_path):
    """Control: a run holding only rcdiag's files — shards, manifest, its report and probes — is replaced."""
    run = _run(tmp_path / "run")
    assert run_cli(["report", str(run), "-q"]).rc == 0
    (run / "probes").mkdir()
    (run / "probes" / "quick.json").write_text("{}")
    result = run_cli(["import", "jsonl", str(_jsonl(tmp_path)), "--out", str(run), "--overwrite", "-q"])
    assert result.rc == 0, result.text
    assert rcdiag.open_run(run).num_tokens == 5
    assert not (run / "report").exists() and not (run / "probes").exists()


@pytest.mark.parametrize("marker", ["manifest.json", "pending.json"])
def test_score_overwrite_refuses_a_foreign_directory(tmp_path, marker):
    """score's writer (RunWriter, also write_run) — `--overwrite` or not — never clears a directory that is not
    one of rcdiag's runs; score's refusal no longer suggests --overwrite there."""
    project = _web_project(tmp_path / "proj", marker)
    before = _tree(project)
    for overwrite in (True, False):
        with pytest.raises(RunDirError, match="nothing was changed") as info:
            RunWriter(project, {"model": "m"}, overwrite=overwrite)
        assert "--overwrite" not in str(info.value)
    with pytest.raises(RunDirError, match="nothing was changed"):
        write_run(project, pd.DataFrame({"seq_id": [0], "pos": [0], "rollout_logprob": [-1.0]}), overwrite=True)
    assert _tree(project) == before


def test_score_overwrite_of_its_own_run_replaces_it(tmp_path):
    run = _run(tmp_path / "run")
    writer = RunWriter(run, {"model": "other"}, overwrite=True)
    assert not list((run / "tokens").iterdir()) and not (run / "manifest.json").exists()
    assert writer.complete_shards() == []


def test_export_never_replaces_a_runs_manifest(tmp_path):
    run = _run(tmp_path / "run")
    before = _tree(run)
    result = run_cli(["export", str(run), "--to", "csv", str(run / "manifest.json"), "-q"])
    assert_user_error(result, "manifest.json", "never writes into a run's data")
    assert _tree(run) == before and rcdiag.open_run(run).num_tokens == 3


@pytest.mark.parametrize("where", ["tokens/part-00001.parquet", "sequences/x", "tokens", "manifest.json"])
def test_report_out_inside_a_runs_data_is_refused(tmp_path, where):
    run = _run(tmp_path / "run")
    before = _tree(run)
    result = run_cli(["report", str(run), "--out", str(run / where), "-q"])
    assert_user_error(result, "never writes into a run's data", "/report")
    assert _tree(run) == before and sorted(p.name for p in (run / "tokens").iterdir()) == ["part-00000.parquet"]
    rcdiag.open_run(run)  # still opens


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_export_replaces_only_its_own_table(tmp_path, fmt):
    """A file of the user's at DEST is refused and kept; rcdiag's own earlier export there is replaced."""
    run = _run(tmp_path / "run")
    mine = tmp_path / f"notes.{fmt}"
    mine.write_text("step,my_metric\n0,1\n" if fmt == "csv" else '{"step": 0, "my_metric": 1}\n')
    result = run_cli(["export", str(run), "--to", fmt, str(mine), "-q"])
    assert_user_error(result, str(mine), "did not write")
    assert mine.read_text().count("my_metric") == 1
    ours = tmp_path / f"ours.{fmt}"
    for _ in range(2):  # written, then replaced by the same export
        assert run_cli(["export", str(run), "--to", fmt, str(ours), "-q"]).rc == 0
    assert "rcdiag/kl" in ours.read_text()


def test_crosscheck_out_replaces_only_its_own_table(tmp_path):
    run = _run(tmp_path / "run")
    history = tmp_path / "history.csv"
    history.write_text("step,rcdiag/kl\n0,0.5\n")
    mine = tmp_path / "mine.csv"
    mine.write_text("step,key,note\n")
    result = run_cli(["crosscheck", str(run), "--csv", str(history), "--keys", "canonical", "--out", str(mine)])
    assert_user_error(result, str(mine), "did not write")
    assert mine.read_text() == "step,key,note\n"


def test_score_overwrite_through_the_cli_keeps_a_web_project(tmp_path):
    """`rcdiag score --overwrite` into a directory with a stray manifest.json: refused before any engine starts."""
    project = _web_project(tmp_path / "proj", "manifest.json")
    before = _tree(project)
    root = Path(__file__).resolve().parents[2]
    result = run_cli(["score", "--model", str(root / "sample_data/tiny-model"), "--prompts",
                      str(root / "sample_data/prompts.jsonl"), "--out", str(project), "--overwrite"])
    assert_user_error(result, str(project), "nothing was changed")
    assert _tree(project) == before
