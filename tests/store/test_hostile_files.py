"""Files rcdiag reads but did not write, planted or damaged, are refused at once with `Error:` naming them (issue #34
item 6): a FIFO blocked the reader forever (an import's JSON-lines file or pickled dump, a run's probe summary, a
report directory's marker), /dev/zero never ended, a 595 MB tokenizer.json was loaded whole (27 s, 1.6 GB) to
decode ten tokens, a manifest holding a 5,000-digit integer was a traceback, and a writer lock planted as a
symlink made rcdiag create the file it pointed at."""
from __future__ import annotations

import json
import os

import pandas as pd
import pytest

from rcdiag.errors import ConfigError, InputError, RunDirError
from rcdiag.store.manifest import load_manifest
from rcdiag.store.safefile import json_lines, read_json
from rcdiag.store.writer import write_run
from rcdiag.tokenizers import MAX_TOKENIZER_BYTES, fast_tokenizer, load_tokenizer, tokenizer_problem
from tests.fixtures.cli import ROOT, assert_user_error, run_cli

TOKENIZER = ROOT / "sample_data" / "tiny-model"
ROW = '{"response_ids": [5, 6], "rollout_logprobs": [-0.1, -0.2], "prompt": "p"}\n'


@pytest.fixture
def run(tmp_path):
    return write_run(tmp_path / "run", pd.DataFrame({"seq_id": [0, 0, 1], "pos": [0, 1, 0],
                                                     "rollout_logprob": [-0.1, -0.2, -0.3],
                                                     "train_logprob": [-0.1, -0.25, -0.3]})).path


def test_jsonl_fifo_without_writer_reads_empty_and_dev_zero_is_refused(tmp_path):
    fifo = tmp_path / "rows.jsonl"
    os.mkfifo(fifo)
    result = run_cli(["import", "jsonl", str(fifo), "--out", str(tmp_path / "a"), "-q"], timeout=60)
    assert_user_error(result, str(fifo), "no samples")
    (tmp_path / "zero.jsonl").symlink_to("/dev/zero")
    result = run_cli(["import", "jsonl", str(tmp_path / "zero.jsonl"), "--out", str(tmp_path / "b"), "-q"],
                     timeout=60)
    assert_user_error(result, "zero.jsonl", "not a regular file")


def test_jsonl_pipe_is_read(tmp_path):
    """A pipe (`rcdiag import jsonl <(zcat x.jsonl.gz)`) stays readable: only devices and directories are refused."""
    read, write = os.pipe()
    os.write(write, ROW.encode())
    os.close(write)
    assert [row["prompt"] for _, row in json_lines(f"/dev/fd/{read}")] == ["p"]
    os.close(read)


def test_pickled_dump_fifo_is_refused(tmp_path):
    (tmp_path / "dump").mkdir()
    os.mkfifo(tmp_path / "dump" / "0.pt")
    result = run_cli(["import", "slime", str(tmp_path / "dump"), "--out", str(tmp_path / "r"), "--allow-pickle",
                      "-q"], timeout=60)
    assert_user_error(result, "0.pt", "FIFO")


@pytest.mark.parametrize("kind", ["huge", "fifo", "dev_zero", "directory"])
def test_odd_tokenizer_json_is_refused_before_loading(tmp_path, kind):
    directory = tmp_path / "tok"
    directory.mkdir()
    (directory / "tokenizer_config.json").write_bytes((TOKENIZER / "tokenizer_config.json").read_bytes())
    file = directory / "tokenizer.json"
    if kind == "huge":
        file.touch()
        os.truncate(file, MAX_TOKENIZER_BYTES + 1)  # sparse: no disk used
    elif kind == "fifo":
        os.mkfifo(file)
    elif kind == "dev_zero":
        file.symlink_to("/dev/zero")
    else:
        file.mkdir()
    problem = tokenizer_problem(directory)
    assert problem is not None and str(file) in problem
    assert ("more than the 128 MiB" if kind == "huge" else "not a regular file") in problem, problem
    with pytest.raises(ConfigError, match="tokenizer.json"):
        load_tokenizer(directory)
    assert fast_tokenizer({"tokenizer": {"path": str(directory)}}) is None  # a courtesy: ids shown instead
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text(ROW)
    result = run_cli(["import", "jsonl", str(jsonl), "--out", str(tmp_path / "r"), "--tokenizer", str(directory),
                      "-q"], timeout=120)
    assert_user_error(result, "tokenizer.json")
    assert result.max_rss_mb is None or result.max_rss_mb < 600  # it was 1.6 GB for a 595 MB file


def test_real_tokenizer_still_loads():
    assert tokenizer_problem(TOKENIZER) is None
    assert fast_tokenizer({"tokenizer": {"path": str(TOKENIZER)}}) is not None


@pytest.mark.parametrize(("text", "words"), [
    ('{"schema_version": 1, "x": ' + "9" * 5000 + "}", "more than 4300 digits"),
    ('{"schema_version": 1, "x": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested deeper"),
    ('{"schema_version": 1, "source": {"path": "\\ud800"}}', "lone surrogate"),
])
def test_manifest_json_traps_name_the_manifest(run, text, words):
    (run / "manifest.json").write_text(text)
    with pytest.raises(RunDirError, match=words):
        load_manifest(run)
    result = run_cli(["report", str(run), "--out", str(run.parent / "rep"), "-q"], timeout=120)
    assert_user_error(result, "manifest.json", words)


def test_fifo_probe_summary_does_not_block_the_report(run):
    (run / "probes").mkdir()
    os.mkfifo(run / "probes" / "p.json")
    result = run_cli(["report", str(run), "--out", str(run.parent / "rep"), "-q"], timeout=120)
    assert_user_error(result, "p.json", "FIFO")


def test_fifo_report_marker_does_not_block(run, tmp_path):
    out = tmp_path / "rep"
    out.mkdir()
    os.mkfifo(out / ".rcdiag-report")
    result = run_cli(["report", str(run), "--out", str(out), "-q"], timeout=120)
    assert_user_error(result, "not an rcdiag report directory")


def test_read_json_bounds_the_size(tmp_path):
    file = tmp_path / "big.json"
    file.write_text(json.dumps({"a": "x" * 2000}))
    with pytest.raises(InputError, match="more than"):
        read_json(file, "summary", 1 << 10)


def test_planted_writer_lock_symlink_is_never_followed(tmp_path):
    victim = tmp_path / "victim"
    (tmp_path / ".run.lock").symlink_to(victim)
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text(ROW)
    result = run_cli(["import", "jsonl", str(jsonl), "--out", str(tmp_path / "run"), "-q"])
    assert_user_error(result, ".run.lock", "symbolic link")
    assert not victim.exists() and not (tmp_path / "run").exists()


def test_score_on_a_list_manifest_is_an_error(run):
    (run / "manifest.json").write_text("[1, 2]\n")
    result = run_cli(["score", "--rescore-only", str(run), "-q"], timeout=300)
    assert_user_error(result, "manifest.json", "JSON list, not an object")


def test_report_on_a_read_only_run_fails_before_the_work(run):
    """It failed with a traceback after the passes; now `Error:` before any is run. Read-only for real: a
    read-only bind mount (root ignores file modes), or the modes for anyone else."""
    import shutil
    import subprocess
    import sys

    from tests.fixtures.cli import _CODE

    args = ["report", str(run), "-q"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RCDIAG_CACHE_DIR": "off"}
    if os.geteuid() != 0:
        for path in [run, *run.rglob("*")]:
            path.chmod(path.stat().st_mode & ~0o222)
        try:
            proc = subprocess.run([sys.executable, "-c", _CODE, *args], capture_output=True, text=True, env=env)
        finally:
            for path in [run, *run.rglob("*")]:
                path.chmod(path.stat().st_mode | 0o200)
    else:
        if shutil.which("unshare") is None or subprocess.run(["unshare", "--mount", "true"]).returncode:
            pytest.skip("needs a mount namespace for a read-only bind mount")
        script = f'mount --bind "{run}" "{run}" && mount -o remount,bind,ro "{run}" "{run}" && exec "$@"'
        proc = subprocess.run(["unshare", "--mount", "sh", "-c", script, "sh", sys.executable, "-c", _CODE, *args],
                              capture_output=True, text=True, env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "Error:" in proc.stderr and "not writable" in proc.stderr and "nothing was computed" in proc.stderr
    assert not (run / "report").exists()
