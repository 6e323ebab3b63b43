"""The command line as a user meets it: the real `python -m rcdiag` process of this checkout (the console script's
entry point, not typer's test runner), its exit code, stdout and stderr.

Guards issue #17: every usage mistake printed a 30–55-line traceback (typer 0.29 raises its vendored click's
exceptions, which `except click.ClickException` missed), `--engine-dtype bf16` was refused, help showed `<bool>`
metavars and "RescoreConfig's" instead of defaults.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import rcdiag
from rcdiag.score.config import GenerateConfig, RescoreConfig

ROOT = Path(__file__).resolve().parents[2]


def rcdiag_cli(*args: str, columns: int = 100) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": str(columns), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "rcdiag", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


MISTAKES = [
    (["report", "--treshold", "2", "RUN"], "No such option: --treshold. Did you mean --threshold"),
    (["scor"], "No such command 'scor'. Did you mean 'score'?"),
    (["report"], "Missing argument 'RUNS...'. For example: rcdiag report runs/sample"),
    (["report", "--threshold", "two", "RUN"], "Invalid value for '--threshold': 'two' is not a number"),
    (["import", "jsonl", "file.jsonl"], "Missing option '--out' / '-o'. For example: rcdiag import"),
    (["probe", "RUN", "--samples", "3"], "No such option: --samples. Did you mean --sample?"),
    (["score", "--n", "x"], "Invalid value for '--n': 'x' is not a whole number"),
    (["score", "-p", "prompts.jsonl"], "--model, --out required (or --rescore-only RUN"),
]


@pytest.mark.parametrize("args, message", MISTAKES, ids=[" ".join(a) for a, _ in MISTAKES])
def test_usage_mistake_is_short_plain_and_exits_2(args: list[str], message: str) -> None:
    result = rcdiag_cli(*args)
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and len(lines) <= 15, result.stderr
    assert lines[0].startswith(f"Usage: rcdiag {args[0] if args[0] != 'scor' else '[OPTIONS]'}"), lines[0]
    assert f"Error: {message}" in result.stderr, result.stderr
    assert "Input should be" not in result.stderr  # typer 0.29's pydantic wording, replaced


def test_version() -> None:
    result = rcdiag_cli("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"rcdiag {rcdiag.__version__}"


def test_dtype_aliases_accepted_and_wrong_dtype_refused() -> None:
    """bf16/fp16/fp32 pass validation (the command then stops at the missing --model, a usage error, before any
    engine starts); a dtype that is no alias is refused naming the option and the aliases."""
    accepted = rcdiag_cli("score", "--engine-dtype", "bf16", "--train-dtype", "FP32", "--out", "x")
    assert accepted.returncode == 2 and "--model, --prompts required" in accepted.stderr, accepted.stderr
    refused = rcdiag_cli("score", "--engine-dtype", "bf17", "-o", "x")
    assert refused.returncode == 2 and "--engine-dtype 'bf17' is not one of" in refused.stderr  # a usage error
    assert "bf16, fp16, fp32" in refused.stderr and "Traceback" not in refused.stderr
    assert GenerateConfig(engine_dtype="fp16").engine_dtype == "float16"
    assert RescoreConfig(train_dtype="BF16").train_dtype == "bfloat16"


def test_help_shows_plain_metavars_and_real_defaults() -> None:
    score = rcdiag_cli("score", "--help", columns=200).stdout
    for text in ("[default: float32]", "[default: 4096]", "[default: 1024]", "[default: auto]", "auto (cuda when available, else cpu)",
                 "(bf16, fp16, fp32 accepted)", "--verbose", "Usage: rcdiag score [OPTIONS]"):
        assert text in score, text
    probe = rcdiag_cli("probe", "--help", columns=200).stdout
    report = rcdiag_cli("report", "--help", columns=200).stdout
    root = rcdiag_cli("--help", columns=200).stdout
    for text in (score, probe, report, root):
        assert "<bool>" not in text and "<list" not in text and "<int>" not in text and "RescoreConfig's" not in text
    assert "Usage: rcdiag report [OPTIONS] RUNS..." in report and "RUNS..." in report
    factors = probe.split("│ --factors")[1].split("│ --name")[0]  # the option table, not the examples
    assert "[default: train_dtype" in factors and "batch_invariance" in factors and "…" not in factors


def test_convention_is_case_insensitive_on_the_cli(tmp_path: Path) -> None:
    """One rule with the API (get_convention folds case): `--convention VERL` reports under verl."""
    from tests.fixtures.runs import build_run

    build_run(tmp_path / "run")
    result = rcdiag_cli("report", str(tmp_path / "run"), "--convention", "VERL", "--out", str(tmp_path / "rep"),
                        "--quiet")
    assert result.returncode == 0, result.stderr
    assert '"convention": "verl"' in (tmp_path / "rep" / "metrics.json").read_text()


def test_progress_in_a_log_is_one_line_per_bar() -> None:
    """stderr not a terminal (CI, a log file): a bar writes its final state once, no redraws — the redraws left
    `trend: 0%|…` fragments glued to the summary lines (user review 3, §14)."""
    code = ("import time\nfrom rcdiag.progress import progress\n"
            "bar = progress(total=500, desc='stage')\n"
            "for _ in range(500): bar.update(1); time.sleep(0.001)\n"  # 0.5 s: a text bar redraws ~5 times

            "bar.close()\nprint('summary')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("stage:") == 1 and "500/500" in done.stderr and " 0%|" not in done.stderr
    assert done.stdout == "summary\n"
