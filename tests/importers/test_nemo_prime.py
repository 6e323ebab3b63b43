"""`rcdiag import nemo-rl` / `prime-rl`: fixtures written to each framework's field lists (tests/importers/
nemo_prime_dumps.py names the files and commits), and a round trip against the number each framework logs,
recomputed here its way: NeMo-RL's token_mult_prob_error, prime-rl's mismatch_kl/all/mean.

Guards issue #28: "two frameworks now write both sides per token and rcdiag reads neither".
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import rcdiag
from rcdiag.checks.verdicts import run_checks
from rcdiag.cli import main
from rcdiag.errors import InputError
from rcdiag.importers import ImportOptions, import_run
from tests.importers.nemo_prime_dumps import (
    nemo_step,
    nemo_token_mult_prob_error,
    prime_mismatch_kl_mean,
    prime_records,
    write_nemo,
    write_prime,
)

Q = ImportOptions(quiet=True)


def _by_step(run, step, keys):
    tokens, seqs = run.tokens(), run.sequences()
    ids = seqs.loc[seqs["step"] == step, "seq_id"]
    return rcdiag.compute_metrics(tokens[tokens.seq_id.isin(ids)], keys=keys, sequences=seqs[seqs.seq_id.isin(ids)])


def test_nemo_rl_round_trip(tmp_path):
    """Two steps of train_data_step{N}.jsonl with multi-turn samples (a tool turn inside the response, mask 0)
    and a sample out of the loss: both sides per token, step N, per-token advantages, rewards; rcdiag's
    token_mult_prob_error per step equals NeMo-RL's own, recomputed from the file its way."""
    rng = np.random.default_rng(60)
    steps = {3: nemo_step(rng, 6), 4: nemo_step(rng, 5, noise=0.3)}
    for n, data in steps.items():
        write_nemo(tmp_path / "logs/exp_1" / f"train_data_step{n}.jsonl", data)
    run, imported = import_run("nemo-rl", tmp_path / "logs", tmp_path / "run", Q)
    seqs, tokens = run.sequences(), run.tokens()
    assert seqs["step"].tolist() == [3] * 6 + [4] * 5
    assert seqs["reward"].tolist() == steps[3]["rewards"] + steps[4]["rewards"]
    for n, data in steps.items():
        ours = _by_step(run, n, "nemo-rl")["train/token_mult_prob_error"]
        theirs = nemo_token_mult_prob_error(data)
        assert ours == pytest.approx(theirs, rel=2e-6), (n, ours, theirs)
    # sample 0 of step 3 is multi-turn: response = first assistant token … input_length, the tool turn masked
    first = steps[3]
    start = first["token_loss_mask"][0].index(1)
    end = first["input_lengths"][0]
    row = tokens[tokens.seq_id == 0]
    assert row["token_id"].tolist() == first["token_ids"][0][start:end]
    assert row["mask"].astype(int).tolist() == first["token_loss_mask"][0][start:end]
    np.testing.assert_array_equal(row["rollout_logprob"].to_numpy(np.float32),
                                  np.float32(first["generation_logprobs"][0][start:end]))
    assert list(seqs.loc[0, "prompt_token_ids"]) == first["token_ids"][0][:start]
    assert not tokens[tokens.seq_id == 1]["mask"].any()  # sample_loss_mask 0
    assert any("sample_loss_mask 0" in w for w in imported.warnings)
    assert seqs.loc[2, "advantage"] == pytest.approx(first["advantages"][2][0])
    assert run.manifest["measured"] == {"rollout": "sampled", "trainer": "pi_old"}


def test_nemo_rl_bad_files(tmp_path):
    """A line whose fields are not NeMo-RL's slices of one, and a wrong file name, are refused by name."""
    data = nemo_step(np.random.default_rng(61), 2)
    file = write_nemo(tmp_path / "train_data_step1.jsonl", data)
    lines = file.read_text().splitlines()
    bad = json.loads(lines[1])
    bad["token_ids"] = bad["token_ids"][0]
    file.write_text(lines[0] + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(InputError, match="row 2 field 'token_ids': expected a one-element list"):
        import_run("nemo-rl", file, tmp_path / "run", Q)
    (tmp_path / "other.jsonl").write_text(lines[0] + "\n")
    with pytest.raises(InputError, match="expected a NeMo-RL train_data_step"):
        import_run("nemo-rl", tmp_path / "other.jsonl", tmp_path / "run", Q)


def test_prime_rl_round_trip_and_stable(tmp_path):
    """Steps 1 and 2 (two ranks each, STABLE) import; step 3 without STABLE is skipped and named; rcdiag's
    mismatch_kl/all/mean per step equals prime-rl's, recomputed from the records its way; entropy, advantages and
    the trainer side's meaning (π_θ at the micro-step) carried."""
    rng = np.random.default_rng(62)
    records = {}
    for step in (1, 2, 3):
        ranks = {0: prime_records(rng, step, 0, 4), 1: prime_records(rng, step, 1, 3)}
        write_prime(tmp_path / "out", step, ranks, stable=step != 3)
        records[step] = ranks[0] + ranks[1]
    run, imported = import_run("prime-rl", tmp_path / "out", tmp_path / "run", Q)
    assert sorted(set(run.sequences()["step"])) == [1, 2]
    assert any("skipped 1 step(s) without a STABLE marker (step_3)" in w for w in imported.warnings)
    for step in (1, 2):
        ours = _by_step(run, step, "prime-rl")["mismatch_kl/all/mean"]
        assert ours == pytest.approx(prime_mismatch_kl_mean(records[step]), rel=1e-5)
    first = records[1][0]
    start = first["loss_mask"].index(True)
    row = run.tokens().query("seq_id == 0")
    assert row["token_id"].tolist() == first["token_ids"][start:]
    np.testing.assert_array_equal(row["train_entropy"].to_numpy(np.float32), np.float32(first["entropy"][start:]))
    assert row["advantage"].tolist() == pytest.approx(first["advantages"][start:])
    assert run.manifest["measured"] == {"rollout": "sampled", "trainer": "pi_theta_microstep"}
    assert "π_θ at the micro-step" in imported.conventions["train_logprobs"]


def test_prime_rl_null_is_reported_not_masked(tmp_path):
    """prime-rl writes null for a non-finite value: it stays NaN on its valid token, a warning counts it, and the
    metrics refuse the run (a masked NaN would hide a broken step)."""
    rng = np.random.default_rng(63)
    recs = prime_records(rng, 5, 0, 3)
    at = recs[1]["loss_mask"].index(True) + 1
    recs[1]["trainer_logprobs"][at] = None  # what _json_float writes for -inf / NaN
    write_prime(tmp_path / "out", 5, {0: recs})
    run, imported = import_run("prime-rl", tmp_path / "out", tmp_path / "run", Q)
    assert any("1 valid token(s) in 1 record(s) have trainer_logprobs null" in w for w in imported.warnings)
    tokens = run.tokens()
    assert tokens["train_logprob"].isna().sum() == 1 and tokens.loc[tokens.train_logprob.isna(), "mask"].all()
    with pytest.raises(InputError, match="train_logprob is missing"):
        rcdiag.compute_metrics(run)


def test_prime_rl_refusals(tmp_path):
    """No STABLE step at all, and another schema_version, are errors (nothing written)."""
    rng = np.random.default_rng(64)
    write_prime(tmp_path / "a", 1, {0: prime_records(rng, 1, 0, 2)}, stable=False)
    with pytest.raises(InputError, match="no step directory has its STABLE marker"):
        import_run("prime-rl", tmp_path / "a", tmp_path / "run", Q)
    recs = prime_records(rng, 1, 0, 2)
    recs[0]["schema_version"] = 2
    write_prime(tmp_path / "b", 1, {0: recs})
    with pytest.raises(InputError, match="row 1 field 'schema_version': schema_version 2"):
        import_run("prime-rl", tmp_path / "b", tmp_path / "run", Q)
    assert not (tmp_path / "run").exists()


def test_shifted_export_is_caught_by_the_alignment_check(tmp_path):
    """A dump whose engine log-probs are one position late (the classic off-by-one) imports, and the existing
    alignment check names the shift."""
    rng = np.random.default_rng(65)
    recs = prime_records(rng, 1, 0, 40, noise=0.02)
    for r in recs:
        r["inference_logprobs"] = [0.0] + r["inference_logprobs"][:-1]
    write_prime(tmp_path / "out", 1, {0: recs})
    run, _ = import_run("prime-rl", tmp_path / "out", tmp_path / "run", Q)
    shift = next(f for f in run_checks(run) if f.name == "alignment_shift")
    assert shift.severity == "error", shift


def test_cli_import_prime_rl_and_nemo(tmp_path, capsys):
    """`rcdiag import prime-rl RUN_DIR` / `nemo-rl LOG_DIR` print the summary and the next step (the report)."""
    rng = np.random.default_rng(66)
    write_prime(tmp_path / "out", 7, {0: prime_records(rng, 7, 0, 3)})
    assert main(["import", "prime-rl", str(tmp_path / "out"), "-o", str(tmp_path / "p"), "-q"]) == 0
    text = capsys.readouterr().out
    assert "from prime-rl dump" in text and "steps       1 (7 … 7)" in text and "Next: rcdiag report" in text
    write_nemo(tmp_path / "logs/train_data_step2.jsonl", nemo_step(rng, 3))
    assert main(["import", "nemo-rl", str(tmp_path / "logs"), "-o", str(tmp_path / "n"), "-q"]) == 0
    assert "steps       1 (2 … 2)" in capsys.readouterr().out


def test_prime_rl_multi_tenant_layout(tmp_path):
    """prime-rl 941019f's per-run directories: `<output>/<run_id>/token_exports/step_<export_step>`, records with
    run_id / export_step / training_mode / rewards and no weight columns. The run's own step (export_step) is the
    step; a training_mode "sft" record (CE on teacher tokens) is masked, never counted as RL tokens; rewards
    become the sequences' rewards. Several runs in one output dir: refused, naming them."""
    rng = np.random.default_rng(7)
    for step in (1, 2):
        ranks = {0: prime_records(rng, step, 0, 4, layout="multi_tenant", run_id="run-a", sft=(1,))}
        write_prime(tmp_path / "out", step + 100, ranks, run_id="run-a")
    run, imported = import_run("prime-rl", tmp_path / "out", tmp_path / "run", Q)
    seqs, tokens = run.sequences(), run.tokens()
    assert sorted(set(seqs["step"])) == [101, 102]
    assert seqs["reward"].tolist() == [0.0, 1.0, 2.0, 3.0] * 2
    sft = seqs.index[seqs["reward"] == 1.0]
    assert not tokens[tokens.seq_id.isin(sft)]["mask"].any()
    assert tokens[~tokens.seq_id.isin(sft)]["mask"].any()
    assert any("training_mode sft" in w for w in imported.warnings)
    assert "multi_tenant" in imported.conventions["layout_version"]
    write_prime(tmp_path / "out", 101, {0: prime_records(rng, 1, 0, 2, layout="multi_tenant", run_id="run-b")},
                run_id="run-b")
    with pytest.raises(InputError, match="2 runs' token exports here .run-a, run-b.*import one"):
        import_run("prime-rl", tmp_path / "out", tmp_path / "run2", Q)
    run_b, _ = import_run("prime-rl", tmp_path / "out" / "run-b", tmp_path / "run-b", Q)
    assert len(run_b.sequences()) == 2


def test_prime_rl_early_layout_without_stable_markers(tmp_path):
    """prime-rl e971d90's first export: training_mode and rewards, one directory, no STABLE marker: every step is
    read, with a warning that says what that risks."""
    rng = np.random.default_rng(8)
    for step in (1, 2):
        write_prime(tmp_path / "out", step, {0: prime_records(rng, step, 0, 3, layout="early")}, stable=False)
    run, imported = import_run("prime-rl", tmp_path / "out", tmp_path / "run", Q)
    assert sorted(set(run.sequences()["step"])) == [1, 2]
    assert any("predates prime-rl's STABLE markers" in w for w in imported.warnings)


def test_multi_turn_dumps_keep_turn_boundaries(tmp_path):
    """NeMo-RL's multi-turn samples (assistant, tool, assistant: token_loss_mask 1 on generated tokens only) get a
    per-token `turn` column: the k-th assistant message and the tool output after it are turn k."""
    rng = np.random.default_rng(9)
    write_nemo(tmp_path / "logs" / "train_data_step1.jsonl", nemo_step(rng, 6, multi_turn=True))
    run, _ = import_run("nemo-rl", tmp_path / "logs", tmp_path / "run", Q)
    tokens = run.tokens()
    assert "turn" in tokens.columns
    for _, rows in tokens.groupby("seq_id"):
        mask, turn = rows["mask"].to_numpy(), rows["turn"].to_numpy()
        starts = mask & ~np.concatenate([[False], mask[:-1]])
        assert (turn == np.maximum(np.cumsum(starts) - 1, 0)).all()
    assert tokens["turn"].max() == 1  # two assistant turns at most in these dumps
