"""The resume and overwrite rules in one place (rcdiag.store.outdir.write_mode), as score's RunWriter and import
use them: every outcome on real run directories, and each refusal before anything changed."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from rcdiag.errors import ConfigError, RunDirError
from rcdiag.store.outdir import write_mode
from rcdiag.store.writer import RunWriter, write_run

SPEC = {"model": "m", "temperature": 0.7}


def _tree(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


def _complete(path: Path) -> Path:
    write_run(path, pd.DataFrame({"seq_id": [0, 1], "pos": [0, 0], "rollout_logprob": [-0.5, -1.5]}))
    return path


def _interrupted(path: Path, spec: dict) -> Path:
    RunWriter(path, spec)  # a score that stopped before its first shard: pending.json holds the spec
    return path


@pytest.mark.parametrize("spec", [SPEC, None])
def test_absent_or_empty_is_new(tmp_path, spec):
    assert write_mode(tmp_path / "absent", overwrite=False, spec=spec) == "new"
    (tmp_path / "empty").mkdir()
    assert write_mode(tmp_path / "empty", overwrite=False, spec=spec) == "new"
    assert write_mode(tmp_path / "empty", overwrite=True, spec=spec) == "new"


def test_same_spec_resumes_other_spec_is_refused_unless_overwrite(tmp_path):
    run = _interrupted(tmp_path / "run", SPEC)
    before = _tree(run)
    assert write_mode(run, overwrite=False, spec=dict(SPEC)) == "resume"
    with pytest.raises(RunDirError, match=r"different settings \(temperature: 0.7 → 1.0\); pass --overwrite"):
        write_mode(run, overwrite=False, spec={**SPEC, "temperature": 1.0})
    assert write_mode(run, overwrite=True, spec={**SPEC, "temperature": 1.0}) == "replace"
    assert _tree(run) == before  # deciding changes nothing: the writer acts on the answer


def test_a_writer_that_cannot_resume_needs_overwrite(tmp_path):
    """import (spec=None) never appends to an existing run, even its own: --overwrite replaces it."""
    run = _complete(tmp_path / "run")
    with pytest.raises(RunDirError, match="already exists and holds a run; pass --overwrite"):
        write_mode(run, overwrite=False)
    assert write_mode(run, overwrite=True) == "replace"


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_directory_that_is_not_rcdiags_is_refused_whatever_overwrite_says(tmp_path, overwrite):
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "app.js").write_text("mine\n")
    (project / "manifest.json").write_text('{"name": "web"}')
    before = _tree(project)
    with pytest.raises(RunDirError, match="nothing was changed") as writer:
        write_mode(project, overwrite=overwrite, spec=SPEC)
    assert "--overwrite" not in str(writer.value)  # overwriting would not help: not suggested
    with pytest.raises(RunDirError, match="nothing was removed" if overwrite else "is not empty"):
        write_mode(project, overwrite=overwrite)
    assert _tree(project) == before


def test_a_run_holding_the_users_files_is_refused_and_named(tmp_path):
    run = _complete(tmp_path / "run")
    (run / "notes.md").write_text("what I saw\n")
    for spec in (SPEC, None):
        with pytest.raises(RunDirError, match="notes.md"):
            write_mode(run, overwrite=True, spec=spec)


def test_a_file_and_a_path_inside_a_runs_data_are_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunDirError, match="exists and is not a directory; choose another --out"):
        write_mode(tmp_path / "file", overwrite=True, spec=SPEC)
    run = _complete(tmp_path / "run")
    with pytest.raises(ConfigError, match="never writes into a run's data"):
        write_mode(run / "tokens" / "x", overwrite=True)


def test_run_writer_acts_on_the_answer(tmp_path):
    """RunWriter keeps the complete shards of a resume and clears them on a replace."""
    run = _complete(tmp_path / "run")
    assert RunWriter(run, {}).mode == "resume" and RunWriter(run, {}).complete_shards() == [0]
    replaced = RunWriter(run, SPEC, overwrite=True)
    assert replaced.mode == "replace" and replaced.complete_shards() == []


def test_a_rewriting_stage_marks_its_shards_and_a_rerun_reads_the_mark(tmp_path):
    """Stage 2's resume rule (rescoring, the replay): a shard rewritten with settings S carries S, and only S."""
    import pyarrow.parquet as pq

    from rcdiag.store.writer import shard_marker, write_marked

    file = _complete(tmp_path / "run") / "tokens" / "part-00000.parquet"
    assert shard_marker(file, b"rcdiag.rescored") is None
    table = pq.read_table(file)
    write_marked(table, file, b"rcdiag.rescored", {"model": "/m", "temperature": 0.7})
    assert shard_marker(file, b"rcdiag.rescored") == {"model": "/m", "temperature": 0.7}
    assert shard_marker(file, b"rcdiag.replayed") is None
    assert pq.read_table(file).equals(table.replace_schema_metadata(pq.read_table(file).schema.metadata))
