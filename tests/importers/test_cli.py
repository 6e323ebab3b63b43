"""`rcdiag import` command line: pinned user-facing text, then checked through the API."""
from __future__ import annotations

import json

import pandas as pd

import rcdiag
from rcdiag.cli import main
from tests.importers.dumps import (
    assert_run_matches,
    make_truth,
    save_slime_rollout,
    save_slime_train,
    train_tokenizer,
)


def _dump(tmp_path):
    truth = make_truth(seed=40)
    save_slime_rollout(tmp_path / "dd/rollout_data/0.pt", truth, rollout_id=0)
    save_slime_train(tmp_path / "dd/train_data/0.pt", truth, rollout_id=0)
    return truth


def test_import_slime_prints_summary(tmp_path, capsys):
    truth = _dump(tmp_path)
    out = tmp_path / "run"
    assert main(["import", "slime", str(tmp_path / "dd"), "--out", str(out), "--allow-pickle", "-q"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"Imported 7 sequences, {sum(len(t.response) for t in truth)} tokens from slime dump")
    assert "convention  mask_field: loss_mask" in text
    assert "lacks       sampling settings" in text
    masked = sum(int((t.mask == 0).sum()) for t in truth)
    assert f"masked      {masked} token(s) imported with mask False, {masked} of them holding the 0.0" in text
    assert_run_matches(rcdiag.open_run(out), truth)


def test_refusals_and_overwrite(tmp_path, capsys):
    _dump(tmp_path)
    out = tmp_path / "run"
    assert main(["import", "slime", str(tmp_path / "dd"), "--out", str(out), "-q"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Error: ") and "execute arbitrary code" in err and "--allow-pickle" in err
    assert not out.exists()
    args = ["import", "slime", str(tmp_path / "dd"), "--out", str(out), "--allow-pickle", "-q"]
    assert main(args) == 0
    assert main(args) == 1 and "already exists" in capsys.readouterr().err
    assert main(args + ["--overwrite"]) == 0
    (tmp_path / "file").write_text("x")
    assert main(args[:3] + ["--out", str(tmp_path / "file"), "--allow-pickle"]) == 1
    assert "exists and is not a directory" in capsys.readouterr().err
    assert main(["import", "nope", str(tmp_path), "--out", str(out)]) == 1
    assert "unknown format 'nope' (choose from: slime, miles, verl" in capsys.readouterr().err


def test_failed_overwrite_keeps_the_old_run(tmp_path, capsys):
    """A failing import with --overwrite leaves the previous run intact and no temp directory behind."""
    truth = _dump(tmp_path)
    out = tmp_path / "run"
    assert main(["import", "slime", str(tmp_path / "dd"), "--out", str(out), "--allow-pickle", "-q"]) == 0
    pd.DataFrame({"response_ids": [[1, 2]], "logprobs": [[-1.0]]}).to_json(tmp_path / "bad.jsonl",
                                                                           orient="records", lines=True)
    assert main(["import", "jsonl", str(tmp_path / "bad.jsonl"), "--out", str(out), "--overwrite", "-q"]) == 1
    assert "-1 pattern" in capsys.readouterr().err
    assert_run_matches(rcdiag.open_run(out), truth)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "dd", "run"]


def test_help_has_examples(capsys):
    assert main(["import", "--help"]) == 0
    text = capsys.readouterr().out
    assert "rcdiag import slime" in text and "--allow-pickle" in text and "--rescore-both" in text


def test_readme_jsonl_and_trl_commands(tmp_path, capsys):
    """The README's jsonl (named fields) and trl (retokenized) commands, verified through the API."""
    truth = make_truth(seed=41)
    pd.DataFrame({"completion_ids": [t.response for t in truth],
                  "logprobs": [t.rollout.tolist() for t in truth]}).to_json(tmp_path / "rollouts.jsonl",
                                                                            orient="records", lines=True)
    assert main(["import", "jsonl", str(tmp_path / "rollouts.jsonl"), "--out", str(tmp_path / "mine"),
                 "--response-ids-field", "completion_ids", "--rollout-logprobs-field", "logprobs", "-q"]) == 0
    assert_run_matches(rcdiag.open_run(tmp_path / "mine"), truth, train=False, mask=False, prompts=False)
    said = capsys.readouterr().out
    assert "lacks       trainer logprobs" in said
    # one next step, the right one: the rows hold the engine's sampled log-probs, so only the trainer side is missing
    assert said.count("--rescore") == 1 and f"Next: rcdiag score --rescore-only {tmp_path / 'mine'}" in said
    (tmp_path / "completions").mkdir()
    pd.DataFrame({"step": [1], "prompt": ["hello world"], "completion": ["it is five"]}).to_parquet(
        tmp_path / "completions/completions_00001.parquet")
    tokenizer = train_tokenizer(tmp_path / "model")
    assert main(["import", "trl", str(tmp_path / "completions"), "--out", str(tmp_path / "trl"),
                 "--tokenizer", str(tokenizer), "-q"]) == 0
    text = capsys.readouterr().out
    assert text.count("--rescore") == 1 and f"Next: rcdiag score --rescore-both {tmp_path / 'trl'} --model" in text
    assert "record the trainer with rcdiag.record.trl.record_grpo" in text  # the way to the ids TRL cannot log
    assert rcdiag.open_run(tmp_path / "trl").manifest["source"]["retokenized"] is True


def test_readme_trl_batch_command(tmp_path, capsys):
    """The README's TRL batch line: TRL's own keys, steps from global_step, the tokenizer recorded — printed and
    verified through the API (before: both sides absent, no steps, the tokenizer ignored)."""
    from tests.importers.test_native_keys import trl_rows

    truth = make_truth(seed=42)
    (tmp_path / "trl_batch.jsonl").write_text("".join(json.dumps(r) + "\n" for r in trl_rows(truth, step=40)))
    assert main(["import", "jsonl", str(tmp_path / "trl_batch.jsonl"), "--out", str(tmp_path / "trl"),
                 "--tokenizer", "sample_data/tiny-model", "-q"]) == 0
    text = capsys.readouterr().out
    assert "convention  rollout_logprobs_field: sampling_per_token_logps" in text
    assert "steps       1 (40 … 40)" in text and "(2048 ids)" in text
    run = rcdiag.open_run(tmp_path / "trl")
    assert_run_matches(run, truth)
    assert run.manifest["tokenizer"]["vocab_size"] == 2048


def test_flag_for_another_format_is_an_error(tmp_path, capsys):
    """`--step-field` on a slime import is refused with the formats that read it, exit 1, nothing written."""
    assert main(["import", "slime", str(tmp_path), "--out", str(tmp_path / "r"), "--step-field", "s", "-q"]) == 1
    assert "--step-field is for jsonl/parquet dumps" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
