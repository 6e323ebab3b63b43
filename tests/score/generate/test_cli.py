"""`rcdiag score`: user-facing text and refusals (before any work), and kill-and-resume with a real subprocess."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rcdiag.cli import main
from rcdiag.score.generate import GenerateConfig, generate_run
from rcdiag.store.run import open_run
from tests.fixtures.engine import ENGINE_KWARGS

REPO = Path(__file__).resolve().parents[2]


def run_cli(args: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    code = main(["score", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_help_has_examples(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run_cli(["--help"], capsys)
    assert code == 0
    for text in ("Examples:", "--generate-only", "--rescore-only", "--allow-truncated-sampling", "--train-dtype",
                 "--enable-prefix-caching", "[default: 256]"):
        assert text in out, text


@pytest.mark.parametrize("extra, message", [
    (["--top-p", "0.9"], "refusing to sample with top_p=0.9, top_k=None: top-p < 1 or top-k truncate"),
    (["--top-k", "20"], "refusing to sample with top_p=1.0, top_k=20"),
    (["--temperature", "0"], "--temperature must be a finite number > 0, got 0.0: greedy"),
    (["--n", "0"], "--n must be ≥ 1, got 0"),
    (["--engine-dtype", "int8"], "--engine-dtype 'int8' is not one of auto, bfloat16, float16, float32"),
    (["--train-dtype", "int8"], "--train-dtype 'int8' is not one of"),
])
def test_refusals_before_any_work(tmp_path: Path, sample_model: Path, capsys: pytest.CaptureFixture,
                                  extra: list[str], message: str) -> None:
    """Bad settings are usage errors: exit 2 with the usage line and `Error: …`, before the engine starts or --out
    is created."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "x"}\n')
    code, _, err = run_cli(["-m", sample_model, "-p", prompts, "-o", tmp_path / "out", *extra], capsys)
    assert code == 2 and err.startswith("Usage: rcdiag score") and "Error: " in err and message in err, err
    assert not (tmp_path / "out").exists()
    if "truncate" in message:
        assert "log S" in err and "--allow-truncated-sampling" in err


def test_bad_prompts_and_missing_options(tmp_path: Path, sample_model: Path, capsys: pytest.CaptureFixture) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "x"}\n{"prompt": "y",}\n')
    code, _, err = run_cli(["-m", sample_model, "-p", prompts, "-o", tmp_path / "out"], capsys)
    assert code == 1 and f"Error: {prompts} row 2: not valid JSON" in err and not (tmp_path / "out").exists()
    code, _, err = run_cli(["-p", prompts], capsys)
    assert code == 2 and "Error: --model, --out required (or --rescore-only RUN" in err  # a usage mistake
    code, _, err = run_cli(["-m", tmp_path, "-p", prompts, "-o", tmp_path / "o"], capsys)
    assert code == 1 and "not a local model directory with a config.json" in err


# --------------------------------------------------------------------------------------------------- resume
RESUME = {"n": 2, "max_tokens": 40, "shard_prompts": 2, "limit": 16}


def score_command(model: Path, prompts: Path, out: Path) -> list[str]:
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in {**RESUME, **ENGINE_KWARGS}.items()
             if k != "enable_prefix_caching"]
    return [sys.executable, "-m", "rcdiag", "score", "--generate-only", "-q", "-m", str(model), "-p", str(prompts),
            "-o", str(out), *flags]


def wait_for(path: Path, process: subprocess.Popen, timeout: float = 240) -> None:
    start = time.monotonic()
    while not path.exists():
        if process.poll() is not None:
            raise AssertionError(f"score exited with {process.returncode} before {path} appeared: "
                                 f"{process.stderr.read()[-3000:]}")
        if time.monotonic() - start > timeout:
            process.kill()
            raise AssertionError(f"{path} did not appear within {timeout} s")
        time.sleep(0.01)


@pytest.mark.vllm
@pytest.mark.slow
def test_sigkill_then_resume_gives_identical_rows(tmp_path: Path, sample_model: Path, vllm_engine: Any) -> None:
    """SIGKILL after the first shard is committed; the same command then skips the complete shards (their files
    untouched) and ends with exactly the rows of an uninterrupted run (generated here with the shared engine)."""
    from rcdiag.score.sample import SAMPLE_PROMPTS

    reference = tmp_path / "reference"
    generate_run(sample_model, SAMPLE_PROMPTS, reference, GenerateConfig(**RESUME, **ENGINE_KWARGS),
                 llm=vllm_engine, silent=True)
    out = tmp_path / "killed"
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"}
    process = subprocess.Popen(score_command(sample_model, SAMPLE_PROMPTS, out), cwd=REPO, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(out / "sequences" / "part-00000.parquet", process)
    process.send_signal(signal.SIGKILL)
    process.wait()
    done = sorted(p.name for p in (out / "sequences").glob("part-*.parquet"))
    assert process.returncode == -signal.SIGKILL and not (out / "manifest.json").exists()
    assert len(done) < 8, f"the run finished ({len(done)} shards) before it was killed; make it longer"
    stamps = {p: p.stat().st_mtime_ns for d in ("tokens", "sequences") for p in (out / d).glob("part-*.parquet")
              if (out / "sequences" / p.name).exists()}
    resumed = subprocess.run(score_command(sample_model, SAMPLE_PROMPTS, out), cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{out}: 32 sequences" in resumed.stdout
    assert all(p.stat().st_mtime_ns == t for p, t in stamps.items()), "complete shards were rewritten"
    got, want = open_run(out), open_run(reference)
    assert got.token_table().equals(want.token_table())
    assert got.sequence_table().equals(want.sequence_table())
    assert got.manifest["spec"] == json.loads(json.dumps(want.manifest["spec"]))
    assert not list(out.glob("*/.*.tmp")) and not (out / "pending.json").exists()


@pytest.mark.vllm
@pytest.mark.slow
def test_score_both_stages_end_to_end(tmp_path: Path, sample_model: Path) -> None:
    """The README command: stage 1 then stage 2 in one process (vLLM shut down before the trainer loads). Same
    weights in float32 on both sides, so train and rollout log-probs agree to float32 noise."""
    from rcdiag.score.sample import SAMPLE_PROMPTS

    out = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "rcdiag", "score", "-m", str(sample_model), "-p",
                             str(SAMPLE_PROMPTS), "-o", str(out), "--limit", "3", "--n", "2", "--max-tokens", "8",
                             "--engine-dtype", "float32", "-q"], cwd=REPO, capture_output=True, text=True,
                            timeout=600, env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"})
    assert result.returncode == 0, result.stderr[-3000:]
    run = open_run(out)
    tokens = run.tokens()
    assert result.stdout.strip().endswith(f"{out}: 6 sequences, {len(tokens)} tokens in 1 shard(s) "
                                          "(generated + rescored)")
    assert run.manifest["trainer"]["temperature"] == run.manifest["engine"]["temperature"] == 1.0
    diff = (tokens.train_logprob - tokens.rollout_logprob).abs()
    assert tokens.train_logprob.notna().all() and diff.max() < 1e-3, f"max |Δ| {diff.max():.3g}"
