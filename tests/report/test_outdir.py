"""Output directories are never someone else's: a report replaces only a previous report holding nothing else,
`import --overwrite` replaces only a run, and two writers on one --out never interleave (real processes)."""
from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import numpy as np
import pytest

from rcdiag.cli import main
from rcdiag.errors import ConfigError, RunDirError
from rcdiag.importers.common import Imported, Record, write_imported
from rcdiag.report.outdir import MARKER, write_files

REPORT = {"report.md": b"md", "report.html": b"<html>", "metrics.json": b"{}", "runs/a/report.md": b"a"}
PLOTS = {f"runs/r{i}/plot.png": bytes(64) for i in range(2)}
WORKERS, ROUNDS = 6, 200
"""Many quick replacements: unlocked writers interleave within a few rounds (the defect reproduces every time)."""


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _mine(folder: Path) -> dict[str, bytes]:
    folder.mkdir()
    (folder / "metrics.json").write_text('{"mine": true}')  # any metrics.json used to pass for an old report
    (folder / "notes.txt").write_text("precious")
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / "step-1.pt").write_bytes(b"weights")
    return _tree(folder)


def test_report_refuses_a_folder_that_merely_holds_metrics_json(clean_run, tmp_path, capsys):
    before = _mine(tmp_path / "work")
    code = main(["report", str(clean_run.path), "--out", str(tmp_path / "work"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("Error: ") and f"no {MARKER} marker" in err, err
    assert _tree(tmp_path / "work") == before


def test_report_refuses_its_own_folder_once_something_else_is_added(tmp_path):
    out = tmp_path / "rep"
    write_files(out, REPORT)
    assert json.loads((out / MARKER).read_text())["files"] == sorted(REPORT)
    write_files(out, REPORT)  # a previous report alone is replaced
    (out / "runs" / "a" / "notes.txt").write_text("mine")
    (out / "extra").mkdir()
    with pytest.raises(ConfigError, match=r"did not write \(extra/, runs/a/notes.txt\)"):
        write_files(out, {"report.md": b"new"})
    assert (out / "runs" / "a" / "notes.txt").read_text() == "mine"
    assert (out / "report.md").read_bytes() == b"md"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]


@pytest.mark.parametrize("out", [".", ".."])
def test_current_directory_is_refused_as_out(tmp_path, monkeypatch, out):
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    with pytest.raises(RunDirError, match="current directory or one above it"):
        write_files(out, REPORT)
    with pytest.raises(RunDirError, match="current directory or one above it"):
        write_imported(_imported(tmp_path), out)


def _imported(tmp_path: Path) -> Imported:
    return Imported("jsonl", tmp_path / "src", [Record(response_ids=np.array([1, 2]), rollout_logprobs=np.zeros(2))])


def test_import_overwrite_replaces_only_a_run(tmp_path):
    before = _mine(tmp_path / "work")
    with pytest.raises(RunDirError, match="is not an rcdiag run .* replaces only its own runs, so nothing was removed"):
        write_imported(_imported(tmp_path), tmp_path / "work", overwrite=True)
    assert _tree(tmp_path / "work") == before
    run = write_imported(_imported(tmp_path), tmp_path / "run")
    assert write_imported(_imported(tmp_path), run.path, overwrite=True).num_tokens == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "work"]


# ------------------------------------------------------------------------------------------- concurrent writers
def _writer(kind: str, out: str, start: multiprocessing.synchronize.Barrier, results: multiprocessing.Queue) -> None:
    start.wait(timeout=60)
    outcomes = []
    for round_ in range(ROUNDS):
        try:
            if kind == "report":
                write_files(out, {**REPORT, **PLOTS, "report.md": f"{os.getpid()} {round_}".encode()})
            else:
                write_imported(_imported(Path(out).parent), out, overwrite=True)
            outcomes.append("ok")
        except RunDirError as exc:
            outcomes.append("busy" if "another rcdiag process is writing there" in str(exc) else f"bad: {exc}")
        except BaseException as exc:  # noqa: BLE001 - any other failure is the defect this test looks for
            outcomes.append(f"bad: {type(exc).__name__}: {exc}")
    results.put(outcomes)


@pytest.mark.parametrize("kind", ["report", "import"])
def test_concurrent_writers_never_interleave(tmp_path, kind):
    """Six processes write the same --out 200 times each, released together: every attempt either succeeds or
    gets the clear "another process is writing" error, and nothing but the output is left in the parent."""
    out = tmp_path / "out"
    context = multiprocessing.get_context("fork")  # spawn would re-import rcdiag per process (~10 s each here)
    start, results = context.Barrier(WORKERS), context.Queue()
    workers = [context.Process(target=_writer, args=(kind, str(out), start, results)) for _ in range(WORKERS)]
    for worker in workers:
        worker.start()
    outcomes = [line for _ in workers for line in results.get(timeout=120)]
    for worker in workers:
        worker.join(timeout=30)
        assert worker.exitcode == 0
    assert not [line for line in outcomes if line.startswith("bad")], outcomes
    assert "ok" in outcomes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    if kind == "report":
        assert set(_tree(out)) == set(REPORT) | set(PLOTS) | {MARKER}
