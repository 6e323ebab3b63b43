"""slime/miles importer: real torch.save dumps (rollout + per-rank train) → run equal to the source."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import rcdiag
from rcdiag.errors import InputError
from rcdiag.importers import ImportOptions, import_run
from tests.importers.dumps import (
    assert_run_matches,
    make_truth,
    pickle_dump,
    save_slime_objects,
    save_slime_rollout,
    save_slime_train,
    slime_sample,
)

OK = ImportOptions(allow_pickle=True, quiet=True)


def test_dump_details_dir_both_sides_per_rank(tmp_path):
    """--dump-details DIR with train data split over two ranks (interleaved): log_probs matched by sample index."""
    truth = make_truth(seed=1, n=9)
    save_slime_rollout(tmp_path / "dd/rollout_data/3.pt", truth)
    save_slime_train(tmp_path / "dd/train_data/3_0.pt", truth[::2], rank=0)
    save_slime_train(tmp_path / "dd/train_data/3_1.pt", truth[1::2], rank=1)
    run, imported = import_run("slime", tmp_path / "dd", tmp_path / "run", OK)
    assert_run_matches(run, truth)
    seqs = run.sequences()
    assert seqs["step"].tolist() == [3] * 9
    assert seqs["sample_index"].tolist() == [t.index for t in truth]
    assert seqs["reward"].tolist() == [t.reward for t in truth]
    assert seqs["finish_reason"].tolist() == ["completed"] * 9
    source = run.manifest["source"]
    assert source["kind"] == "imported:slime" and source["retokenized"] is False
    assert "loss_mask" in source["conventions"]["mask_field"]
    assert not any("trainer log_probs" in item for item in source["lacks"])


def test_multiple_rollouts_in_order(tmp_path):
    """Two rollout ids sort numerically (10 after 2) and each keeps its own step."""
    a, b = make_truth(seed=2, n=3), make_truth(seed=3, n=4)
    save_slime_rollout(tmp_path / "dd/rollout_data/10.pt", b, rollout_id=10)
    save_slime_train(tmp_path / "dd/train_data/10.pt", b, rollout_id=10)
    save_slime_rollout(tmp_path / "dd/rollout_data/2.pt", a, rollout_id=2)
    save_slime_train(tmp_path / "dd/train_data/2.pt", a, rollout_id=2)
    run, _ = import_run("slime", tmp_path / "dd", tmp_path / "run", OK)
    assert_run_matches(run, a + b)
    assert run.sequences()["step"].tolist() == [2] * 3 + [10] * 4


def test_rollout_only_says_trainer_side_is_missing(tmp_path):
    truth = make_truth(seed=4)
    file = save_slime_rollout(tmp_path / "debug_3.pt", truth)
    run, imported = import_run("miles", file, tmp_path / "run", OK)
    assert_run_matches(run, truth, train=False)
    assert run.manifest["source"]["kind"] == "imported:miles"
    assert any("trainer log_probs" in item for item in run.manifest["source"]["lacks"])


def test_train_data_flag_with_samples_form(tmp_path):
    """--train-data FILE; a train dump in the `samples` form with `sample_index`; tensors as values."""
    truth = make_truth(seed=5)
    file = save_slime_rollout(tmp_path / "r.pt", truth)
    samples = [{"sample_index": t.index, "log_probs": torch.tensor(t.train)} for t in reversed(truth)]
    torch.save({"samples": samples}, tmp_path / "t.pt")
    run, _ = import_run("slime", file, tmp_path / "run",
                        ImportOptions(allow_pickle=True, quiet=True, train_path=str(tmp_path / "t.pt")))
    assert_run_matches(run, truth)


def test_refuses_pickle_without_consent(tmp_path):
    file = save_slime_rollout(tmp_path / "r.pt", make_truth())
    with pytest.raises(InputError, match="execute arbitrary code.*--allow-pickle"):
        import_run("slime", file, tmp_path / "run", ImportOptions(quiet=True))
    assert not (tmp_path / "run").exists()


def test_malicious_pickle_is_refused_even_with_consent(tmp_path):
    """The restricted unpickler refuses globals outside the allow-list (os.system here) — nothing runs."""
    class Evil:
        def __reduce__(self):
            return (__import__("os").system, (f"touch {tmp_path / 'pwned'}",))

    torch.save({"rollout_id": 0, "samples": [Evil()]}, tmp_path / "evil.pt")
    with pytest.raises(InputError, match=r"references (posix|os|nt)\.system"):
        import_run("slime", tmp_path / "evil.pt", tmp_path / "run", OK)
    assert not (tmp_path / "pwned").exists()
    assert not (tmp_path / "run").exists()

    class Walk:  # getattr is resolved only for the nested classes of the stand-ins, never as a general tool
        def __reduce__(self):
            return (getattr, (dict, "fromkeys"))

    pickle_dump(tmp_path / "walk.pkl", {"samples": [Walk()]})
    with pytest.raises(InputError, match="walk.pkl: the dump asks for attribute 'fromkeys' of dict"):
        import_run("slime", tmp_path / "walk.pkl", tmp_path / "run", OK)


def _bad(tmp_path, truth, edit):
    samples = [slime_sample(t, 0) for t in truth]
    edit(samples)
    torch.save({"rollout_id": 1, "samples": samples}, tmp_path / "bad.pt")
    return tmp_path / "bad.pt"


@pytest.mark.parametrize(("edit", "message", "field"), [
    (lambda s: s[4].__setitem__("rollout_log_probs", s[4]["rollout_log_probs"] + [-0.5]),
     r"rollout_log_probs has \d+ values for \d+ response tokens \(\+1 pattern", "rollout_log_probs"),
    (lambda s: s[4].__setitem__("rollout_log_probs", s[4]["rollout_log_probs"][1:]), r"\(-1 pattern",
     "rollout_log_probs"),
    (lambda s: s[4].__setitem__("rollout_log_probs", s[4]["rollout_log_probs"] * 2 + [0.0]), r"\(2n\+1 pattern",
     "rollout_log_probs"),
    (lambda s: s[4].__setitem__("loss_mask", s[4]["loss_mask"][:-2]), "loss_mask has", "loss_mask"),
    (lambda s: s[4].pop("response_length"), "missing field", "response_length"),
    (lambda s: s[4].__setitem__("rollout_log_probs", None), "missing in this sample but present",
     "rollout_log_probs"),
    (lambda s: s[4].__setitem__("response_length", 999), "does not fit", "response_length"),
])
def test_bad_samples_name_file_row_field(tmp_path, edit, message, field):
    truth = make_truth(seed=6)
    file = _bad(tmp_path, truth, edit)
    with pytest.raises(InputError, match=message) as info:
        import_run("slime", file, tmp_path / "run", OK)
    assert (info.value.file, info.value.row, info.value.field) == (str(file), 5, field)  # s[4] is row 5
    assert not (tmp_path / "run").exists()
    assert not list(tmp_path.glob(".run*"))


def test_length_error_counts_all_offenders(tmp_path):
    truth = make_truth(seed=7)

    def edit(samples):
        for s in samples[3:6]:
            s["rollout_log_probs"] = s["rollout_log_probs"] + [0.0]

    with pytest.raises(InputError, match=r"row 4 .*3 of 7 sample\(s\)"):
        import_run("slime", _bad(tmp_path, truth, edit), tmp_path / "run", OK)


def test_train_dump_from_another_rollout_is_refused(tmp_path):
    truth = make_truth(seed=8)
    other = make_truth(seed=9)
    for t, o in zip(truth, other, strict=True):
        o.index = t.index
    save_slime_rollout(tmp_path / "dd/rollout_data/1.pt", truth)
    save_slime_train(tmp_path / "dd/train_data/1.pt", other)
    with pytest.raises(InputError, match="do not belong together"):
        import_run("slime", tmp_path / "dd", tmp_path / "run", OK)


def test_missing_rank_is_reported(tmp_path):
    truth = make_truth(seed=10)
    save_slime_rollout(tmp_path / "dd/rollout_data/1.pt", truth)
    save_slime_train(tmp_path / "dd/train_data/1_0.pt", truth[:3])
    with pytest.raises(InputError, match="no train log_probs for sample index 103.*all ranks"):
        import_run("slime", tmp_path / "dd", tmp_path / "run", OK)


def test_bf16_train_logprobs_and_nan_warning(tmp_path):
    """bf16 tensors are widened exactly; a NaN on a valid token is kept and surfaced as a warning."""
    truth = make_truth(seed=11, n=3)
    truth[0].train = torch.tensor(truth[0].train).bfloat16().float().numpy()
    truth[1].rollout[0] = np.nan
    file = save_slime_rollout(tmp_path / "r.pt", truth)
    samples = [{"index": t.index, "log_probs": torch.tensor(t.train).bfloat16() if i == 0 else t.train.tolist()}
               for i, t in enumerate(truth)]
    torch.save({"samples": samples}, tmp_path / "t.pt")
    run, imported = import_run("slime", file, tmp_path / "run",
                               ImportOptions(allow_pickle=True, quiet=True, train_path=str(tmp_path / "t.pt")))
    tok = run.tokens()
    np.testing.assert_array_equal(tok[tok.seq_id == 0]["train_logprob"].to_numpy(np.float32), truth[0].train)
    assert any("rollout_logprobs is nan at response position 0" in w for w in imported.warnings)
    assert np.isnan(tok[tok.seq_id == 1]["rollout_logprob"].iloc[0])


def test_imported_run_feeds_the_metrics(tmp_path):
    """End to end: the imported run's kl equals a float64 reference over the source's valid tokens."""
    truth = make_truth(seed=12, n=20, max_len=30)
    save_slime_rollout(tmp_path / "dd/rollout_data/0.pt", truth, rollout_id=0)
    save_slime_train(tmp_path / "dd/train_data/0.pt", truth, rollout_id=0)
    run, imported = import_run("slime", tmp_path / "dd", tmp_path / "run", OK)
    valid = np.concatenate([t.mask for t in truth]) != 0
    a = np.concatenate([t.train for t in truth]).astype(np.float64)[valid]
    b = np.concatenate([t.rollout for t in truth]).astype(np.float64)[valid]
    metrics = rcdiag.compute_metrics(run)
    assert metrics["kl"] == pytest.approx(float(np.mean(b - a)), rel=1e-12)
    assert metrics["tokens"] == int(valid.sum()) and metrics["empty_sequences"] == 1
    assert imported.mask_counts["placeholder_zeros_masked"] == int((~valid).sum()) > 0


def test_pickled_sample_objects_without_slime_installed(tmp_path):
    """Dumps holding Sample objects (with the Status enum) load through the mapped stand-ins."""
    truth = make_truth(seed=13)
    file = save_slime_objects(tmp_path / "r.pt", truth, tmp_path / "pkgs")
    run, _ = import_run("slime", file, tmp_path / "run", OK)
    assert_run_matches(run, truth, train=False)
    assert run.sequences()["finish_reason"].tolist() == ["truncated"] * len(truth)
